//! Upstream's "Pods" `[NodeConformance]` specs
//! (`test/e2e/common/node/pods.go`) on one joined kubelet: host IP,
//! submitted and removed, label updates, `activeDeadlineSeconds` updates,
//! service environment variables, exec over websockets, container logs,
//! readiness gates. nginx and serve-hostname are emulated with busybox
//! (a TERM-trapping sleeper, httpd).
//!
//! Upstream's exec and logs specs go through the apiserver's proxy to the
//! kubelet; here the test talks to the kubelet's handlers directly (served
//! on a local listener, as `tests/streaming.rs` does). The logs spec's
//! websocket framing (`binary.k8s.io`) is the apiserver's, so the kubelet's
//! part is the `/containerLogs` body, checked byte for byte.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const HOST_IP: &str = "should get a host IP [NodeConformance]";
const SUBMIT_REMOVE: &str = "should be submitted and removed [NodeConformance]";
const UPDATED: &str = "should be updated [NodeConformance]";
const DEADLINE: &str = "should allow activeDeadlineSeconds to be updated [NodeConformance]";
const SERVICE_ENV: &str = "should contain environment variables for services [NodeConformance]";
const EXEC_WS: &str = "should support remote command execution over websockets [NodeConformance]";
const LOGS_WS: &str =
    "should support retrieving logs from the container over websockets [NodeConformance]";
const GATES: &str = "should support pod readiness gates [NodeConformance]";

/// The pause image `deploy/setup-runtime.sh` builds.
const PAUSE: &str = "localhost:5000/pause:3.9";
/// nginx stand-in: runs until TERM, then exits at once.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";
/// Bound on waits (upstream's PodStartTimeout is 5 min).
const T: Duration = Duration::from_secs(90);

fn nginx_pod(labels: Value) -> Value {
    json!({"metadata": {"labels": labels},
        "spec": {"containers": [{"name": "nginx", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", SERVE]}]}})
}

fn pods_api(s: &Suite) -> Api<Pod> {
    Api::namespaced(s.j.admin.clone(), NS)
}

async fn count(s: &Suite, selector: &str) -> usize {
    pods_api(s)
        .list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items.len())
        .unwrap_or(usize::MAX)
}

/// Polls (bounded by `timeout`) until `ok` holds on the stored pod.
async fn wait_pod(s: &Suite, short: &str, timeout: Duration, ok: impl Fn(&Value) -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if s.api_pod(short).as_ref().is_some_and(&ok) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn host_ip(s: &Suite) {
    let short = "pod-hostip";
    let p = json!({"metadata": {}, "spec": {"containers": [{"name": "test", "image": PAUSE,
        "imagePullPolicy": "IfNotPresent"}]}});
    if !s.pod(HOST_IP, short, p).await || !s.wait_running(HOST_IP, short, T).await {
        return;
    }
    if !wait_pod(s, short, Duration::from_secs(30), |p| {
        p["status"]["hostIP"]
            .as_str()
            .is_some_and(|ip| !ip.is_empty())
    })
    .await
    {
        s.fail(HOST_IP, format!("no hostIP: {:?}", s.api_pod(short)));
    }
}

async fn submit_remove(s: &Suite) {
    let short = "pod-submit-remove";
    let value = "submit-remove-1";
    let selector = format!("time={value}");
    let n = count(s, &selector).await;
    if n != 0 {
        s.fail(SUBMIT_REMOVE, format!("{n} pods before creation"));
    }
    if !s
        .pod(
            SUBMIT_REMOVE,
            short,
            nginx_pod(json!({"name": "foo", "time": value})),
        )
        .await
    {
        return;
    }
    let n = count(s, &selector).await;
    if n != 1 {
        s.fail(
            SUBMIT_REMOVE,
            format!("{n} pods listed after creation, want 1"),
        );
    }
    if !s.wait_running(SUBMIT_REMOVE, short, T).await {
        return;
    }
    if let Err(e) = pods_api(s)
        .delete(&s.name(short), &DeleteParams::default().grace_period(30))
        .await
    {
        s.fail(SUBMIT_REMOVE, format!("delete: {e}"));
        return;
    }
    // The last state the watch sees before the deletion carries the
    // deletion timestamp and a non-zero grace period.
    let last = s.api_pod(short);
    if let Some(p) = &last
        && (p["metadata"]["deletionTimestamp"].is_null()
            || p["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                == 0)
    {
        s.fail(
            SUBMIT_REMOVE,
            format!("deleted pod without deletionTimestamp or grace period: {p}"),
        );
    }
    // Upstream's DefaultPodDeletionTimeout is 3 min; the container exits on TERM.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while s.api_pod(short).is_some() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if s.api_pod(short).is_some() {
        s.fail(
            SUBMIT_REMOVE,
            format!("pod not removed within 60s; {}", s.describe(short)),
        );
    }
    let n = count(s, &selector).await;
    if n != 0 {
        s.fail(SUBMIT_REMOVE, format!("{n} pods listed after deletion"));
    }
}

async fn updated(s: &Suite) {
    let short = "pod-update";
    if !s
        .pod(
            UPDATED,
            short,
            nginx_pod(json!({"name": "foo", "time": "update-1"})),
        )
        .await
        || !s.wait_running(UPDATED, short, T).await
    {
        return;
    }
    let n = count(s, "time=update-1").await;
    if n != 1 {
        s.fail(UPDATED, format!("{n} pods with the first label, want 1"));
    }
    s.patch_pod(short, json!({"metadata": {"labels": {"time": "update-2"}}}))
        .await;
    if !s.wait_running(UPDATED, short, T).await {
        return;
    }
    let n = count(s, "time=update-2").await;
    if n != 1 {
        s.fail(UPDATED, format!("{n} pods with the updated label, want 1"));
    }
}

async fn active_deadline(s: &Suite) {
    let short = "pod-update-activedeadlineseconds";
    if !s
        .pod(
            DEADLINE,
            short,
            nginx_pod(json!({"name": "foo", "time": "deadline-1"})),
        )
        .await
        || !s.wait_running(DEADLINE, short, T).await
    {
        return;
    }
    s.patch_pod(short, json!({"spec": {"activeDeadlineSeconds": 5}}))
        .await;
    // WaitForPodTerminatedInNamespace: phase Failed with reason DeadlineExceeded.
    if !wait_pod(s, short, T, |p| {
        p["status"]["phase"] == "Failed" && p["status"]["reason"] == "DeadlineExceeded"
    })
    .await
    {
        s.fail(
            DEADLINE,
            format!(
                "not Failed/DeadlineExceeded within {T:?}: status {}",
                s.api_pod(short)
                    .map(|p| p["status"].clone())
                    .unwrap_or_default()
            ),
        );
    }
}

async fn service_env(s: &Suite) {
    let server = "server-envvars";
    let server_name = s.name(server);
    let p = json!({"metadata": {"labels": {"name": server_name}},
        "spec": {"containers": [{"name": "srv", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "hostname > /tmp/index.html && exec httpd -f -p 9376 -h /tmp"],
            "ports": [{"containerPort": 9376}]}]}});
    if !s.pod(SERVICE_ENV, server, p).await || !s.wait_running(SERVICE_ENV, server, T).await {
        return;
    }
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "fooservice", "namespace": NS, "labels": {"name": "fooservice"}},
        "spec": {"ports": [{"port": 8765, "targetPort": 8080}], "selector": {"name": server_name}},
    }))
    .expect("service");
    if let Err(e) = Api::<Service>::namespaced(s.j.admin.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await
    {
        s.fail(SERVICE_ENV, format!("create service: {e}"));
        return;
    }
    let expected = [
        "FOOSERVICE_SERVICE_HOST=",
        "FOOSERVICE_SERVICE_PORT=",
        "FOOSERVICE_PORT=",
        "FOOSERVICE_PORT_8765_TCP_PORT=",
        "FOOSERVICE_PORT_8765_TCP_PROTO=",
        "FOOSERVICE_PORT_8765_TCP=",
        "FOOSERVICE_PORT_8765_TCP_ADDR=",
    ];
    // The pod may start before the kubelet sees the service: upstream
    // retries up to 3 times, each with a new client pod.
    let mut last = String::new();
    for attempt in 1..=3 {
        let short = format!("client-envvars-{attempt}");
        let name = s.name(&short);
        let p = json!({"metadata": {"labels": {"name": name}},
            "spec": {"containers": [{"name": "env3cont", "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", "env"]}],
                "restartPolicy": "Never"}});
        if !s.pod(SERVICE_ENV, &short, p).await {
            return;
        }
        s.wait_all(&[short.as_str()], POD_TIMEOUT, terminal).await;
        let log = s.log(&short, "env3cont").unwrap_or_default();
        if s.phase(&short) == "Succeeded" && expected.iter().all(|v| log.contains(v)) {
            return;
        }
        last = format!(
            "attempt {attempt}: phase {:?}, log {log:?}",
            s.phase(&short)
        );
    }
    s.fail(
        SERVICE_ENV,
        format!("service environment variables missing after 3 attempts; {last}"),
    );
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

async fn exec_ws(s: &Suite, addr: SocketAddr) {
    let short = "pod-exec-websocket";
    let p = json!({"metadata": {}, "spec": {"containers": [{"name": "main", "image": BUSYBOX,
        "imagePullPolicy": "IfNotPresent", "command": ["/bin/sh", "-c", "echo container is alive; sleep 600"]}],
        "terminationGracePeriodSeconds": 1}});
    if !s.pod(EXEC_WS, short, p).await || !s.wait_running(EXEC_WS, short, T).await {
        return;
    }
    // The apiserver turns `stdout=1&stderr=1` into the kubelet's `output=1&error=1`.
    let path = format!(
        "/exec/{NS}/{}/main?error=1&output=1&command=echo&command=remote%20execution%20test",
        s.name(short)
    );
    let out = match ws_read(addr, &path, "channel.k8s.io").await {
        Ok(m) => m,
        Err(e) => {
            s.fail(EXEC_WS, format!("websocket: {e}"));
            return;
        }
    };
    let mut stdout = Vec::new();
    for msg in out {
        match msg.split_first() {
            None => {}
            Some((1, rest)) => stdout.extend_from_slice(rest),
            Some((_, [])) => {}
            Some((ch, rest)) => s.fail(
                EXEC_WS,
                format!(
                    "message on channel {ch}, not STDOUT: {:?}",
                    String::from_utf8_lossy(rest)
                ),
            ),
        }
    }
    let stdout = String::from_utf8_lossy(&stdout);
    if !stdout.contains("remote execution test") {
        s.fail(
            EXEC_WS,
            format!("expected to find 'remote execution test' in {stdout:?}"),
        );
    }
}

/// Opens a websocket with `protocol` and returns its binary messages until it closes.
async fn ws_read(addr: SocketAddr, path: &str, protocol: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut req = format!("ws://{addr}{path}").into_client_request()?;
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse()?);
    let tcp = TcpStream::connect(addr).await?;
    let (mut ws, _) = tokio::time::timeout(
        Duration::from_secs(20),
        tokio_tungstenite::client_async(req, tcp),
    )
    .await??;
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(60), ws.next()).await? {
            Some(Ok(Message::Binary(b))) => out.push(b.to_vec()),
            Some(Ok(Message::Close(_))) | None => return Ok(out),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
        }
    }
}

async fn logs_ws(s: &Suite, addr: SocketAddr) {
    let short = "pod-logs-websocket";
    let p = json!({"metadata": {}, "spec": {"containers": [{"name": "main", "image": BUSYBOX,
        "imagePullPolicy": "IfNotPresent", "command": ["/bin/sh", "-c", "echo container is alive; sleep 10000"]}],
        "terminationGracePeriodSeconds": 1}});
    if !s.pod(LOGS_WS, short, p).await || !s.wait_running(LOGS_WS, short, T).await {
        return;
    }
    let url = format!("http://{addr}/containerLogs/{NS}/{}/main", s.name(short));
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
        anyhow::Ok((status, String::from_utf8_lossy(&body).to_string()))
    };
    match tokio::time::timeout(Duration::from_secs(30), body).await {
        Ok(Ok((status, body))) if status.is_success() && body == "container is alive\n" => {}
        other => s.fail(LOGS_WS, format!("Unexpected logs: {other:?}")),
    }
}

fn ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

async fn readiness_gates(s: &Suite) {
    let short = "pod-ready";
    let (g1, g2) = ("k8s.io/test-condition1", "k8s.io/test-condition2");
    let p = json!({"metadata": {"labels": {"test": "pod-readiness-gate"}},
        "spec": {"containers": [{"name": "pod-readiness-gate", "image": BUSYBOX,
            "imagePullPolicy": "IfNotPresent", "command": ["/bin/sh", "-c", "echo container is alive; sleep 10000"]}],
            "readinessGates": [{"conditionType": g1}, {"conditionType": g2}],
            "terminationGracePeriodSeconds": 1}});
    if !s.pod(GATES, short, p).await || !s.wait_running(GATES, short, T).await {
        return;
    }
    if s.api_pod(short).as_ref().is_some_and(ready) {
        s.fail(GATES, "Expect pod's Ready condition to be false initially.");
    }
    let patch = |t: &str, st: &str| {
        let api = pods_api(s);
        let name = s.name(short);
        let body = json!({"status": {"conditions": [{"type": t, "status": st}]}});
        async move {
            api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(body))
                .await
        }
    };
    if let Err(e) = patch(g1, "True").await {
        s.fail(GATES, format!("patch status: {e}"));
        return;
    }
    // Upstream sleeps syncLoopFrequency (10 s) before checking.
    tokio::time::sleep(Duration::from_secs(10)).await;
    if s.api_pod(short).as_ref().is_some_and(ready) {
        s.fail(
            GATES,
            "Expect pod's Ready condition to be false with only one condition in readinessGates equal to True",
        );
    }
    if let Err(e) = patch(g2, "True").await {
        s.fail(GATES, format!("patch status: {e}"));
        return;
    }
    if !wait_pod(s, short, Duration::from_secs(60), ready).await {
        s.fail(
            GATES,
            format!(
                "not Ready with both gates True: {:?}",
                s.api_pod(short).map(|p| p["status"].clone())
            ),
        );
        return;
    }
    if let Err(e) = patch(g1, "False").await {
        s.fail(GATES, format!("patch status: {e}"));
        return;
    }
    if !wait_pod(s, short, Duration::from_secs(60), |p| !ready(p)).await {
        s.fail(
            GATES,
            format!(
                "still Ready with one gate False: {:?}",
                s.api_pod(short).map(|p| p["status"].clone())
            ),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_specs() {
    let s = Suite::start().await;
    let addr = serve(&s).await;
    tokio::join!(
        host_ip(&s),
        submit_remove(&s),
        updated(&s),
        active_deadline(&s),
        service_env(&s),
        exec_ws(&s, addr),
        logs_ws(&s, addr),
        readiness_gates(&s),
    );
    s.finish("pods").await;
}
