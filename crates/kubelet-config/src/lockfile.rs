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
//! The blocking `flock` runs on tokio's blocking pool. The watch asks the
//! kernel for exactly upstream's two events, `IN_OPEN` and `IN_DELETE_SELF`,
//! and acts on both; the kubelet never opens its lock file again after
//! taking it, so nothing of its own wakes the watch.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchMask};

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
        /// inotify error.
        #[source]
        source: std::io::Error,
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
    /// being deleted), as upstream's `watchForLockfileContention`. Must be
    /// called on the tokio runtime.
    pub fn watch_for_contention(&self) -> Result<Contention, LockError> {
        let watch = |source| LockError::Watch {
            path: self.path.clone(),
            source,
        };
        let events = Inotify::init()
            .and_then(|i| i.into_event_stream(vec![0u8; 1024]))
            .map_err(watch)?;
        events
            .watches()
            .add(&self.path, WatchMask::OPEN | WatchMask::DELETE_SELF)
            .map_err(watch)?;
        Ok(Contention {
            events: Some(events),
            path: self.path.clone(),
        })
    }
}

/// A running watch on the lock file.
#[derive(Debug)]
pub struct Contention {
    events: Option<EventStream<Vec<u8>>>,
    path: PathBuf,
}

impl Contention {
    /// Resolves with a description of the first contention event (or
    /// watcher error); after that, or if the watch stops without one,
    /// never resolves again. Cancel-safe.
    pub async fn wait(&mut self) -> String {
        if let Some(events) = self.events.as_mut() {
            // Only IN_OPEN and IN_DELETE_SELF (then IN_IGNORED) are asked for.
            let what = match events.next().await {
                Some(Ok(ev)) if ev.mask.contains(EventMask::OPEN) => Some("Open".to_string()),
                Some(Ok(ev)) => Some(format!("{:?}", ev.mask)),
                Some(Err(e)) => Some(format!("inotify watcher error: {e}")),
                None => None,
            };
            self.events = None;
            if let Some(what) = what {
                return format!("{what} on {:?}", self.path);
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
    async fn reads_of_its_metadata_are_not_contention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubelet.lock");
        let held = LockFile::acquire(&path).await.expect("lock");
        let mut contention = held.watch_for_contention().expect("watch");
        // `ls -l` and a `chmod`/`touch -m` by an operator: not contention
        // (`IN_ATTRIB` is outside upstream's mask, IN_OPEN and IN_DELETE_SELF;
        // the latter comes only once the held file is closed, for upstream's
        // kubelet too).
        let _ = std::fs::metadata(&path).expect("stat");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .expect("chmod");
        assert!(
            tokio::time::timeout(Duration::from_millis(200), contention.wait())
                .await
                .is_err()
        );
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
