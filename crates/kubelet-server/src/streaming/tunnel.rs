//! WebSocket acceptance for the streams the kubelet serves itself, and the
//! port-forward WebSocket tunnel (upstream `apiserver/pkg/util/proxy`
//! `StreamTunnel` with client-go's `TunnelingConnection`): kubectl 1.31+
//! offers `SPDY/3.1+portforward.k8s.io`, and each binary WebSocket message
//! carries raw bytes of an SPDY/3.1 session, with no channel byte. The
//! runtime speaks SPDY port-forward but not the tunnel, so the kubelet opens
//! an SPDY upgrade to the runtime first, and only once that succeeded
//! accepts the WebSocket and relays the bytes opaquely.

use std::future::Future;

use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::header::{
    CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, UPGRADE,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt, split};
use tokio_tungstenite::WebSocketStream;

use crate::serve::Sessions;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tracing::debug;

use super::proxy::{open_upgrade, proxy_error, refused, switching};
use super::{StreamError, text_error};

/// The prefix of tunnelled SPDY protocols (upstream `WebsocketsSPDYTunnelingPrefix`).
pub const SPDY_TUNNEL_PREFIX: &str = "SPDY/3.1+";
/// The port-forward tunnel protocol (upstream `WebsocketsSPDYTunnelingPortForwardV1`).
pub const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
/// The SPDY port-forward protocol (upstream `portforward.PortForwardProtocolV1Name`).
pub const PORT_FORWARD_V1: &str = "portforward.k8s.io";
/// The header naming SPDY stream protocols (upstream `httpstream.HeaderProtocolVersion`).
pub const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// A WebSocket served over the client's upgraded connection.
pub type ServerWebSocket = WebSocketStream<TokioIo<Upgraded>>;

/// The largest WebSocket message, and frame, a client may send to the
/// streams the kubelet serves itself. kubectl's are at most 32 KiB (one
/// stdin read, or one SPDY frame of the tunnel); the bound keeps a client
/// from making the kubelet buffer tungstenite's 64 MiB default per session.
pub const MAX_WEBSOCKET_MESSAGE: usize = 4 << 20;

/// The WebSocket settings of the streams the kubelet serves itself.
pub fn websocket_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_WEBSOCKET_MESSAGE))
        .max_frame_size(Some(MAX_WEBSOCKET_MESSAGE))
}

/// Accepts the client's WebSocket with sub-protocol `protocol` and runs
/// `serve` on it once the connection is upgraded; returns the `101`.
pub fn accept_websocket<F, Fut>(parts: &mut Parts, protocol: &str, serve: F) -> Response
where
    F: FnOnce(ServerWebSocket) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), StreamError>> + Send + 'static,
{
    let Some(key) = parts.headers.get(SEC_WEBSOCKET_KEY) else {
        return text_error(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key\n");
    };
    let accept = derive_accept_key(key.as_bytes());
    let Some(on_upgrade) = parts.extensions.remove::<OnUpgrade>() else {
        return proxy_error(&StreamError::NoUpgrade);
    };
    let mut headers = HeaderMap::new();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        headers.insert(SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Ok(v) = HeaderValue::from_str(protocol) {
        headers.insert(SEC_WEBSOCKET_PROTOCOL, v);
    }
    Sessions::of(&parts.extensions).spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                debug!(error = %e, "websocket upgrade failed");
                return;
            }
        };
        let ws = WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            Some(websocket_config()),
        )
        .await;
        if let Err(e) = serve(ws).await {
            debug!(error = %e, "websocket stream ended with an error");
        }
    });
    switching(&headers)
}

/// Serves the port-forward tunnel: `offered` are the client's tunnel
/// protocols (`SPDY/3.1+...`), in its order.
pub async fn port_forward_tunnel(mut parts: Parts, url: Uri, offered: Vec<String>) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    for p in &offered {
        if let Some(inner) = p.strip_prefix(SPDY_TUNNEL_PREFIX)
            && let Ok(v) = HeaderValue::from_str(inner)
        {
            headers.append(STREAM_PROTOCOL_HEADER, v);
        }
    }
    let mut resp = match open_upgrade(
        parts.method.clone(),
        &url,
        headers,
        &Sessions::of(&parts.extensions),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return proxy_error(&e),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return refused(resp).await;
    }
    let negotiated = resp
        .headers()
        .get(STREAM_PROTOCOL_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(PORT_FORWARD_V1)
        .to_string();
    let backend = hyper::upgrade::on(&mut resp);
    let protocol = format!("{SPDY_TUNNEL_PREFIX}{negotiated}");
    accept_websocket(&mut parts, &protocol, move |ws| async move {
        let backend = backend.await.map_err(StreamError::Upgrade)?;
        relay(ws, backend).await
    })
}

/// Relays binary WebSocket messages to the runtime connection as raw bytes
/// and back; ends when either side closes.
pub async fn relay(ws: ServerWebSocket, backend: Upgraded) -> Result<(), StreamError> {
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut rt_rx, mut rt_tx) = split(TokioIo::new(backend));
    let up = async {
        while let Some(msg) = ws_rx.next().await {
            match msg.map_err(StreamError::WebSocket)? {
                Message::Binary(b) => rt_tx.write_all(&b).await.map_err(StreamError::Io)?,
                Message::Close(_) => break,
                Message::Text(_) => return Err(StreamError::MessageType),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
        Ok(())
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = rt_rx.read(&mut buf).await.map_err(StreamError::Io)?;
            if n == 0 {
                break;
            }
            ws_tx
                .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                .await
                .map_err(StreamError::WebSocket)?;
        }
        let close = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        // The peer may be gone already.
        let _ = ws_tx.send(Message::Close(Some(close))).await;
        Ok(())
    };
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}
