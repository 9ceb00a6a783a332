//! Which pod a streaming request reaches, the proxied headers, and the sessions' bounds (upstream `FindPod`, `AppendForwardedForHeader`).

use super::*;

#[tokio::test]
async fn a_uid_of_another_pod_is_not_found_and_a_mirror_uid_is_the_static_pods() {
    let host = FakeHost::new(Answer::Url("http://127.0.0.1:1/x".into()));
    let addr = serve(host.clone()).await;
    for (method, path) in [
        ("POST", "/exec/ns/p/u2/c?command=ls&output=1"),
        ("GET", "/attach/ns/p/u2/c?output=1"),
        ("POST", "/run/ns/p/u2/c?cmd=ls"),
    ] {
        let (head, body, _) = send(addr, method, path, SPDY).await;
        assert!(head.starts_with("HTTP/1.1 404"), "{path}: {head}");
        assert_eq!(body, "pod not found", "{path}");
    }
    assert!(host.calls.lock().is_empty(), "the host is not asked");

    // A mirror pod's UID names its static pod.
    let (head, _, _) = send(addr, "POST", "/run/ns/p/m1/c?cmd=ls", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        *host.calls.lock(),
        [Call::Run("m1".into(), "c".into(), vec!["ls".into()])]
    );
}

/// Serves the routes as the kubelet does ([`crate::serve::serve_plain`]).
async fn serve_kubelet(
    host: Arc<FakeHost>,
) -> (
    SocketAddr,
    tokio_util::sync::CancellationToken,
    tokio_util::task::TaskTracker,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let tracker = tokio_util::task::TaskTracker::new();
    tokio::spawn(crate::serve::serve_plain(
        listener,
        routes(host),
        stop.clone(),
        tracker.clone(),
    ));
    (addr, stop, tracker)
}

#[tokio::test]
async fn the_peer_is_appended_to_x_forwarded_for() {
    let (base, mut heads) = runtime().await;
    let host = FakeHost::new(Answer::Url(format!("{base}/up/tok")));
    let (addr, _stop, _tracker) = serve_kubelet(host).await;
    let headers = format!("{SPDY}X-Forwarded-For: 192.0.2.1\r\n");
    let (head, _, _) = send(addr, "POST", "/exec/ns/p/c?command=sh&output=1", &headers).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let seen = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(
        seen.contains("x-forwarded-for: 192.0.2.1, 127.0.0.1\r\n"),
        "{seen}"
    );
}

/// A runtime that takes one upgrade request and never answers; sends the
/// request head, then the connection.
async fn silent_runtime() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<(String, TcpStream)>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let head = read_head(&mut s).await;
            let _ = tx.send((head, s));
        }
    });
    (base, rx)
}

#[tokio::test]
async fn the_v5_translators_runtime_connection_is_a_session_of_the_server() {
    let (base, mut requests) = silent_runtime().await;
    let host = FakeHost::new(Answer::Url(format!("{base}/exec/tok")));
    let (addr, stop, tracker) = serve_kubelet(host).await;
    let mut req = format!("ws://{addr}/exec/ns/p/c?command=sh&output=1")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", V5_PROTOCOL.parse().unwrap());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (_ws, resp) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    assert_eq!(resp.headers()["sec-websocket-protocol"], V5_PROTOCOL);
    let (head, mut backend) = tokio::time::timeout(DEADLINE, requests.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        head.to_ascii_lowercase().contains("upgrade: spdy/3.1"),
        "{head}"
    );
    // The client's HTTP connection ended with its upgrade; what remains
    // are the WebSocket session and its runtime connection.
    assert_eq!(tracker.len(), 2, "session and runtime connection tracked");
    stop.cancel();
    tracker.close();
    tokio::time::timeout(DEADLINE, tracker.wait())
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(DEADLINE, backend.read(&mut buf))
        .await
        .unwrap();
    assert!(
        !matches!(read, Ok(n) if n > 0),
        "runtime connection closed: {read:?}"
    );
}

#[tokio::test]
async fn an_oversized_websocket_message_ends_the_tunnel() {
    let (base, _heads) = runtime().await;
    let host = FakeHost::new(Answer::Url(format!("{base}/up/pf")));
    let addr = serve(host).await;
    let mut req = format!("ws://{addr}/portForward/ns/p")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "SPDY/3.1+portforward.k8s.io".parse().unwrap(),
    );
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    // Within the bound, bytes cross.
    let fits = bytes::Bytes::from(vec![7u8; 64 * 1024]);
    ws.send(Message::Binary(fits.clone())).await.unwrap();
    let mut echoed = Vec::new();
    while echoed.len() < fits.len() {
        match tokio::time::timeout(DEADLINE, ws.next()).await.unwrap() {
            Some(Ok(Message::Binary(b))) => echoed.extend_from_slice(&b),
            other => panic!("echo expected: {other:?}"),
        }
    }
    assert_eq!(echoed, fits);
    // Beyond it, the session ends and nothing is relayed.
    let big = bytes::Bytes::from(vec![7u8; tunnel::MAX_WEBSOCKET_MESSAGE + 1]);
    let _ = ws.send(Message::Binary(big)).await;
    let end = tokio::time::timeout(DEADLINE, ws.next()).await.unwrap();
    assert!(
        !matches!(end, Some(Ok(Message::Binary(_)))),
        "oversized message not relayed: {:?}",
        end.map(|m| m.map(|m| m.len()))
    );
}
