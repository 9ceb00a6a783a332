//! An idle reconciler does no passes (issue 21): with nothing to do it waits
//! for a wake-up instead of looking every 100 ms, and a change still wakes it.

use std::sync::atomic::Ordering;

use super::*;

fn passes(f: &Fixture) -> u64 {
    f.vm.inner.passes.load(Ordering::Relaxed)
}

#[tokio::test(start_paused = true)]
async fn a_settled_reconciler_sleeps_until_a_change_wakes_it() {
    let f = fixture(vec![]);
    settle().await;
    // No pods: one pass, then none over 10 s (it was 100 before).
    let idle = passes(&f);
    assert!(idle >= 1, "the reconciler ran");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(passes(&f), idle, "an idle reconciler must not poll");

    // A pod arrives: woken, its volume is set up at once.
    let p = pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]));
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    settle().await;
    assert_eq!(f.ops.count("set_up data"), 1);
    // Mounted and wanted: quiet again.
    let mounted = passes(&f);
    assert!(mounted > idle);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(passes(&f), mounted, "a settled pod must not be looked at");
    assert_eq!(f.ops.count("set_up data"), 1);

    // The pod ends: woken, the volume is torn down and the directory goes.
    *f.orphans_ok.lock() = true;
    f.vm.pod_terminated("u1", true);
    assert!(f.vm.wait_for_unmount("u1", Duration::from_secs(5)).await);
    assert_eq!(f.ops.count("tear_down data"), 1);
    settle().await;
    let gone = passes(&f);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(passes(&f), gone, "idle again once the pod is gone");
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_set_up_keeps_the_reconciler_looking_until_it_succeeds() {
    let f = fixture(vec![]);
    f.ops.failing.lock().insert("cfg".into());
    let p = pod(
        "u1",
        serde_json::json!([{"name": "cfg", "configMap": {"name": "c"}}]),
    );
    f.vm.add_pod(&p);
    settle().await;
    assert_eq!(f.ops.count("set_up cfg"), 1);
    // The retry is due by time alone (backoff), with no wake-up.
    f.ops.failing.lock().clear();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(f.ops.count("set_up cfg"), 2, "{:?}", f.ops.calls());
    assert_eq!(f.vm.get_mounted_volumes_for_pod("u1").len(), 1);
    f.shutdown.cancel();
}
