//! The node API's streaming endpoints on real containerd: a standalone
//! kubelet runs a static pod with a busybox httpd and a sleeper, and the
//! test serves `kubelet_server::streaming::routes` over its host on a plain
//! local listener. Exec and port-forward go through the transparent proxy to
//! containerd's streaming server with the WebSocket `v4.channel.k8s.io`
//! protocol, where each message starts with its channel byte, and with
//! SPDY/3.1 (a minimal client below, written from the SPDY/3 draft); the
//! port-forward WebSocket tunnel carries the same SPDY bytes in binary
//! messages.

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
    node.write_manifest("other.yaml", &manifest("other"));
    for name in ["st", "other"] {
        node.wait_status(name, T, "running", |s| {
            is_running(s, "web") && is_running(s, "sleeper")
        })
        .await
        .unwrap();
    }
    let pod = node.pod_name("st");
    let uid = node.uid_of("st").unwrap();
    let other_uid = node.uid_of("other").unwrap();
    let addr = serve(&node).await;

    // A UID in the path must be the named pod's: another pod's is refused
    // (upstream finds the pod by its full name), for exec and /run alike.
    let mut req =
        format!("ws://{addr}/exec/default/{pod}/{other_uid}/sleeper?command=true&output=1")
            .into_client_request()
            .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    let tcp = TcpStream::connect(addr).await.unwrap();
    match tokio::time::timeout(IO, tokio_tungstenite::client_async(req, tcp))
        .await
        .expect("answer in time")
    {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 404);
        }
        other => panic!(
            "exec into another pod by UID: {:?}",
            other.map(|(_, r)| r.status())
        ),
    }
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /run/default/{pod}/{other_uid}/sleeper?cmd=true HTTP/1.1\r\nHost: k\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(IO, s.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    assert!(resp.ends_with("pod not found"), "{resp}");

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

    // (d) exec over SPDY/3.1 through the transparent proxy, closing stdin.
    spdy_exec(addr, &pod).await;
    // (e) port-forward over the WebSocket tunnel kubectl 1.31+ uses.
    tunnel_port_forward(addr, &pod).await;

    node.cleanup().await;
}

/// A minimal SPDY/3 client side: SYN_STREAM and DATA frames out, frames in.
/// Header blocks are zlib-compressed without the preset dictionary (allowed:
/// the dictionary only enables back-references), one stream per session.
struct Spdy {
    deflate: flate2::Compress,
    inbuf: Vec<u8>,
}

#[derive(Debug)]
enum Frame {
    Control {
        kind: u16,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
}

impl Spdy {
    fn new() -> Self {
        Spdy {
            deflate: flate2::Compress::new(flate2::Compression::default(), true),
            inbuf: Vec::new(),
        }
    }

    fn syn_stream(&mut self, stream: u32, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut block = Vec::new();
        block.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (k, v) in headers {
            for s in [k, v] {
                block.extend_from_slice(&(s.len() as u32).to_be_bytes());
                block.extend_from_slice(s.as_bytes());
            }
        }
        let mut z = Vec::with_capacity(block.len() + 64);
        self.deflate
            .compress_vec(&block, &mut z, flate2::FlushCompress::Sync)
            .unwrap();
        let mut f = vec![0x80, 0x03, 0x00, 0x01, 0x00];
        f.extend_from_slice(&((10 + z.len()) as u32).to_be_bytes()[1..]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(&0u32.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&z);
        f
    }

    fn data(stream: u32, fin: bool, data: &[u8]) -> Vec<u8> {
        let mut f = stream.to_be_bytes().to_vec();
        f.push(u8::from(fin));
        f.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        f.extend_from_slice(data);
        f
    }

    fn push(&mut self, bytes: &[u8]) {
        self.inbuf.extend_from_slice(bytes);
    }

    fn next(&mut self) -> Option<Frame> {
        if self.inbuf.len() < 8 {
            return None;
        }
        let len = u32::from_be_bytes([0, self.inbuf[5], self.inbuf[6], self.inbuf[7]]) as usize;
        if self.inbuf.len() < 8 + len {
            return None;
        }
        let frame: Vec<u8> = self.inbuf.drain(..8 + len).collect();
        Some(if frame[0] & 0x80 != 0 {
            Frame::Control {
                kind: u16::from_be_bytes([frame[2], frame[3]]),
            }
        } else {
            Frame::Data {
                stream: u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) & 0x7fff_ffff,
                fin: frame[4] & 1 != 0,
                data: frame[8..].to_vec(),
            }
        })
    }
}

async fn spdy_exec(addr: SocketAddr, pod: &str) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let cmd = "command=sh&command=-c&command=cat%3B%20echo%20oops%20%3E%262%3B%20exit%205";
    let req = format!(
        "POST /exec/default/{pod}/sleeper?{cmd}&input=1&output=1&error=1 HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(
            tokio::time::timeout(IO, s.read_u8())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );

    let mut spdy = Spdy::new();
    let mut out = Vec::new();
    for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
        out.extend(spdy.syn_stream(id, &[("streamtype", kind)]));
    }
    out.extend(Spdy::data(3, true, b"hello"));
    s.write_all(&out).await.unwrap();

    // The runtime closes the connection once the command ended.
    let mut streams: [Vec<u8>; 9] = Default::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::time::timeout(IO, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        spdy.push(&buf[..n]);
        while let Some(f) = spdy.next() {
            if let Frame::Data { stream, data, .. } = f {
                streams[stream as usize].extend(data);
            }
        }
    }
    assert_eq!(String::from_utf8_lossy(&streams[5]), "hello");
    assert_eq!(String::from_utf8_lossy(&streams[7]), "oops\n");
    let status: serde_json::Value = serde_json::from_slice(&streams[1]).expect("status JSON");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "5", "{status}");
}

async fn tunnel_port_forward(addr: SocketAddr, pod: &str) {
    let mut ws = connect(
        addr,
        &format!("/portForward/default/{pod}"),
        "SPDY/3.1+portforward.k8s.io",
    )
    .await;
    let mut spdy = Spdy::new();
    let mut out = Vec::new();
    for (id, kind) in [(1, "error"), (3, "data")] {
        out.extend(spdy.syn_stream(
            id,
            &[("streamtype", kind), ("port", "8080"), ("requestid", "0")],
        ));
    }
    out.extend(Spdy::data(3, false, b"GET /index.html HTTP/1.0\r\n\r\n"));
    ws.send(Message::Binary(out.into())).await.unwrap();

    let mut page = Vec::new();
    let mut replies = 0;
    'read: loop {
        let msg = tokio::time::timeout(IO, ws.next())
            .await
            .expect("tunnel data in time");
        let Some(Ok(Message::Binary(b))) = msg else {
            panic!(
                "tunnel ended early: {msg:?}; so far {:?}",
                String::from_utf8_lossy(&page)
            );
        };
        spdy.push(&b);
        while let Some(f) = spdy.next() {
            match f {
                Frame::Control { kind: 2 } => replies += 1,
                Frame::Data {
                    stream: 3,
                    fin,
                    data,
                } => {
                    page.extend(data);
                    if fin {
                        break 'read;
                    }
                }
                Frame::Data {
                    stream: 1, data, ..
                } if !data.is_empty() => {
                    panic!("port-forward error: {}", String::from_utf8_lossy(&data));
                }
                _ => {}
            }
        }
    }
    assert_eq!(replies, 2, "SYN_REPLY for both streams");
    let page = String::from_utf8_lossy(&page);
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(page.contains("hello-pf"), "{page}");
    ws.close(None).await.unwrap();
}
