//! `status.volumesInUse` (upstream `nodestatus.VolumesInUse`).

use super::*;
use crate::VolumesInUse;

/// A volume manager whose answer the test sets.
#[derive(Default)]
struct InUse(RwLock<Option<Vec<String>>>);

impl VolumesInUse for InUse {
    fn volumes_in_use(&self) -> Option<Vec<String>> {
        self.0.read().clone()
    }
}

fn in_use(c: &Cluster) -> serde_json::Value {
    c.api
        .get("nodes", "", "n1")
        .map(|n| n["status"]["volumesInUse"].clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn volumes_in_use_are_reported_once_known_and_cleared_when_released() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (mut m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    let volumes = Arc::new(InUse::default());
    m.volumes = volumes.clone();
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    assert!(in_use(&c).is_null(), "not known yet: {}", in_use(&c));

    *volumes.0.write() = Some(vec!["kubernetes.io/csi/hostpath.csi.k8s.io^vol-1".into()]);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        in_use(&c),
        serde_json::json!(["kubernetes.io/csi/hostpath.csi.k8s.io^vol-1"])
    );

    // Unknown again (never after a start, but the rule holds): kept.
    *volumes.0.write() = None;
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        in_use(&c),
        serde_json::json!(["kubernetes.io/csi/hostpath.csi.k8s.io^vol-1"])
    );

    // Released: the list goes, so the attach/detach controller may detach.
    *volumes.0.write() = Some(vec![]);
    tokio::time::sleep(Duration::from_secs(11)).await;
    let after = in_use(&c);
    assert!(
        after.is_null() || after == serde_json::json!([]),
        "cleared: {after}"
    );
    stop.cancel();
}
