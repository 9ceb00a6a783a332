//! Secret volumes (upstream `pkg/volume/secret`): the Secret's keys, or the
//! chosen `items`, projected by the atomic writer into a tmpfs so that
//! secret data never reaches the node's disk (upstream wraps a
//! memory-backed emptyDir).
//!
//! `set_up` is idempotent (the tmpfs is mounted once) and is called again
//! to refresh the content when the Secret changes. Ownership for `fsGroup`
//! is applied by the caller after `set_up`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use k8s_openapi::api::core::v1::{KeyToPath, Pod, Secret};

use crate::atomic_writer::{Payload, blocking};
use crate::configmap::{DEFAULT_MODE, file, file_mode, mark_wrapped_ready, mounted, populate};
use crate::plugin::names;
use crate::{Error, MountedVolume, Result, SetUpRequest, VolumeHost};

/// Sets up the Secret volume `req.volume` in
/// `<pod>/volumes/kubernetes.io~secret/<name>` (upstream `SetUpAt`).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let source = req
        .volume
        .secret
        .as_ref()
        .ok_or_else(|| Error::Invalid("Spec does not reference a Secret volume type".into()))?;
    let pod = req.pod;
    let namespace = kubelet_types::pod::namespace(pod);
    let name = source.secret_name.as_deref().unwrap_or_default();
    let dir = req.dir(names::SECRET);
    tracing::debug!(
        "Setting up volume {} for pod {} at {}",
        req.volume.name,
        kubelet_types::pod::uid(pod),
        dir.display()
    );
    let optional = source.optional.unwrap_or(false);
    let secret = match host.get_secret(namespace, name).await {
        Ok(s) => s,
        Err(e) if e.is_not_found() && optional => Secret::default(),
        Err(e) => {
            tracing::error!("Couldn't get secret {namespace}/{name}: {e}");
            return Err(e.into());
        }
    };
    tracing::debug!(
        "Received secret {namespace}/{name} containing ({}) pieces of data, {} total bytes",
        secret.data.as_ref().map_or(0, |d| d.len()),
        secret
            .data
            .iter()
            .flatten()
            .map(|(_, v)| v.0.len())
            .sum::<usize>()
    );
    let payload = make_payload(
        source.items.as_deref(),
        &secret,
        source.default_mode,
        optional,
    )?;
    set_up_memory_dir(host, pod, &dir).await?;
    mark_wrapped_ready(&req).await?;
    populate(&req, names::SECRET, pod, &dir, payload).await?;
    Ok(mounted(&req, names::SECRET, dir))
}

/// The Secret's files (upstream `MakePayload`): every key of `data` with
/// `default_mode`, or only the `items`. A missing item key is skipped when
/// `optional`, and is upstream's error otherwise.
pub fn make_payload(
    items: Option<&[KeyToPath]>,
    secret: &Secret,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload> {
    let default_mode = file_mode(default_mode.unwrap_or(DEFAULT_MODE));
    let data = secret.data.as_ref();
    let mut payload = Payload::new();
    match items {
        None | Some([]) => {
            for (key, value) in data.into_iter().flatten() {
                payload.insert(key.clone(), file(value.0.clone(), default_mode));
            }
        }
        Some(items) => {
            for item in items {
                let Some(value) = data.and_then(|d| d.get(&item.key)) else {
                    if optional {
                        continue;
                    }
                    return Err(Error::Invalid(format!(
                        "references non-existent secret key: {}",
                        item.key
                    )));
                };
                let mode = item.mode.map_or(default_mode, file_mode);
                payload.insert(item.path.clone(), file(value.0.clone(), mode));
            }
        }
    }
    Ok(payload)
}

/// The directory of a memory-backed wrapped emptyDir (upstream
/// `emptyDir.setupTmpfs`): created with mode 0777, then a tmpfs mounted on
/// it once, sized as a Memory emptyDir without `sizeLimit` (upstream's
/// `calculateEmptyDirMemorySize`: node allocatable memory, or the pod's
/// memory limit when smaller), its root 1777 as a tmpfs mounted without a
/// mode option.
pub(crate) async fn set_up_memory_dir(host: &dyn VolumeHost, pod: &Pod, dir: &Path) -> Result<()> {
    let size = crate::emptydir::memory_size_limit(&host.node_allocatable(), pod, None)
        .and_then(|b| u64::try_from(b).ok());
    let d = dir.to_path_buf();
    let mounted = blocking(move || {
        std::fs::create_dir_all(&d).map_err(Error::io("create directory", &d))?;
        let mounted = crate::mount::is_mount_point_blocking(&d)?;
        if !mounted {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777))
                .map_err(Error::io("chmod", &d))?;
        }
        Ok(mounted)
    })
    .await?;
    if mounted {
        return Ok(());
    }
    tracing::debug!("mounting tmpfs for volume directory {}", dir.display());
    crate::mount::mount_tmpfs(dir, size, 0o1777).await
}

#[cfg(test)]
mod tests;
