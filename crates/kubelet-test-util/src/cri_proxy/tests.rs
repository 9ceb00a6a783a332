//! Unit tests of the CRI proxy: a small fake CRI server on a temp socket
//! behind it, the kubelet's own `cri::RemoteRuntime` in front.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use cri::pb::runtime_service_server::{RuntimeService as Srv, RuntimeServiceServer};
use cri::{CriError, RemoteRuntime, RuntimeService as _, pb};
use tonic::{Code, Request, Response, Status};

use super::*;

/// A backend with two pods: sandbox `s1` (label app=hung) with container
/// `c1`, sandbox `s2` (app=ok) with `c2`. `Version` answers its call count.
#[derive(Clone, Default)]
struct Backend {
    calls: Arc<parking_lot::Mutex<HashMap<&'static str, usize>>>,
    versions: Arc<AtomicUsize>,
}

impl Backend {
    fn count(&self, m: &'static str) {
        *self.calls.lock().entry(m).or_default() += 1;
    }
    fn calls(&self, m: &str) -> usize {
        self.calls.lock().get(m).copied().unwrap_or(0)
    }
}

fn sandbox(id: &str, app: &str) -> pb::PodSandbox {
    pb::PodSandbox {
        id: id.into(),
        metadata: Some(pb::PodSandboxMetadata {
            name: format!("pod-{id}"),
            namespace: "default".into(),
            uid: format!("uid-{id}"),
            attempt: 0,
        }),
        labels: HashMap::from([("app".to_string(), app.to_string())]),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Srv for Backend {
    async fn version(
        &self,
        _: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        self.count("Version");
        let n = self.versions.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Response::new(pb::VersionResponse {
            runtime_name: "fake".into(),
            runtime_version: n.to_string(),
            ..Default::default()
        }))
    }
    async fn list_pod_sandbox(
        &self,
        _: Request<pb::ListPodSandboxRequest>,
    ) -> Result<Response<pb::ListPodSandboxResponse>, Status> {
        self.count("ListPodSandbox");
        Ok(Response::new(pb::ListPodSandboxResponse {
            items: vec![sandbox("s1", "hung"), sandbox("s2", "ok")],
        }))
    }
    async fn list_containers(
        &self,
        _: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, Status> {
        self.count("ListContainers");
        let c = |id: &str, s: &str| pb::Container {
            id: id.into(),
            pod_sandbox_id: s.into(),
            ..Default::default()
        };
        Ok(Response::new(pb::ListContainersResponse {
            containers: vec![c("c1", "s1"), c("c2", "s2")],
        }))
    }
    async fn container_status(
        &self,
        r: Request<pb::ContainerStatusRequest>,
    ) -> Result<Response<pb::ContainerStatusResponse>, Status> {
        self.count("ContainerStatus");
        Ok(Response::new(pb::ContainerStatusResponse {
            status: Some(pb::ContainerStatus {
                id: r.into_inner().container_id,
                ..Default::default()
            }),
            ..Default::default()
        }))
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    backend: Backend,
    proxy: CriProxy,
    client: RemoteRuntime,
}

/// Backend, proxy and a client with `timeout`.
async fn fixture(timeout: Duration) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = Backend::default();
    let sock = dir.path().join("backend.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("bind backend");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(backend.clone()))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let proxy = CriProxy::start(
        dir.path().join("proxy.sock"),
        &format!("unix://{}", sock.display()),
    )
    .await
    .expect("proxy starts");
    let client = RemoteRuntime::new(&proxy.endpoint(), None, timeout).expect("client");
    Fixture {
        _dir: dir,
        backend,
        proxy,
        client,
    }
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "not {what} within 10s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn code(e: &CriError) -> Option<Code> {
    match e {
        CriError::Rpc { code, .. } => Some(*code),
        _ => None,
    }
}

#[tokio::test]
async fn forwards_unchanged_and_counts() {
    let f = fixture(Duration::from_secs(5)).await;
    let v = f.client.version().await.expect("version");
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_version.as_str()),
        ("fake", "1")
    );
    let s = f.client.list_pod_sandbox(None).await.expect("list");
    assert_eq!(s.len(), 2);
    assert_eq!(f.proxy.calls("Version"), 1);
    assert_eq!(f.proxy.calls("ListPodSandbox"), 1);
    assert_eq!(f.proxy.calls("RunPodSandbox"), 0);
    assert_eq!(f.backend.calls("Version"), 1);
}

#[tokio::test]
async fn delays_then_forwards() {
    let f = fixture(Duration::from_secs(5)).await;
    let rule = f
        .proxy
        .add_rule(Rule::new(Action::Delay(Duration::from_millis(300))).method("Version"));
    let start = Instant::now();
    f.client.version().await.expect("version");
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(rule.hits(), 1);
    assert_eq!(f.backend.calls("Version"), 1);
}

#[tokio::test]
async fn hangs_until_released() {
    let f = fixture(Duration::from_secs(10)).await;
    let rule = f
        .proxy
        .add_rule(Rule::new(Action::Hang).method("ContainerStatus"));
    let client = f.client.clone();
    let call = tokio::spawn(async move { client.container_status("c1").await });
    eventually("held", || f.proxy.held() == 1).await;
    // Other methods pass while it hangs.
    f.client.version().await.expect("version passes");
    assert!(!call.is_finished());
    assert_eq!(f.backend.calls("ContainerStatus"), 0);
    rule.release();
    let st = call.await.expect("task").expect("answered after release");
    assert_eq!(st.id, "c1");
    assert_eq!(f.backend.calls("ContainerStatus"), 1);
    assert_eq!(f.proxy.held(), 0);
    // The rule is gone: the next call passes at once.
    f.client.container_status("c1").await.expect("passes");
}

#[tokio::test]
async fn a_held_call_ends_with_the_clients_deadline() {
    let f = fixture(Duration::from_millis(300)).await;
    let _rule = f
        .proxy
        .add_rule(Rule::new(Action::Hang).method("ContainerStatus"));
    let err = f.client.container_status("c1").await.expect_err("deadline");
    // DeadlineExceeded, as containerd answers, so the kubelet retries.
    assert!(err.is_retryable(), "{err}");
    // The proxy dropped the held call's future: nothing held any more.
    eventually("dropped", || f.proxy.held() == 0).await;
    assert_eq!(f.backend.calls("ContainerStatus"), 0);
}

#[tokio::test]
async fn a_held_call_ends_when_the_client_goes_away() {
    let f = fixture(Duration::from_secs(30)).await;
    let _rule = f
        .proxy
        .add_rule(Rule::new(Action::Hang).method("ContainerStatus"));
    let client = f.client.clone();
    let call = tokio::spawn(async move { client.container_status("c1").await });
    eventually("held", || f.proxy.held() == 1).await;
    call.abort();
    eventually("dropped", || f.proxy.held() == 0).await;
    assert_eq!(f.backend.calls("ContainerStatus"), 0);
}

#[tokio::test]
async fn fails_with_the_given_code() {
    let f = fixture(Duration::from_secs(5)).await;
    let _rule = f.proxy.add_rule(
        Rule::new(Action::Fail(Code::ResourceExhausted, "no room".into())).method("Version"),
    );
    let err = f.client.version().await.expect_err("fails");
    assert_eq!(code(&err), Some(Code::ResourceExhausted), "{err}");
    assert!(err.message().contains("no room"), "{err}");
    assert_eq!(f.backend.calls("Version"), 0);
    f.client
        .list_containers(None)
        .await
        .expect("other methods pass");
}

#[tokio::test]
async fn dropping_the_connection_is_a_transport_error_then_reconnects() {
    let f = fixture(Duration::from_secs(5)).await;
    f.client.version().await.expect("connected");
    let _rule = f
        .proxy
        .add_rule(Rule::new(Action::DropConnection).method("Version").times(1));
    let err = f.client.version().await.expect_err("connection dropped");
    // Not the proxy's own status: the answer never reached the client.
    assert!(
        !err.to_string().contains("dropped by the CRI proxy"),
        "{err}"
    );
    let v = f.client.version().await.expect("reconnected");
    assert_eq!(v.runtime_version, "2");
    assert_eq!(f.proxy.calls("Version"), 3);
}

#[tokio::test]
async fn stale_answers_repeat_the_previous_one() {
    let f = fixture(Duration::from_secs(5)).await;
    assert_eq!(f.client.version().await.expect("v").runtime_version, "1");
    let rule = f.proxy.add_rule(Rule::new(Action::Stale).method("Version"));
    assert_eq!(f.client.version().await.expect("v").runtime_version, "1");
    assert_eq!(f.client.version().await.expect("v").runtime_version, "1");
    rule.remove();
    assert_eq!(f.client.version().await.expect("v").runtime_version, "2");
}

#[tokio::test]
async fn edits_answers() {
    let f = fixture(Duration::from_secs(5)).await;
    let _rule = f.proxy.add_rule(Rule::new(Action::edit(
        |r: &mut pb::ListContainersResponse| {
            r.containers.truncate(1);
            r.containers.push(r.containers[0].clone());
            r.containers[1].state = 42;
        },
    )));
    let cs = f.client.list_containers(None).await.expect("list");
    assert_eq!(cs.len(), 2);
    assert_eq!(cs[0].id, cs[1].id, "duplicate IDs");
    assert_eq!(cs[1].state, 42, "unknown enum value");
    // Other answer types pass unchanged under the same rule.
    assert_eq!(
        f.client.list_pod_sandbox(None).await.expect("list").len(),
        2
    );
}

#[tokio::test]
async fn a_pod_label_rule_catches_its_containers() {
    let f = fixture(Duration::from_secs(5)).await;
    // The kubelet's relist teaches the proxy which pod is which.
    f.client.list_pod_sandbox(None).await.expect("sandboxes");
    f.client.list_containers(None).await.expect("containers");
    let rule = f.proxy.add_rule(
        Rule::new(Action::Fail(Code::Internal, "injected".into()))
            .method("ContainerStatus")
            .pod(PodSelector::Label("app".into(), "hung".into())),
    );
    f.client
        .container_status("c2")
        .await
        .expect("other pod passes");
    let err = f
        .client
        .container_status("c1")
        .await
        .expect_err("its pod fails");
    assert_eq!(code(&err), Some(Code::Internal), "{err}");
    assert_eq!(rule.hits(), 1);
    let by_name = f
        .proxy
        .add_rule(
            Rule::new(Action::Fail(Code::NotFound, "gone".into())).pod(PodSelector::Name {
                namespace: "default".into(),
                name: "pod-s2".into(),
            }),
        );
    assert!(f.client.container_status("c2").await.is_err());
    assert_eq!(by_name.hits(), 1);
}

#[tokio::test]
async fn a_rule_limited_to_n_hits_then_passes() {
    let f = fixture(Duration::from_secs(5)).await;
    let rule = f.proxy.add_rule(
        Rule::new(Action::Fail(Code::Unavailable, "down".into()))
            .method("Version")
            .times(2),
    );
    assert!(f.client.version().await.is_err());
    assert!(f.client.version().await.is_err());
    f.client.version().await.expect("third passes");
    assert_eq!(rule.hits(), 2);
    assert_eq!(f.backend.calls("Version"), 1);
}

#[test]
fn reads_grpc_timeouts() {
    let mut m = tonic::metadata::MetadataMap::new();
    assert_eq!(service::client_deadline(&m), None);
    for (v, d) in [
        ("2S", Duration::from_secs(2)),
        ("300m", Duration::from_millis(300)),
        ("1M", Duration::from_secs(60)),
        ("5u", Duration::from_micros(5)),
    ] {
        m.insert("grpc-timeout", v.parse().expect("ascii"));
        assert_eq!(service::client_deadline(&m), Some(d), "{v}");
    }
    m.insert("grpc-timeout", "12x".parse().expect("ascii"));
    assert_eq!(service::client_deadline(&m), None);
}
