//! Node status across wall-clock jumps (issue 20's fault matrix). Upstream
//! measures its report interval on Go's monotonic clock (`clock.Since` of a
//! `time.Now()`), and stamps heartbeats with the wall clock; so does this
//! manager, on tokio's clock and its `Clock` seam.

use std::sync::atomic::{AtomicI64, Ordering};

use super::*;
use kubelet_client::clock::Clock;

/// Wall time that moves with tokio's clock plus an offset a test can jump.
#[derive(Default)]
struct JumpingClock {
    base: TokioClock,
    offset_secs: AtomicI64,
}

impl JumpingClock {
    fn jump(&self, secs: i64) {
        self.offset_secs.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for JumpingClock {
    fn now(&self) -> jiff::Timestamp {
        let off = jiff::SignedDuration::from_secs(self.offset_secs.load(Ordering::SeqCst));
        let now = self.base.now();
        now.checked_add(off).unwrap_or(now)
    }
}

fn ready_heartbeat(c: &Cluster) -> jiff::Timestamp {
    let node = c.api.get("nodes", "", "n1").expect("node");
    heartbeat(&node, "Ready").0.parse().expect("heartbeat")
}

#[tokio::test(start_paused = true)]
async fn wall_clock_jumps_change_heartbeat_stamps_not_the_report_pace() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (mut m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    let clock = Arc::new(JumpingClock::default());
    m.clock = clock.clone();
    let period = m.cfg.node_status_update_frequency;
    let report = m.cfg.node_status_report_frequency;
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    tokio::time::sleep(period * 2).await;
    let first = ready_heartbeat(&c);
    let reported = status_patches(&c);

    // Back one hour: the next report still comes after the report interval
    // (not an hour and five minutes later), stamped with the clock as it
    // reads now, an hour before the last stamp.
    clock.jump(-3600);
    tokio::time::sleep(report + period).await;
    let after_back = status_patches(&c);
    assert_eq!(after_back, reported + 1, "one report per interval");
    let back = ready_heartbeat(&c);
    let behind = first.duration_since(back).as_secs();
    assert!(
        (3600 - 400..=3600).contains(&behind),
        "the heartbeat follows the clock back: {first} then {back}"
    );
    assert_eq!(ready(&c).0, "True", "still Ready");

    // Forward two hours: no report before the interval is up on the
    // monotonic clock, then one, stamped two hours ahead.
    clock.jump(7200);
    tokio::time::sleep(period * 2).await;
    assert_eq!(
        status_patches(&c),
        after_back,
        "a jump forward is not a missed report"
    );
    tokio::time::sleep(report).await;
    assert_eq!(status_patches(&c), after_back + 1);
    let ahead = ready_heartbeat(&c).duration_since(back).as_secs();
    assert!(
        (7200..=7200 + 400).contains(&ahead),
        "the heartbeat follows the clock forward: {ahead} s after the last"
    );
    assert_eq!(ready(&c).0, "True", "still Ready");
    stop.cancel();
}
