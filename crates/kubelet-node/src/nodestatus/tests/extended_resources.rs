//! Device plugin resources in the node status (upstream `MachineInfo`'s
//! device plugin part and `reconcileExtendedResource`).

use super::*;
use crate::{DeviceCapacity, ExtendedResources};

/// A device manager whose capacity the test sets.
#[derive(Default)]
struct Devices {
    now: RwLock<DeviceCapacity>,
    reset: bool,
}

#[async_trait::async_trait]
impl ExtendedResources for Devices {
    async fn capacity(&self) -> DeviceCapacity {
        self.now.read().clone()
    }
    async fn should_reset_capacity(&self) -> bool {
        self.reset
    }
}

fn resource(c: &Cluster, field: &str, name: &str) -> Option<String> {
    let n = c.api.get("nodes", "", "n1")?;
    n["status"][field][name].as_str().map(str::to_string)
}

#[tokio::test(start_paused = true)]
async fn plugin_resources_are_reported_and_a_gone_plugin_reads_zero() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (mut m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    let devices = Arc::new(Devices::default());
    *devices.now.write() = DeviceCapacity {
        capacity: [("example.com/resource".to_string(), 2)].into(),
        allocatable: [("example.com/resource".to_string(), 1)].into(),
        deleted: vec![],
    };
    m.extended = devices.clone();
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    assert_eq!(
        resource(&c, "capacity", "example.com/resource").as_deref(),
        Some("2")
    );
    assert_eq!(
        resource(&c, "allocatable", "example.com/resource").as_deref(),
        Some("1")
    );
    *devices.now.write() = DeviceCapacity {
        deleted: vec!["example.com/resource".into()],
        ..DeviceCapacity::default()
    };
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        resource(&c, "capacity", "example.com/resource").as_deref(),
        Some("0")
    );
    assert_eq!(
        resource(&c, "allocatable", "example.com/resource").as_deref(),
        Some("0")
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_existing_node_without_a_checkpoint_has_its_extended_resources_zeroed() {
    let c = Cluster::start(Default::default()).await;
    let admin: Api<Node> = Api::all(c.admin().await);
    let mut n = Node::default();
    n.metadata.name = Some("n1".into());
    admin.create(&Default::default(), &n).await.expect("node");
    let stale = serde_json::json!({"status": {"capacity": {"example.com/resource": "4", "cpu": "2"},
        "allocatable": {"example.com/resource": "4", "cpu": "2"}}});
    admin
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(stale))
        .await
        .expect("stale status");
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (mut m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    m.extended = Arc::new(Devices {
        reset: true,
        ..Devices::default()
    });
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    assert_eq!(
        resource(&c, "capacity", "example.com/resource").as_deref(),
        Some("0")
    );
    assert_eq!(
        resource(&c, "allocatable", "example.com/resource").as_deref(),
        Some("0")
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_extended_resource_removed_from_capacity_leaves_allocatable() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    // An admin advertises a cluster-level resource, then removes it from
    // capacity only.
    let admin: Api<Node> = Api::all(c.admin().await);
    let add = serde_json::json!({"status": {"capacity": {"example.com/dongle": "1"},
        "allocatable": {"example.com/dongle": "1"}}});
    admin
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(add))
        .await
        .expect("advertise");
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        resource(&c, "allocatable", "example.com/dongle").as_deref(),
        Some("1"),
        "kept while in capacity"
    );
    let remove = serde_json::json!({"status": {"capacity": {"example.com/dongle": null}}});
    admin
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(remove))
        .await
        .expect("remove from capacity");
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(resource(&c, "allocatable", "example.com/dongle"), None);
    stop.cancel();
}
