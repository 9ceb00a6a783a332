//! The client side of SPDY/3.1 framing, as far as the remotecommand
//! protocol needs it (upstream uses `moby/spdystream` through
//! `apimachinery/pkg/util/httpstream/spdy`): SYN_STREAM frames with
//! zlib-compressed header blocks, DATA frames with FIN for half-close, PING
//! answered, and the other control frames (SYN_REPLY, SETTINGS,
//! WINDOW_UPDATE, RST_STREAM, GOAWAY) recognised.
//!
//! Header blocks are compressed with one zlib stream per connection, flushed
//! per frame, without SPDY's preset dictionary: the dictionary only enables
//! back-references into it, and Go's reader accepts a stream that makes
//! none. Received header blocks are never needed by a client that knows the
//! streams it opened, so they are not decompressed.

use std::io;

/// SPDY protocol version 3.
const VERSION: u16 = 3;

/// Control frame types (SPDY/3 section 2.6).
pub mod kind {
    /// SYN_STREAM.
    pub const SYN_STREAM: u16 = 1;
    /// SYN_REPLY.
    pub const SYN_REPLY: u16 = 2;
    /// RST_STREAM.
    pub const RST_STREAM: u16 = 3;
    /// SETTINGS.
    pub const SETTINGS: u16 = 4;
    /// PING.
    pub const PING: u16 = 6;
    /// GOAWAY.
    pub const GOAWAY: u16 = 7;
    /// HEADERS.
    pub const HEADERS: u16 = 8;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u16 = 9;
}

/// FLAG_FIN on DATA and SYN_STREAM frames.
pub const FLAG_FIN: u8 = 0x01;

/// One received frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A control frame: its type, flags and payload.
    Control {
        /// Frame type ([`kind`]).
        kind: u16,
        /// Flags.
        flags: u8,
        /// The payload after the 8-byte header.
        payload: Vec<u8>,
    },
    /// A DATA frame.
    Data {
        /// Stream ID.
        stream: u32,
        /// FIN: the sender's half of the stream is closed.
        fin: bool,
        /// Bytes.
        data: Vec<u8>,
    },
}

/// Encodes frames (with the connection's header compressor) and decodes
/// received bytes into frames.
pub struct Codec {
    deflate: flate2::Compress,
    inbuf: Vec<u8>,
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

fn len24(n: usize) -> io::Result<[u8; 3]> {
    let n = u32::try_from(n)
        .ok()
        .filter(|n| *n < 1 << 24)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "SPDY frame too long"))?;
    let b = n.to_be_bytes();
    Ok([b[1], b[2], b[3]])
}

impl Codec {
    /// A codec for a new connection.
    pub fn new() -> Self {
        Self {
            deflate: flate2::Compress::new(flate2::Compression::default(), true),
            inbuf: Vec::new(),
        }
    }

    /// A SYN_STREAM opening client stream `stream` with `headers`.
    pub fn syn_stream(&mut self, stream: u32, headers: &[(&str, &str)]) -> io::Result<Vec<u8>> {
        let count = u32::try_from(headers.len()).unwrap_or(u32::MAX);
        let mut block = count.to_be_bytes().to_vec();
        for (k, v) in headers {
            for s in [k, v] {
                let n = u32::try_from(s.len()).unwrap_or(u32::MAX);
                block.extend_from_slice(&n.to_be_bytes());
                block.extend_from_slice(s.as_bytes());
            }
        }
        let mut z = Vec::with_capacity(block.len() + 64);
        self.deflate
            .compress_vec(&block, &mut z, flate2::FlushCompress::Sync)
            .map_err(io::Error::other)?;
        let mut f = Vec::with_capacity(18 + z.len());
        f.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        f.extend_from_slice(&kind::SYN_STREAM.to_be_bytes());
        f.push(0);
        f.extend_from_slice(&len24(10 + z.len())?);
        f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        f.extend_from_slice(&0u32.to_be_bytes()); // associated stream
        f.extend_from_slice(&[0, 0]); // priority, slot
        f.extend_from_slice(&z);
        Ok(f)
    }

    /// A DATA frame on `stream`; `fin` half-closes it.
    pub fn data(stream: u32, fin: bool, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut f = Vec::with_capacity(8 + data.len());
        f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        f.push(if fin { FLAG_FIN } else { 0 });
        f.extend_from_slice(&len24(data.len())?);
        f.extend_from_slice(data);
        Ok(f)
    }

    /// The answer to a received PING (the same frame back).
    pub fn ping_reply(payload: &[u8]) -> io::Result<Vec<u8>> {
        let mut f = Vec::with_capacity(8 + payload.len());
        f.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        f.extend_from_slice(&kind::PING.to_be_bytes());
        f.push(0);
        f.extend_from_slice(&len24(payload.len())?);
        f.extend_from_slice(payload);
        Ok(f)
    }

    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.inbuf.extend_from_slice(bytes);
    }

    /// The next complete frame received, if any.
    pub fn next_frame(&mut self) -> Option<Frame> {
        if self.inbuf.len() < 8 {
            return None;
        }
        let len = u32::from_be_bytes([0, self.inbuf[5], self.inbuf[6], self.inbuf[7]]) as usize;
        if self.inbuf.len() < 8 + len {
            return None;
        }
        let frame: Vec<u8> = self.inbuf.drain(..8 + len).collect();
        let flags = frame[4];
        Some(if frame[0] & 0x80 != 0 {
            Frame::Control {
                kind: u16::from_be_bytes([frame[2], frame[3]]),
                flags,
                payload: frame[8..].to_vec(),
            }
        } else {
            Frame::Data {
                stream: u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                data: frame[8..].to_vec(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_frames_round_trip_with_fin() {
        let mut c = Codec::new();
        let mut bytes = Codec::data(5, false, b"hello").expect("frame");
        bytes.extend(Codec::data(3, true, b"").expect("frame"));
        // Split anywhere: frames come out whole.
        c.push(&bytes[..7]);
        assert_eq!(c.next_frame(), None);
        c.push(&bytes[7..]);
        assert_eq!(
            c.next_frame(),
            Some(Frame::Data {
                stream: 5,
                fin: false,
                data: b"hello".to_vec()
            })
        );
        assert_eq!(
            c.next_frame(),
            Some(Frame::Data {
                stream: 3,
                fin: true,
                data: vec![]
            })
        );
    }

    #[test]
    fn syn_stream_headers_decompress_to_the_name_value_block() {
        let mut c = Codec::new();
        let a = c.syn_stream(1, &[("streamtype", "error")]).expect("a");
        let b = c.syn_stream(3, &[("streamtype", "stdin")]).expect("b");
        let mut d = flate2::Decompress::new(true);
        let mut blocks = vec![];
        for f in [&a, &b] {
            let mut r = Codec::new();
            r.push(f);
            let Some(Frame::Control { kind, payload, .. }) = r.next_frame() else {
                panic!("a control frame");
            };
            assert_eq!(kind, kind::SYN_STREAM);
            let mut out = Vec::with_capacity(256);
            d.decompress_vec(&payload[10..], &mut out, flate2::FlushDecompress::Sync)
                .expect("inflate");
            blocks.push(out);
        }
        let mut want = 1u32.to_be_bytes().to_vec();
        for s in ["streamtype", "stdin"] {
            want.extend_from_slice(&(s.len() as u32).to_be_bytes());
            want.extend_from_slice(s.as_bytes());
        }
        assert_eq!(
            blocks[1], want,
            "the compression state continues across frames"
        );
    }

    #[test]
    fn a_ping_is_answered_with_itself() {
        let mut c = Codec::new();
        c.push(&Codec::ping_reply(&7u32.to_be_bytes()).expect("ping"));
        assert_eq!(
            c.next_frame(),
            Some(Frame::Control {
                kind: kind::PING,
                flags: 0,
                payload: 7u32.to_be_bytes().to_vec()
            })
        );
    }
}
