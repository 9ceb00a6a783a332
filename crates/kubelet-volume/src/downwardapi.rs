//! Downward API volumes (upstream `pkg/volume/downwardapi`): files holding
//! the pod's own fields (`fieldRef`) and its containers' resources
//! (`resourceFieldRef`), written by the atomic writer into a tmpfs
//! (upstream wraps a memory-backed emptyDir).
//!
//! `set_up` reads the pod as the kubelet knows it now, so calling it again
//! rewrites the files when the pod's labels or annotations change.
//! Ownership for `fsGroup` is applied by the caller after `set_up`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_types::fieldpath::{extract_field_path_as_string, extract_resource_value};

use crate::atomic_writer::Payload;
use crate::configmap::{
    DEFAULT_MODE, clean, file, file_mode, mark_wrapped_ready, mounted, populate,
};
use crate::plugin::names;
use crate::secret::set_up_memory_dir;
use crate::{Error, MountedVolume, Result, SetUpRequest, VolumeHost};

/// Sets up the downward API volume `req.volume` in
/// `<pod>/volumes/kubernetes.io~downward-api/<name>` (upstream `SetUpAt`).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let source = req.volume.downward_api.as_ref().ok_or_else(|| {
        Error::Invalid("Spec does not reference a DownwardAPI volume type".into())
    })?;
    let dir = req.dir(names::DOWNWARD_API);
    let pod = current_pod(host, req.pod);
    tracing::debug!(
        "Setting up a downwardAPI volume {} for pod {}/{} at {}",
        req.volume.name,
        kubelet_types::pod::namespace(&pod),
        kubelet_types::pod::name(&pod),
        dir.display()
    );
    let payload = collect_data(
        source.items.as_deref().unwrap_or_default(),
        &pod,
        source.default_mode,
        &host.node_allocatable(),
    )
    .inspect_err(|e| {
        tracing::error!(
            "Error preparing data for downwardAPI volume {} for pod {}/{}: {e}",
            req.volume.name,
            kubelet_types::pod::namespace(&pod),
            kubelet_types::pod::name(&pod)
        );
    })?;
    set_up_memory_dir(host, &pod, &dir).await?;
    mark_wrapped_ready(&req).await?;
    populate(&req, names::DOWNWARD_API, &pod, &dir, payload).await?;
    Ok(mounted(&req, names::DOWNWARD_API, dir))
}

/// The files of `items` for `pod` (upstream `CollectData`): each at its
/// cleaned path, with its own mode or `default_mode` (0644 when unset).
/// Every item is tried; the errors are aggregated as upstream's.
pub fn collect_data(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    default_mode: Option<i32>,
    node_allocatable: &BTreeMap<String, Quantity>,
) -> Result<Payload> {
    let default_mode = file_mode(default_mode.unwrap_or(DEFAULT_MODE));
    let mut errors = Vec::new();
    let mut payload = Payload::new();
    for item in items {
        let mode = item.mode.map_or(default_mode, file_mode);
        let value = if let Some(field) = &item.field_ref {
            extract_field_path_as_string(pod, &field.field_path).map_err(|e| {
                tracing::error!("Unable to extract field {}: {e}", field.field_path);
                Error::Invalid(e.to_string())
            })
        } else if let Some(resource) = &item.resource_field_ref {
            let name = resource.container_name.as_deref().unwrap_or_default();
            find_container(pod, name).and_then(|c| {
                extract_resource_value(resource, pod, c, node_allocatable).map_err(|e| {
                    tracing::error!("Unable to extract field {}: {e}", resource.resource);
                    Error::Invalid(e.to_string())
                })
            })
        } else {
            Ok(String::new())
        };
        match value {
            Ok(v) => {
                payload.insert(clean(&item.path), file(v.into_bytes(), mode));
            }
            Err(e) => errors.push(e),
        }
    }
    aggregate(errors)?;
    Ok(payload)
}

/// The pod as the kubelet knows it now, or the one in the request.
pub(crate) fn current_pod(host: &dyn VolumeHost, pod: &Pod) -> Pod {
    host.pod(kubelet_types::pod::uid(pod))
        .unwrap_or_else(|| pod.clone())
}

/// The container (or init container) `name` of `pod` (upstream
/// `findContainerInPod`).
fn find_container<'a>(
    pod: &'a Pod,
    name: &str,
) -> Result<&'a k8s_openapi::api::core::v1::Container> {
    kubelet_types::pod::containers(pod)
        .iter()
        .chain(kubelet_types::pod::init_containers(pod))
        .find(|c| c.name == name)
        .ok_or_else(|| Error::Invalid(format!("container {name} not found")))
}

/// Upstream `utilerrors.NewAggregate`: no error, the one error, or the
/// distinct messages as `[a, b]`.
pub(crate) fn aggregate(mut errors: Vec<Error>) -> Result<()> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => {
            let mut seen = BTreeSet::new();
            let messages: Vec<String> = errors
                .iter()
                .map(ToString::to_string)
                .filter(|m| seen.insert(m.clone()))
                .collect();
            if messages.len() == 1 {
                Err(errors.remove(0))
            } else {
                Err(Error::Invalid(format!("[{}]", messages.join(", "))))
            }
        }
    }
}

#[cfg(test)]
mod tests;
