//! The streaming protocols on port 10250 (upstream
//! `pkg/kubelet/cri/streaming` and `apimachinery/pkg/util/httpstream`):
//! SPDY/3.1 frames read from the runtime's streaming server, and WebSocket
//! frames from a client carrying `v5.channel.k8s.io` channel messages that
//! the kubelet translates to SPDY.

use std::io::{Cursor, Read, Write};

use kubelet_server::streaming::StreamOptions;
use kubelet_server::streaming::spdy::{Codec, Frame};
use kubelet_server::streaming::tunnel::websocket_config;
use kubelet_server::streaming::v5::client_message_to_runtime;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{Message, WebSocket};

/// Received SPDY bytes, pushed into the frame decoder in chunks (the first
/// byte picks the chunk size: reads split frames anywhere).
///
/// Invariants: the decoder consumes exactly the frames' bytes, and a DATA
/// frame re-encoded decodes to the same frame.
pub fn spdy_frames(data: &[u8]) {
    let Some((&chunk, bytes)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk % 64) + 1;
    let mut codec = Codec::new();
    let mut consumed = 0;
    for part in bytes.chunks(chunk) {
        codec.push(part);
        while let Some(f) = codec.next_frame() {
            consumed += 8 + match &f {
                Frame::Control { payload, .. } => payload.len(),
                Frame::Data { data, .. } => data.len(),
            };
            if let Frame::Data { stream, fin, data } = &f {
                let again = Codec::data(*stream, *fin, data).map(|b| {
                    let mut c = Codec::new();
                    c.push(&b);
                    c.next_frame()
                });
                assert_eq!(again.ok().flatten().as_ref(), Some(&f), "DATA round trip");
            }
        }
    }
    assert!(consumed <= bytes.len(), "decoded more than received");
    assert!(
        bytes.len() - consumed < 8 + (1 << 24),
        "a whole frame was left"
    );
}

/// A client's side of an exec WebSocket: raw frames read with the kubelet's
/// WebSocket settings (server role: frames must be masked; size limits),
/// and every binary message translated to the runtime as the v5 session
/// does. The first byte picks the session's stdin/tty options.
///
/// Invariant: a translated message is one DATA frame on stdin or resize.
pub fn websocket(data: &[u8]) {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let opts = StreamOptions {
        stdin: mode & 1 != 0,
        stdout: true,
        stderr: mode & 2 == 0,
        tty: mode & 2 != 0,
    };
    let socket = Socket {
        input: Cursor::new(bytes),
        written: 0,
    };
    let mut ws = WebSocket::from_raw_socket(socket, Role::Server, Some(websocket_config()));
    // Every message takes at least two bytes of input: more reads than that
    // means the reader is spinning.
    for _ in 0..bytes.len() / 2 + 2 {
        match ws.read() {
            Ok(Message::Binary(m)) => check_translation(&m, &opts),
            Ok(_) => {}
            Err(_) => return,
        }
    }
    panic!("the WebSocket reader returns messages without consuming input");
}

fn check_translation(m: &[u8], opts: &StreamOptions) {
    let Some(frame) = client_message_to_runtime(m, opts) else {
        return;
    };
    let Ok(frame) = frame else { return };
    let mut c = Codec::new();
    c.push(&frame);
    match c.next_frame() {
        Some(Frame::Data { stream: 3 | 9, .. }) => {}
        other => panic!("message {m:?} became {other:?}"),
    }
}

/// An in-memory connection: reads the fuzz input, swallows what is written
/// (pongs, close replies).
struct Socket<'a> {
    input: Cursor<&'a [u8]>,
    written: usize,
}

impl Read for Socket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Socket<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
