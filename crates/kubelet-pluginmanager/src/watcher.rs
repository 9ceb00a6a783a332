//! The inotify half of the plugin watcher (upstream `pluginwatcher.Watcher`:
//! fsnotify on the registry directory and, as `traversePluginDir` finds
//! them, on each of its subdirectories).
//!
//! It wakes the manager only on events that can add, remove or replace a
//! registration socket: `IN_CREATE`, `IN_DELETE`, `IN_MOVED_FROM`,
//! `IN_MOVED_TO` and `IN_ATTRIB` (a socket's identity includes its change
//! time) of a name that does not start with `.`, `IN_DELETE_SELF` and
//! `IN_MOVE_SELF` of a watched directory, and `IN_Q_OVERFLOW` (events were
//! lost: walk again). It never asks for `IN_OPEN`, `IN_ACCESS`,
//! `IN_CLOSE_*` or `IN_MODIFY`: the manager walks the tree on every wake-up
//! and once a minute, and those walks must not wake it (issue 28); sockets
//! are not written through the file system.
//!
//! Subdirectories are watched as the walk enters them ([`DirAdder`], before
//! each directory is listed), so a socket bound in a new subdirectory right
//! after it was created is seen by that walk or wakes the next one.

use std::path::Path;

use futures::{FutureExt, StreamExt};
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchMask, Watches};
use tracing::{debug, warn};

use crate::error::Error;

fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
}

/// A live inotify watch on the registry tree; dropping it stops it.
pub struct DirWatch {
    stream: EventStream<Vec<u8>>,
    root: std::path::PathBuf,
}

/// Adds a directory of the tree to the watch (blocking; from the walk).
#[derive(Clone)]
pub struct DirAdder {
    watches: Watches,
    /// The registry directory itself, which may be a symbolic link.
    root: std::sync::Arc<Path>,
    /// The watch limit was reported once already.
    limit_logged: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl DirAdder {
    /// Watches `dir` (again: the kernel keeps one watch per directory). A
    /// subdirectory is never watched through a symbolic link: the walk saw a
    /// directory, and one replaced by a link since is not followed
    /// (`IN_DONT_FOLLOW | IN_ONLYDIR`); the registry directory itself is.
    pub fn add(&self, dir: &Path) {
        let mask = if dir == &*self.root {
            mask()
        } else {
            mask() | WatchMask::DONT_FOLLOW | WatchMask::ONLYDIR
        };
        match self.watches.clone().add(dir, mask) {
            Ok(_) => {}
            // ENOSPC: the user's inotify watches are used up.
            Err(error) if error.raw_os_error() == Some(28) => {
                if !self
                    .limit_logged
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    warn!(
                        path = %dir.display(),
                        "inotify watch limit reached (fs.inotify.max_user_watches): plugin \
                         directories past it are found by the rescan a minute apart"
                    );
                }
            }
            Err(error) => debug!(path = %dir.display(), %error, "Cannot watch plugin directory"),
        }
    }
}

/// Watches `dir`; its subdirectories are added by the walk.
/// Must be called on the tokio runtime.
pub fn watch(dir: &Path) -> Result<DirWatch, Error> {
    let stream = Inotify::init()
        .and_then(|i| i.into_event_stream(vec![0u8; 4096]))
        .map_err(|error| Error::Watch { error })?;
    stream
        .watches()
        .add(dir, mask())
        .map_err(|error| Error::Watch { error })?;
    Ok(DirWatch {
        stream,
        root: dir.to_path_buf(),
    })
}

impl DirWatch {
    /// The handle the walk adds subdirectories with.
    pub fn adder(&self) -> DirAdder {
        DirAdder {
            watches: self.stream.watches(),
            root: self.root.as_path().into(),
            limit_logged: std::sync::Arc::default(),
        }
    }

    /// Resolves at the next event that may add or remove a socket. A broken
    /// inotify descriptor leaves the manager on its rescan: never resolves again.
    pub async fn changed(&mut self) {
        loop {
            match self.stream.next().await {
                Some(Ok(ev)) if matters(&ev) => {
                    if ev.mask.contains(EventMask::MOVE_SELF) {
                        // The kernel keeps watching a directory moved out
                        // of the tree; the next walk adds back what is in it.
                        let _ = self.stream.watches().remove(ev.wd);
                    }
                    return;
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    warn!(%error, "FsWatcher received error");
                    return std::future::pending().await;
                }
                None => return std::future::pending().await,
            }
        }
    }

    /// Takes the events already queued (a debounced burst).
    pub fn drain(&mut self) {
        while let Some(Some(Ok(ev))) = self.stream.next().now_or_never() {
            if ev.mask.contains(EventMask::MOVE_SELF) {
                let _ = self.stream.watches().remove(ev.wd);
            }
        }
    }
}

fn matters(ev: &EventOwned) -> bool {
    if ev
        .mask
        .intersects(EventMask::Q_OVERFLOW | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
    {
        return true;
    }
    match &ev.name {
        Some(name) => !name.as_encoded_bytes().starts_with(b"."),
        // IN_IGNORED: a watched subdirectory went; its parent's IN_DELETE said so.
        None => false,
    }
}
