//! The CSI driver registration handler (upstream `csi_plugin.go`
//! `RegistrationHandler`): the plugin watcher hands it each `CSIPlugin`
//! socket; it checks the CSI versions, records the driver, asks the driver
//! for `NodeGetInfo` and publishes the answer on the Node and CSINode.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kubelet_pluginmanager::{HandlerError, PluginHandler, PluginRegistration};

use crate::client::CsiClient;
use crate::drivers::{Driver, DriversStore, Version, highest_supported_version};
use crate::{CsiHost, Error, Result, nodeinfo};

/// Accepts CSI drivers from the plugin watcher.
pub struct RegistrationHandler {
    host: Arc<dyn CsiHost>,
    drivers: Arc<DriversStore>,
}

impl RegistrationHandler {
    /// A handler recording drivers in `drivers` and the node facts through `host`.
    pub fn new(host: Arc<dyn CsiHost>, drivers: Arc<DriversStore>) -> Self {
        Self { host, drivers }
    }

    /// Upstream `validateVersions`: the highest 1.x version, refused when a
    /// driver of the same name is already registered with one as high.
    fn validate_versions(&self, caller: &str, name: &str, versions: &[String]) -> Result<Version> {
        if versions.is_empty() {
            return Err(Error::Registration(format!(
                "{caller} for CSI driver {name:?} failed. Plugin returned an empty list for supported versions"
            )));
        }
        let Some(highest) = highest_supported_version(versions) else {
            return Err(Error::Registration(format!(
                "{caller} for CSI driver {name:?} failed. None of the versions specified {} are supported. err=none of the CSI versions reported by the plugin are supported",
                go_quoted_list(versions)
            )));
        };
        if let Some(existing) = self.drivers.get(name)
            && existing.highest_supported_version >= highest
        {
            return Err(Error::Registration(format!(
                "{caller} for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: \"{}\"",
                existing.highest_supported_version
            )));
        }
        Ok(highest)
    }

    async fn register(
        &self,
        name: &str,
        endpoint: &Path,
        versions: &[String],
        timeout: Duration,
    ) -> Result<()> {
        let highest = self.validate_versions("RegisterPlugin", name, versions)?;
        self.drivers.set(
            name,
            Driver {
                endpoint: endpoint.to_path_buf(),
                highest_supported_version: highest,
            },
        );
        let result = async {
            let client = CsiClient::connect(endpoint, timeout).await?;
            let info = client.node_get_info(timeout).await?;
            tracing::info!(
                driver = name,
                node_id = %info.node_id,
                max_volumes = info.max_volumes_per_node,
                topology_keys = info.topology.len(),
                "CSI driver registered"
            );
            nodeinfo::install_driver(self.host.as_ref(), name, &info).await
        }
        .await;
        if let Err(e) = &result {
            tracing::error!(driver = name, error = %e, "Registering CSI driver failed; unregistering it");
            if self.drivers.delete_if_endpoint(name, endpoint)
                && let Err(e) = nodeinfo::uninstall_driver(self.host.as_ref(), name).await
            {
                tracing::error!(driver = name, error = %e, "Unregistering CSI driver after a failed registration failed");
            }
        }
        result
    }
}

/// Go's `%q` of a `[]string`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

#[async_trait::async_trait]
impl PluginHandler for RegistrationHandler {
    async fn validate_plugin(&self, plugin: &PluginRegistration<'_>) -> Result<(), HandlerError> {
        self.validate_versions("ValidatePlugin", plugin.name, plugin.versions)
            .map(|_| ())
            .map_err(|e| {
                HandlerError::new(format!(
                    "validation failed for CSI Driver {} at endpoint {}: {e}",
                    plugin.name,
                    plugin.endpoint.display()
                ))
            })
    }

    async fn register_plugin(
        &self,
        plugin: &PluginRegistration<'_>,
        timeout: Duration,
    ) -> Result<(), HandlerError> {
        self.register(plugin.name, plugin.endpoint, plugin.versions, timeout)
            .await
            .map_err(HandlerError::new)
    }

    async fn deregister_plugin(&self, name: &str, endpoint: &Path) {
        tracing::info!(driver = name, endpoint = %endpoint.display(), "CSI driver deregistered");
        if !self.drivers.delete_if_endpoint(name, endpoint) {
            return;
        }
        if let Err(e) = nodeinfo::uninstall_driver(self.host.as_ref(), name).await {
            tracing::error!(driver = name, error = %e, "Removing CSI driver from the node failed");
        }
    }
}
