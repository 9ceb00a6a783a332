//! Who can reach the node API of a kubelet started with flags alone (issue:
//! the README's first command opened a root shell to the network).
//! Upstream's legacy flag defaults allow anonymous requests with
//! `AlwaysAllow`; kubelet-rs then serves 10250 and the read-only port on
//! loopback only, unless the operator opens them on purpose, which keeps
//! upstream's behaviour. "Another address of the machine" is the host's
//! address on the pod bridge that `deploy/setup-runtime.sh` configures
//! (`kubeletrs0`), the only non-loopback address these tests may use; a pod
//! is started first so that the bridge exists.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::{Method, StatusCode};
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);
const BRIDGE: &str = "kubeletrs0";

/// The host's IPv4 address on the pod bridge.
fn bridge_address() -> anyhow::Result<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", BRIDGE])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ip = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .ctx("the pod bridge has no IPv4 address: is deploy/setup-runtime.sh's CNI network installed?")?;
    Ok(ip.parse()?)
}

/// Starts a kubelet with flags alone (the harness's `--address` dropped)
/// plus `extra`, and a running pod so that the bridge exists.
async fn start(extra: &[(&str, &str)]) -> anyhow::Result<(Node, IpAddr)> {
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let node = Node::start(move |f| {
        f.extra.remove("address");
        f.read_only_port = Some(free_port());
        for (k, v) in &extra {
            f.extra.push(k, v).expect("flag");
        }
    })
    .await;
    node.write_manifest(
        "exp.yaml",
        &pod_yaml("exp", "Always", BUSYBOX, "sleep 3600"),
    );
    node.wait_status("exp", T, "running", |s| is_running(s, "c"))
        .await?;
    let bridge = bridge_address()?;
    Ok((node, bridge))
}

fn anonymous(node: &Node, addr: SocketAddr) -> anyhow::Result<NodeApiClient> {
    NodeApiClient::new(addr, &node.serving_ca(), &node.name, Credentials::None)
}

/// `POST /run/default/<pod>/c?cmd=id` as an anonymous client.
async fn run_id(node: &Node, addr: SocketAddr) -> anyhow::Result<(StatusCode, String)> {
    let a = anonymous(node, addr)?
        .call(
            Method::POST,
            &format!("/run/default/{}/c?cmd=id", node.pod_name("exp")),
            bytes::Bytes::new(),
        )
        .await?;
    Ok((a.status, a.text()))
}

async fn refused(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_alone_serve_the_node_api_on_loopback_only() -> anyhow::Result<()> {
    let (node, bridge) = start(&[]).await?;
    let secure = node.handle().server_addr.ctx("server port")?;
    let read_only = node.handle().read_only_addr.ctx("read-only port")?;
    assert!(secure.ip().is_loopback(), "10250 bound on {secure}");
    assert!(
        read_only.ip().is_loopback(),
        "read-only port bound on {read_only}"
    );

    // Not reachable on another address of the machine.
    let from_pods = SocketAddr::new(bridge, secure.port());
    assert!(
        refused(from_pods).await,
        "{from_pods} accepted a connection"
    );
    let ro_from_pods = SocketAddr::new(bridge, read_only.port());
    assert!(
        refused(ro_from_pods).await,
        "{ro_from_pods} accepted a connection"
    );

    // Loopback keeps upstream's legacy behaviour for the local operator.
    let (status, out) = run_id(&node, secure).await?;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert!(out.contains("uid=0"), "{out}");
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_anonymous_auth_opens_it_as_upstream() -> anyhow::Result<()> {
    let (node, bridge) = start(&[("anonymous-auth", "true")]).await?;
    let secure = node.handle().server_addr.ctx("server port")?;
    assert!(
        secure.ip().is_unspecified(),
        "upstream's address 0.0.0.0, got {secure}"
    );
    // Reachable on the bridge address, and anonymous requests run commands,
    // exactly as upstream's kubelet with these flags.
    let (status, out) = run_id(&node, SocketAddr::new(bridge, secure.port())).await?;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert!(out.contains("uid=0"), "{out}");
    node.cleanup().await;
    Ok(())
}
