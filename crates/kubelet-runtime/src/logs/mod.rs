//! Reading a container's CRI log file (upstream
//! `pkg/kubelet/kuberuntime/logs`: `ReadLogs`, `parseCRILog`, `logWriter`,
//! `waitLogs`, and `pkg/util/tail`): lines in the CRI format
//! `<RFC3339Nano> <stdout|stderr> <P|F> <content>`, with `tail`, `since`,
//! `limitBytes` and `timestamps`, and `follow`, which waits for new lines
//! (inotify, with upstream's one-second forced check), reopens the path when
//! the runtime rotates the file, and ends when the container stops or the
//! reader goes away.

mod parse;
mod tail;

use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub use parse::{LogLine, Stream, parse_cri_line};
pub use tail::find_tail_line_start;

/// How often a follow re-checks the file without an inotify event
/// (upstream `logForceCheckPeriod`).
pub const FORCE_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// Upstream `LogOptions`: what to read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogOptions {
    /// The last lines only; `None`: all.
    pub tail: Option<u64>,
    /// At most this many bytes; `None`: no limit.
    pub bytes: Option<u64>,
    /// Lines older than this are skipped.
    pub since: Option<Timestamp>,
    /// Keep reading while the container runs.
    pub follow: bool,
    /// Prefix each line with its timestamp.
    pub timestamps: bool,
}

/// Why reading a log failed.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// The log file cannot be opened or read.
    #[error("failed to read log file {path:?}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Asking the runtime whether the container still runs failed.
    #[error("container status: {0}")]
    Runtime(#[from] cri::CriError),
}

/// Whether the container writing the log still runs (upstream
/// `isContainerRunning` over CRI `ContainerStatus`).
#[async_trait::async_trait]
pub trait ContainerRunning: Send + Sync {
    /// `true` while the container runs.
    async fn is_running(&self, container_id: &str) -> Result<bool, cri::CriError>;
}

#[async_trait::async_trait]
impl ContainerRunning for dyn cri::RuntimeService {
    async fn is_running(&self, container_id: &str) -> Result<bool, cri::CriError> {
        let s = self.container_status(container_id).await?;
        Ok(s.state == cri::pb::ContainerState::ContainerRunning as i32)
    }
}

/// Upstream `logWriter`: since, timestamps and the byte limit.
struct Writer<'a, W> {
    out: &'a mut W,
    opts: &'a LogOptions,
    remain: u64,
}

enum Written {
    More,
    /// The byte limit is reached.
    Full,
}

impl<W: AsyncWrite + Unpin + Send> Writer<'_, W> {
    async fn write(&mut self, line: &LogLine<'_>) -> std::io::Result<Written> {
        if self.opts.since.is_some_and(|s| line.timestamp < s) {
            return Ok(Written::More);
        }
        let mut buf = Vec::with_capacity(line.content.len() + 32);
        if self.opts.timestamps {
            buf.extend_from_slice(parse::format_timestamp(line.timestamp).as_bytes());
            buf.push(b' ');
        }
        buf.extend_from_slice(line.content);
        let n = usize::try_from(self.remain)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        self.out.write_all(&buf[..n]).await?;
        self.out.flush().await?;
        self.remain -= n as u64;
        Ok(if self.remain == 0 {
            Written::Full
        } else {
            Written::More
        })
    }
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> LogsError + '_ {
    move |source| LogsError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// A file's identity, to notice that the path now names a new file.
async fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = tokio::fs::metadata(path).await.ok()?;
    Some((m.dev(), m.ino()))
}

/// Upstream `ReadLogs`: writes the log at `path` of container
/// `container_id` into `out` (stdout and stderr together, as the node API
/// serves them). Returns when the log is read (or, with `follow`, when the
/// container stopped and the rest is read), when a write to `out` fails (the
/// reader went away), or when `stop` fires (the caller cancels it when its
/// client disconnects).
pub async fn read_logs<W>(
    path: &Path,
    container_id: &str,
    opts: &LogOptions,
    runtime: &dyn ContainerRunning,
    out: &mut W,
    stop: &CancellationToken,
) -> Result<(), LogsError>
where
    W: AsyncWrite + Unpin + Send,
{
    let path = tokio::fs::canonicalize(path)
        .await
        .map_err(read_err(path))?;
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(read_err(&path))?;
    let start = match opts.tail {
        Some(n) => {
            let std = file
                .try_clone()
                .await
                .map_err(read_err(&path))?
                .into_std()
                .await;
            tokio::task::spawn_blocking(move || find_tail_line_start(std, n))
                .await
                .map_err(|e| read_err(&path)(std::io::Error::other(e)))?
                .map_err(read_err(&path))?
        }
        None => 0,
    };
    tokio::io::AsyncSeekExt::seek(&mut file, std::io::SeekFrom::Start(start))
        .await
        .map_err(read_err(&path))?;
    let mut ident = identity(&path).await;
    let mut reader = BufReader::new(file);
    let mut writer = Writer {
        out,
        opts,
        remain: opts.bytes.unwrap_or(u64::MAX),
    };
    let mut events = None;
    let mut line = Vec::new();
    // Once the container is seen stopped, read to the end and return.
    let mut draining = false;
    // The file now at the path, once the runtime rotated the one being read.
    let mut reopened: Option<(tokio::fs::File, Option<(u64, u64)>)> = None;
    loop {
        let n = reader
            .read_until(b'\n', &mut line)
            .await
            .map_err(read_err(&path))?;
        if n > 0 && line.ends_with(b"\n") {
            match parse_cri_line(&line) {
                Ok(l) => match writer.write(&l).await {
                    Ok(Written::More) => {}
                    Ok(Written::Full) => return Ok(()),
                    // The reader went away.
                    Err(_) => return Ok(()),
                },
                Err(e) => {
                    debug!(path = %path.display(), error = %e, "Skipping a malformed log line")
                }
            }
            line.clear();
            continue;
        }
        // End of file; `line` may hold an incomplete line (kept for later).
        if let Some((f, now)) = reopened.take() {
            // The old file is read to its end: go on in the new one.
            debug!(path = %path.display(), "Log file rotated; reading the new one");
            if !line.is_empty()
                && let Ok(l) = parse_cri_line(&line)
                && writer.write(&l).await.is_err()
            {
                return Ok(());
            }
            line.clear();
            reader = BufReader::new(f);
            ident = now;
            events = None;
            continue;
        }
        if !opts.follow || draining {
            if !line.is_empty()
                && let Ok(l) = parse_cri_line(&line)
            {
                let _ = writer.write(&l).await;
            }
            return Ok(());
        }
        if !runtime.is_running(container_id).await? {
            draining = true;
            continue;
        }
        // A rotated file (upstream `waitLogs`' recreated): open the new one
        // now, but first read the old one to its end once more, for what the
        // runtime wrote to it before it reopened.
        let now = identity(&path).await;
        if now.is_some() && now != ident {
            match tokio::fs::File::open(&path).await {
                Ok(f) => {
                    reopened = Some((f, now));
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(read_err(&path)(e)),
            }
        }
        if events.is_none() {
            events = watch(&path);
            // Data may have arrived before the watch: look again first.
            continue;
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = next_event(&mut events) => {}
            () = tokio::time::sleep(FORCE_CHECK_PERIOD) => {}
        }
    }
}

/// A watch on the log file and its directory (upstream `waitLogs`' fsnotify
/// watch): data written to the file (`IN_MODIFY`), the file renamed or
/// removed (`IN_MOVE_SELF`; `IN_DELETE_SELF` only comes once this reader has
/// closed it, so a removal is seen by the 1 s check, as upstream), and a file
/// created or moved into the directory (`IN_CREATE`, `IN_MOVED_TO`: the
/// runtime's new file after a rotation). Opens, reads and closes are never asked for: this
/// reader's own, another `kubectl logs` or the log rotation's gzip would
/// otherwise wake it (issue 28).
struct Watch {
    events: inotify::EventStream<Vec<u8>>,
}

fn watch(path: &Path) -> Option<Watch> {
    use inotify::WatchMask;
    let events = inotify::Inotify::init()
        .and_then(|i| i.into_event_stream(vec![0u8; 1024]))
        .ok()?;
    events
        .watches()
        .add(
            path,
            WatchMask::MODIFY | WatchMask::MOVE_SELF | WatchMask::DELETE_SELF,
        )
        .ok()?;
    if let Some(dir) = path.parent() {
        let _ = events
            .watches()
            .add(dir, WatchMask::CREATE | WatchMask::MOVED_TO);
    }
    Some(Watch { events })
}

async fn next_event(w: &mut Option<Watch>) {
    use futures::{FutureExt, StreamExt};
    match w {
        Some(w) => {
            // A broken descriptor leaves the 1 s check alone (no spinning).
            if !matches!(w.events.next().await, Some(Ok(_))) {
                std::future::pending::<()>().await;
            }
            // Coalesce a burst.
            while let Some(Some(_)) = w.events.next().now_or_never() {}
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
