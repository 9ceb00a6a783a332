//! The inotify half of the plugin watcher (upstream `pluginwatcher.Watcher`'s
//! fsnotify loop): any change under the registry directory wakes the manager,
//! which then walks the directory again. `notify` calls back on its own
//! thread, so the callback only pokes a one-slot tokio channel; a full slot
//! already means "look again".

use std::path::Path;

use notify::event::EventKind;
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::warn;

use crate::error::Error;

/// A live inotify watch on the registry directory; dropping it stops it.
pub struct DirWatch {
    _watcher: RecommendedWatcher,
}

/// Watches `dir` and its subdirectories (new ones included) and sends `()`
/// on `wake` for every change that may add or remove a socket.
pub fn watch(dir: &Path, wake: mpsc::Sender<()>) -> Result<DirWatch, Error> {
    let handler = move |res: notify::Result<notify::Event>| match res {
        // `need_rescan`: the inotify queue overflowed, events were lost.
        Ok(event) if matters(&event.kind) || event.need_rescan() => {
            // Full: a wake-up is already pending, which is enough.
            let _ = wake.try_send(());
        }
        Ok(_) => {}
        Err(error) => {
            warn!(%error, "FsWatcher received error");
            let _ = wake.try_send(());
        }
    };
    let mut watcher =
        notify::recommended_watcher(handler).map_err(|error| Error::Watch { error })?;
    watcher
        .watch(dir, RecursiveMode::Recursive)
        .map_err(|error| Error::Watch { error })?;
    Ok(DirWatch { _watcher: watcher })
}

fn matters(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(_) | EventKind::Any
    )
}
