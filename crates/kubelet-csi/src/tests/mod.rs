//! Behaviour tests of the plugin against the fake driver and fake host:
//! shared fixtures here, registration, mount and other operations in submodules.

mod block;
mod mount;
mod ops;
mod registration;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, LocalObjectReference, PersistentVolume,
    PersistentVolumeSpec, Pod, PodSecurityContext, PodSpec, Secret, SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::{
    CSIDriver, CSIDriverSpec, TokenRequest as DriverTokenRequest, VolumeAttachment,
    VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus, VolumeError,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubelet_pluginmanager::{PluginHandler, PluginRegistration};

use crate::drivers::{Driver, Version};
use crate::paths::{attachment_name, ephemeral_volume_handle, keys, load_volume_data};
use crate::pb::node_service_capability::rpc::Type as Cap;
use crate::testing::{Call, DriverConfig, FakeDriver, FakeHost};
use crate::{CsiPlugin, CsiVolume, Timeouts};

pub(super) const DRIVER: &str = "fake.csi.k8s.io";

pub(super) struct Env {
    _dir: tempfile::TempDir,
    pub(super) root: std::path::PathBuf,
    pub(super) socket: std::path::PathBuf,
    pub(super) host: Arc<FakeHost>,
    pub(super) plugin: CsiPlugin,
}

pub(super) fn env(timeouts: Timeouts) -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("kubelet");
    let socket = dir.path().join("csi.sock");
    let host = Arc::new(FakeHost::default());
    let plugin = CsiPlugin::new(host.clone(), &root, timeouts);
    Env {
        _dir: dir,
        root,
        socket,
        host,
        plugin,
    }
}

impl Env {
    pub(super) async fn driver(&self, config: DriverConfig) -> FakeDriver {
        let d = FakeDriver::serve(&self.socket, config).await;
        self.plugin.drivers().set(
            DRIVER,
            Driver {
                endpoint: self.socket.clone(),
                highest_supported_version: Version(1, 0, 0),
            },
        );
        d
    }

    pub(super) fn csi_driver(&self, spec: CSIDriverSpec) {
        self.host.state.lock().drivers.insert(
            DRIVER.into(),
            CSIDriver {
                metadata: ObjectMeta {
                    name: Some(DRIVER.into()),
                    ..Default::default()
                },
                spec,
            },
        );
    }
}

pub(super) fn pod(uid: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns1".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some("sa1".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn pv(name: &str, handle: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            mount_options: Some(vec!["noatime".into()]),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: handle.into(),
                fs_type: Some("ext4".into()),
                volume_attributes: Some(BTreeMap::from([("attr".into(), "v".into())])),
                node_stage_secret_ref: Some(SecretReference {
                    name: Some("stage".into()),
                    namespace: Some("sec".into()),
                }),
                node_publish_secret_ref: Some(SecretReference {
                    name: Some("pub".into()),
                    namespace: Some("sec".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn secret(host: &FakeHost, name: &str, key: &str) {
    host.state.lock().secrets.insert(
        ("sec".into(), name.into()),
        Secret {
            data: Some(BTreeMap::from([(
                key.into(),
                ByteString(b"s3cr3t".to_vec()),
            )])),
            ..Default::default()
        },
    );
}

pub(super) fn caps(list: &[Cap]) -> DriverConfig {
    DriverConfig {
        caps: list.to_vec(),
        node_id: "fake-node-1".into(),
        ..Default::default()
    }
}

pub(super) fn no_attach() -> CSIDriverSpec {
    CSIDriverSpec {
        attach_required: Some(false),
        pod_info_on_mount: Some(true),
        ..Default::default()
    }
}

pub(super) fn inline_volume() -> Volume {
    Volume {
        name: "scratch".into(),
        csi: Some(CSIVolumeSource {
            driver: DRIVER.into(),
            volume_attributes: Some(BTreeMap::from([("size".into(), "1Mi".into())])),
            node_publish_secret_ref: Some(LocalObjectReference { name: "pub".into() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
