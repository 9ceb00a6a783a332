//! The streaming routes against a fake host and a fake runtime streaming
//! server (raw TCP, so what crosses the proxy is seen byte for byte).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::*;

const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Exec(String, String, Vec<String>, StreamOptions),
    Attach(String, String, StreamOptions),
    PortForward(String, Vec<i32>),
    Run(String, String, Vec<String>),
}

enum Answer {
    Url(String),
    NotFound,
    Exhausted,
    NoContainer,
}

struct FakeHost {
    answer: Mutex<Answer>,
    calls: Mutex<Vec<Call>>,
}

impl FakeHost {
    fn new(answer: Answer) -> Arc<Self> {
        Arc::new(Self {
            answer: Mutex::new(answer),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn answer(&self, call: Call) -> Result<String, HostError> {
        self.calls.lock().push(call);
        match &*self.answer.lock() {
            Answer::Url(u) => Ok(u.clone()),
            Answer::NotFound => Err(HostError::Runtime(cri::CriError::NotFound {
                op: "Exec",
                message: "gone".into(),
            })),
            Answer::Exhausted => Err(HostError::Runtime(cri::CriError::Rpc {
                op: "Exec",
                code: cri::Code::ResourceExhausted,
                message: "too many".into(),
            })),
            Answer::NoContainer => Err(HostError::ContainerNotFound("c".into())),
        }
    }
}

#[async_trait::async_trait]
impl StreamingHost for FakeHost {
    fn get_pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        (namespace == "ns" && name == "p").then(|| {
            Arc::new(Pod {
                metadata: ObjectMeta {
                    name: Some("p".into()),
                    namespace: Some("ns".into()),
                    uid: Some("u1".into()),
                    ..Default::default()
                },
                ..Default::default()
            })
        })
    }
    fn translate_pod_uid(&self, uid: &str) -> String {
        // "m1" is the UID of the pod's mirror pod.
        if uid == "m1" { "u1".into() } else { uid.into() }
    }
    async fn get_exec(
        &self,
        _pod: &Pod,
        pod_uid: &str,
        container: &str,
        cmd: Vec<String>,
        opts: StreamOptions,
    ) -> Result<String, HostError> {
        self.answer(Call::Exec(pod_uid.into(), container.into(), cmd, opts))
    }
    async fn get_attach(
        &self,
        _pod: &Pod,
        pod_uid: &str,
        container: &str,
        opts: StreamOptions,
    ) -> Result<String, HostError> {
        self.answer(Call::Attach(pod_uid.into(), container.into(), opts))
    }
    async fn get_port_forward(&self, pod: &Pod, ports: Vec<i32>) -> Result<String, HostError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.answer(Call::PortForward(uid, ports))
    }
    async fn run_in_container(
        &self,
        _pod: &Pod,
        pod_uid: &str,
        container: &str,
        cmd: Vec<String>,
    ) -> Result<Vec<u8>, HostError> {
        self.calls
            .lock()
            .push(Call::Run(pod_uid.into(), container.into(), cmd.clone()));
        if cmd.first().map(String::as_str) == Some("false") {
            return Err(HostError::ExitCode {
                cmd: cmd.join(" "),
                code: 1,
                stderr: "oops".into(),
            });
        }
        Ok(cmd.join("+").into_bytes())
    }
}

async fn serve(host: Arc<FakeHost>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, routes(host)).await.unwrap();
    });
    addr
}

/// Reads an HTTP head (through the blank line) byte by byte.
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let b = tokio::time::timeout(DEADLINE, s.read_u8())
            .await
            .expect("head in time")
            .expect("head");
        head.push(b);
    }
    String::from_utf8(head).unwrap()
}

async fn read_body(s: &mut TcpStream, head: &str) -> String {
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_string)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut body))
        .await
        .expect("body in time")
        .expect("body");
    String::from_utf8(body).unwrap()
}

/// Sends a request to `addr`; returns the response head, its body (unless
/// it is a 101) and the connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
) -> (String, String, TcpStream) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: kubelet\r\n{headers}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut s).await;
    let body = if head.starts_with("HTTP/1.1 101") {
        String::new()
    } else {
        read_body(&mut s, &head).await
    };
    (head, body, s)
}

const SPDY: &str = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: channel.k8s.io\r\nAuthorization: Bearer secret\r\n";

/// A fake runtime streaming server: `/up` upgrades (echoing the first
/// `X-Stream-Protocol-Version`) and then echoes bytes, `/refuse` answers
/// 403, `/plain` 200. Each request head is sent on `heads`.
async fn runtime() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let head = read_head(&mut s).await;
                let _ = tx.send(head.clone());
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                if path.starts_with("/refuse") {
                    let _ = s
                        .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\nno v5!")
                        .await;
                    return;
                }
                if path.starts_with("/plain") {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let proto = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("x-stream-protocol-version: ")
                            .map(str::to_string)
                    })
                    .unwrap_or_default();
                let resp = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {proto}\r\n\r\n"
                );
                s.write_all(resp.as_bytes()).await.unwrap();
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (base, rx)
}

#[tokio::test]
async fn exec_validates_options_and_maps_host_errors() {
    let host = FakeHost::new(Answer::NoContainer);
    let addr = serve(host.clone()).await;

    let (head, body, _) = send(addr, "GET", "/exec/ns/p/c?command=ls", "").await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert_eq!(body, "you must specify at least 1 of stdin, stdout, stderr");
    assert!(host.calls.lock().is_empty(), "validation comes first");

    let (head, body, _) = send(addr, "POST", "/exec/ns/nope/c?output=1", "").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert_eq!(body, "pod does not exist");

    let (head, body, _) = send(addr, "POST", "/exec/ns/p/c?output=1", "").await;
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert_eq!(body, "container not found (\"c\")");

    *host.answer.lock() = Answer::NotFound;
    let (head, _, _) = send(addr, "GET", "/attach/ns/p/c?output=1", "").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");

    *host.answer.lock() = Answer::Exhausted;
    let (head, _, _) = send(addr, "GET", "/attach/ns/p/c?output=1", "").await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 60"),
        "{head}"
    );

    // A plain request reaches the host (as upstream) and is then refused.
    *host.answer.lock() = Answer::Url("http://127.0.0.1:1/x".into());
    host.calls.lock().clear();
    let (head, body, _) = send(
        addr,
        "POST",
        "/exec/ns/p/u1/c?command=sh&command=-c&command=echo%20hi&input=1&tty=1&error=1",
        "",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert_eq!(body, "Upgrade request required\n");
    let opts = StreamOptions {
        stdin: true,
        tty: true,
        ..Default::default()
    };
    assert_eq!(
        *host.calls.lock(),
        [Call::Exec(
            "u1".into(),
            "c".into(),
            vec!["sh".into(), "-c".into(), "echo hi".into()],
            opts
        )]
    );
}

#[tokio::test]
async fn port_forward_checks_ports_and_uid() {
    let host = FakeHost::new(Answer::Url("http://127.0.0.1:1/pf".into()));
    let addr = serve(host.clone()).await;
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n";

    let (head, body, _) = send(addr, "GET", "/portForward/ns/p", ws).await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert_eq!(body, "query parameter \"port\" is required");

    let (head, body, _) = send(addr, "GET", "/portForward/ns/p/other?port=80", ws).await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert_eq!(body, "pod not found");

    // Nothing listens on port 1: the dial fails after the host was asked.
    let (head, body, _) = send(addr, "GET", "/portForward/ns/p/u1?port=80,8080", ws).await;
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert!(body.starts_with("error dialing backend"), "{body}");
    // SPDY names no ports in the query.
    let (head, _, _) = send(addr, "POST", "/portForward/ns/p", SPDY).await;
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert_eq!(
        *host.calls.lock(),
        [
            Call::PortForward("u1".into(), vec![80, 8080]),
            Call::PortForward("u1".into(), vec![])
        ]
    );
}

#[tokio::test]
async fn run_splits_cmd_and_returns_output() {
    let host = FakeHost::new(Answer::NoContainer);
    let addr = serve(host.clone()).await;
    let (head, body, _) = send(addr, "POST", "/run/ns/p/c?cmd=echo%20a%20b", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(body, "echo+a+b");
    let (head, body, _) = send(addr, "POST", "/run/ns/p/u1/c?cmd=false", "").await;
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert_eq!(body, "command 'false' exited with 1: oops");
    let (head, _, _) = send(addr, "GET", "/run/ns/p/c?cmd=ls", "").await;
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    assert_eq!(
        *host.calls.lock(),
        [
            Call::Run(
                "".into(),
                "c".into(),
                vec!["echo".into(), "a".into(), "b".into()]
            ),
            Call::Run("u1".into(), "c".into(), vec!["false".into()])
        ]
    );
}

#[tokio::test]
async fn spdy_upgrade_is_proxied_transparently() {
    let (base, mut heads) = runtime().await;
    let host = FakeHost::new(Answer::Url(format!("{base}/up/tok")));
    let addr = serve(host).await;
    let (head, _, mut conn) = send(
        addr,
        "POST",
        "/exec/ns/p/c?command=sh&input=1&output=1",
        SPDY,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    let seen = heads.recv().await.unwrap();
    assert!(seen.starts_with("POST /up/tok HTTP/1.1"), "{seen}");
    let lower = seen.to_ascii_lowercase();
    assert!(lower.contains("upgrade: spdy/3.1"), "{seen}");
    assert!(
        lower.contains("x-stream-protocol-version: channel.k8s.io"),
        "{seen}"
    );
    assert!(
        !lower.contains("authorization"),
        "credentials stay here: {seen}"
    );
    // Bytes cross both ways.
    conn.write_all(b"\x80\x03\x00\x01frame").await.unwrap();
    let mut back = [0u8; 9];
    tokio::time::timeout(DEADLINE, conn.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"\x80\x03\x00\x01frame");
}

#[tokio::test]
async fn runtime_refusals_are_relayed() {
    let (base, _heads) = runtime().await;
    let host = FakeHost::new(Answer::Url(format!("{base}/refuse")));
    let addr = serve(host.clone()).await;
    // A protocol nobody here serves: the runtime decides.
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v9.channel.k8s.io\r\n";
    let (head, body, _) = send(addr, "GET", "/exec/ns/p/c?command=ls&output=1", ws).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert_eq!(body, "no v5!");

    *host.answer.lock() = Answer::Url(format!("{base}/plain"));
    let (head, body, _) = send(addr, "GET", "/attach/ns/p/c?output=1", SPDY).await;
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert_eq!(body, "invalid upgrade response: status code 200\n");
}

#[tokio::test]
async fn port_forward_websocket_tunnel_relays_spdy_bytes() {
    let (base, mut heads) = runtime().await;
    let host = FakeHost::new(Answer::Url(format!("{base}/up/pf")));
    let addr = serve(host.clone()).await;
    let mut req = format!("ws://{addr}/portForward/ns/p")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "SPDY/3.1+portforward.k8s.io".parse().unwrap(),
    );
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "SPDY/3.1+portforward.k8s.io"
    );
    let seen = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(seen.contains("upgrade: spdy/3.1"), "{seen}");
    assert!(
        seen.contains("x-stream-protocol-version: portforward.k8s.io"),
        "{seen}"
    );
    assert!(!seen.contains("websocket"), "{seen}");
    // The tunnel needs no port parameter.
    assert_eq!(*host.calls.lock(), [Call::PortForward("u1".into(), vec![])]);

    ws.send(Message::Binary(bytes::Bytes::from_static(b"\x80\x03syn")))
        .await
        .unwrap();
    let echoed = tokio::time::timeout(DEADLINE, ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        echoed,
        Message::Binary(bytes::Bytes::from_static(b"\x80\x03syn"))
    );
    // A text message ends the tunnel.
    ws.send(Message::Text("no".into())).await.unwrap();
    let end = tokio::time::timeout(DEADLINE, ws.next()).await.unwrap();
    assert!(
        !matches!(end, Some(Ok(Message::Binary(_)))),
        "tunnel closed: {end:?}"
    );
}

#[test]
fn the_clients_protocol_order_picks_the_server() {
    let offer = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Untranslated, v5 is left to the runtime, which refuses it.
    let v5 = V5_TRANSLATION.then_some(Choice::V5);
    assert_eq!(
        chosen_remote_command(&offer(&[V5_PROTOCOL, "v4.channel.k8s.io"])),
        v5.or(Some(Choice::Runtime))
    );
    assert_eq!(chosen_remote_command(&offer(&[V5_PROTOCOL])), v5);
    assert_eq!(
        chosen_remote_command(&offer(&["base64.channel.k8s.io"])),
        Some(Choice::Runtime)
    );
    assert_eq!(
        chosen_port_forward(&offer(&[tunnel::PORT_FORWARD_TUNNEL, "v4.channel.k8s.io"])),
        Some(Choice::Tunnel)
    );
    assert_eq!(
        chosen_port_forward(&offer(&["v4.channel.k8s.io", tunnel::PORT_FORWARD_TUNNEL])),
        Some(Choice::Runtime)
    );
    assert_eq!(chosen_port_forward(&offer(&["channel.k8s.io"])), None);
}

mod isolation;
