//! Projected volumes (upstream `pkg/volume/projected`): Secrets,
//! ConfigMaps, downward API items and service-account tokens merged into
//! one payload and written by the atomic writer into a tmpfs (upstream
//! wraps a memory-backed emptyDir). This is how every pod gets its
//! `kube-api-access-*` volume: a token, `ca.crt` from the
//! `kube-root-ca.crt` ConfigMap and the namespace.
//!
//! `set_up` is idempotent and is called again to refresh the content
//! (objects changed, token rotated, labels changed). Ownership for
//! `fsGroup` is applied by the caller after `set_up`; token files are 0600
//! when it will be (upstream relies on it to make them 0640).

use k8s_openapi::api::core::v1::{ConfigMap, Pod, ProjectedVolumeSource, Secret};

use crate::atomic_writer::{FileProjection, Payload};
use crate::configmap::{DEFAULT_MODE, file_mode, mark_wrapped_ready, mounted, populate};
use crate::downwardapi::{aggregate, current_pod};
use crate::host::TokenRequest;
use crate::plugin::names;
use crate::secret::set_up_memory_dir;
use crate::{Error, MountedVolume, Result, SetUpRequest, VolumeHost};

/// The API's default `expirationSeconds` of a token projection.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// Sets up the projected volume `req.volume` in
/// `<pod>/volumes/kubernetes.io~projected/<name>` (upstream `SetUpAt`).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let source =
        req.volume.projected.as_ref().ok_or_else(|| {
            Error::Invalid("Spec does not reference a projected volume type".into())
        })?;
    let dir = req.dir(names::PROJECTED);
    let pod = current_pod(host, req.pod);
    tracing::debug!(
        "Setting up volume {} for pod {} at {}",
        req.volume.name,
        kubelet_types::pod::uid(&pod),
        dir.display()
    );
    let payload = collect_data(host, &pod, source).await.inspect_err(|e| {
        tracing::error!(
            "Error preparing data for projected volume {} for pod {}/{}: {e}",
            req.volume.name,
            kubelet_types::pod::namespace(&pod),
            kubelet_types::pod::name(&pod)
        );
    })?;
    set_up_memory_dir(host, &pod, &dir).await?;
    mark_wrapped_ready(&req).await?;
    populate(&req, names::PROJECTED, &pod, &dir, payload).await?;
    Ok(mounted(&req, names::PROJECTED, dir))
}

/// The merged files of every source (upstream `collectData`): each source
/// with the volume's `defaultMode` (0644 when unset), later sources
/// overwriting earlier ones on the same path. A missing Secret or ConfigMap
/// is skipped when the source is `optional`. Every source is tried; the
/// errors are aggregated as upstream's.
pub async fn collect_data(
    host: &dyn VolumeHost,
    pod: &Pod,
    source: &ProjectedVolumeSource,
) -> Result<Payload> {
    let default_mode = source.default_mode.unwrap_or(DEFAULT_MODE);
    let namespace = kubelet_types::pod::namespace(pod);
    let fs_user = fs_user_from(pod);
    let fs_group = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.fs_group);
    let mut errors = Vec::new();
    let mut payload = Payload::new();
    for projection in source.sources.iter().flatten() {
        let part = if let Some(s) = &projection.secret {
            let optional = s.optional.unwrap_or(false);
            match host.get_secret(namespace, &s.name).await {
                Ok(secret) => Ok(secret),
                Err(e) if e.is_not_found() && optional => Ok(Secret::default()),
                Err(e) => {
                    tracing::error!("Couldn't get secret {namespace}/{}: {e}", s.name);
                    Err(e.into())
                }
            }
            .and_then(|secret| {
                crate::secret::make_payload(
                    s.items.as_deref(),
                    &secret,
                    Some(default_mode),
                    optional,
                )
                .inspect_err(|e| {
                    tracing::error!("Couldn't get secret payload {namespace}/{}: {e}", s.name);
                })
            })
        } else if let Some(c) = &projection.config_map {
            let optional = c.optional.unwrap_or(false);
            match host.get_config_map(namespace, &c.name).await {
                Ok(cm) => Ok(cm),
                Err(e) if e.is_not_found() && optional => Ok(ConfigMap::default()),
                Err(e) => {
                    tracing::error!("Couldn't get configMap {namespace}/{}: {e}", c.name);
                    Err(e.into())
                }
            }
            .and_then(|cm| {
                crate::configmap::make_payload(
                    c.items.as_deref(),
                    &cm,
                    Some(default_mode),
                    optional,
                )
                .inspect_err(|e| {
                    tracing::error!("Couldn't get configMap payload {namespace}/{}: {e}", c.name);
                })
            })
        } else if let Some(d) = &projection.downward_api {
            crate::downwardapi::collect_data(
                d.items.as_deref().unwrap_or_default(),
                pod,
                Some(default_mode),
                &host.node_allocatable(),
            )
        } else if let Some(t) = &projection.service_account_token {
            // With fsGroup, ownership makes 0600 into 0640.
            let mode = if fs_user.is_some() || fs_group.is_some() {
                0o600
            } else {
                file_mode(default_mode)
            };
            let request = token_request(pod, t.audience.as_deref(), t.expiration_seconds);
            host.get_service_account_token(&request)
                .await
                .map_err(Error::from)
                .map(|token| {
                    Payload::from([(
                        t.path.clone(),
                        FileProjection {
                            data: token.into_bytes(),
                            mode,
                            fs_user,
                        },
                    )])
                })
        } else if projection.cluster_trust_bundle.is_some() {
            Err(Error::Unsupported {
                volume: "projected".into(),
                kind: "clusterTrustBundle".into(),
            })
        } else {
            Ok(Payload::new())
        };
        match part {
            Ok(files) => payload.extend(files),
            Err(e) => errors.push(e),
        }
    }
    aggregate(errors)?;
    Ok(payload)
}

/// The token request of a `serviceAccountToken` projection: bound to the
/// pod, for its service account (`default` when unset).
pub fn token_request(
    pod: &Pod,
    audience: Option<&str>,
    expiration_seconds: Option<i64>,
) -> TokenRequest {
    let service_account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    TokenRequest {
        namespace: kubelet_types::pod::namespace(pod).to_string(),
        service_account: service_account.to_string(),
        audience: audience.unwrap_or_default().to_string(),
        expiration_seconds: expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS),
        pod_name: kubelet_types::pod::name(pod).to_string(),
        pod_uid: kubelet_types::pod::uid(pod).to_string(),
    }
}

/// The one user every init and app container runs as (upstream
/// `FsUserFrom`: each container's `runAsUser`, else the pod's), or `None`
/// when one has none or two differ.
pub fn fs_user_from(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let mut fs_user = None;
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        let user = c
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .or(pod_user)?;
        if fs_user.is_some_and(|u| u != user) {
            return None;
        }
        fs_user = Some(user);
    }
    fs_user
}

#[cfg(test)]
mod tests;
