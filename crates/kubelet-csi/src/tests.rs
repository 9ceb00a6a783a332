//! Behaviour tests of the plugin against the fake driver and fake host.

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

const DRIVER: &str = "fake.csi.k8s.io";

struct Env {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    socket: std::path::PathBuf,
    host: Arc<FakeHost>,
    plugin: CsiPlugin,
}

fn env(timeouts: Timeouts) -> Env {
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
    async fn driver(&self, config: DriverConfig) -> FakeDriver {
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

    fn csi_driver(&self, spec: CSIDriverSpec) {
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

fn pod(uid: &str) -> Pod {
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

fn pv(name: &str, handle: &str) -> PersistentVolume {
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

fn secret(host: &FakeHost, name: &str, key: &str) {
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

fn caps(list: &[Cap]) -> DriverConfig {
    DriverConfig {
        caps: list.to_vec(),
        node_id: "fake-node-1".into(),
        ..Default::default()
    }
}

fn no_attach() -> CSIDriverSpec {
    CSIDriverSpec {
        attach_required: Some(false),
        pod_info_on_mount: Some(true),
        ..Default::default()
    }
}

#[tokio::test]
async fn registration_updates_csi_node_and_node_then_deregistration_removes_them() {
    let e = env(Timeouts::default());
    let mut config = caps(&[]);
    config.max_volumes = 7;
    config.topology = BTreeMap::from([("topology.fake/zone".into(), "z1".into())]);
    let _d = FakeDriver::serve(&e.socket, config).await;
    let handler = e.plugin.registration_handler();
    let versions = vec!["1.0.0".to_string()];
    let reg = PluginRegistration {
        name: DRIVER,
        endpoint: &e.socket,
        versions: &versions,
    };
    handler.validate_plugin(&reg).await.expect("valid");
    handler
        .register_plugin(&reg, Duration::from_secs(5))
        .await
        .expect("registered");

    assert_eq!(
        e.plugin.drivers().get(DRIVER).map(|d| d.endpoint),
        Some(e.socket.clone())
    );
    {
        let s = e.host.state.lock();
        let node = s.csi_node.as_ref().expect("CSINode created");
        assert_eq!(node.metadata.name.as_deref(), Some("node-1"));
        let owner = &node.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        let d = &node.spec.drivers[0];
        assert_eq!(d.name, DRIVER);
        assert_eq!(d.node_id, "fake-node-1");
        assert_eq!(
            d.topology_keys.as_deref(),
            Some(&["topology.fake/zone".to_string()][..])
        );
        assert_eq!(d.allocatable.as_ref().and_then(|a| a.count), Some(7));
        assert_eq!(
            s.labels.get("topology.fake/zone").map(String::as_str),
            Some("z1")
        );
        assert_eq!(
            s.annotations
                .get("csi.volume.kubernetes.io/nodeid")
                .map(String::as_str),
            Some("{\"fake.csi.k8s.io\":\"fake-node-1\"}")
        );
    }

    // A second registration with no higher version is refused.
    let err = handler
        .validate_plugin(&reg)
        .await
        .expect_err("same version refused");
    assert!(
        err.to_string()
            .contains("already registered with a higher supported version: \"1.0.0\""),
        "{err}"
    );

    handler.deregister_plugin(DRIVER, &e.socket).await;
    assert!(e.plugin.drivers().get(DRIVER).is_none());
    let s = e.host.state.lock();
    assert!(
        s.csi_node
            .as_ref()
            .expect("CSINode")
            .spec
            .drivers
            .is_empty()
    );
    assert!(
        !s.annotations
            .contains_key("csi.volume.kubernetes.io/nodeid")
    );
}

#[tokio::test]
async fn unsupported_versions_are_refused_with_upstreams_message() {
    let e = env(Timeouts::default());
    let handler = e.plugin.registration_handler();
    let versions = vec!["0.3.0".to_string(), "2.0.0".to_string()];
    let reg = PluginRegistration {
        name: DRIVER,
        endpoint: Path::new("/x.sock"),
        versions: &versions,
    };
    let err = handler
        .validate_plugin(&reg)
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        err.starts_with("validation failed for CSI Driver fake.csi.k8s.io at endpoint /x.sock: kubernetes.io/csi: ValidatePlugin for CSI driver \"fake.csi.k8s.io\" failed. None of the versions specified [\"0.3.0\" \"2.0.0\"] are supported."),
        "{err}"
    );
}

#[tokio::test]
async fn stage_and_publish_use_upstreams_paths_vol_data_secrets_and_pod_info() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[Cap::StageUnstageVolume])).await;
    e.csi_driver(no_attach());
    secret(&e.host, "stage", "stagekey");
    secret(&e.host, "pub", "pubkey");
    let pod = pod("uid-1");
    let pv = pv("pv-1", "vol-1");

    let mounted = e
        .plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");

    let staging = e.root.join(format!(
        "plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
        crate::paths::sha256_hex("vol-1")
    ));
    let target = e
        .root
        .join("pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount");
    assert_eq!(mounted.path, target);
    assert_eq!(mounted.staging_path.as_deref(), Some(staging.as_path()));
    assert_eq!(
        e.host.state.lock().va_reads,
        0,
        "attachRequired=false skips the attach wait"
    );

    let calls = d.calls();
    let Call::Stage(stage) = &calls[0] else {
        panic!("stage first: {calls:?}")
    };
    assert_eq!(stage.staging_target_path, staging.to_string_lossy());
    assert_eq!(
        stage.secrets.get("stagekey").map(String::as_str),
        Some("s3cr3t")
    );
    assert_eq!(
        stage.volume_context.get("attr").map(String::as_str),
        Some("v")
    );
    let Call::Publish(publish) = &calls[1] else {
        panic!("publish second: {calls:?}")
    };
    assert_eq!(publish.target_path, target.to_string_lossy());
    assert_eq!(publish.staging_target_path, staging.to_string_lossy());
    assert_eq!(
        publish.secrets.get("pubkey").map(String::as_str),
        Some("s3cr3t")
    );
    let ctx = &publish.volume_context;
    assert_eq!(
        ctx.get("csi.storage.k8s.io/pod.name").map(String::as_str),
        Some("web")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/pod.namespace")
            .map(String::as_str),
        Some("ns1")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/pod.uid").map(String::as_str),
        Some("uid-1")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/serviceAccount.name")
            .map(String::as_str),
        Some("sa1")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/ephemeral").map(String::as_str),
        Some("false")
    );
    let Some(crate::pb::volume_capability::AccessType::Mount(m)) = publish
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.clone())
    else {
        panic!("mount capability");
    };
    assert_eq!(
        (m.fs_type.as_str(), m.mount_flags.clone()),
        ("ext4", vec!["noatime".to_string()])
    );

    let pod_data = load_volume_data(target.parent().expect("parent"))
        .await
        .expect("pod vol_data");
    let expect = BTreeMap::from([
        (keys::SPEC_VOL_ID.to_string(), "pv-1".to_string()),
        (keys::VOLUME_HANDLE.to_string(), "vol-1".to_string()),
        (keys::DRIVER_NAME.to_string(), DRIVER.to_string()),
        (keys::NODE_NAME.to_string(), "node-1".to_string()),
        (
            keys::ATTACHMENT_ID.to_string(),
            attachment_name("vol-1", DRIVER, "node-1"),
        ),
        (
            keys::VOLUME_LIFECYCLE_MODE.to_string(),
            "Persistent".to_string(),
        ),
    ]);
    assert_eq!(pod_data, expect);
    let stage_data = load_volume_data(staging.parent().expect("parent"))
        .await
        .expect("stage vol_data");
    assert_eq!(
        stage_data,
        BTreeMap::from([
            (keys::VOLUME_HANDLE.to_string(), "vol-1".to_string()),
            (keys::DRIVER_NAME.to_string(), DRIVER.to_string()),
        ])
    );

    // After a restart the volume is found from vol_data.json.
    let found = e.plugin.reconstruct("uid-1").await.expect("reconstruct");
    assert_eq!(found.len(), 1);
    assert_eq!(
        (
            found[0].spec_name.as_str(),
            found[0].driver.as_str(),
            found[0].volume_handle.as_str()
        ),
        ("pv-1", DRIVER, "vol-1")
    );
    assert_eq!(found[0].target, target);

    // Teardown: unpublish, then the pod's directory is gone; unstage, then the staging dir is gone.
    let torn = e
        .plugin
        .tear_down("uid-1", "pv-1")
        .await
        .expect("tear down");
    assert_eq!(
        (torn.driver.as_str(), torn.volume_handle.as_str()),
        (DRIVER, "vol-1")
    );
    assert!(
        !target.parent().expect("parent").exists(),
        "pod volume dir removed"
    );
    e.plugin
        .unmount_device(DRIVER, "vol-1")
        .await
        .expect("unstage");
    assert!(
        !staging.parent().expect("parent").exists(),
        "staging dir removed"
    );
    let calls = d.calls();
    assert!(
        matches!(&calls[2], Call::Unpublish(u) if u.target_path == target.to_string_lossy() && u.volume_id == "vol-1")
    );
    assert!(
        matches!(&calls[3], Call::Unstage(u) if u.staging_target_path == staging.to_string_lossy())
    );
    assert!(
        e.plugin
            .reconstruct("uid-1")
            .await
            .expect("reconstruct")
            .is_empty()
    );
}

fn inline_volume() -> Volume {
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

#[tokio::test]
async fn inline_volume_is_refused_unless_the_driver_allows_ephemeral() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[Cap::StageUnstageVolume])).await;
    let pod = pod("uid-2");
    let vol = inline_volume();

    // No CSIDriver object.
    let err = e
        .plugin
        .set_up(&pod, CsiVolume::Inline(&vol))
        .await
        .expect_err("no CSIDriver");
    assert_eq!(
        err.to_string(),
        "MountVolume.SetUp failed for volume \"scratch\" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode \"Ephemeral\" not supported by driver fake.csi.k8s.io (no CSIDriver object)"
    );
    // A CSIDriver listing only Persistent.
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Persistent".into()]),
        ..no_attach()
    });
    let err = e
        .plugin
        .set_up(&pod, CsiVolume::Inline(&vol))
        .await
        .expect_err("persistent only");
    assert!(
        err.to_string()
            .ends_with("(only supports [\"Persistent\"])"),
        "{err}"
    );
    assert!(d.calls().is_empty(), "the driver is never asked");

    // Allowed: no stage, generated handle, ephemeral=true, the secret from the pod's namespace.
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..no_attach()
    });
    e.host.state.lock().secrets.insert(
        ("ns1".into(), "pub".into()),
        Secret {
            data: Some(BTreeMap::from([("k".into(), ByteString(b"v".to_vec()))])),
            ..Default::default()
        },
    );
    let mounted = e
        .plugin
        .set_up(&pod, CsiVolume::Inline(&vol))
        .await
        .expect("ephemeral set up");
    assert_eq!(
        mounted.path,
        e.root
            .join("pods/uid-2/volumes/kubernetes.io~csi/scratch/mount")
    );
    let calls = d.calls();
    assert_eq!(calls.len(), 1, "publish only: {calls:?}");
    let Call::Publish(p) = &calls[0] else {
        panic!("publish")
    };
    assert_eq!(p.volume_id, ephemeral_volume_handle("uid-2", "scratch"));
    assert_eq!(
        p.volume_context
            .get("csi.storage.k8s.io/ephemeral")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(
        p.volume_context.get("size").map(String::as_str),
        Some("1Mi")
    );
    assert_eq!(p.secrets.get("k").map(String::as_str), Some("v"));
    let data = load_volume_data(&e.root.join("pods/uid-2/volumes/kubernetes.io~csi/scratch"))
        .await
        .expect("vol_data");
    assert_eq!(
        data.get(keys::VOLUME_LIFECYCLE_MODE).map(String::as_str),
        Some("Ephemeral")
    );
}

fn attachment(status: VolumeAttachmentStatus) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(attachment_name("vol-1", DRIVER, "node-1")),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.into(),
            node_name: "node-1".into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some("pv-1".into()),
                ..Default::default()
            },
        },
        status: Some(status),
    }
}

#[tokio::test(start_paused = true)]
async fn attach_wait_reports_attach_error_and_times_out() {
    let e = env(Timeouts {
        attach: Duration::from_secs(30),
        attach_poll: Duration::from_secs(1),
        ..Timeouts::default()
    });
    let pod = pod("uid-3");
    let pv = pv("pv-1", "vol-1");
    let name = attachment_name("vol-1", DRIVER, "node-1");

    // No CSIDriver: attach is required; nothing appears: upstream's timeout text.
    let err = e
        .plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect_err("timeout");
    assert_eq!(
        err.to_string(),
        "MountVolume.WaitForAttach failed for volume \"pv-1\" : timed out waiting for external-attacher of fake.csi.k8s.io CSI driver to attach volume vol-1"
    );
    assert!(e.host.state.lock().va_reads >= 30, "polled every second");

    // attachRequired: true and the attacher failed: its message.
    e.csi_driver(CSIDriverSpec {
        attach_required: Some(true),
        ..Default::default()
    });
    e.host.state.lock().attachments.insert(
        name.clone(),
        attachment(VolumeAttachmentStatus {
            attached: false,
            attach_error: Some(VolumeError {
                message: Some("rpc error: code = Internal desc = no disk".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    );
    let err = e
        .plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect_err("attach error");
    assert_eq!(
        err.to_string(),
        "MountVolume.WaitForAttach failed for volume \"pv-1\" : rpc error: code = Internal desc = no disk"
    );

    // Attached: the wait returns the attachment metadata as publish context.
    e.host.state.lock().attachments.insert(
        name.clone(),
        attachment(VolumeAttachmentStatus {
            attached: true,
            attachment_metadata: Some(BTreeMap::from([("devicePath".into(), "/dev/x".into())])),
            ..Default::default()
        }),
    );
    let (id, ctx) = crate::attach::wait_for_attach(
        e.host.as_ref(),
        DRIVER,
        "vol-1",
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .await
    .expect("attached");
    assert_eq!(id, name);
    assert_eq!(ctx.get("devicePath").map(String::as_str), Some("/dev/x"));
}

#[tokio::test]
async fn a_hung_publish_hits_its_deadline_and_keeps_the_directory() {
    let e = env(Timeouts {
        operation: Duration::from_millis(300),
        ..Timeouts::default()
    });
    let mut config = caps(&[]);
    config.hang_publish = true;
    let _d = e.driver(config).await;
    e.csi_driver(no_attach());
    let pod = pod("uid-4");
    let vol = inline_volume();
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..no_attach()
    });
    e.host
        .state
        .lock()
        .secrets
        .insert(("ns1".into(), "pub".into()), Secret::default());
    // A generous outer bound: the 300ms deadline, not the driver, ends the call.
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        e.plugin.set_up(&pod, CsiVolume::Inline(&vol)),
    )
    .await
    .expect("the deadline ends the call")
    .expect_err("deadline");
    assert_eq!(
        err.to_string(),
        "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    );
    // The publish may still complete: the volume directory and its data stay for teardown.
    assert!(
        e.root
            .join("pods/uid-4/volumes/kubernetes.io~csi/scratch/vol_data.json")
            .exists()
    );
}

#[tokio::test]
async fn a_failed_publish_cleans_up_and_shows_the_grpc_error() {
    let e = env(Timeouts::default());
    let mut config = caps(&[]);
    config.fail_publish = Some("no space".into());
    let _d = e.driver(config).await;
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..no_attach()
    });
    e.host
        .state
        .lock()
        .secrets
        .insert(("ns1".into(), "pub".into()), Secret::default());
    let err = e
        .plugin
        .set_up(&pod("uid-5"), CsiVolume::Inline(&inline_volume()))
        .await
        .expect_err("fails");
    assert_eq!(
        err.to_string(),
        "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = Internal desc = no space"
    );
    assert!(
        !e.root
            .join("pods/uid-5/volumes/kubernetes.io~csi/scratch")
            .exists()
    );
}

#[tokio::test]
async fn fs_group_goes_to_the_driver_with_volume_mount_group_else_the_kubelet_applies_it() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[Cap::VolumeMountGroup])).await;
    e.csi_driver(no_attach());
    secret(&e.host, "pub", "k");
    let mut pod = pod("uid-6");
    if let Some(spec) = pod.spec.as_mut() {
        spec.security_context = Some(PodSecurityContext {
            fs_group: Some(4321),
            ..Default::default()
        });
    }
    let pv6 = pv("pv-6", "vol-6");
    e.plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv6,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let calls = d.calls();
    let Some(Call::Publish(p)) = calls.last() else {
        panic!("publish")
    };
    let Some(crate::pb::volume_capability::AccessType::Mount(m)) = p
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.clone())
    else {
        panic!("mount");
    };
    assert_eq!(m.volume_mount_group, "4321");
    let target = e
        .root
        .join("pods/uid-6/volumes/kubernetes.io~csi/pv-6/mount");
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        std::fs::metadata(target.join("data")).expect("data").gid(),
        4321,
        "the driver's job"
    );

    // Without the capability, fsGroupPolicy File: the kubelet chowns.
    d.config.lock().caps.clear();
    e.csi_driver(CSIDriverSpec {
        fs_group_policy: Some("File".into()),
        ..no_attach()
    });
    let pv7 = pv("pv-7", "vol-7");
    e.plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv7,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let target = e
        .root
        .join("pods/uid-6/volumes/kubernetes.io~csi/pv-7/mount");
    assert_eq!(
        std::fs::metadata(target.join("data")).expect("data").gid(),
        4321
    );

    // fsGroupPolicy None: nothing changes.
    e.csi_driver(CSIDriverSpec {
        fs_group_policy: Some("None".into()),
        ..no_attach()
    });
    let pv8 = pv("pv-8", "vol-8");
    e.plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv8,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let target = e
        .root
        .join("pods/uid-6/volumes/kubernetes.io~csi/pv-8/mount");
    assert_ne!(
        std::fs::metadata(target.join("data")).expect("data").gid(),
        4321
    );
}

#[tokio::test]
async fn token_requests_reach_the_volume_context() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[])).await;
    e.csi_driver(CSIDriverSpec {
        token_requests: Some(vec![DriverTokenRequest {
            audience: "vault".into(),
            expiration_seconds: Some(3600),
        }]),
        ..no_attach()
    });
    secret(&e.host, "pub", "k");
    let pv = pv("pv-9", "vol-9");
    e.plugin
        .set_up(
            &pod("uid-9"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let calls = d.calls();
    let Some(Call::Publish(p)) = calls.last() else {
        panic!("publish")
    };
    let tokens: serde_json::Value = serde_json::from_str(
        p.volume_context
            .get("csi.storage.k8s.io/serviceAccount.tokens")
            .expect("tokens"),
    )
    .expect("json");
    assert_eq!(tokens["vault"]["token"], "token-for-vault");
    let s = e.host.state.lock();
    let (ns, sa, req) = &s.token_requests[0];
    assert_eq!((ns.as_str(), sa.as_str()), ("ns1", "sa1"));
    assert_eq!(req.spec.expiration_seconds, Some(3600));
    assert_eq!(
        req.spec
            .bound_object_ref
            .as_ref()
            .and_then(|b| b.uid.as_deref()),
        Some("uid-9")
    );
}

#[tokio::test]
async fn stats_and_expand_follow_the_capabilities() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[])).await;
    e.csi_driver(no_attach());
    secret(&e.host, "pub", "k");
    let pv = pv("pv-10", "vol-10");
    e.plugin
        .set_up(
            &pod("uid-10"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    assert_eq!(
        e.plugin
            .volume_stats("uid-10", "pv-10")
            .await
            .expect("stats"),
        None
    );
    assert_eq!(
        e.plugin
            .expand("uid-10", "pv-10", 2048, "ext4", "ReadWriteOnce")
            .await
            .expect("expand"),
        None
    );

    d.config.lock().caps = vec![Cap::GetVolumeStats, Cap::ExpandVolume];
    let stats = e
        .plugin
        .volume_stats("uid-10", "pv-10")
        .await
        .expect("stats")
        .expect("some");
    assert_eq!(stats.bytes, Some((70, 100, 30)));
    assert_eq!(stats.abnormal.as_deref(), Some("disk sad"));
    assert_eq!(
        e.plugin
            .expand("uid-10", "pv-10", 2048, "ext4", "ReadWriteOnce")
            .await
            .expect("expand"),
        Some(2048)
    );
    let calls = d.calls();
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, Call::Stats(s) if s.volume_id == "vol-10"))
    );
    assert!(calls.iter().any(|c| matches!(c, Call::Expand(x) if x.capacity_range.as_ref().map(|r| r.required_bytes) == Some(2048))));
}

#[tokio::test]
async fn an_unregistered_driver_is_upstreams_error() {
    let e = env(Timeouts::default());
    e.csi_driver(no_attach());
    let pv = pv("pv-11", "vol-11");
    let err = e
        .plugin
        .set_up(
            &pod("uid-11"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect_err("no driver");
    assert_eq!(
        err.to_string(),
        "MountVolume.MountDevice failed for volume \"pv-11\" : kubernetes.io/csi: attacher.MountDevice failed to create newCsiDriverClient: driver name fake.csi.k8s.io not found in the list of registered CSI drivers"
    );
}
