//! A container's mounts (upstream `kubelet_pods.go` `makeMounts`): each
//! `volumeMount` resolved against the pod's set-up volumes, with `subPath`
//! and `subPathExpr` made safe by `kubelet-volume`'s subpath code,
//! `readOnly` from the mount or the volume, `recursiveReadOnly` (upstream
//! `resolveRecursiveReadOnly`: `Enabled` on a runtime handler without
//! recursive read-only mounts fails the container, never mounts it merely
//! read-only), and `mountPropagation`.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod, VolumeMount};
use kubelet_types::pod;
use kubelet_volume::MountedVolume;
use tracing::error;

/// A container's mounts could not be made; the message is upstream's and
/// becomes the container's `CreateContainerConfigError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MountError(pub String);

/// Upstream `translateMountPropagation`, with the API's rule that only
/// privileged containers may use `Bidirectional`.
fn propagation(m: &VolumeMount, privileged: bool) -> Result<i32, MountError> {
    use pb::MountPropagation as P;
    Ok(match m.mount_propagation.as_deref() {
        None | Some("None") => P::PropagationPrivate as i32,
        Some("HostToContainer") => P::PropagationHostToContainer as i32,
        Some("Bidirectional") if privileged => P::PropagationBidirectional as i32,
        Some("Bidirectional") => {
            return Err(MountError(
                "Bidirectional mount propagation is available only to privileged containers".into(),
            ));
        }
        Some(other) => {
            return Err(MountError(format!(
                "invalid MountPropagation mode: {other:?}"
            )));
        }
    })
}

/// Upstream `resolveRecursiveReadOnly`: whether the mount is made
/// recursively read-only.
fn recursive_read_only(m: &VolumeMount, supports_rro: bool) -> Result<bool, String> {
    let mode = match m.recursive_read_only.as_deref() {
        None | Some("Disabled") => return Ok(false),
        Some(mode) => mode,
    };
    if !m.read_only.unwrap_or(false) {
        return Err(format!(
            "volume {:?} requested recursive read-only mode, but it is not read-only",
            m.name
        ));
    }
    if let Some(prop) = m.mount_propagation.as_deref().filter(|p| *p != "None") {
        return Err(format!(
            "volume {:?} requested recursive read-only mode, but it is not compatible with propagation {prop:?}",
            m.name
        ));
    }
    match mode {
        "IfPossible" => Ok(supports_rro),
        "Enabled" if supports_rro => Ok(true),
        "Enabled" => Err(format!(
            "volume {:?} requested recursive read-only mode, but it is not supported by the runtime",
            m.name
        )),
        other => Err(format!("unknown RecursiveReadOnly mode {other:?}")),
    }
}

/// Upstream `ExpandContainerVolumeMounts`: `$(VAR)` in `subPathExpr` from
/// the container's environment; a missing or empty variable is an error.
pub fn expand_subpath_expr(
    expr: &str,
    env: &HashMap<String, String>,
) -> Result<String, MountError> {
    let mut missing = BTreeSet::new();
    let out = kubelet_runtime::expansion::expand_with(expr, |name| {
        let v = env.get(name).cloned().unwrap_or_default();
        if v.is_empty() {
            missing.insert(name.to_string());
        }
        Some(v)
    });
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(MountError(format!(
            "missing value for {}",
            missing.into_iter().collect::<Vec<_>>().join(", ")
        )))
    }
}

/// Upstream `ValidatePathNoBacksteps`.
fn no_backsteps(p: &str) -> bool {
    !p.split('/').any(|part| part == "..")
}

/// The mounts of `c`: every `volumeMount` in order (upstream `makeMounts`,
/// without the `/etc/hosts` mount, which the caller adds).
pub async fn make_mounts(
    p: &Pod,
    c: &Container,
    volumes: &HashMap<String, MountedVolume>,
    env: &HashMap<String, String>,
    pods_dir: &Path,
    supports_rro: bool,
) -> Result<Vec<pb::Mount>, MountError> {
    let privileged = c
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    let mut out = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        // A raw block volume has no mounter (upstream `vol.Mounter == nil`).
        let Some(vol) = volumes.get(&m.name).filter(|v| !v.block) else {
            error!(volume = %m.name, "Could not find volume");
            return Err(MountError(format!(
                "cannot find volume {:?} to mount into container {:?}",
                m.name, c.name
            )));
        };
        let mut host_path = vol.host_path.clone();
        let mut sub = m.sub_path.clone().unwrap_or_default();
        if let Some(expr) = m.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            sub = expand_subpath_expr(expr, env)?;
        }
        if !sub.is_empty() {
            if sub.starts_with('/') {
                return Err(MountError(format!(
                    "error SubPath `{sub}` must not be an absolute path"
                )));
            }
            if !no_backsteps(&sub) {
                return Err(MountError(format!(
                    "unable to provision SubPath `{sub}`: must not contain '..'"
                )));
            }
            // The detailed error stays in the log: it would tell the user
            // about the host's file system.
            host_path = kubelet_volume::subpath::prepare_safe_subpath(
                &vol.host_path,
                &sub,
                pods_dir,
                pod::uid(p),
                &m.name,
                &c.name,
                i,
            )
            .await
            .map_err(|e| {
                error!(error = %e, container = %c.name, volume = %m.name, "Failed to prepare subPath for volumeMount of the container");
                MountError(format!(
                    "failed to prepare subPath for volumeMount {:?} of container {:?}",
                    m.name, c.name
                ))
            })?;
        }
        let rro = recursive_read_only(m, supports_rro)
            .map_err(|e| MountError(format!("failed to resolve recursive read-only mode: {e}")))?;
        out.push(pb::Mount {
            container_path: m.mount_path.clone(),
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: m.read_only.unwrap_or(false) || vol.read_only,
            recursive_read_only: rro,
            selinux_relabel: false,
            propagation: propagation(m, privileged)?,
            ..Default::default()
        });
    }
    Ok(out)
}

/// The raw block devices of `c` (upstream `makeBlockVolumes`): each
/// `volumeDevice` as the pod's link to its published device, read-write
/// (`mrw`) or read-only (`r`) as the volume was published.
pub fn make_block_devices(
    c: &Container,
    volumes: &HashMap<String, MountedVolume>,
) -> Result<Vec<pb::Device>, MountError> {
    let mut out = Vec::new();
    for d in c.volume_devices.iter().flatten() {
        if !d.device_path.starts_with('/') {
            return Err(MountError(format!(
                "error DevicePath `{}` must be an absolute path",
                d.device_path
            )));
        }
        let Some(vol) = volumes.get(&d.name).filter(|v| v.block) else {
            error!(volume = %d.name, container = %c.name, "Block volume cannot be satisfied for container, because the volume is missing or the volume mapper is nil");
            return Err(MountError(format!(
                "cannot find volume {:?} to pass into container {:?}",
                d.name, c.name
            )));
        };
        out.push(pb::Device {
            container_path: d.device_path.clone(),
            host_path: vol.host_path.to_string_lossy().into_owned(),
            permissions: if vol.read_only { "r" } else { "mrw" }.into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn pod(mounts: serde_json::Value, privileged: bool) -> (Pod, Container) {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "securityContext": {"privileged": privileged},
                "volumeMounts": mounts}]}
        }))
        .expect("pod");
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        (p, c)
    }

    fn vol(path: &Path, read_only: bool) -> MountedVolume {
        MountedVolume {
            name: "v".into(),
            plugin: kubelet_volume::plugin::names::EMPTY_DIR,
            host_path: path.to_path_buf(),
            read_only,
            refresh: false,
            block: false,
        }
    }

    #[tokio::test]
    async fn block_volumes_are_devices_never_mounts() {
        let (p, mut c) = pod(
            serde_json::json!([{"name": "blk", "mountPath": "/a"}]),
            false,
        );
        let mut blk = vol(
            Path::new("/k/pods/u/volumeDevices/kubernetes.io~csi/pv"),
            false,
        );
        blk.block = true;
        let vols = HashMap::from([("blk".to_string(), blk.clone())]);
        let err = make_mounts(&p, &c, &vols, &HashMap::new(), Path::new("/k/pods"), false)
            .await
            .expect_err("a block volume has no mounter");
        assert_eq!(
            err.0,
            "cannot find volume \"blk\" to mount into container \"c\""
        );
        c.volume_mounts = None;
        c.volume_devices = Some(vec![k8s_openapi::api::core::v1::VolumeDevice {
            name: "blk".into(),
            device_path: "/dev/xvda".into(),
        }]);
        let devices = make_block_devices(&c, &vols).expect("devices");
        assert_eq!(
            devices,
            vec![pb::Device {
                container_path: "/dev/xvda".into(),
                host_path: "/k/pods/u/volumeDevices/kubernetes.io~csi/pv".into(),
                permissions: "mrw".into(),
            }]
        );
        blk.read_only = true;
        let ro = HashMap::from([("blk".to_string(), blk)]);
        assert_eq!(
            make_block_devices(&c, &ro).expect("devices")[0].permissions,
            "r"
        );
        // A filesystem volume cannot be a device.
        let fs = HashMap::from([("blk".to_string(), vol(Path::new("/x"), false))]);
        assert_eq!(
            make_block_devices(&c, &fs).expect_err("not block").0,
            "cannot find volume \"blk\" to pass into container \"c\""
        );
        c.volume_devices = Some(vec![k8s_openapi::api::core::v1::VolumeDevice {
            name: "blk".into(),
            device_path: "dev/xvda".into(),
        }]);
        assert_eq!(
            make_block_devices(&c, &ro).expect_err("relative").0,
            "error DevicePath `dev/xvda` must be an absolute path"
        );
    }

    #[tokio::test]
    async fn mounts_carry_paths_read_only_and_propagation() {
        let dir = tempfile::tempdir().expect("tmp");
        let (p, c) = pod(
            serde_json::json!([
                {"name": "a", "mountPath": "/a", "readOnly": true},
                {"name": "b", "mountPath": "/b", "mountPropagation": "HostToContainer"}
            ]),
            false,
        );
        let vols = HashMap::from([
            ("a".to_string(), vol(&dir.path().join("a"), false)),
            ("b".to_string(), vol(&dir.path().join("b"), true)),
        ]);
        let m = make_mounts(&p, &c, &vols, &HashMap::new(), dir.path(), false)
            .await
            .expect("mounts");
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].container_path, "/a");
        assert!(m[0].readonly, "readOnly from the mount");
        assert!(m[1].readonly, "readOnly from the volume (a read-only PVC)");
        assert_eq!(
            m[1].propagation,
            pb::MountPropagation::PropagationHostToContainer as i32
        );
        assert_eq!(m[0].host_path, dir.path().join("a").to_string_lossy());
    }

    #[tokio::test]
    async fn bidirectional_is_only_for_privileged_containers() {
        let dir = tempfile::tempdir().expect("tmp");
        let mounts = serde_json::json!([{"name": "a", "mountPath": "/a", "mountPropagation": "Bidirectional"}]);
        let vols = HashMap::from([("a".to_string(), vol(dir.path(), false))]);
        let (p, c) = pod(mounts.clone(), false);
        let err = make_mounts(&p, &c, &vols, &HashMap::new(), dir.path(), false)
            .await
            .expect_err("refused");
        assert_eq!(
            err.0,
            "Bidirectional mount propagation is available only to privileged containers"
        );
        let (p, c) = pod(mounts, true);
        let m = make_mounts(&p, &c, &vols, &HashMap::new(), dir.path(), false)
            .await
            .expect("privileged");
        assert_eq!(
            m[0].propagation,
            pb::MountPropagation::PropagationBidirectional as i32
        );
    }

    #[tokio::test]
    async fn a_missing_volume_and_bad_subpaths_get_upstreams_messages() {
        let dir = tempfile::tempdir().expect("tmp");
        let vols = HashMap::from([("a".to_string(), vol(dir.path(), false))]);
        let cases = [
            (
                serde_json::json!([{"name": "x", "mountPath": "/x"}]),
                "cannot find volume \"x\" to mount into container \"c\"",
            ),
            (
                serde_json::json!([{"name": "a", "mountPath": "/a", "subPath": "/etc"}]),
                "error SubPath `/etc` must not be an absolute path",
            ),
            (
                serde_json::json!([{"name": "a", "mountPath": "/a", "subPath": "x/../.."}]),
                "unable to provision SubPath `x/../..`: must not contain '..'",
            ),
            (
                serde_json::json!([{"name": "a", "mountPath": "/a", "subPathExpr": "$(POD)/$(NODE)"}]),
                "missing value for NODE, POD",
            ),
        ];
        for (mounts, want) in cases {
            let (p, c) = pod(mounts, false);
            let err = make_mounts(&p, &c, &vols, &HashMap::new(), dir.path(), false)
                .await
                .expect_err(want);
            assert_eq!(err.0, want);
        }
    }

    #[tokio::test]
    async fn subpath_expr_expands_from_the_environment_into_a_safe_bind_mount() {
        let dir = tempfile::tempdir().expect("tmp");
        let volume = dir.path().join("vol");
        std::fs::create_dir_all(&volume).expect("mkdir");
        let vols = HashMap::from([("a".to_string(), vol(&volume, false))]);
        let (p, c) = pod(
            serde_json::json!([{"name": "a", "mountPath": "/logs", "subPathExpr": "$(POD_NAME)"}]),
            false,
        );
        let env = HashMap::from([("POD_NAME".to_string(), "web-1".to_string())]);
        let pods_dir = dir.path().join("pods");
        let m = make_mounts(&p, &c, &vols, &env, &pods_dir, false)
            .await
            .expect("mounts");
        assert_eq!(
            PathBuf::from(&m[0].host_path),
            pods_dir.join("u1/volume-subpaths/a/c/0")
        );
        assert!(
            volume.join("web-1").is_dir(),
            "the subPath directory is created"
        );
        kubelet_volume::subpath::clean_subpaths(&pods_dir, "u1")
            .await
            .expect("clean");
    }

    /// Issue 28: `recursiveReadOnly` as upstream's `resolveRecursiveReadOnly`
    /// (the texts of `test/e2e_node/mount_rro_linux_test.go`); `Enabled` on
    /// a runtime without support fails the container, never mounts it
    /// merely read-only.
    #[tokio::test]
    async fn recursive_read_only_as_upstream() {
        let dir = tempfile::tempdir().expect("tmp");
        let vols = HashMap::from([("mnt".to_string(), vol(dir.path(), false))]);
        let mounts = |spec: serde_json::Value| pod(serde_json::json!([spec]), false);
        let run = |p: Pod, c: Container, rro: bool| {
            let vols = vols.clone();
            let dir = dir.path().to_path_buf();
            async move { make_mounts(&p, &c, &vols, &HashMap::new(), &dir, rro).await }
        };
        let (p, c) = mounts(serde_json::json!(
            {"name": "mnt", "mountPath": "/mnt", "readOnly": true, "recursiveReadOnly": "Enabled"}));
        assert_eq!(
            run(p.clone(), c.clone(), false)
                .await
                .expect_err("refused")
                .0,
            "failed to resolve recursive read-only mode: volume \"mnt\" requested recursive read-only mode, but it is not supported by the runtime"
        );
        let m = run(p, c, true).await.expect("supported");
        assert!(m[0].readonly && m[0].recursive_read_only);

        let (p, c) = mounts(serde_json::json!(
            {"name": "mnt", "mountPath": "/mnt", "readOnly": true, "recursiveReadOnly": "IfPossible"}));
        let m = run(p.clone(), c.clone(), false).await.expect("falls back");
        assert!(m[0].readonly && !m[0].recursive_read_only);
        let m = run(p, c, true).await.expect("supported");
        assert!(m[0].recursive_read_only);

        let (p, c) = mounts(serde_json::json!(
            {"name": "mnt", "mountPath": "/mnt", "recursiveReadOnly": "IfPossible"}));
        assert!(
            run(p, c, true)
                .await
                .expect_err("not read-only")
                .0
                .ends_with(
                    "volume \"mnt\" requested recursive read-only mode, but it is not read-only"
                )
        );
        let (p, c) = mounts(serde_json::json!(
            {"name": "mnt", "mountPath": "/mnt", "readOnly": true, "recursiveReadOnly": "Enabled",
             "mountPropagation": "HostToContainer"}));
        assert!(run(p, c, true).await.expect_err("propagation").0.ends_with(
            "volume \"mnt\" requested recursive read-only mode, but it is not compatible with propagation \"HostToContainer\""
        ));
        let (p, c) = mounts(serde_json::json!(
            {"name": "mnt", "mountPath": "/mnt", "readOnly": true, "recursiveReadOnly": "Disabled"}));
        let m = run(p, c, true).await.expect("disabled");
        assert!(m[0].readonly && !m[0].recursive_read_only);
    }
}
