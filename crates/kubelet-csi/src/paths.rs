//! Upstream's on-disk layout of CSI volumes (`csi_attacher.go`
//! `makeDeviceMountPath`, `csi_mounter.go` `getTargetPath`, `csi_block.go`,
//! `csi_util.go` `saveVolumeData`/`loadVolumeData`) and the names derived
//! by hashing (`getAttachmentName`, `makeVolumeHandle`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The plugin's name (upstream `CSIPluginName`).
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";
/// The plugin's name escaped for a path (`/` becomes `~`).
pub const CSI_PLUGIN_DIR_NAME: &str = "kubernetes.io~csi";
/// The volume metadata file (upstream `volDataFileName`).
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// The last element of a staging path (upstream `globalMountInGlobalPath`).
pub const GLOBAL_MOUNT: &str = "globalmount";

/// Keys of `vol_data.json` (upstream `volDataKey`).
pub mod keys {
    /// The spec name: the PV name, or the pod's volume name for inline volumes.
    pub const SPEC_VOL_ID: &str = "specVolID";
    /// The CSI volume handle.
    pub const VOLUME_HANDLE: &str = "volumeHandle";
    /// The CSI driver name.
    pub const DRIVER_NAME: &str = "driverName";
    /// This node's name.
    pub const NODE_NAME: &str = "nodeName";
    /// The VolumeAttachment name.
    pub const ATTACHMENT_ID: &str = "attachmentID";
    /// `Persistent` or `Ephemeral`.
    pub const VOLUME_LIFECYCLE_MODE: &str = "volumeLifecycleMode";
    /// The SELinux context the volume was mounted with.
    pub const SELINUX_MOUNT_CONTEXT: &str = "seLinuxMountContext";
}

/// Lower-case hex of the SHA-256 of `s`.
pub fn sha256_hex(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The VolumeAttachment name: `csi-<sha256(handle + driver + node)>`.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!(
        "csi-{}",
        sha256_hex(&format!("{volume_handle}{driver}{node}"))
    )
}

/// The handle of an inline ephemeral volume: `csi-<sha256(podUID + volume name)>`.
pub fn ephemeral_volume_handle(pod_uid: &str, volume_name: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{pod_uid}{volume_name}")))
}

/// Upstream `EscapeQualifiedName`: `/` becomes `~`.
pub fn escape_qualified_name(name: &str) -> String {
    name.replace('/', "~")
}

/// Where a kubelet keeps CSI volumes, from its `--root-dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// A layout under `root_dir` (e.g. `/var/lib/kubelet`).
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root: root_dir.into(),
        }
    }

    /// `<root>/plugins/kubernetes.io/csi`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.root.join("plugins").join(CSI_PLUGIN_NAME)
    }

    /// The staging path of a filesystem volume:
    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
    pub fn device_mount_path(&self, driver: &str, volume_handle: &str) -> PathBuf {
        self.plugin_dir()
            .join(driver)
            .join(sha256_hex(volume_handle))
            .join(GLOBAL_MOUNT)
    }

    /// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<spec name>`: holds
    /// `vol_data.json` and the `mount` target.
    pub fn pod_volume_dir(&self, pod_uid: &str, spec_name: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join(CSI_PLUGIN_DIR_NAME)
            .join(escape_qualified_name(spec_name))
    }

    /// The publish target of a filesystem volume (upstream `GetCSIMounterPath`).
    pub fn target_path(&self, pod_uid: &str, spec_name: &str) -> PathBuf {
        self.pod_volume_dir(pod_uid, spec_name).join("mount")
    }

    /// `<root>/pods/<uid>/volumes/kubernetes.io~csi`: every CSI volume of a pod.
    pub fn pod_csi_dir(&self, pod_uid: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join(CSI_PLUGIN_DIR_NAME)
    }

    /// `<root>/plugins/kubernetes.io/csi/volumeDevices`.
    pub fn volume_devices_dir(&self) -> PathBuf {
        self.plugin_dir().join("volumeDevices")
    }

    /// Block staging path: `.../volumeDevices/staging/<spec name>`.
    pub fn block_staging_path(&self, spec_name: &str) -> PathBuf {
        self.volume_devices_dir().join("staging").join(spec_name)
    }

    /// Block publish directory: `.../volumeDevices/publish/<spec name>`.
    pub fn block_publish_dir(&self, spec_name: &str) -> PathBuf {
        self.volume_devices_dir().join("publish").join(spec_name)
    }

    /// Block publish target, a file: `.../volumeDevices/publish/<spec name>/<pod uid>`.
    pub fn block_publish_path(&self, spec_name: &str, pod_uid: &str) -> PathBuf {
        self.block_publish_dir(spec_name).join(pod_uid)
    }

    /// Block metadata directory: `.../volumeDevices/<spec name>/data`.
    pub fn block_data_dir(&self, spec_name: &str) -> PathBuf {
        self.volume_devices_dir().join(spec_name).join("data")
    }

    /// The global map directory of a block volume (upstream
    /// `GetGlobalMapPath`): `.../volumeDevices/<spec name>/dev`, holding one
    /// bind mount of the published device per pod, named by its UID.
    pub fn block_global_map_dir(&self, spec_name: &str) -> PathBuf {
        self.volume_devices_dir().join(spec_name).join("dev")
    }

    /// `<root>/pods/<uid>/volumeDevices/kubernetes.io~csi` (upstream
    /// `GetPodDeviceMapPath`'s directory).
    pub fn pod_device_map_dir(&self, pod_uid: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(pod_uid)
            .join("volumeDevices")
            .join(CSI_PLUGIN_DIR_NAME)
    }

    /// The pod's link to its published block device:
    /// `<root>/pods/<uid>/volumeDevices/kubernetes.io~csi/<spec name>`.
    pub fn pod_device_map_path(&self, pod_uid: &str, spec_name: &str) -> PathBuf {
        self.pod_device_map_dir(pod_uid)
            .join(escape_qualified_name(spec_name))
    }
}

/// Writes `vol_data.json` in `dir` (a JSON object of strings, as upstream's encoder).
pub async fn save_volume_data(dir: &Path, data: &BTreeMap<String, String>) -> Result<()> {
    let path = dir.join(VOL_DATA_FILE);
    let mut body = serde_json::to_vec(data).map_err(|source| Error::VolData {
        path: path.clone(),
        source,
    })?;
    body.push(b'\n');
    tokio::fs::write(&path, body)
        .await
        .map_err(Error::io("failed to save volume data file", &path))
}

/// Reads `vol_data.json` from `dir`.
pub async fn load_volume_data(dir: &Path) -> Result<BTreeMap<String, String>> {
    let path = dir.join(VOL_DATA_FILE);
    let body = tokio::fs::read(&path)
        .await
        .map_err(Error::io("failed to open volume data file", &path))?;
    serde_json::from_slice(&body).map_err(|source| Error::VolData { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_names_are_upstreams() {
        // sha256("") is well known; the hash is over the plain concatenation.
        assert_eq!(
            sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            attachment_name("h", "d", "n"),
            format!("csi-{}", sha256_hex("hdn"))
        );
        assert_eq!(
            ephemeral_volume_handle("uid", "vol"),
            format!("csi-{}", sha256_hex("uidvol"))
        );
    }

    #[test]
    fn layout_paths() {
        let l = Layout::new("/var/lib/kubelet");
        assert_eq!(
            l.device_mount_path("hostpath.csi.k8s.io", "vol-1"),
            PathBuf::from(format!(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/{}/globalmount",
                sha256_hex("vol-1")
            ))
        );
        assert_eq!(
            l.target_path("uid-1", "pv-1"),
            PathBuf::from("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount")
        );
        assert_eq!(
            l.block_publish_path("pv-1", "uid-1"),
            PathBuf::from(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid-1"
            )
        );
        assert_eq!(
            l.block_global_map_dir("pv-1"),
            PathBuf::from("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv-1/dev")
        );
        assert_eq!(
            l.pod_device_map_path("uid-1", "pv-1"),
            PathBuf::from("/var/lib/kubelet/pods/uid-1/volumeDevices/kubernetes.io~csi/pv-1")
        );
    }

    #[tokio::test]
    async fn vol_data_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut data = BTreeMap::new();
        data.insert(keys::DRIVER_NAME.to_string(), "d".to_string());
        save_volume_data(dir.path(), &data).await.expect("save");
        let text = std::fs::read_to_string(dir.path().join(VOL_DATA_FILE)).expect("read");
        assert_eq!(text, "{\"driverName\":\"d\"}\n");
        assert_eq!(load_volume_data(dir.path()).await.expect("load"), data);
    }
}
