//! The plugin watcher and plugin manager (upstream `pkg/kubelet/pluginmanager`):
//! plugins announce themselves by a unix socket in `<root-dir>/plugins_registry`
//! serving the `pluginregistration.v1` API; the manager calls `GetInfo`, hands
//! the plugin to the [`PluginHandler`] of its type (CSI, device plugin),
//! reports the outcome with `NotifyRegistrationStatus`, and deregisters the
//! plugin when its socket goes.

mod handler;

pub use handler::{CSI_PLUGIN, DEVICE_PLUGIN, HandlerError, PluginHandler, PluginRegistration};

/// Generated protobuf messages and gRPC stubs for `pluginregistration`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("pluginregistration");
}
