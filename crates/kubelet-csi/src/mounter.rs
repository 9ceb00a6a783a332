//! Publishing a volume into a pod (upstream `csi_mounter.go` `SetUpAt` /
//! `TearDownAt`): `vol_data.json` beside the target, `NodePublishVolume`
//! with the volume context (plus pod info when `podInfoOnMount`, plus
//! service-account tokens per `tokenRequests`), fsGroup by the driver
//! (`VOLUME_MOUNT_GROUP`) or by the kubelet per `fsGroupPolicy`, and
//! `NodeUnpublishVolume` with the directory's cleanup on teardown.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, SecretReference};
use k8s_openapi::api::storage::v1::CSIDriver;

use crate::client::{csi_access_mode, to_map, volume_capability};
use crate::paths::{attachment_name, keys, load_volume_data, save_volume_data};
use crate::plugin::{
    CsiPlugin, CsiVolume, LIFECYCLE_EPHEMERAL, VolumeFacts, fs_group_policy, pod_uid,
};
use crate::{CsiHost, Error, Result, pb};

/// A volume set up for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedCsiVolume {
    /// The spec name.
    pub spec_name: String,
    /// The CSI driver.
    pub driver: String,
    /// The volume handle.
    pub volume_handle: String,
    /// What containers use: the publish target directory, or for block
    /// volumes the published device file.
    pub path: PathBuf,
    /// Published read-only.
    pub read_only: bool,
    /// A raw block volume.
    pub block: bool,
    /// The staging path, when the driver staged the volume.
    pub staging_path: Option<PathBuf>,
}

/// What teardown learnt about the volume it unpublished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornDown {
    /// The CSI driver.
    pub driver: String,
    /// The volume handle.
    pub volume_handle: String,
    /// `Persistent` or `Ephemeral` (ephemeral volumes have no staging to undo).
    pub lifecycle_mode: String,
}

/// Secret data as CSI `secrets`.
pub(crate) async fn secrets(
    host: &dyn CsiHost,
    r: &SecretReference,
    default_ns: &str,
) -> Result<HashMap<String, String>> {
    let ns = r.namespace.as_deref().unwrap_or(default_ns);
    let name = r.name.as_deref().unwrap_or_default();
    let secret = host.secret(ns, name).await?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// Pod information for drivers with `podInfoOnMount` (upstream `podAttributes`).
fn pod_attributes(
    pod: &Pod,
    csi_driver: Option<&CSIDriver>,
    lifecycle_mode: &str,
) -> BTreeMap<String, String> {
    let mut attrs = BTreeMap::new();
    if csi_driver.is_none_or(|d| d.spec.pod_info_on_mount != Some(true)) {
        return attrs;
    }
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    attrs.insert(
        "csi.storage.k8s.io/pod.name".into(),
        kubelet_types::pod::name(pod).into(),
    );
    attrs.insert(
        "csi.storage.k8s.io/pod.namespace".into(),
        kubelet_types::pod::namespace(pod).into(),
    );
    attrs.insert("csi.storage.k8s.io/pod.uid".into(), pod_uid(pod).into());
    attrs.insert("csi.storage.k8s.io/serviceAccount.name".into(), sa);
    attrs.insert(
        "csi.storage.k8s.io/ephemeral".into(),
        (lifecycle_mode == LIFECYCLE_EPHEMERAL).to_string(),
    );
    attrs
}

/// Service-account tokens per the CSIDriver's `tokenRequests` (upstream
/// `podServiceAccountTokenAttrs`): `csi.storage.k8s.io/serviceAccount.tokens`,
/// a JSON object from audience to `TokenRequestStatus`.
async fn token_attributes(
    host: &dyn CsiHost,
    pod: &Pod,
    csi_driver: Option<&CSIDriver>,
) -> Result<BTreeMap<String, String>> {
    let mut attrs = BTreeMap::new();
    let Some(requests) = csi_driver.and_then(|d| d.spec.token_requests.as_ref()) else {
        return Ok(attrs);
    };
    if requests.is_empty() {
        return Ok(attrs);
    }
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let mut outputs = serde_json::Map::new();
    for r in requests {
        let audiences = if r.audience.is_empty() {
            Vec::new()
        } else {
            vec![r.audience.clone()]
        };
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences,
                expiration_seconds: r.expiration_seconds,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(kubelet_types::pod::name(pod).into()),
                    uid: Some(pod_uid(pod).into()),
                }),
            },
            ..Default::default()
        };
        let status = host
            .service_account_token(kubelet_types::pod::namespace(pod), &sa, request)
            .await?;
        let value = serde_json::to_value(&status).map_err(|source| Error::VolData {
            path: "serviceAccount.tokens".into(),
            source,
        })?;
        outputs.insert(r.audience.clone(), value);
    }
    attrs.insert(
        "csi.storage.k8s.io/serviceAccount.tokens".into(),
        serde_json::Value::Object(outputs).to_string(),
    );
    Ok(attrs)
}

/// Upstream `supportsFSGroup`: whether the kubelet changes ownership itself.
fn kubelet_applies_fs_group(facts: &VolumeFacts, fs_group: Option<i64>, policy: &str) -> bool {
    if fs_group.is_none() || policy == "None" || facts.read_only {
        return false;
    }
    if policy == "File" {
        return true;
    }
    if facts.fs_type.is_empty() {
        tracing::debug!(volume = %facts.spec_name, "Skipping fsGroup, fsType not provided");
        return false;
    }
    facts.lifecycle_mode == LIFECYCLE_EPHEMERAL
        || matches!(
            facts.access_mode.as_str(),
            "ReadWriteOnce" | "ReadWriteOncePod"
        )
}

/// The pod's fsGroup and fsGroupChangePolicy.
pub(crate) fn pod_fs_group(pod: &Pod) -> (Option<i64>, Option<String>) {
    let sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    (
        sc.and_then(|s| s.fs_group),
        sc.and_then(|s| s.fs_group_change_policy.clone()),
    )
}

/// Removes a publish or staging directory when nothing is mounted on it,
/// with `vol_data.json` and the parent directory (upstream `removeMountDir`).
pub(crate) async fn remove_mount_dir(dir: &Path) -> Result<()> {
    if kubelet_volume::mount::is_mount_point(dir).await? {
        tracing::warn!(dir = %dir.display(), "Directory still mounted after the driver call; leaving it");
        return Ok(());
    }
    let remove = |p: PathBuf, file: bool| async move {
        let r = if file {
            tokio::fs::remove_file(&p).await
        } else {
            tokio::fs::remove_dir(&p).await
        };
        match r {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io("failed to remove", p)(e))
            }
            _ => Ok(()),
        }
    };
    // A driver may leave a file (block publish target) or a directory.
    match tokio::fs::symlink_metadata(dir).await {
        Ok(m) if m.is_dir() => remove(dir.to_path_buf(), false).await?,
        Ok(_) => remove(dir.to_path_buf(), true).await?,
        Err(_) => {}
    }
    if let Some(parent) = dir.parent() {
        remove(parent.join(crate::paths::VOL_DATA_FILE), true).await?;
        remove(parent.to_path_buf(), false).await?;
    }
    Ok(())
}

impl CsiPlugin {
    /// Publishes the volume for `pod` (upstream `SetUpAt`) at the pod's
    /// target path; `staging` and `publish_context` come from
    /// [`CsiPlugin::mount_device`] and the attach wait.
    pub async fn set_up_at(
        &self,
        pod: &Pod,
        volume: CsiVolume<'_>,
        staging: Option<&Path>,
        publish_context: &BTreeMap<String, String>,
    ) -> Result<MountedCsiVolume> {
        let uid = pod_uid(pod);
        let facts = volume.facts(uid)?;
        let node = self.host.node_name().to_string();
        let csi_driver = self.host.csi_driver(&facts.driver).await?;
        crate::plugin::check_lifecycle_mode(
            &facts.driver,
            csi_driver.as_ref(),
            facts.lifecycle_mode,
        )
        .map_err(|e| e.step("mounter.SetupAt failed to check volume lifecycle mode"))?;
        let client = self
            .client(&facts.driver)
            .await
            .map_err(|e| e.step("mounter.SetUpAt failed to get CSI client"))?;
        let caps = client.node_capabilities(self.timeouts.probe).await?;

        let (mut attrs, secret_ref, mount_flags) = match volume {
            CsiVolume::Persistent { pv, .. } => {
                let spec = pv.spec.as_ref();
                let csi = spec.and_then(|s| s.csi.as_ref());
                (
                    csi.and_then(|c| c.volume_attributes.clone())
                        .unwrap_or_default(),
                    csi.and_then(|c| c.node_publish_secret_ref.clone()),
                    spec.and_then(|s| s.mount_options.clone())
                        .unwrap_or_default(),
                )
            }
            CsiVolume::Inline(v) => {
                let csi = v.csi.as_ref();
                let secret_ref = csi
                    .and_then(|c| c.node_publish_secret_ref.as_ref())
                    .map(|r| SecretReference {
                        name: r.name.clone().into(),
                        namespace: Some(kubelet_types::pod::namespace(pod).to_string()),
                    });
                (
                    csi.and_then(|c| c.volume_attributes.clone())
                        .unwrap_or_default(),
                    secret_ref,
                    Vec::new(),
                )
            }
        };

        let (target, data_dir) = if facts.block {
            let target = self.layout.block_publish_path(&facts.spec_name, uid);
            (target, self.layout.block_data_dir(&facts.spec_name))
        } else {
            let target = self.layout.target_path(uid, &facts.spec_name);
            let parent = self.layout.pod_volume_dir(uid, &facts.spec_name);
            (target, parent)
        };
        let create = if facts.block {
            target.parent().map(Path::to_path_buf)
        } else {
            Some(data_dir.clone())
        };
        for dir in create.iter().chain(facts.block.then_some(&data_dir)) {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(Error::io("mounter.SetUpAt failed to create dir", dir))?;
        }
        let mut data = BTreeMap::new();
        data.insert(keys::SPEC_VOL_ID.to_string(), facts.spec_name.clone());
        data.insert(keys::VOLUME_HANDLE.to_string(), facts.volume_handle.clone());
        data.insert(keys::DRIVER_NAME.to_string(), facts.driver.clone());
        data.insert(keys::NODE_NAME.to_string(), node.clone());
        data.insert(
            keys::VOLUME_LIFECYCLE_MODE.to_string(),
            facts.lifecycle_mode.to_string(),
        );
        data.insert(
            keys::ATTACHMENT_ID.to_string(),
            attachment_name(&facts.volume_handle, &facts.driver, &node),
        );
        save_volume_data(&data_dir, &data).await?;

        let publish_secrets = match &secret_ref {
            Some(r) => secrets(self.host.as_ref(), r, kubelet_types::pod::namespace(pod))
                .await
                .map_err(|e| {
                    Error::InvalidSpec(format!(
                        "fetching NodePublishSecretRef {}/{} failed: {e}",
                        r.namespace.as_deref().unwrap_or_default(),
                        r.name.as_deref().unwrap_or_default()
                    ))
                })?,
            None => HashMap::new(),
        };
        attrs.extend(pod_attributes(
            pod,
            csi_driver.as_ref(),
            facts.lifecycle_mode,
        ));
        attrs.extend(
            token_attributes(self.host.as_ref(), pod, csi_driver.as_ref())
                .await
                .map_err(|e| {
                    e.step("mounter.SetUpAt failed to get service accoount token attributes")
                })?,
        );

        let (fs_group, change_policy) = pod_fs_group(pod);
        let mount_group = caps
            .volume_mount_group
            .then_some(fs_group)
            .flatten()
            .map(|g| g.to_string());
        let req = pb::NodePublishVolumeRequest {
            volume_id: facts.volume_handle.clone(),
            publish_context: to_map(Some(publish_context)),
            staging_target_path: staging
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(volume_capability(
                csi_access_mode(&facts.access_mode, caps.single_node_multi_writer),
                &facts.fs_type,
                &mount_flags,
                mount_group.clone(),
            )),
            readonly: facts.read_only,
            secrets: publish_secrets,
            volume_context: to_map(Some(&attrs)),
        };
        if let Err(e) = client.node_publish(req, self.timeouts.operation).await {
            if e.is_final()
                && let Err(cleanup) = remove_mount_dir(&target).await
            {
                tracing::error!(dir = %target.display(), error = %cleanup, "Removing the mount dir after a NodePublish error failed");
            }
            return Err(e);
        }

        let policy = fs_group_policy(csi_driver.as_ref());
        if mount_group.is_none()
            && !facts.block
            && kubelet_applies_fs_group(&facts, fs_group, &policy)
        {
            kubelet_volume::ownership::set_volume_ownership(
                &target,
                fs_group,
                change_policy.as_deref(),
            )
            .await
            .map_err(|source| Error::FsGroup {
                volume_handle: facts.volume_handle.clone(),
                source,
            })?;
        }
        tracing::info!(
            driver = %facts.driver,
            volume = %facts.spec_name,
            target = %target.display(),
            pod_info = attrs.contains_key("csi.storage.k8s.io/pod.uid"),
            "CSI volume published"
        );
        Ok(MountedCsiVolume {
            spec_name: facts.spec_name,
            driver: facts.driver,
            volume_handle: facts.volume_handle,
            path: target,
            read_only: facts.read_only,
            block: facts.block,
            staging_path: staging.map(Path::to_path_buf),
        })
    }

    /// Unpublishes the filesystem volume `spec_name` of pod `pod_uid`
    /// (upstream `TearDownAt`), from what its `vol_data.json` says, and
    /// removes its directory.
    pub async fn tear_down(&self, pod_uid: &str, spec_name: &str) -> Result<TornDown> {
        let dir = self.layout.pod_volume_dir(pod_uid, spec_name);
        let target = self.layout.target_path(pod_uid, spec_name);
        self.unpublish(&dir, &target)
            .await
            .map_err(|e| e.phase("UnmountVolume.TearDown", spec_name))
    }

    /// Unpublishes the block volume `spec_name` of pod `pod_uid`.
    pub async fn tear_down_block(&self, pod_uid: &str, spec_name: &str) -> Result<TornDown> {
        let dir = self.layout.block_data_dir(spec_name);
        let target = self.layout.block_publish_path(spec_name, pod_uid);
        self.unpublish(&dir, &target)
            .await
            .map_err(|e| e.phase("UnmapVolume.UnmapBlockDevice", spec_name))
    }

    async fn unpublish(&self, data_dir: &Path, target: &Path) -> Result<TornDown> {
        let data = load_volume_data(data_dir).await?;
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let torn = TornDown {
            driver: get(keys::DRIVER_NAME),
            volume_handle: get(keys::VOLUME_HANDLE),
            lifecycle_mode: get(keys::VOLUME_LIFECYCLE_MODE),
        };
        let client = self
            .client(&torn.driver)
            .await
            .map_err(|e| e.step("Unmounter.TearDownAt failed to get CSI client"))?;
        client
            .node_unpublish(&torn.volume_handle, target, self.timeouts.operation)
            .await
            .map_err(|e| e.step("Unmounter.TearDownAt failed"))?;
        if target.starts_with(self.layout.volume_devices_dir()) {
            // Block: the publish file only; vol_data.json stays for unstage.
            if let Err(e) = tokio::fs::remove_file(target).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::io("failed to remove", target)(e));
            }
        } else {
            remove_mount_dir(target).await.map_err(|e| {
                e.step(format!(
                    "Unmounter.TearDownAt failed to clean mount dir [{}]",
                    target.display()
                ))
            })?;
        }
        tracing::info!(driver = %torn.driver, target = %target.display(), "CSI volume unpublished");
        Ok(torn)
    }
}
