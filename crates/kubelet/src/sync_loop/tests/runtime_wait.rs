//! The loop before the runtime's first ready answer (upstream `syncLoop`
//! skips pod synchronization while `runtimeErrors` reports one, and stores
//! no `syncLoopMonitor` time meanwhile).

use super::*;

#[tokio::test(start_paused = true)]
async fn no_pod_is_handled_and_no_heartbeat_recorded_before_the_runtime_answers() {
    let features = Arc::new(crate::runtime_features::RuntimeFeatures::default());
    let h = start_admitting(admitter(110).with_runtime_features(features.clone()));
    let p = pods::simple("web", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    // A runtime down for longer than the /healthz limit (5 minutes).
    tokio::time::sleep(Duration::from_secs(400)).await;
    assert!(!h.pods.contains(&uid), "no update is handled");
    assert!(h.workers.take().is_empty(), "no work is dispatched");
    assert_eq!(
        h.heartbeat.latest(),
        None,
        "no heartbeat: /healthz stays healthy while the node waits for its runtime"
    );

    features.record(&cri::pb::StatusResponse::default());
    settle().await;
    assert!(
        h.pods.contains(&uid),
        "the queued update is handled at once"
    );
    assert_eq!(h.workers.take(), vec![(uid, WorkKind::Sync)]);
    assert!(h.heartbeat.latest().is_some());
    h.stop.cancel();
}
