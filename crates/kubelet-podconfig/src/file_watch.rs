//! The static pod path's inotify watch (upstream `file_linux.go`, which
//! watches the path with fsnotify and lists it again on a change).
//!
//! It wakes the file source only on events that can change the pods:
//! `IN_CREATE`, `IN_CLOSE_WRITE` (a write completed), `IN_DELETE`,
//! `IN_MOVED_FROM`, `IN_MOVED_TO` and `IN_ATTRIB` (a manifest made
//! unreadable, or readable again) of a manifest name (any name not starting
//! with `.`, as upstream reads every such file), `IN_DELETE_SELF` and
//! `IN_MOVE_SELF` of the watched directory, and `IN_Q_OVERFLOW` (events
//! were lost). It never asks the kernel for `IN_OPEN`, `IN_ACCESS` or
//! `IN_CLOSE_NOWRITE`: the source lists the directory and reads every
//! manifest on each wake-up and every 20 s, and a watch that saw those reads
//! would wake itself again at once, forever (issue 28: an empty static pod
//! directory was listed 19 times a second). `IN_MODIFY` is left out too: a
//! half-written manifest is read when its writer closes it.
//!
//! The watch follows the path: the directory itself when it is one; the
//! parent directory, for that one name, when the path is a single manifest
//! file or does not exist yet. [`Retarget::ensure`] re-points it before
//! every read, so a directory created, removed, replaced or moved later (or
//! a symbolic link to it re-pointed: the watch is kept per inode) is
//! watched from the next read on.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use parking_lot::Mutex;
use tracing::{debug, warn};

/// True for a name the file source reads (upstream's `[^.]*` glob): any
/// name but a dotfile (editors' swap files start with a dot).
pub fn is_manifest_name(name: &OsStr) -> bool {
    !name.as_encoded_bytes().starts_with(b".")
}

/// The events asked for; see the module documentation.
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::CLOSE_WRITE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
}

/// What the watch points at.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// The static pod directory: every manifest name in it counts.
    Dir,
    /// The parent directory, for this name only.
    Entry(OsString),
}

/// The watch now: its descriptor, the watched directory's (device, inode),
/// and what it stands for.
type Current = Arc<Mutex<Option<(WatchDescriptor, (u64, u64), Target)>>>;

/// The async half: waits for events that matter.
pub struct PathWatch {
    stream: EventStream<Vec<u8>>,
    current: Current,
    path: PathBuf,
}

/// The blocking half: points the watch where the path is now.
#[derive(Clone)]
pub struct Retarget {
    path: PathBuf,
    watches: Watches,
    current: Current,
}

impl PathWatch {
    /// An inotify instance for `path`, watching nothing until
    /// [`Retarget::ensure`]. Must be called on the tokio runtime.
    pub fn new(path: &Path) -> std::io::Result<Self> {
        let stream = Inotify::init()?.into_event_stream(vec![0u8; 4096])?;
        Ok(Self {
            stream,
            current: Current::default(),
            path: path.to_path_buf(),
        })
    }

    /// The handle that re-points the watch (used off the async runtime).
    pub fn retarget(&self) -> Retarget {
        Retarget {
            path: self.path.clone(),
            watches: self.stream.watches(),
            current: self.current.clone(),
        }
    }

    /// Resolves at the next event that can change the pods. A broken
    /// inotify descriptor leaves the source polling: never resolves again.
    pub async fn changed(&mut self) {
        loop {
            match self.stream.next().await {
                Some(Ok(ev)) if self.observe(&ev) => return,
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    warn!(path = %self.path.display(), %error, "Static pod path watch failed; polling only");
                    return std::future::pending().await;
                }
                None => return std::future::pending().await,
            }
        }
    }

    /// Takes the events already queued (a debounced burst), keeping the
    /// watch's own state current.
    pub fn drain(&mut self) {
        while let Some(Some(Ok(ev))) = self.stream.next().now_or_never() {
            self.observe(&ev);
        }
    }

    /// Whether `ev` can change the pods. A watch the kernel dropped (its
    /// directory removed or moved) is forgotten, for `ensure` to set again.
    fn observe(&self, ev: &EventOwned) -> bool {
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            return true;
        }
        let mut current = self.current.lock();
        let Some((wd, _, target)) = current.as_ref() else {
            return false;
        };
        if ev.wd != *wd {
            // A watch replaced by `ensure`: its last events say nothing.
            return false;
        }
        if ev
            .mask
            .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED)
        {
            if ev.mask.contains(EventMask::MOVE_SELF)
                && let Some((wd, _, _)) = current.take()
            {
                // The kernel keeps watching a moved directory: stop that.
                let _ = self.stream.watches().remove(wd);
            }
            *current = None;
            return true;
        }
        match (target, ev.name.as_deref()) {
            (Target::Dir, Some(name)) => is_manifest_name(name),
            (Target::Entry(want), Some(name)) => name == want,
            (_, None) => false,
        }
    }
}

impl Retarget {
    /// Points the watch at the directory, or at the parent for the path's
    /// name, whichever the path is now. Blocking: it stats the path.
    pub fn ensure(&self) {
        use std::os::unix::fs::MetadataExt;
        let (dir, target) = match std::fs::metadata(&self.path) {
            Ok(m) if m.is_dir() => (self.path.clone(), Target::Dir),
            _ => match (self.path.parent(), self.path.file_name()) {
                (Some(parent), Some(name)) => (parent.to_path_buf(), Target::Entry(name.into())),
                _ => return,
            },
        };
        let Ok(meta) = std::fs::metadata(&dir) else {
            // No parent either: polled until one appears.
            return;
        };
        let inode = (meta.dev(), meta.ino());
        let mut current = self.current.lock();
        if let Some((_, i, t)) = current.as_ref()
            && *i == inode
            && *t == target
        {
            return;
        }
        if let Some((wd, _, _)) = current.take() {
            // Already gone when the kernel dropped it.
            let _ = self.watches.clone().remove(wd);
        }
        match self.watches.clone().add(&dir, mask()) {
            Ok(wd) => {
                debug!(path = %dir.display(), ?target, "Watching static pod path");
                *current = Some((wd, inode, target));
            }
            Err(error) => {
                debug!(path = %dir.display(), %error, "Cannot watch static pod path yet; polling");
            }
        }
    }
}

#[cfg(test)]
mod tests;
