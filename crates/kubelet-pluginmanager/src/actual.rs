//! The plugins registered now (upstream `cache.ActualStateOfWorld`), as the
//! kubelet and tests read them. A plugin appears once its handler accepted
//! it and leaves before its handler is told it is gone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

/// One plugin the manager registered with its handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredPlugin {
    /// The registration socket in the registry directory.
    pub socket_path: PathBuf,
    /// `PluginInfo.type` (`CSIPlugin`, `DevicePlugin`).
    pub plugin_type: String,
    /// `PluginInfo.name`.
    pub name: String,
    /// The endpoint handed to the handler.
    pub endpoint: PathBuf,
    /// `PluginInfo.supported_versions`.
    pub versions: Vec<String>,
}

/// Shared, cheap to clone view of the registered plugins, by socket path.
#[derive(Debug, Clone, Default)]
pub struct ActualStateOfWorld {
    plugins: Arc<Mutex<BTreeMap<PathBuf, RegisteredPlugin>>>,
}

impl ActualStateOfWorld {
    /// Every registered plugin, ordered by socket path.
    pub fn registered_plugins(&self) -> Vec<RegisteredPlugin> {
        self.plugins.lock().values().cloned().collect()
    }

    /// The plugin registered from `socket`, if any.
    pub fn plugin_at(&self, socket: &Path) -> Option<RegisteredPlugin> {
        self.plugins.lock().get(socket).cloned()
    }

    pub(crate) fn add(&self, plugin: RegisteredPlugin) {
        self.plugins
            .lock()
            .insert(plugin.socket_path.clone(), plugin);
    }

    pub(crate) fn remove(&self, socket: &Path) {
        self.plugins.lock().remove(socket);
    }
}
