//! The plugin manager's wiring (upstream `Kubelet.initializeRuntimeDependentModules`
//! starting `pluginManager.Run` with the CSI and device-plugin handlers): it
//! watches `<root-dir>/plugins_registry` for the registration sockets of CSI
//! drivers and device plugins.

use std::collections::HashMap;
use std::sync::Arc;

use kubelet_config::KubeletConfig;
use kubelet_pluginmanager::{
    PLUGINS_REGISTRY_DIR_NAME, PluginHandler, PluginManager, PluginManagerConfig,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info_span};

use super::spawn::spawn_in;

/// Starts the plugin manager with `handlers` by plugin type. A registry
/// directory that cannot be created or watched is logged and leaves plugins
/// unregistered; the kubelet runs on, as pods without plugins need nothing.
pub(super) fn spawn(
    cfg: &KubeletConfig,
    handlers: Vec<(&'static str, Arc<dyn PluginHandler>)>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) {
    let handlers: HashMap<&'static str, Arc<dyn PluginHandler>> = handlers.into_iter().collect();
    // No connection monitor: upstream checks only DRA plugins that way; a
    // CSI driver or device plugin missing two checks must not lose its
    // registration (its volumes could no longer be torn down), it goes
    // when its socket goes.
    let config = PluginManagerConfig {
        connection_check_interval: std::time::Duration::ZERO,
        ..Default::default()
    };
    let manager = PluginManager::new(
        cfg.root_dir.join(PLUGINS_REGISTRY_DIR_NAME),
        handlers,
        config,
    );
    let stop = stop.child_token();
    spawn_in(tasks, info_span!("plugin_manager"), async move {
        if let Err(e) = manager.run(stop).await {
            error!(error = %e, "The plugin manager could not start; no CSI driver or device plugin can register");
        }
    });
}
