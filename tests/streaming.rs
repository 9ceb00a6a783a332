//! The node API's streaming endpoints on real containerd: a standalone
//! kubelet runs a static pod with a busybox httpd and a sleeper, and the
//! test serves `kubelet_server::streaming::routes` over its host on a plain
//! local listener. Exec and port-forward go through the transparent proxy to
//! containerd's streaming server with the WebSocket `v4.channel.k8s.io`
//! protocol, where each message starts with its channel byte.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kubelet_rs_integration::{BUSYBOX, Node, is_running};
use kubelet_server::streaming::{StreamingHost, routes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const T: Duration = Duration::from_secs(90);
const IO: Duration = Duration::from_secs(20);

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo hello-pf > /tmp/index.html && exec httpd -f -p 8080 -h /tmp\"]\n  - name: sleeper\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n"
    )
}

async fn serve(node: &Node) -> SocketAddr {
    let host: Arc<dyn StreamingHost> = node.handle().host.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, routes(host)).await.unwrap();
    });
    addr
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

async fn connect(addr: SocketAddr, path: &str, protocol: &str) -> Ws {
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (ws, resp) = tokio::time::timeout(IO, tokio_tungstenite::client_async(req, tcp))
        .await
        .expect("handshake in time")
        .expect("websocket handshake");
    assert_eq!(resp.headers()["sec-websocket-protocol"], protocol);
    ws
}

/// Reads channel messages until the stream ends; returns what each channel
/// (0..=3) carried.
async fn drain(ws: &mut Ws) -> [Vec<u8>; 4] {
    let mut out: [Vec<u8>; 4] = Default::default();
    loop {
        let msg = tokio::time::timeout(IO, ws.next())
            .await
            .expect("stream ends in time");
        match msg {
            Some(Ok(Message::Binary(b))) if !b.is_empty() => {
                if let Some(ch) = out.get_mut(usize::from(b[0])) {
                    ch.extend_from_slice(&b[1..]);
                }
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return out,
            Some(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_port_forward_and_run_through_the_kubelet() {
    let node = Node::start(|_| {}).await;
    node.write_manifest("st.yaml", &manifest("st"));
    node.wait_status("st", T, "running", |s| {
        is_running(s, "web") && is_running(s, "sleeper")
    })
    .await
    .unwrap();
    let pod = node.pod_name("st");
    let uid = node.uid_of("st").unwrap();
    let addr = serve(&node).await;

    // (a) exec with stdin, stdout, stderr and the exit code (v4 error channel).
    let cmd = "command=sh&command=-c&command=head%20-c%205%3B%20echo%3B%20echo%20oops%20%3E%262%3B%20exit%203";
    let mut ws = connect(
        addr,
        &format!("/exec/default/{pod}/sleeper?{cmd}&input=1&output=1&error=1"),
        "v4.channel.k8s.io",
    )
    .await;
    ws.send(Message::Binary(bytes::Bytes::from_static(b"\x00hello")))
        .await
        .unwrap();
    let [_, stdout, stderr, status] = drain(&mut ws).await;
    assert_eq!(String::from_utf8_lossy(&stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&stderr), "oops\n");
    let status: serde_json::Value = serde_json::from_slice(&status).expect("status JSON");
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(
        status["details"]["causes"][0]["reason"], "ExitCode",
        "{status}"
    );
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");

    // A successful command reports Success; the path with the UID works too.
    let mut ws = connect(
        addr,
        &format!("/exec/default/{pod}/{uid}/sleeper?command=true&output=1"),
        "v4.channel.k8s.io",
    )
    .await;
    let [_, _, _, status] = drain(&mut ws).await;
    let status: serde_json::Value = serde_json::from_slice(&status).expect("status JSON");
    assert_eq!(status["status"], "Success", "{status}");

    // (b) port-forward to the httpd: each channel first carries the port.
    let mut ws = connect(
        addr,
        &format!("/portForward/default/{pod}?port=8080"),
        "v4.channel.k8s.io",
    )
    .await;
    ws.send(Message::Binary(bytes::Bytes::from_static(
        b"\x00GET /index.html HTTP/1.0\r\n\r\n",
    )))
    .await
    .unwrap();
    let [data, errors, ..] = drain(&mut ws).await;
    assert_eq!(&data[..2], &8080u16.to_le_bytes(), "port prefix");
    let page = String::from_utf8_lossy(&data[2..]);
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(page.contains("hello-pf"), "{page}");
    assert_eq!(&errors[..], &8080u16.to_le_bytes(), "no port-forward error");

    // (c) /run returns the command's output.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /run/default/{pod}/sleeper?cmd=echo%20hello%20run HTTP/1.1\r\nHost: k\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(IO, s.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nhello run\n"), "{resp}");

    // A container that does not run is reported as upstream does.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /run/default/{pod}/nope?cmd=true HTTP/1.1\r\nHost: k\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(IO, s.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 500"), "{resp}");
    assert!(resp.ends_with("container not found (\"nope\")"), "{resp}");

    node.cleanup().await;
}
