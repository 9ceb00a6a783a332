//! The per-type registration handler (upstream
//! `pluginmanager/cache.PluginHandler`): the CSI and device-plugin
//! subsystems implement it and the plugin manager calls it for each plugin
//! socket of their type that appears in or leaves the registry directory.

use std::path::Path;
use std::time::Duration;

/// Plugin type advertised by CSI drivers (upstream `CSIPlugin`).
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// Plugin type advertised by device plugins (upstream `DevicePlugin`).
pub const DEVICE_PLUGIN: &str = "DevicePlugin";

/// Why a handler refused or failed a plugin. Its text is what the plugin
/// receives in `NotifyRegistrationStatus.error`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub Box<dyn std::error::Error + Send + Sync>);

impl HandlerError {
    /// A handler error from any error.
    pub fn new(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(e.into())
    }
}

/// One plugin as the registry saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginRegistration<'a> {
    /// `PluginInfo.name`: the CSI driver name or the device resource name.
    pub name: &'a str,
    /// The socket the plugin's own API is served on: `PluginInfo.endpoint`
    /// when set, else the registration socket itself.
    pub endpoint: &'a Path,
    /// `PluginInfo.supported_versions`.
    pub versions: &'a [String],
}

/// A subsystem that accepts plugins of one type (upstream
/// `cache.PluginHandler`). Every call must finish within its own deadline:
/// the plugin manager serializes calls per socket, never across sockets.
#[async_trait::async_trait]
pub trait PluginHandler: Send + Sync + 'static {
    /// Whether the plugin may register (name and versions acceptable).
    async fn validate_plugin(&self, plugin: &PluginRegistration<'_>) -> Result<(), HandlerError>;

    /// Registers the plugin; `timeout` bounds each call the handler makes to
    /// the plugin while registering.
    async fn register_plugin(
        &self,
        plugin: &PluginRegistration<'_>,
        timeout: Duration,
    ) -> Result<(), HandlerError>;

    /// The plugin's registration socket went away (or a newer registration
    /// of the same name replaced it): forget the plugin at `endpoint`.
    async fn deregister_plugin(&self, name: &str, endpoint: &Path);
}
