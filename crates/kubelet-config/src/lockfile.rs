//! `--lock-file` and `--exit-on-lock-contention`, as upstream's
//! `pkg/util/flock.Acquire` and the kubelet's `watchForLockfileContention`
//! do them.
//!
//! The kubelet opens the file (created `0600` if missing) and takes an
//! exclusive `flock`, waiting for as long as another process holds it; the
//! lock is held until the process exits. With `--exit-on-lock-contention` it
//! then watches the file with inotify for `IN_OPEN` or `IN_DELETE_SELF`: a
//! second kubelet opening the same lock file makes the first one exit, and the
//! second, blocked in `flock`, gets the lock and starts. This is how a
//! bootstrap kubelet hands a node over to its successor.
//!
//! The blocking `flock` runs on tokio's blocking pool; the inotify watch runs
//! on notify's own thread and reports through a channel.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, EventKind};
use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::oneshot;

/// Errors taking or watching the lock file.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The file could not be opened or created.
    #[error("unable to open lock file {path:?}: {source}")]
    Open {
        /// Lock file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// `flock` failed (not contention: that waits).
    #[error("unable to acquire file lock on {path:?}: {source}")]
    Lock {
        /// Lock file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The inotify watch could not be set up.
    #[error("unable to watch lock file {path:?}: {source}")]
    Watch {
        /// Lock file.
        path: PathBuf,
        /// Watcher error.
        #[source]
        source: notify::Error,
    },
    /// The blocking task that takes the lock did not finish.
    #[error("lock file task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// An exclusive `flock` on the lock file, held while this value lives (and
/// released by the kernel when the process exits).
#[derive(Debug)]
pub struct LockFile {
    _file: File,
    path: PathBuf,
}

impl LockFile {
    /// Opens (creating, mode 0600) and exclusively locks `path`, waiting while
    /// another process holds the lock. Runs on the blocking pool.
    pub async fn acquire(path: &Path) -> Result<Self, LockError> {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || Self::acquire_blocking(path)).await?
    }

    fn acquire_blocking(path: PathBuf) -> Result<Self, LockError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path);
        let file = match file {
            Ok(f) => f,
            Err(source) => return Err(LockError::Open { path, source }),
        };
        // flock(LOCK_EX): blocks until the holder exits or unlocks.
        if let Err(source) = file.lock() {
            return Err(LockError::Lock { path, source });
        }
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts watching the lock file for another process opening (or the file
    /// being deleted), as upstream's `watchForLockfileContention`.
    pub fn watch_for_contention(&self) -> Result<Contention, LockError> {
        let (tx, rx) = oneshot::channel();
        let mut tx = Some(tx);
        let handler = move |res: notify::Result<Event>| {
            let hit = match res {
                Ok(ev) if is_contention(&ev.kind) => {
                    Some(format!("{:?} on {:?}", ev.kind, ev.paths))
                }
                Ok(_) => None,
                Err(e) => Some(format!("inotify watcher error: {e}")),
            };
            if let (Some(what), Some(tx)) = (hit, tx.take()) {
                let _ = tx.send(what);
            }
        };
        let watch = |source| LockError::Watch {
            path: self.path.clone(),
            source,
        };
        let mut watcher = notify::recommended_watcher(handler).map_err(watch)?;
        watcher
            .watch(&self.path, RecursiveMode::NonRecursive)
            .map_err(watch)?;
        Ok(Contention {
            rx: Some(rx),
            _watcher: watcher,
        })
    }
}

/// Upstream watches `IN_OPEN | IN_DELETE_SELF`; notify also reports
/// attribute changes, writes and closes, which do not count.
fn is_contention(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Open(_)) | EventKind::Remove(_)
    )
}

/// A running watch on the lock file.
#[derive(Debug)]
pub struct Contention {
    rx: Option<oneshot::Receiver<String>>,
    _watcher: RecommendedWatcher,
}

impl Contention {
    /// Resolves with a description of the first contention event (or
    /// watcher error); after that, or if the watcher stops without one,
    /// never resolves again. Cancel-safe.
    pub async fn wait(&mut self) -> String {
        if let Some(rx) = self.rx.as_mut() {
            let got = rx.await;
            self.rx = None;
            if let Ok(what) = got {
                return what;
            }
        }
        std::future::pending().await
    }
}

/// The kubelet's start-up lock step (upstream `run`): with a lock file, take
/// it (waiting for the holder to exit) and, when asked to exit on
/// contention, watch it. Without one, holds nothing.
#[derive(Debug, Default)]
pub struct StartupLock {
    lock: Option<LockFile>,
    contention: Option<Contention>,
}

impl StartupLock {
    /// Takes `path` (if any) and starts the contention watch if `exit_on_contention`.
    pub async fn take(path: Option<&Path>, exit_on_contention: bool) -> Result<Self, LockError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        tracing::info!(path = %path.display(), "Acquiring file lock");
        let lock = LockFile::acquire(path).await?;
        let contention = if exit_on_contention {
            tracing::info!(path = %path.display(), "Watching for inotify events");
            Some(lock.watch_for_contention()?)
        } else {
            None
        };
        Ok(Self {
            lock: Some(lock),
            contention,
        })
    }

    /// The held lock, if any.
    pub fn lock(&self) -> Option<&LockFile> {
        self.lock.as_ref()
    }

    /// Resolves when another process contends for the lock; never without a watch.
    pub async fn contended(&mut self) -> String {
        match self.contention.as_mut() {
            Some(c) => c.wait().await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn lock_is_exclusive_and_an_open_is_contention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubelet.lock");
        let held = LockFile::acquire(&path).await.expect("first lock");
        assert_eq!(held.path(), path);
        // Another open file description cannot take the lock while it is held.
        let other = File::open(&path).expect("open");
        assert!(other.try_lock().is_err(), "flock is exclusive");
        drop(other);

        let mut contention = held.watch_for_contention().expect("watch");
        let waiting = tokio::spawn(async move { contention.wait().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "nothing opened the file yet");
        let path2 = path.clone();
        tokio::task::spawn_blocking(move || File::open(path2))
            .await
            .expect("join")
            .expect("second open");
        let what = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("an open is seen")
            .expect("join");
        assert!(what.contains("Open"), "{what}");

        // Released on drop: the next holder gets it at once.
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(5), LockFile::acquire(&path))
            .await
            .expect("not blocked")
            .expect("lock");
        drop(again);
    }

    #[tokio::test]
    async fn unopenable_path_is_an_open_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = LockFile::acquire(&dir.path().join("missing/dir/lock"))
            .await
            .expect_err("no parent directory");
        assert!(matches!(e, LockError::Open { .. }), "{e}");
        assert!(e.to_string().contains("missing/dir/lock"), "{e}");
    }
}
