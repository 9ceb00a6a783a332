//! Device plugins that register through the plugin watcher
//! (`<root-dir>/plugins_registry`, type `DevicePlugin`; upstream
//! `plugin/v1beta1/handler.go`): the same checks and connection as the
//! `Register` call, with the socket given by the watcher.

use std::path::Path;
use std::time::Duration;

use kubelet_pluginmanager::{HandlerError, PluginHandler, PluginRegistration};

use crate::error::DeviceManagerError;
use crate::manager::DeviceManager;
use crate::resource_name::is_extended_resource_name;
use crate::v1beta1::{SUPPORTED_VERSIONS, VERSION};

#[async_trait::async_trait]
impl PluginHandler for DeviceManager {
    async fn validate_plugin(&self, plugin: &PluginRegistration<'_>) -> Result<(), HandlerError> {
        tracing::info!(name = plugin.name, endpoint = %plugin.endpoint.display(), versions = ?plugin.versions,
            "Got plugin at endpoint with versions");
        if !plugin
            .versions
            .iter()
            .any(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        {
            return Err(HandlerError::new(DeviceManagerError::PluginVersions {
                manager: VERSION.to_string(),
                versions: plugin.versions.to_vec(),
            }));
        }
        if !is_extended_resource_name(plugin.name) {
            return Err(HandlerError::new(format!(
                "invalid name of device plugin socket: {}",
                DeviceManagerError::InvalidResourceName(plugin.name.to_string())
            )));
        }
        Ok(())
    }

    async fn register_plugin(
        &self,
        plugin: &PluginRegistration<'_>,
        timeout: Duration,
    ) -> Result<(), HandlerError> {
        let connect = self.connect_plugin(plugin.name, plugin.endpoint);
        match tokio::time::timeout(timeout.saturating_mul(2), connect).await {
            Ok(res) => res.map_err(HandlerError::new),
            Err(_) => Err(HandlerError::new(DeviceManagerError::Dial(format!(
                "timed out registering {} at {}",
                plugin.name,
                plugin.endpoint.display()
            )))),
        }
    }

    async fn deregister_plugin(&self, name: &str, endpoint: &Path) {
        if let Some(id) = self.endpoint_for_socket(name, endpoint) {
            self.disconnect(name, Some(id));
        }
    }
}
