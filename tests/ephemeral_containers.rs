//! Upstream's "Ephemeral Containers" `[NodeConformance]` specs
//! (`test/e2e/common/node/ephemeral_containers.go`) on one joined kubelet
//! and real containerd, plus `kubectl debug --target` (the target's PID
//! namespace) and what the kubelet must not do when one is added or exits.
//!
//! Upstream's exec and logs go through the apiserver's proxy to the
//! kubelet; here the test talks to the kubelet's `/exec` and
//! `/containerLogs` handlers directly (served on a local listener, as
//! `tests/pods.rs` does). agnhost (`debugger2`) is replaced by busybox
//! without a command: it exits at once, as agnhost without arguments does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::condition;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const START: &str = "will start an ephemeral container in an existing pod [NodeConformance]";
const UPDATE: &str = "should update the ephemeral containers in an existing pod [NodeConformance]";
const TARGET: &str =
    "kubelet-rs: an ephemeral container with targetContainerName shares the target's PID namespace";
const EC: &str = "ephemeralcontainers";
/// Bound on waits (upstream: 5 min pod start, 1 min for the ephemeral container).
const T: Duration = Duration::from_secs(90);

fn pods(s: &Suite) -> Api<Pod> {
    Api::namespaced(s.j.admin.clone(), NS)
}

fn target_pod() -> Value {
    json!({"metadata": {}, "spec": {"terminationGracePeriodSeconds": 1, "containers": [
        {"name": "test-container-1", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
         "command": ["/bin/sleep"], "args": ["10000"]}]}})
}

fn debugger(target: Option<&str>) -> Value {
    let mut ec = json!({"name": "debugger", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", "while true; do echo polo; sleep 2; done"],
        "stdin": true, "tty": true});
    if let Some(t) = target {
        ec["targetContainerName"] = json!(t);
    }
    ec
}

/// The stored status of ephemeral container `name`.
fn ec_status(s: &Suite, short: &str, name: &str) -> Option<Value> {
    s.api_pod(short)?["status"]["ephemeralContainerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
}

fn app_status(s: &Suite, short: &str) -> Value {
    s.api_pod(short)
        .and_then(|p| p["status"]["containerStatuses"].get(0).cloned())
        .unwrap_or_default()
}

/// Polls until `ok` holds on the ephemeral container's status.
async fn wait_ec(s: &Suite, short: &str, name: &str, ok: impl Fn(&Value) -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if ec_status(s, short, name).as_ref().is_some_and(&ok) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Creates the target pod (upstream `CreateSync`) and adds `ec` through the
/// subresource with a strategic merge patch (`AddEphemeralContainerSync`):
/// the container must be running within the bound. Returns whether it is.
async fn add_ephemeral(s: &Suite, spec: &str, short: &str, ec: Value) -> bool {
    if !s.pod(spec, short, target_pod()).await || !s.wait_running(spec, short, T).await {
        return false;
    }
    let generation = |s: &Suite| {
        s.api_pod(short)
            .map(|p| p["metadata"]["generation"].clone())
    };
    if generation(s) != Some(json!(1)) {
        s.fail(spec, format!("generation {:?}, want 1", generation(s)));
    }
    let patch = json!({"spec": {"ephemeralContainers": [ec]}});
    if let Err(e) = pods(s)
        .patch_subresource(
            EC,
            &s.name(short),
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
    {
        s.fail(spec, format!("patch ephemeralcontainers: {e}"));
        return false;
    }
    let running = wait_ec(s, short, "debugger", |c| c["state"]["running"].is_object()).await;
    if !running {
        s.fail(
            spec,
            format!(
                "debugger not running within {T:?}: {:?}; {}",
                ec_status(s, short, "debugger"),
                s.describe(short)
            ),
        );
        return false;
    }
    if generation(s) != Some(json!(2)) {
        s.fail(spec, format!("generation {:?}, want 2", generation(s)));
    }
    true
}

/// Upstream "checking pod container endpoints": exec `/bin/echo marco` in
/// the ephemeral container, and `polo` in its log.
async fn endpoints(s: &Suite, addr: SocketAddr, spec: &str, short: &str) {
    let path = format!(
        "/exec/{NS}/{}/debugger?output=1&error=1&command=/bin/echo&command=marco",
        s.name(short)
    );
    match ws_read(addr, &path).await {
        Ok(out) if out.contains("marco") => {}
        other => s.fail(spec, format!("exec in debugger: {other:?}")),
    }
    // The loop prints every 2 s; the log may need a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        last = container_logs(addr, &s.name(short), "debugger")
            .await
            .unwrap_or_else(|e| format!("error: {e}"));
        if last.contains("polo") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !last.contains("polo") {
        s.fail(spec, format!("debugger log without polo: {last:?}"));
    }
    let status = ec_status(s, short, "debugger").unwrap_or_default();
    let id = status["containerID"].as_str().unwrap_or("");
    if !id.starts_with("containerd://")
        || status["restartCount"] != 0
        || status["ready"] != false
        || status["image"] != BUSYBOX
        || status["imageID"].as_str().is_none_or(str::is_empty)
    {
        s.fail(spec, format!("ephemeralContainerStatuses entry: {status}"));
    }
    let events = s.events(short);
    for want in ["Created container: debugger", "Started container debugger"] {
        if !events.iter().any(|(_, _, m)| m == want) {
            s.fail(spec, format!("no event {want:?}: {events:?}"));
        }
    }
}

async fn start(s: &Suite, addr: SocketAddr) {
    let short = "ephemeral-containers-target-pod";
    if add_ephemeral(s, START, short, debugger(None)).await {
        endpoints(s, addr, START, short).await;
    }
}

fn ec_count(p: &Pod) -> usize {
    p.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_ref())
        .map_or(0, Vec::len)
}

async fn update(s: &Suite, addr: SocketAddr) {
    let short = "ephemeral-containers-update-pod";
    if !add_ephemeral(s, UPDATE, short, debugger(None)).await {
        return;
    }
    endpoints(s, addr, UPDATE, short).await;
    let name = s.name(short);
    match pods(s).get_subresource(EC, &name).await {
        Ok(p) if ec_count(&p) == 1 => {}
        other => s.fail(
            UPDATE,
            format!("one ephemeral container expected: {other:?}"),
        ),
    }
    let app_before = app_status(s, short);
    // RetryOnConflict around Get + UpdateEphemeralContainers.
    let mut updated = false;
    for _ in 0..5 {
        let Ok(mut p) = pods(s).get(&name).await else {
            continue;
        };
        if let Some(spec) = p.spec.as_mut() {
            let ec = serde_json::from_value(json!({"name": "debugger2", "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent", "terminationMessagePolicy": "File"}));
            if let Ok(ec) = ec {
                spec.ephemeral_containers
                    .get_or_insert_with(Vec::new)
                    .push(ec);
            }
        }
        match pods(s)
            .replace_subresource(EC, &name, &PostParams::default(), &p)
            .await
        {
            Ok(_) => {
                updated = true;
                break;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                s.fail(UPDATE, format!("update ephemeral containers: {e}"));
                return;
            }
        }
    }
    if !updated {
        s.fail(UPDATE, "update ephemeral containers: conflicts");
        return;
    }
    match pods(s).get_subresource(EC, &name).await {
        Ok(p) if ec_count(&p) == 2 => {}
        other => s.fail(
            UPDATE,
            format!("two ephemeral containers expected: {other:?}"),
        ),
    }
    // Beyond upstream: debugger2 runs and exits, and is never restarted; the
    // app container was not restarted by either addition; the pod stays
    // Running and Ready.
    if !wait_ec(s, short, "debugger2", |c| {
        c["state"]["terminated"].is_object()
    })
    .await
    {
        s.fail(
            UPDATE,
            format!(
                "debugger2 never ran to completion: {:?}",
                ec_status(s, short, "debugger2")
            ),
        );
        return;
    }
    let first = ec_status(s, short, "debugger2").unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = ec_status(s, short, "debugger2").unwrap_or_default();
    if later["containerID"] != first["containerID"] || later["restartCount"] != 0 {
        s.fail(UPDATE, format!("debugger2 restarted: {first} then {later}"));
    }
    let app = app_status(s, short);
    if app["containerID"] != app_before["containerID"] || app["restartCount"] != 0 {
        s.fail(
            UPDATE,
            format!("app container restarted: {app_before} then {app}"),
        );
    }
    if s.phase(short) != "Running" || !condition(s.api_pod(short).as_ref(), "Ready") {
        s.fail(
            UPDATE,
            format!("pod no longer Running and Ready: {}", s.describe(short)),
        );
    }
}

async fn target(s: &Suite, addr: SocketAddr) {
    let short = "ephemeral-containers-target-pid";
    if !add_ephemeral(s, TARGET, short, debugger(Some("test-container-1"))).await {
        return;
    }
    // In the target's PID namespace the debugger sees `sleep 10000`.
    let path = format!(
        "/exec/{NS}/{}/debugger?output=1&error=1&command=ps",
        s.name(short)
    );
    match ws_read(addr, &path).await {
        Ok(out) if out.contains("sleep 10000") => {}
        other => s.fail(TARGET, format!("ps in debugger: {other:?}")),
    }
}

/// Serves the kubelet's exec and containerLogs handlers on a local listener.
async fn serve(s: &Suite) -> SocketAddr {
    let host = s.j.node.handle().host.clone();
    let streaming: Arc<dyn kubelet_server::streaming::StreamingHost> = host.clone();
    let logs: Arc<dyn kubelet_server::logs::ContainerLogsHost> = host;
    let router =
        kubelet_server::streaming::routes(streaming).merge(kubelet_server::logs::routes(logs));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// Runs an exec over a `channel.k8s.io` websocket; returns stdout and stderr.
async fn ws_read(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut req = format!("ws://{addr}{path}").into_client_request()?;
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", "channel.k8s.io".parse()?);
    let tcp = TcpStream::connect(addr).await?;
    let (mut ws, _) = tokio::time::timeout(
        Duration::from_secs(20),
        tokio_tungstenite::client_async(req, tcp),
    )
    .await??;
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await? {
            Some(Ok(Message::Binary(b))) => {
                if let Some((1 | 2, rest)) = b.split_first() {
                    out.extend_from_slice(rest);
                }
            }
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
        }
    }
    Ok(String::from_utf8_lossy(&out).to_string())
}

/// `GET /containerLogs/<ns>/<pod>/<container>` on the kubelet.
async fn container_logs(addr: SocketAddr, pod: &str, container: &str) -> anyhow::Result<String> {
    let url = format!("http://{addr}/containerLogs/{NS}/{pod}/{container}");
    let body = async {
        let tcp = TcpStream::connect(addr).await?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let req = http::Request::get(url.as_str())
            .header("host", "kubelet")
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let resp = send.send_request(req).await?;
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await?
            .to_bytes();
        anyhow::ensure!(
            status.is_success(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
        anyhow::Ok(String::from_utf8_lossy(&body).to_string())
    };
    tokio::time::timeout(Duration::from_secs(20), body).await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_containers_specs() {
    let s = Suite::start().await;
    if !s.j.api.profile().at_least(25) {
        // Only from 1.25 (GA; alpha and off by default in 1.19): an older
        // apiserver serves no pods/ephemeralcontainers, so no kubelet can be
        // given one there.
        eprintln!(
            "ephemeral_containers: the specs do not apply to a {} apiserver (no pods/ephemeralcontainers)",
            s.j.api.profile()
        );
        s.finish("ephemeral_containers.rs").await;
        return;
    }
    let addr = serve(&s).await;
    tokio::join!(start(&s, addr), update(&s, addr), target(&s, addr));
    s.finish("ephemeral_containers.rs").await;
}
