//! Raw block CSI volumes on the node (upstream `util.MapBlockVolume` and
//! `UnmapBlockVolume` as the operation generator runs them for the CSI
//! plugin's `csiBlockMapper`): the device the driver published for a pod is
//! bind-mounted into the volume's global map directory
//! (`plugins/kubernetes.io/csi/volumeDevices/<spec>/dev/<pod uid>`), which
//! keeps it visible as long as a pod uses it, and linked from the pod's
//! device map path (`pods/<uid>/volumeDevices/kubernetes.io~csi/<spec>`),
//! the host path containers get as a device. Also upstream's check that a
//! block volume is used through `volumeDevices` and a filesystem one
//! through `volumeMounts` (the desired state populator's `createVolumeSpec`).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_csi::paths::Layout;
use kubelet_volume::mount;

/// The `volumeMode` of a claim's PersistentVolume used the wrong way by a
/// container: upstream's refusal.
pub(super) fn check_volume_mode(pod: &Pod, volume: &Volume, block: bool) -> Result<(), String> {
    let containers = pod.spec.as_ref().into_iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    });
    let (mut mounted, mut mapped) = (false, false);
    for c in containers {
        mounted |= c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == volume.name);
        mapped |= c
            .volume_devices
            .iter()
            .flatten()
            .any(|d| d.name == volume.name);
    }
    if block && mounted {
        return Err(format!(
            "volume {} has volumeMode Block, but is specified in volumeMounts",
            volume.name
        ));
    }
    if !block && mapped {
        return Err(format!(
            "volume {} has volumeMode Filesystem, but is specified in volumeDevices",
            volume.name
        ));
    }
    Ok(())
}

/// Whether `dir` is a pod's block device link
/// (`.../pods/<uid>/volumeDevices/kubernetes.io~csi/<spec>`).
pub(super) fn is_block_link(dir: &Path) -> bool {
    dir.ancestors()
        .nth(2)
        .and_then(Path::file_name)
        .is_some_and(|n| n == "volumeDevices")
}

fn io(what: &str, path: &Path, e: std::io::Error) -> kubelet_volume::Error {
    kubelet_volume::Error::Invalid(format!("{what} {}: {e}", path.display()))
}

fn joined(e: tokio::task::JoinError) -> kubelet_volume::Error {
    kubelet_volume::Error::Invalid(format!("block volume mapping task failed: {e}"))
}

/// Maps the device published at `device` for pod `uid`'s volume `spec`:
/// the global map bind mount and the pod's link, both kept when already
/// in place. Returns the link.
pub(super) async fn map(
    layout: &Layout,
    uid: &str,
    spec: &str,
    device: &Path,
) -> Result<PathBuf, kubelet_volume::Error> {
    let global = layout.block_global_map_dir(spec).join(uid);
    let link = layout.pod_device_map_path(uid, spec);
    let device = device.to_path_buf();
    let out = link.clone();
    tokio::task::spawn_blocking(move || map_blocking(&device, &global, &link))
        .await
        .map_err(joined)??;
    Ok(out)
}

fn map_blocking(device: &Path, global: &Path, link: &Path) -> Result<(), kubelet_volume::Error> {
    for dir in [global.parent(), link.parent()].into_iter().flatten() {
        std::fs::create_dir_all(dir).map_err(|e| io("failed to create", dir, e))?;
    }
    if std::fs::symlink_metadata(global).is_err() {
        std::fs::File::create(global).map_err(|e| io("failed to create", global, e))?;
    }
    if !mount::is_mount_point_blocking(global)? {
        mount::bind_mount_blocking(device, global, false)?;
    }
    match std::fs::read_link(link) {
        Ok(to) if to == device => return Ok(()),
        Ok(_) => std::fs::remove_file(link).map_err(|e| io("failed to remove", link, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("failed to read the link", link, e)),
    }
    std::os::unix::fs::symlink(device, link).map_err(|e| io("failed to link", link, e))
}

/// Undoes [`map`] for pod `uid`'s volume `spec`: the link, then the global
/// map bind mount; what is already gone is no error.
pub(super) async fn unmap(
    layout: &Layout,
    uid: &str,
    spec: &str,
) -> Result<(), kubelet_volume::Error> {
    let global = layout.block_global_map_dir(spec).join(uid);
    let link = layout.pod_device_map_path(uid, spec);
    tokio::task::spawn_blocking(move || unmap_blocking(&global, &link))
        .await
        .map_err(joined)?
}

fn unmap_blocking(global: &Path, link: &Path) -> Result<(), kubelet_volume::Error> {
    let gone = |r: std::io::Result<()>, what: &str, p: &Path| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(what, p, e)),
        _ => Ok(()),
    };
    gone(std::fs::remove_file(link), "failed to remove", link)?;
    if std::fs::symlink_metadata(global).is_ok() {
        if mount::is_mount_point_blocking(global)? {
            mount::unmount_blocking(global)?;
        }
        gone(std::fs::remove_file(global), "failed to remove", global)?;
    }
    // Empty directories go too (others still in use stay).
    for dir in [global.parent(), link.parent()].into_iter().flatten() {
        let _ = std::fs::remove_dir(dir);
    }
    if let Some(pod_dir) = link.parent().and_then(Path::parent) {
        let _ = std::fs::remove_dir(pod_dir);
    }
    Ok(())
}

/// A block volume of a pod found on disk after a restart.
pub(super) struct FoundBlock {
    /// The spec name.
    pub spec: String,
    /// The CSI driver.
    pub driver: String,
    /// The volume handle.
    pub handle: String,
    /// Still published for the pod.
    pub published: bool,
}

/// The block volumes of pod `uid` on disk (upstream reconstructs them from
/// the pod's device map path and the volume's `vol_data.json`).
pub(super) async fn reconstruct(layout: &Layout, uid: &str) -> Vec<FoundBlock> {
    let dir = layout.pod_device_map_dir(uid);
    let Ok(mut rd) = tokio::fs::read_dir(&dir).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Ok(Some(e)) = rd.next_entry().await {
        let spec = e.file_name().to_string_lossy().into_owned();
        let Ok(data) = kubelet_csi::paths::load_volume_data(&layout.block_data_dir(&spec)).await
        else {
            continue;
        };
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let published = mount::is_mount_point(&layout.block_publish_path(&spec, uid))
            .await
            .unwrap_or(false);
        out.push(FoundBlock {
            driver: get(kubelet_csi::paths::keys::DRIVER_NAME),
            handle: get(kubelet_csi::paths::keys::VOLUME_HANDLE),
            spec,
            published,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(mounts: bool, devices: bool) -> Pod {
        let mut c = json!({"name": "c", "image": "i"});
        if mounts {
            c["volumeMounts"] = json!([{"name": "v", "mountPath": "/data"}]);
        }
        if devices {
            c["volumeDevices"] = json!([{"name": "v", "devicePath": "/dev/xvda"}]);
        }
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [c]}}))
            .expect("pod")
    }

    #[test]
    fn block_volumes_go_through_volume_devices_only() {
        let v = Volume {
            name: "v".into(),
            ..Default::default()
        };
        assert_eq!(check_volume_mode(&pod(false, true), &v, true), Ok(()));
        assert_eq!(
            check_volume_mode(&pod(true, false), &v, true),
            Err("volume v has volumeMode Block, but is specified in volumeMounts".into())
        );
        assert_eq!(check_volume_mode(&pod(true, false), &v, false), Ok(()));
        assert_eq!(
            check_volume_mode(&pod(false, true), &v, false),
            Err("volume v has volumeMode Filesystem, but is specified in volumeDevices".into())
        );
    }

    #[test]
    fn links_are_recognised() {
        assert!(is_block_link(Path::new(
            "/var/lib/kubelet/pods/u/volumeDevices/kubernetes.io~csi/pv-1"
        )));
        assert!(!is_block_link(Path::new(
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv-1"
        )));
    }

    #[tokio::test]
    async fn map_and_unmap_leave_nothing_behind() {
        let root = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(root.path());
        // A regular file stands in for the published device.
        let device = root.path().join("published");
        std::fs::write(&device, b"x").expect("write");
        let link = map(&layout, "u", "pv-1", &device).await.expect("map");
        assert_eq!(link, layout.pod_device_map_path("u", "pv-1"));
        assert_eq!(std::fs::read_link(&link).expect("link"), device);
        let global = layout.block_global_map_dir("pv-1").join("u");
        assert!(mount::is_mount_point(&global).await.expect("mountinfo"));
        // Mapping again keeps what is there.
        map(&layout, "u", "pv-1", &device).await.expect("map again");
        unmap(&layout, "u", "pv-1").await.expect("unmap");
        assert!(std::fs::symlink_metadata(&link).is_err());
        assert!(!global.exists());
        assert!(!layout.block_global_map_dir("pv-1").exists());
        // Unmapping twice is fine.
        unmap(&layout, "u", "pv-1").await.expect("unmap again");
    }
}
