//! WebSocket `v5.channel.k8s.io` to SPDY (upstream's
//! `translator.NewStreamTranslatorHandler`, which the kubelet installs for
//! exec and attach with `ExtendWebSocketsToKubelet`): the client's v5
//! WebSocket is served here, and the runtime, which speaks SPDY, is asked
//! over SPDY/3.1 with `v4.channel.k8s.io`.
//!
//! Channel bytes as `remotecommand`: 0 stdin, 1 stdout, 2 stderr, 3 error,
//! 4 resize; v5 adds CLOSE (255, then the channel), which half-closes the
//! runtime's stdin stream, so `cat` sees EOF.

use futures::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::spdy::{Codec, Frame, kind};
use super::{ServerWebSocket, StreamError, StreamOptions};
use crate::serve::Sessions;

/// The SPDY sub-protocol asked of the runtime.
const RUNTIME_PROTOCOL: &str = "v4.channel.k8s.io";

/// Channel bytes.
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// SPDY stream IDs the client side opens, in upstream's order.
const ERROR_STREAM: u32 = 1;
const STDIN_STREAM: u32 = 3;
const STDOUT_STREAM: u32 = 5;
const STDERR_STREAM: u32 = 7;
const RESIZE_STREAM: u32 = 9;

fn io(e: std::io::Error) -> StreamError {
    StreamError::Io(e)
}

/// Serves `ws` (already accepted with `v5.channel.k8s.io`) against the
/// runtime's streaming URL until the command ends or either side goes away;
/// the runtime connection runs among `sessions`, so it ends with the server.
pub async fn serve(
    mut ws: ServerWebSocket,
    runtime_url: Uri,
    opts: StreamOptions,
    sessions: &Sessions,
) -> Result<(), StreamError> {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    headers.insert(http::header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    headers.insert(
        super::tunnel::STREAM_PROTOCOL_HEADER,
        HeaderValue::from_static(RUNTIME_PROTOCOL),
    );
    let mut resp =
        match super::proxy::open_upgrade(Method::POST, &runtime_url, headers, sessions).await {
            Ok(r) => r,
            Err(e) => {
                let _ = send_failure(&mut ws, &e.to_string()).await;
                return Err(e);
            }
        };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let e = StreamError::UpgradeStatus(resp.status().as_u16());
        let _ = send_failure(&mut ws, &e.to_string()).await;
        return Err(e);
    }
    let upgraded = hyper::upgrade::on(&mut resp)
        .await
        .map_err(StreamError::Upgrade)?;
    let (mut rd, mut wr) = tokio::io::split(TokioIo::new(upgraded));

    let mut codec = Codec::new();
    let mut open = vec![(ERROR_STREAM, "error")];
    if opts.stdin {
        open.push((STDIN_STREAM, "stdin"));
    }
    if opts.stdout {
        open.push((STDOUT_STREAM, "stdout"));
    }
    if opts.stderr && !opts.tty {
        open.push((STDERR_STREAM, "stderr"));
    }
    if opts.tty {
        open.push((RESIZE_STREAM, "resize"));
    }
    let mut hello = Vec::new();
    for (id, t) in open {
        hello.extend(codec.syn_stream(id, &[("streamtype", t)]).map_err(io)?);
    }
    wr.write_all(&hello).await.map_err(io)?;

    let mut buf = vec![0u8; 32 * 1024];
    let mut error_done = false;
    loop {
        tokio::select! {
            msg = ws.next() => {
                let data = match msg {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Close(_))) | None => return Ok(()),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(StreamError::WebSocket(e)),
                };
                let Some(frame) = client_message_to_runtime(&data, &opts) else { continue };
                wr.write_all(&frame.map_err(io)?).await.map_err(io)?;
            }
            n = rd.read(&mut buf) => {
                let n = n.map_err(io)?;
                if n == 0 {
                    return close(&mut ws).await;
                }
                codec.push(&buf[..n]);
                while let Some(f) = codec.next_frame() {
                    match f {
                        Frame::Data { stream, fin, data } => {
                            let ch = match stream {
                                STDOUT_STREAM => STDOUT,
                                STDERR_STREAM => STDERR,
                                ERROR_STREAM => ERROR,
                                _ => continue,
                            };
                            if !data.is_empty() {
                                let mut m = Vec::with_capacity(data.len() + 1);
                                m.push(ch);
                                m.extend_from_slice(&data);
                                ws.send(Message::binary(m)).await.map_err(StreamError::WebSocket)?;
                            }
                            if stream == ERROR_STREAM && fin {
                                error_done = true;
                            }
                        }
                        Frame::Control { kind: kind::PING, payload, .. } => {
                            wr.write_all(&Codec::ping_reply(&payload).map_err(io)?)
                                .await
                                .map_err(io)?;
                        }
                        Frame::Control { kind: kind::GOAWAY, .. } => return close(&mut ws).await,
                        Frame::Control { .. } => {}
                    }
                }
                if error_done {
                    // The runtime reported the result: the session is over.
                    return close(&mut ws).await;
                }
            }
        }
    }
}

/// The SPDY frame a client's binary v5 message becomes (channel byte first:
/// stdin data, a resize, or CLOSE of stdin), or `None` for a message the
/// session ignores (empty, an unknown or unopened channel).
#[doc(hidden)]
pub fn client_message_to_runtime(
    data: &[u8],
    opts: &StreamOptions,
) -> Option<std::io::Result<Vec<u8>>> {
    let (&ch, rest) = data.split_first()?;
    match ch {
        STDIN if opts.stdin => Some(Codec::data(STDIN_STREAM, false, rest)),
        RESIZE if opts.tty => Some(Codec::data(RESIZE_STREAM, false, rest)),
        CLOSE if rest.first() == Some(&STDIN) && opts.stdin => {
            Some(Codec::data(STDIN_STREAM, true, &[]))
        }
        _ => None,
    }
}

async fn close(ws: &mut ServerWebSocket) -> Result<(), StreamError> {
    let frame = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    match ws.send(Message::Close(Some(frame))).await {
        Ok(()) | Err(tokio_tungstenite::tungstenite::Error::ConnectionClosed) => Ok(()),
        Err(e) => Err(StreamError::WebSocket(e)),
    }
}

/// Tells the client why the runtime could not be reached: a Failure
/// Status on the error channel, as upstream's translator writes it.
async fn send_failure(ws: &mut ServerWebSocket, message: &str) -> Result<(), StreamError> {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": "InternalError", "code": 500,
    });
    let mut m = vec![ERROR];
    m.extend_from_slice(status.to_string().as_bytes());
    ws.send(Message::binary(m))
        .await
        .map_err(StreamError::WebSocket)?;
    close(ws).await
}
