//! The node API (10250) and the read-only port of a kubelet under test, on
//! real containerd, called over the network as the apiserver, kubectl and
//! metrics-server call them.

use std::time::Duration;

use http::{Method, StatusCode};
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);

/// A plain-HTTP GET on the read-only port.
async fn plain_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(StatusCode, String)> {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = tokio::time::timeout(T, send.send_request(req)).await??;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_only_port_serves_only_what_needs_no_authorization() -> anyhow::Result<()> {
    let node = Node::start(|f| f.read_only_port = Some(free_port())).await;
    node.write_manifest("ro.yaml", &pod_yaml("ro", "Always", BUSYBOX, "sleep 3600"));
    node.wait_status("ro", T, "running", |s| is_running(s, "c"))
        .await?;
    let addr = node.handle().read_only_addr.ctx("read-only port")?;

    let (s, body) = plain_get(addr, "/pods").await?;
    assert_eq!(s, StatusCode::OK, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(list["kind"], "PodList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .ctx("items")?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&node.pod_name("ro").as_str()), "{names:?}");

    let (s, body) = plain_get(addr, "/healthz").await?;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "ok"));

    // The debugging handlers are not there: upstream's 405 on each.
    let uid = node.uid_of("ro").ctx("uid")?;
    for path in [
        format!("/containerLogs/default/{}/c", node.pod_name("ro")),
        format!(
            "/exec/default/{}/c?command=ls&output=1",
            node.pod_name("ro")
        ),
        format!("/attach/default/{}/{uid}/c?output=1", node.pod_name("ro")),
        format!("/portForward/default/{}", node.pod_name("ro")),
        format!("/run/default/{}/c", node.pod_name("ro")),
        "/runningpods/".to_string(),
    ] {
        let (s, body) = plain_get(addr, &path).await?;
        assert_eq!(
            (s, body.as_str()),
            (
                StatusCode::METHOD_NOT_ALLOWED,
                "Debug endpoints are disabled.\n"
            ),
            "{path}"
        );
    }
    // Nor is what upstream installs only with the debugging handlers.
    for path in ["/configz", "/debug/flags/v"] {
        let (s, _) = plain_get(addr, path).await?;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    node.cleanup().await;
    Ok(())
}

fn client(node: &Node, creds: Credentials) -> anyhow::Result<NodeApiClient> {
    let addr = node.handle().server_addr.ctx("server port")?;
    NodeApiClient::new(addr, &node.serving_ca(), &node.name, creds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secure_port_serves_pods_running_pods_configz_and_healthz_over_tls()
-> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "api.yaml",
        &pod_yaml("api", "Always", BUSYBOX, "sleep 3600"),
    );
    node.wait_status("api", T, "running", |s| is_running(s, "c"))
        .await?;
    // Flags alone: upstream's legacy defaults allow anonymous requests.
    let c = client(&node, Credentials::None)?;

    let a = c.get("/healthz").await?;
    assert_eq!((a.status, a.text().as_str()), (StatusCode::OK, "ok"));
    let a = c.get("/healthz?verbose").await?;
    for check in ["[+]ping ok", "[+]log ok", "[+]syncloop ok"] {
        assert!(a.text().contains(check), "{}", a.text());
    }

    let pods = c.get("/pods").await?.json()?;
    let pod = pods["items"]
        .as_array()
        .ctx("items")?
        .iter()
        .find(|p| p["metadata"]["name"] == node.pod_name("api").as_str())
        .ctx("our pod in /pods")?
        .clone();
    assert_eq!(
        pod["status"]["phase"], "Running",
        "/pods carries the status"
    );

    let running = c.get("/runningpods/").await?.json()?;
    let uid = node.uid_of("api").ctx("uid")?;
    let rp = running["items"]
        .as_array()
        .ctx("items")?
        .iter()
        .find(|p| p["metadata"]["uid"] == uid.as_str())
        .ctx("our pod in /runningpods/")?
        .clone();
    assert_eq!(rp["spec"]["containers"][0]["name"], "c");
    // The image as the runtime reports it (upstream `toKubeContainer`:
    // `Image.Image`, which containerd answers with the resolved image ID).
    let image = rp["spec"]["containers"][0]["image"].as_str().ctx("image")?;
    assert!(image == BUSYBOX || image.starts_with("sha256:"), "{image}");

    let cz = c.get("/configz").await?.json()?;
    assert_eq!(cz["kubeletconfig"]["kind"], "KubeletConfiguration");
    assert_eq!(cz["kubeletconfig"]["authorization"]["mode"], "AlwaysAllow");

    // h2 is negotiated and serves the same.
    let a = c.http2()?.get("/healthz").await?;
    assert_eq!(a.status, StatusCode::OK);

    // /debug/flags/v: PUT only.
    let a = c
        .call(Method::GET, "/debug/flags/v", bytes::Bytes::new())
        .await?;
    assert_eq!(a.status, StatusCode::NOT_ACCEPTABLE);
    node.cleanup().await;
    Ok(())
}
