//! The HTTP manifest source and the local health endpoint.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use kubelet::{App, KubeletConfig};
use kubelet_config::Flags;
use kubelet_rs_integration::*;
use parking_lot::RwLock;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_source_runs_served_pods_and_removes_withdrawn_ones() -> anyhow::Result<()> {
    // The served body; requests without the configured header get 403.
    let body = Arc::new(RwLock::new(String::new()));
    async fn serve(
        State(b): State<Arc<RwLock<String>>>,
        h: HeaderMap,
    ) -> (axum::http::StatusCode, String) {
        if h.get("x-token").and_then(|v| v.to_str().ok()) != Some("s3cret") {
            return (axum::http::StatusCode::FORBIDDEN, String::new());
        }
        (axum::http::StatusCode::OK, b.read().clone())
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/pods", get(serve))
        .with_state(body.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let node = Node::start(|f| {
        f.manifest_url = Some(format!("http://{addr}/pods"));
        f.manifest_url_header = vec!["X-Token:s3cret".into()];
        f.http_check_frequency = Some("1s".into());
    })
    .await;
    let list = format!(
        "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {{name: h1}}\n  spec: {{terminationGracePeriodSeconds: 2, containers: [{{name: c, image: {BUSYBOX}, command: [sleep, '3600']}}]}}\n- metadata: {{name: h2}}\n  spec: {{terminationGracePeriodSeconds: 2, containers: [{{name: c, image: {BUSYBOX}, command: [sleep, '3600']}}]}}\n"
    );
    *body.write() = list;
    let t = Duration::from_secs(60);
    for name in ["h1", "h2"] {
        node.wait_status(name, t, "running", |s| is_running(s, "c"))
            .await?;
    }
    let src = node.handle().desired.get_pods().into_iter().find_map(|p| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/config.source").cloned())
    });
    assert_eq!(src.as_deref(), Some("http"));

    // Withdraw h2: it is stopped and removed; h1 keeps running.
    *body.write() = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: h1}}\nspec: {{terminationGracePeriodSeconds: 2, containers: [{{name: c, image: {BUSYBOX}, command: [sleep, '3600']}}]}}\n"
    );
    let deadline = tokio::time::Instant::now() + t;
    while node.uid_of("h2").is_some() || node.sandboxes().await.len() != 1 {
        assert!(tokio::time::Instant::now() < deadline, "h2 not removed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let h1 = node.status("h1").ctx("h1 status")?;
    assert!(is_running(&h1, "c"));
    assert_eq!(container(&h1, "c").map(|c| c.restart_count), Some(0));

    // A failing URL keeps what it served before.
    server.abort();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(node.uid_of("h1").is_some());
    node.cleanup().await;
    Ok(())
}

async fn get_healthz(addr: std::net::SocketAddr) -> anyhow::Result<(u16, String)> {
    get_healthz_path(addr, "/healthz").await
}

async fn get_healthz_path(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let code = out.split_whitespace().nth(1).unwrap_or("0").parse()?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((code, body))
}

fn free_port() -> u16 {
    kubelet_rs_integration::lane::free_port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_ok_with_containerd() -> anyhow::Result<()> {
    let port = free_port();
    let node = Node::start(|f| f.healthz_port = Some(i32::from(port))).await;
    let addr = node.handle().healthz_addr.ctx("healthz bound")?;
    let (code, body) = get_healthz(addr).await?;
    assert_eq!((code, body.trim()), (200, "ok"));
    node.cleanup().await;
    Ok(())
}

/// Issue 7, fix 4.4: a runtime outage makes the node NotReady (runtime state)
/// but does not fail `/healthz`, as upstream: a failing `/healthz` would make
/// watchdogs restart the kubelet during a containerd outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_runtime_starts_and_healthz_stays_ok() -> anyhow::Result<()> {
    use kubelet_node::RuntimeState as _;
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("no-runtime.sock");
    let flags = Flags {
        container_runtime_endpoint: Some(format!("unix://{}", sock.display())),
        healthz_port: Some(i32::from(free_port())),
        root_dir: Some(dir.path().join("root")),
        hostname_override: Some("no-runtime".into()),
        ..Flags::default()
    };
    let cfg = KubeletConfig::resolve(&flags, None, "x")?;
    let running = App::build(cfg).await?.spawn();
    let addr = running.handle.healthz_addr.ctx("healthz bound")?;
    // Upstream's runtimeErrors before the runtime ever answered ready.
    let errors = running.handle.runtime_state.runtime_errors();
    assert_eq!(
        errors,
        vec!["container runtime status check may not have completed yet".to_string()],
        "the node sees the outage"
    );
    for _ in 0..3 {
        let (code, body) = get_healthz(addr).await?;
        assert_eq!((code, body.as_str()), (200, "ok"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, body) = get_healthz_path(addr, "/healthz?verbose").await?;
    assert_eq!(code, 200);
    assert_eq!(
        body, "[+]ping ok\nhealthz check passed\n",
        "ping alone, as upstream serves the healthz port"
    );
    assert_eq!(
        get_healthz_path(addr, "/healthz/ping").await?,
        (200, "ok".to_string())
    );
    running.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
