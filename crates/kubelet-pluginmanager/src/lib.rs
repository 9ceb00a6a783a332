//! The plugin watcher and plugin manager (upstream `pkg/kubelet/pluginmanager`):
//! plugins announce themselves by a unix socket in `<root-dir>/plugins_registry`
//! serving the `pluginregistration.v1` API; the manager calls `GetInfo`, hands
//! the plugin to the [`PluginHandler`] of its type (CSI, device plugin),
//! reports the outcome with `NotifyRegistrationStatus`, and deregisters the
//! plugin when its socket goes.

mod actual;
mod client;
mod desired;
mod error;
mod handler;
mod manager;
mod operation;
mod scan;
mod watcher;
mod worker;

#[cfg(test)]
mod tests;

pub use actual::{ActualStateOfWorld, RegisteredPlugin};
pub use client::CallTimeouts;
pub use desired::DesiredStateOfWorld;
pub use error::{DialFailure, Error};
pub use handler::{CSI_PLUGIN, DEVICE_PLUGIN, HandlerError, PluginHandler, PluginRegistration};
pub use manager::{
    DEFAULT_CONNECTION_CHECK_INTERVAL, DEFAULT_MAX_CHECK_FAILURES, DEFAULT_REGISTER_TIMEOUT,
    DEFAULT_RESCAN_INTERVAL, PluginManager, PluginManagerConfig,
};
pub use scan::REGISTRY_DIR_MODE;

/// The registry directory under the kubelet's root directory (upstream
/// `config.DefaultKubeletPluginsRegistrationDirName`).
pub const PLUGINS_REGISTRY_DIR_NAME: &str = "plugins_registry";

/// Generated protobuf messages and gRPC stubs for `pluginregistration`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("pluginregistration");
}
