//! The sockets found in the registry directory (upstream
//! `cache.DesiredStateOfWorld`), as the kubelet reads them for the
//! `plugin_manager_total_plugins{state="desired_state_of_world"}` gauge.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Shared, cheap to clone view of the registration sockets the last walk
/// of the directory found.
#[derive(Debug, Clone, Default)]
pub struct DesiredStateOfWorld {
    sockets: Arc<Mutex<BTreeSet<PathBuf>>>,
    walks: Arc<AtomicU64>,
}

impl DesiredStateOfWorld {
    /// The socket paths, sorted.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.sockets.lock().iter().cloned().collect()
    }

    /// How many walks of the directory produced this state so far.
    pub fn walks(&self) -> u64 {
        self.walks.load(Ordering::Relaxed)
    }

    pub(crate) fn replace(&self, sockets: impl IntoIterator<Item = PathBuf>) {
        *self.sockets.lock() = sockets.into_iter().collect();
        self.walks.fetch_add(1, Ordering::Relaxed);
    }
}
