//! Plugin dispatch (upstream `VolumePluginMgr.FindPluginBySpec` and each
//! plugin's `NewMounter(...).SetUp`): which plugin serves a pod volume,
//! where its directory is, and setting it up or tearing it down.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::{Error, Result, VolumeHost};

/// Upstream plugin names, as they appear escaped (`/` → `~`) in paths.
pub mod names {
    /// `kubernetes.io/empty-dir`.
    pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
    /// `kubernetes.io/host-path` (no directory of its own).
    pub const HOST_PATH: &str = "kubernetes.io~host-path";
    /// `kubernetes.io/configmap`.
    pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
    /// `kubernetes.io/secret`.
    pub const SECRET: &str = "kubernetes.io~secret";
    /// `kubernetes.io/downward-api`.
    pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";
    /// `kubernetes.io/projected`.
    pub const PROJECTED: &str = "kubernetes.io~projected";
    /// `kubernetes.io/local-volume` (a PVC bound to a local PV).
    pub const LOCAL_VOLUME: &str = "kubernetes.io~local-volume";
}

/// What a set-up volume gives the containers that mount it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// The pod's name for the volume.
    pub name: String,
    /// The plugin's escaped name ([`names`]).
    pub plugin: &'static str,
    /// The host path containers bind-mount (the volume directory, or the
    /// hostPath / hostPath PV's path).
    pub host_path: PathBuf,
    /// Forced read-only (a PVC with `readOnly`, a read-only PV).
    pub read_only: bool,
    /// The content comes from apiserver objects or the pod itself and is
    /// rewritten when they change (configMap, secret, downwardAPI, projected).
    pub refresh: bool,
}

/// A request to set up one volume of one pod.
#[derive(Debug, Clone, Copy)]
pub struct SetUpRequest<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The volume, from `spec.volumes`.
    pub volume: &'a Volume,
    /// `<root-dir>/pods`.
    pub pods_dir: &'a Path,
}

impl SetUpRequest<'_> {
    /// `<root-dir>/pods/<uid>/volumes/<plugin>/<name>`.
    pub fn dir(&self, plugin: &str) -> PathBuf {
        volume_dir(
            self.pods_dir,
            kubelet_types::pod::uid(self.pod),
            plugin,
            &self.volume.name,
        )
    }

    /// The pod's `securityContext.fsGroup`.
    pub fn fs_group(&self) -> Option<i64> {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group)
    }
}

/// `<pods_dir>/<uid>/volumes/<plugin>/<name>`.
pub fn volume_dir(pods_dir: &Path, uid: &str, plugin: &str, name: &str) -> PathBuf {
    pods_dir.join(uid).join("volumes").join(plugin).join(name)
}

/// The plugin serving `v`, or [`Error::Unsupported`] naming its type.
pub fn plugin_for(v: &Volume) -> Result<&'static str> {
    use names::*;
    let unsupported = |kind: &str| Error::Unsupported {
        volume: v.name.clone(),
        kind: kind.to_string(),
    };
    Ok(if v.empty_dir.is_some() {
        EMPTY_DIR
    } else if v.host_path.is_some() {
        HOST_PATH
    } else if v.config_map.is_some() {
        CONFIG_MAP
    } else if v.secret.is_some() {
        SECRET
    } else if v.downward_api.is_some() {
        DOWNWARD_API
    } else if v.projected.is_some() {
        PROJECTED
    } else if v.persistent_volume_claim.is_some() {
        // Resolved to the bound PV's plugin by `pvc`.
        LOCAL_VOLUME
    } else {
        return Err(unsupported(&source_kind(v)));
    })
}

/// The name of the volume source field that is set (`csi`, `nfs`, ...).
pub fn source_kind(v: &Volume) -> String {
    let Ok(serde_json::Value::Object(m)) = serde_json::to_value(v) else {
        return "unknown".into();
    };
    m.keys()
        .find(|k| k.as_str() != "name")
        .cloned()
        .unwrap_or_else(|| "unknown".into())
}

/// Sets up `req.volume` (idempotent: called again to refresh content).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let _ = host;
    Err(Error::Unsupported {
        volume: req.volume.name.clone(),
        kind: source_kind(req.volume),
    })
}

/// Tears down the volume directory `dir` of plugin `plugin` (unmounting
/// first; never deleting through a mount).
pub async fn tear_down(plugin: &str, dir: &Path) -> Result<()> {
    let _ = (plugin, dir);
    Ok(())
}
