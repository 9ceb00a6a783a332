//! Raw block volumes: upstream's `volumeDevices` staging and publish paths.

use super::*;

#[tokio::test]
async fn block_volume_stages_and_publishes_a_device_file_under_volume_devices() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[Cap::StageUnstageVolume])).await;
    e.csi_driver(no_attach());
    secret(&e.host, "stage", "k");
    secret(&e.host, "pub", "k");
    let mut pv = pv("pv-b", "vol-b");
    if let Some(spec) = pv.spec.as_mut() {
        spec.volume_mode = Some("Block".into());
    }
    let mounted = e
        .plugin
        .set_up(
            &pod("uid-b"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let devices = e.root.join("plugins/kubernetes.io/csi/volumeDevices");
    assert!(mounted.block);
    assert_eq!(mounted.path, devices.join("publish/pv-b/uid-b"));
    assert!(mounted.path.is_file(), "the driver published a device file");
    assert_eq!(
        mounted.staging_path.as_deref(),
        Some(devices.join("staging/pv-b").as_path())
    );
    let calls = d.calls();
    let Call::Publish(p) = &calls[1] else {
        panic!("publish: {calls:?}")
    };
    assert!(matches!(
        p.volume_capability
            .as_ref()
            .and_then(|c| c.access_type.as_ref()),
        Some(crate::pb::volume_capability::AccessType::Block(_))
    ));
    let data = load_volume_data(&devices.join("pv-b/data"))
        .await
        .expect("block vol_data");
    assert_eq!(
        data.get(keys::VOLUME_HANDLE).map(String::as_str),
        Some("vol-b")
    );

    e.plugin
        .tear_down_block("uid-b", "pv-b")
        .await
        .expect("unpublish");
    assert!(!mounted.path.exists());
    e.plugin
        .unmount_block_device("pv-b")
        .await
        .expect("unstage");
    assert!(!devices.join("pv-b/data").exists());
    assert!(!devices.join("staging/pv-b").exists());
    let calls = d.calls();
    assert!(
        matches!(&calls[2], Call::Unpublish(u) if u.target_path == mounted.path.to_string_lossy())
    );
    assert!(
        matches!(&calls[3], Call::Unstage(u) if u.staging_target_path.ends_with("staging/pv-b"))
    );
    // Unstaged already (or never staged): nothing more to do, no driver call.
    e.plugin
        .unmount_block_device("pv-b")
        .await
        .expect("unstaged already");
    e.plugin
        .unmount_block_device("never-staged")
        .await
        .expect("never staged");
    assert_eq!(d.calls().len(), 4, "{:?}", d.calls());
}

#[tokio::test]
async fn a_registered_driver_whose_socket_is_gone_is_unavailable() {
    let e = env(Timeouts::default());
    e.plugin.drivers().set(
        DRIVER,
        Driver {
            endpoint: e.socket.clone(),
            highest_supported_version: Version(1, 0, 0),
        },
    );
    e.csi_driver(no_attach());
    let pv = pv("pv-g", "vol-g");
    let err = e
        .plugin
        .set_up(
            &pod("uid-g"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect_err("no socket");
    let text = err.to_string();
    assert!(
        text.starts_with("MountVolume.MountDevice failed for volume \"pv-g\" : kubernetes.io/csi: attacher.MountDevice failed to create newCsiDriverClient: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial unix "),
        "{text}"
    );
    assert!(!err.is_final());
}

#[tokio::test]
async fn initialize_creates_an_empty_csi_node_owned_by_the_node() {
    let e = env(Timeouts::default());
    crate::nodeinfo::initialize_csi_node(e.host.as_ref())
        .await
        .expect("init");
    let s = e.host.state.lock();
    let n = s.csi_node.as_ref().expect("created");
    assert!(n.spec.drivers.is_empty());
    assert_eq!(
        n.metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].name.as_str()),
        Some("node-1")
    );
}
