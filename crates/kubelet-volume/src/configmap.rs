//! ConfigMap volumes (upstream `pkg/volume/configmap`): the ConfigMap's
//! keys, or the chosen `items`, projected by the [`AtomicWriter`] into a
//! directory on disk (upstream wraps a disk-backed emptyDir).
//!
//! `set_up` is idempotent and is called again to refresh the content when
//! the ConfigMap changes. Ownership for `fsGroup` is not applied here: the
//! caller applies it to the volume directory after `set_up`.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, Pod};

use crate::atomic_writer::{AtomicWriter, FileProjection, Payload, blocking};
use crate::plugin::names;
use crate::{Error, MountedVolume, Result, SetUpRequest, VolumeHost};

/// The API's default `defaultMode` (0644), used when a pod was not defaulted.
pub const DEFAULT_MODE: i32 = 0o644;

/// Sets up the ConfigMap volume `req.volume` in
/// `<pod>/volumes/kubernetes.io~configmap/<name>` (upstream `SetUpAt`).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let source =
        req.volume.config_map.as_ref().ok_or_else(|| {
            Error::Invalid("Spec does not reference a ConfigMap volume type".into())
        })?;
    let pod = req.pod;
    let namespace = kubelet_types::pod::namespace(pod);
    let dir = req.dir(names::CONFIG_MAP);
    tracing::debug!(
        "Setting up volume {} for pod {} at {}",
        req.volume.name,
        kubelet_types::pod::uid(pod),
        dir.display()
    );
    let optional = source.optional.unwrap_or(false);
    let config_map = match host.get_config_map(namespace, &source.name).await {
        Ok(cm) => cm,
        Err(e) if e.is_not_found() && optional => ConfigMap::default(),
        Err(e) => {
            tracing::error!("Couldn't get configMap {namespace}/{}: {e}", source.name);
            return Err(e.into());
        }
    };
    tracing::debug!(
        "Received configMap {namespace}/{} containing ({}) pieces of data, {} total bytes",
        source.name,
        config_map.data.as_ref().map_or(0, |d| d.len())
            + config_map.binary_data.as_ref().map_or(0, |d| d.len()),
        total_bytes(&config_map)
    );
    let payload = make_payload(
        source.items.as_deref(),
        &config_map,
        source.default_mode,
        optional,
    )?;
    set_up_disk_dir(&dir).await?;
    mark_wrapped_ready(&req).await?;
    populate(&req, names::CONFIG_MAP, pod, &dir, payload).await?;
    Ok(mounted(&req, names::CONFIG_MAP, dir))
}

/// The ConfigMap's files (upstream `MakePayload`): every key of `data` and
/// `binaryData` with `default_mode`, or only the `items` (each with its own
/// mode or `default_mode`). A missing item key is skipped when `optional`,
/// and is upstream's error otherwise.
pub fn make_payload(
    items: Option<&[KeyToPath]>,
    config_map: &ConfigMap,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload> {
    let default_mode = file_mode(default_mode.unwrap_or(DEFAULT_MODE));
    let data = config_map.data.as_ref();
    let binary = config_map.binary_data.as_ref();
    let mut payload = Payload::new();
    match items {
        None | Some([]) => {
            for (key, value) in data.into_iter().flatten() {
                payload.insert(key.clone(), file(value.as_bytes().to_vec(), default_mode));
            }
            for (key, value) in binary.into_iter().flatten() {
                payload.insert(key.clone(), file(value.0.clone(), default_mode));
            }
        }
        Some(items) => {
            for item in items {
                let content = if let Some(v) = data.and_then(|d| d.get(&item.key)) {
                    v.as_bytes().to_vec()
                } else if let Some(v) = binary.and_then(|d| d.get(&item.key)) {
                    v.0.clone()
                } else if optional {
                    continue;
                } else {
                    return Err(Error::Invalid(format!(
                        "configmap references non-existent config key: {}",
                        item.key
                    )));
                };
                let mode = item.mode.map_or(default_mode, file_mode);
                payload.insert(item.path.clone(), file(content, mode));
            }
        }
    }
    Ok(payload)
}

/// Bytes of data in the ConfigMap (logged, as upstream).
fn total_bytes(cm: &ConfigMap) -> usize {
    cm.data
        .iter()
        .flatten()
        .map(|(_, v)| v.len())
        .sum::<usize>()
        + cm.binary_data
            .iter()
            .flatten()
            .map(|(_, v)| v.0.len())
            .sum::<usize>()
}

/// A file of `data` with `mode` and no owner change.
pub(crate) fn file(data: Vec<u8>, mode: u32) -> FileProjection {
    FileProjection {
        data,
        mode,
        fs_user: None,
    }
}

/// An API mode (an `int32` the apiserver keeps within 0..=0777) as
/// permission bits.
pub(crate) fn file_mode(mode: i32) -> u32 {
    u32::try_from(mode).unwrap_or(0) & 0o777
}

/// The directory of a disk-backed wrapped emptyDir: created with mode 0777
/// whatever the umask (upstream `emptyDir.setupDir`).
pub(crate) async fn set_up_disk_dir(dir: &Path) -> Result<()> {
    let dir = dir.to_path_buf();
    blocking(move || {
        std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
            .map_err(Error::io("chmod", &dir))
    })
    .await
}

/// Marks the wrapped emptyDir of `req.volume` ready, as upstream's wrapper
/// does once it is set up: `<pod>/plugins/kubernetes.io~empty-dir/
/// wrapped_<volume>/ready` (directory 0750, file 0600; `tear_down` removes
/// it).
pub(crate) async fn mark_wrapped_ready(req: &SetUpRequest<'_>) -> Result<()> {
    let meta = crate::emptydir::meta_dir(
        req.pods_dir,
        kubelet_types::pod::uid(req.pod),
        &format!("wrapped_{}", req.volume.name),
    );
    blocking(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&meta)
            .map_err(Error::io("create directory", &meta))?;
        let ready = meta.join("ready");
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&ready)
            .map_err(Error::io("create", &ready))?;
        std::fs::set_permissions(&ready, std::fs::Permissions::from_mode(0o600))
            .map_err(Error::io("chmod", &ready))
    })
    .await
}

/// Creates, inside the volume directory `dir`, the directories that other
/// volumes are mounted on when a container mounts them beneath this volume
/// `name` (upstream `MakeNestedMountpoints`), so the runtime need not create
/// them in a read-only mount. Only the outermost nested mount point counts.
async fn make_nested_mountpoints(pod: &Pod, name: &str, dir: &Path) -> Result<()> {
    let nested = nested_mountpoints(pod, name)?;
    if nested.is_empty() {
        return Ok(());
    }
    let dir = dir.to_path_buf();
    blocking(move || {
        for n in nested {
            let d = dir.join(n);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&d)
                .map_err(Error::io("create directory", &d))?;
        }
        Ok(())
    })
    .await
}

/// Upstream `getNestedMountpoints`: for every container (init, app,
/// ephemeral) mounting volume `name`, the other mount points directly
/// beneath it, relative to it.
fn nested_mountpoints(pod: &Pod, name: &str) -> Result<Vec<String>> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let mounts = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| c.volume_mounts.as_deref().unwrap_or_default())
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| c.volume_mounts.as_deref().unwrap_or_default()),
        );
    let mut out = Vec::new();
    for mounts in mounts {
        let mut all: Vec<String> = mounts.iter().map(|m| clean(&m.mount_path)).collect();
        all.sort();
        for mine in mounts.iter().filter(|m| m.name == name) {
            let mine = clean(&mine.mount_path);
            if mine.starts_with("../") {
                return Err(Error::Invalid(format!(
                    "invalid container mount point {mine}"
                )));
            }
            let prefix = format!("{mine}/");
            let mut previous: Option<String> = None;
            for mp in all.iter().filter(|mp| mp.starts_with(&prefix)) {
                if previous
                    .as_ref()
                    .is_some_and(|p| mp.starts_with(p.as_str()))
                {
                    continue;
                }
                previous = Some(format!("{mp}/"));
                out.push(mp[prefix.len()..].to_string());
            }
        }
    }
    Ok(out)
}

pub(crate) use kubelet_types::path::clean;

/// Fills the set-up volume directory `dir`: nested mount points, then
/// `payload` through the atomic writer. On failure a volume set up for the
/// first time is torn down again (upstream's deferred clean-up once the
/// wrapped emptyDir is set up) and the error returned. A volume that
/// already holds a payload (an update for a running pod) is kept as it is:
/// upstream tears it down as well, so a full disk took a running pod's
/// files away; the atomic writer never touched them, and they stay until
/// an update succeeds.
pub(crate) async fn populate(
    req: &SetUpRequest<'_>,
    plugin: &'static str,
    pod: &Pod,
    dir: &Path,
    payload: Payload,
) -> Result<()> {
    let name = &req.volume.name;
    let populated = tokio::fs::symlink_metadata(dir.join(crate::atomic_writer::DATA_DIR_NAME))
        .await
        .is_ok();
    let res = match make_nested_mountpoints(pod, name, dir).await {
        Ok(()) => write_payload(pod, name, dir, payload).await,
        Err(e) => Err(e),
    };
    if res.is_err()
        && !populated
        && let Err(e) = crate::plugin::tear_down(plugin, dir).await
    {
        tracing::error!("Error tearing down volume {name} with : {e}");
    }
    res
}

/// Writes `payload` into the volume directory `dir` of `pod`'s volume
/// `volume`, logging under upstream's writer context.
async fn write_payload(pod: &Pod, volume: &str, dir: &Path, payload: Payload) -> Result<()> {
    let context = format!(
        "pod {}/{} volume {volume}",
        kubelet_types::pod::namespace(pod),
        kubelet_types::pod::name(pod)
    );
    AtomicWriter::new(dir, context)
        .write(payload, None)
        .await
        .inspect_err(|e| tracing::error!("Error writing payload to dir: {e}"))
}

/// The [`MountedVolume`] of an API-backed volume: always mounted read-only
/// (upstream's `GetAttributes().ReadOnly`) and refreshed.
pub(crate) fn mounted(
    req: &SetUpRequest<'_>,
    plugin: &'static str,
    dir: std::path::PathBuf,
) -> MountedVolume {
    MountedVolume {
        name: req.volume.name.clone(),
        plugin,
        host_path: dir,
        read_only: true,
        refresh: true,
        block: false,
    }
}

#[cfg(test)]
pub(crate) mod tests;
