//! `kubectl exec` through kubelet-rs into real containers, over the node
//! API's TLS port, in each protocol kubectl and the apiserver speak:
//! WebSocket `v4.channel.k8s.io` (proxied to containerd), WebSocket
//! `v5.channel.k8s.io` (translated to SPDY by the kubelet) and SPDY/3.1.

use std::time::Duration;

use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);

fn client(node: &Node, creds: Credentials) -> anyhow::Result<NodeApiClient> {
    let addr = node.handle().server_addr.ctx("server port")?;
    NodeApiClient::new(addr, &node.serving_ca(), &node.name, creds)
}

/// Runs one exec over WebSocket `protocol` through the kubelet and returns
/// (stdout, stderr, the error channel's Status JSON).
async fn ws_exec(
    c: &NodeApiClient,
    path: &str,
    protocol: &str,
    stdin: Option<&[u8]>,
) -> anyhow::Result<(String, String, serde_json::Value)> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let tls = c.connect().await?;
    let mut req = format!("wss://{}{path}", c.authority()).into_client_request()?;
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse()?);
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tls).await?;
    assert_eq!(
        resp.headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok()),
        Some(protocol)
    );
    if let Some(input) = stdin {
        let mut m = vec![0u8];
        m.extend_from_slice(input);
        ws.send(Message::binary(m)).await?;
        if protocol == "v5.channel.k8s.io" {
            // v5: CLOSE of stdin (channel 255, then the stream id).
            ws.send(Message::binary(vec![255u8, 0])).await?;
        }
    }
    let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), Vec::new());
    let read = async {
        while let Some(msg) = ws.next().await {
            let data = match msg? {
                Message::Binary(b) => b.to_vec(),
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&ch, rest)) = data.split_first() else {
                continue;
            };
            match ch {
                1 => out.extend_from_slice(rest),
                2 => err.extend_from_slice(rest),
                3 => status.extend_from_slice(rest),
                _ => {}
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    tokio::time::timeout(T, read)
        .await
        .map_err(|_| anyhow::anyhow!("exec did not end"))??;
    let status = serde_json::from_slice(&status).unwrap_or(serde_json::Value::Null);
    Ok((
        String::from_utf8_lossy(&out).to_string(),
        String::from_utf8_lossy(&err).to_string(),
        status,
    ))
}

/// The exit code in a remotecommand Status (`NonZeroExitCode`), 0 for Success.
fn exit_code(status: &serde_json::Value) -> Option<i64> {
    if status["status"] == "Success" {
        return Some(0);
    }
    status["details"]["causes"]
        .as_array()?
        .iter()
        .find(|c| c["reason"] == "ExitCode")?["message"]
        .as_str()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_websocket_v4_through_the_kubelet_into_a_real_container() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest("ex.yaml", &pod_yaml("ex", "Always", BUSYBOX, "sleep 3600"));
    node.wait_status("ex", T, "running", |s| is_running(s, "c"))
        .await?;
    let c = client(&node, Credentials::None)?;
    let pod = node.pod_name("ex");
    let path = format!(
        "/exec/default/{pod}/c?command=sh&command=-c&command=echo+out%3B+echo+err+%3E%262%3B+exit+3&output=1&error=1"
    );
    let (out, err, status) = ws_exec(&c, &path, "v4.channel.k8s.io", None).await?;
    assert_eq!(out, "out\n");
    assert_eq!(err, "err\n");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(exit_code(&status), Some(3), "{status}");
    node.cleanup().await;
    Ok(())
}

/// kubectl 1.30+: exec over WebSocket `v5.channel.k8s.io`, which containerd
/// 1.6 does not speak, translated by the kubelet to SPDY; stdin is closed
/// with v5's CLOSE, so `cat` ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_websocket_v5_with_stdin_close() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest("v5.yaml", &pod_yaml("v5", "Always", BUSYBOX, "sleep 3600"));
    node.wait_status("v5", T, "running", |s| is_running(s, "c"))
        .await?;
    let c = client(&node, Credentials::None)?;
    let pod = node.pod_name("v5");
    let path = format!(
        "/exec/default/{pod}/c?command=sh&command=-c&command=cat%3B+echo+err+%3E%262%3B+exit+3&input=1&output=1&error=1"
    );
    let (out, err, status) = ws_exec(&c, &path, "v5.channel.k8s.io", Some(b"hello v5\n")).await?;
    assert_eq!(out, "hello v5\n");
    assert_eq!(err, "err\n");
    assert_eq!(exit_code(&status), Some(3), "{status}");
    // Success is reported as such.
    let path = format!("/exec/default/{pod}/c?command=true&output=1");
    let (_, _, status) = ws_exec(&c, &path, "v5.channel.k8s.io", None).await?;
    assert_eq!(exit_code(&status), Some(0), "{status}");
    node.cleanup().await;
    Ok(())
}

/// kubectl up to 1.29 and the apiserver's proxy: exec over SPDY/3.1
/// (`v4.channel.k8s.io`) through the kubelet's TLS port, stdin half-closed
/// with a FIN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_spdy_through_the_kubelet() -> anyhow::Result<()> {
    use kubelet_server::streaming::spdy::{Codec, Frame};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = Node::start(|_| {}).await;
    node.write_manifest("sp.yaml", &pod_yaml("sp", "Always", BUSYBOX, "sleep 3600"));
    node.wait_status("sp", T, "running", |s| is_running(s, "c"))
        .await?;
    let c = client(&node, Credentials::None)?;
    let pod = node.pod_name("sp");
    let mut tls = c.connect().await?;
    let cmd = "command=sh&command=-c&command=cat%3B+echo+oops+%3E%262%3B+exit+5";
    let req = format!(
        "POST /exec/default/{pod}/c?{cmd}&input=1&output=1&error=1 HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n",
        c.authority()
    );
    tls.write_all(req.as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tokio::time::timeout(T, tls.read_u8()).await??);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    let mut codec = Codec::new();
    let mut out = Vec::new();
    for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
        out.extend(codec.syn_stream(id, &[("streamtype", kind)])?);
    }
    out.extend(Codec::data(3, false, b"over spdy\n")?);
    out.extend(Codec::data(3, true, b"")?);
    tls.write_all(&out).await?;
    let mut streams: [Vec<u8>; 8] = Default::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut done = false;
    while !done {
        let n = tokio::time::timeout(T, tls.read(&mut buf))
            .await?
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        codec.push(&buf[..n]);
        while let Some(f) = codec.next_frame() {
            if let Frame::Data { stream, fin, data } = f {
                streams[stream as usize].extend(data);
                done |= stream == 1 && fin;
            }
        }
    }
    assert_eq!(String::from_utf8_lossy(&streams[5]), "over spdy\n");
    assert_eq!(String::from_utf8_lossy(&streams[7]), "oops\n");
    let status: serde_json::Value = serde_json::from_slice(&streams[1])?;
    assert_eq!(exit_code(&status), Some(5), "{status}");
    node.cleanup().await;
    Ok(())
}
