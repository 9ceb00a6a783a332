//! Driver registration: CSINode, Node labels and annotation, versions.

use super::*;

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
async fn drivers_registering_together_both_keep_their_node_id() {
    let host = FakeHost::default();
    let info = |id: &str| crate::client::NodeInfo {
        node_id: id.into(),
        ..Default::default()
    };
    let (a, b) = (info("node-a"), info("node-b"));
    let (ra, rb) = tokio::join!(
        crate::nodeinfo::install_driver(&host, "a.csi.example.com", &a),
        crate::nodeinfo::install_driver(&host, "b.csi.example.com", &b),
    );
    ra.expect("a");
    rb.expect("b");
    let s = host.state.lock();
    let ids: BTreeMap<String, String> = serde_json::from_str(
        s.annotations
            .get("csi.volume.kubernetes.io/nodeid")
            .expect("annotation"),
    )
    .expect("json");
    assert_eq!(
        ids,
        BTreeMap::from([
            ("a.csi.example.com".to_string(), "node-a".to_string()),
            ("b.csi.example.com".to_string(), "node-b".to_string()),
        ])
    );
}
