//! The kernel log device (`/dev/kmsg`, as euank/go-kmsg-parser reads it
//! for cAdvisor): one record per `read`, `PRIORITY,SEQUENCE,TIMESTAMP_US,
//! FLAGS;MESSAGE` followed by optional ` KEY=VALUE` continuation lines.
//!
//! A dedicated thread blocks in `read` (no busy loop) and hands records to
//! the watcher's task, which stops at once with its cancellation token; the
//! thread ends at its next record once nobody listens. The device is
//! positioned at its end first: records
//! from before the kubelet started are not replayed. Only the kernel's own
//! records count: a process writing OOM-like lines to `/dev/kmsg` gets the
//! user facility and cannot fake a node event.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Watcher;

/// The device.
pub(super) const DEV_KMSG: &str = "/dev/kmsg";

/// Larger than any record (the kernel's `CONSOLE_EXT_LOG_MAX`); a smaller
/// buffer makes `read` fail with `EINVAL`.
const RECORD_MAX: usize = 8192;

/// One parsed record.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Record<'a> {
    /// Syslog facility: 0 for the kernel's own messages (a process writing
    /// to `/dev/kmsg` cannot claim it).
    pub facility: u32,
    /// Sequence number.
    pub seq: u64,
    /// Microseconds since boot.
    pub timestamp_us: u64,
    /// The message, without its continuation lines.
    pub message: &'a str,
}

/// Parses one record; `None` for a malformed one (skipped).
pub(super) fn parse_record(raw: &str) -> Option<Record<'_>> {
    let (header, body) = raw.split_once(';')?;
    let mut fields = header.split(',');
    let priority: u32 = fields.next()?.trim().parse().ok()?;
    let seq = fields.next()?.trim().parse().ok()?;
    let timestamp_us = fields.next()?.trim().parse().ok()?;
    let message = body.split('\n').next().unwrap_or_default();
    Some(Record {
        facility: priority >> 3,
        seq,
        timestamp_us,
        message,
    })
}

/// Opens the device at its end.
fn open_at_end(path: &Path) -> std::io::Result<std::fs::File> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::End(0))?;
    Ok(f)
}

/// The reading thread: sends each raw record until the receiver is gone
/// or the device fails.
fn read_records(
    path: PathBuf,
    records: mpsc::Sender<String>,
    opened: oneshot::Sender<std::io::Result<()>>,
) {
    let mut f = match open_at_end(&path) {
        Ok(f) => {
            let _ = opened.send(Ok(()));
            f
        }
        Err(e) => {
            let _ = opened.send(Err(e));
            return;
        }
    };
    let mut buf = vec![0u8; RECORD_MAX];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let raw = String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned();
                if records.blocking_send(raw).is_err() {
                    return;
                }
            }
            // Records were overwritten before they were read (EPIPE): the
            // next read returns the oldest one left.
            Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                warn!(path = %path.display(), error = %e, "Cannot read the kernel log: system OOM events will not be reported");
                return;
            }
        }
    }
}

/// Feeds every new record of `path` to `watcher` until `stop`.
pub(super) async fn watch(mut watcher: Watcher, path: &str, stop: CancellationToken) {
    let (tx, mut rx) = mpsc::channel(64);
    let (opened_tx, opened) = oneshot::channel();
    let p = PathBuf::from(path);
    let spawned = std::thread::Builder::new()
        .name("kmsg".into())
        .spawn(move || read_records(p, tx, opened_tx));
    if let Err(e) = spawned {
        warn!(path, error = %e, "Cannot start the kernel log reader: system OOM events will not be reported");
        return;
    }
    match opened.await {
        Ok(Ok(())) => info!(path, "Watching the kernel log for system OOM kills"),
        Ok(Err(e)) => {
            warn!(path, error = %e, "Cannot read the kernel log: system OOM events will not be reported");
            return;
        }
        Err(_) => return,
    }
    let mut last_seq: Option<u64> = None;
    loop {
        let raw = tokio::select! {
            () = stop.cancelled() => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => {
                    debug!(path, "The kernel log reader ended");
                    return;
                }
            },
        };
        let Some(r) = parse_record(&raw) else {
            continue;
        };
        if last_seq.is_some_and(|s| r.seq <= s) || r.facility != 0 {
            continue;
        }
        last_seq = Some(r.seq);
        watcher.handle(r.message, r.timestamp_us);
    }
}
