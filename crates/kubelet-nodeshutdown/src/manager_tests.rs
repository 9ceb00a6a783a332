use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::logind::{KillFailed, ShutdownPod};
use crate::{Error, migrate_config};

/// A lock the fake hands out: counts the live ones.
struct Held(Arc<AtomicUsize>);
impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct FakeLogind {
    delay: Mutex<Duration>,
    /// What a reload makes the delay (`None`: the drop-in is ignored).
    honours_override: bool,
    overrides: Mutex<Vec<Duration>>,
    reloads: AtomicUsize,
    inhibits: AtomicUsize,
    held: Arc<AtomicUsize>,
    events: Mutex<Option<mpsc::UnboundedReceiver<bool>>>,
    pending: Mutex<Option<Duration>>,
    /// `inhibit` and `monitor`, in call order.
    calls: Mutex<Vec<&'static str>>,
    /// `Inhibit` calls from this number on never answer.
    hang_from: Mutex<Option<usize>>,
}

#[async_trait::async_trait]
impl Logind for FakeLogind {
    async fn current_inhibit_delay(&self) -> Result<Duration, Error> {
        Ok(*self.delay.lock())
    }
    async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error> {
        self.calls.lock().push("inhibit");
        let n = self.inhibits.fetch_add(1, Ordering::SeqCst);
        if self.hang_from.lock().is_some_and(|from| n >= from) {
            std::future::pending::<()>().await;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        Ok(InhibitLock::new(Held(self.held.clone())))
    }
    async fn override_inhibit_delay(&self, max: Duration) -> Result<(), Error> {
        self.overrides.lock().push(max);
        *self.pending.lock() = Some(max);
        Ok(())
    }
    async fn reload_logind_conf(&self) -> Result<(), Error> {
        self.reloads.fetch_add(1, Ordering::SeqCst);
        if self.honours_override
            && let Some(d) = self.pending.lock().take()
        {
            *self.delay.lock() = d;
        }
        Ok(())
    }
    async fn monitor_shutdown(&self) -> Result<ShutdownEvents, Error> {
        self.calls.lock().push("monitor");
        let rx = self.events.lock().take().expect("one watch");
        Ok(tokio_stream_from(rx))
    }
}

fn tokio_stream_from(mut rx: mpsc::UnboundedReceiver<bool>) -> ShutdownEvents {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

/// Connects to the logind, if any, unless told to refuse.
struct FakeConnect(Option<Arc<FakeLogind>>, Arc<AtomicBool>);

impl FakeConnect {
    fn new(logind: Option<Arc<FakeLogind>>) -> Self {
        Self(logind, Arc::default())
    }
}

#[async_trait::async_trait]
impl Connect for FakeConnect {
    async fn connect(&self) -> Result<Arc<dyn Logind>, Error> {
        let refuse = self.1.load(Ordering::SeqCst);
        match &self.0 {
            Some(l) if !refuse => Ok(l.clone() as Arc<dyn Logind>),
            _ => Err(Error::Timeout {
                what: "connecting to the system bus",
                after: Duration::from_secs(10),
            }),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Kill {
    pod: String,
    grace: i64,
    start: Duration,
    end: Option<Duration>,
    locks_held: usize,
}

struct FakeNode {
    t0: Instant,
    pods: Vec<ShutdownPod>,
    /// How long each pod takes to die, at most its grace period; absent:
    /// it never dies.
    takes: Vec<(String, Duration)>,
    kills: Mutex<Vec<Kill>>,
    shutting_down: Mutex<Vec<bool>>,
    events: Mutex<Vec<String>>,
    held: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Node for FakeNode {
    fn active_pods(&self) -> Vec<ShutdownPod> {
        self.pods.clone()
    }
    async fn kill_pod(&self, pod: &ShutdownPod, grace: i64) -> Result<(), KillFailed> {
        let i = {
            let mut k = self.kills.lock();
            k.push(Kill {
                pod: pod.name.clone(),
                grace,
                start: self.t0.elapsed(),
                end: None,
                locks_held: self.held.load(Ordering::SeqCst),
            });
            k.len() - 1
        };
        let Some((_, takes)) = self.takes.iter().find(|(n, _)| *n == pod.name) else {
            std::future::pending::<()>().await;
            unreachable!()
        };
        let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        tokio::time::sleep((*takes).min(grace)).await;
        self.kills.lock()[i].end = Some(self.t0.elapsed());
        Ok(())
    }
    fn set_shutting_down(&self, v: bool) {
        self.shutting_down.lock().push(v);
    }
    fn record_event(&self, message: &str) {
        self.events.lock().push(message.to_string());
    }
}

fn pod(name: &str, priority: i32, tgps: Option<i64>) -> ShutdownPod {
    ShutdownPod {
        uid: format!("uid-{name}"),
        name: name.to_string(),
        priority,
        termination_grace_period_seconds: tgps,
    }
}

struct Rig {
    logind: Arc<FakeLogind>,
    node: Arc<FakeNode>,
    tx: mpsc::UnboundedSender<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// Connections are refused while set.
    refuse: Arc<AtomicBool>,
}

fn rig(
    delay: Duration,
    honours_override: bool,
    pods: Vec<ShutdownPod>,
    takes: &[(&str, u64)],
) -> Rig {
    let ranges = migrate_config(Duration::from_secs(10), Duration::from_secs(4));
    rig_with(ranges, delay, honours_override, pods, takes)
}

fn rig_with(
    ranges: Vec<crate::PriorityGrace>,
    delay: Duration,
    honours_override: bool,
    pods: Vec<ShutdownPod>,
    takes: &[(&str, u64)],
) -> Rig {
    let (tx, rx) = mpsc::unbounded_channel();
    let logind = Arc::new(FakeLogind {
        delay: Mutex::new(delay),
        honours_override,
        events: Mutex::new(Some(rx)),
        ..Default::default()
    });
    let node = Arc::new(FakeNode {
        t0: Instant::now(),
        pods,
        takes: takes
            .iter()
            .map(|(n, s)| (n.to_string(), Duration::from_secs(*s)))
            .collect(),
        kills: Mutex::new(vec![]),
        shutting_down: Mutex::new(vec![]),
        events: Mutex::new(vec![]),
        held: logind.held.clone(),
    });
    let m = Manager::new(ranges, node.clone()).expect("enabled");
    let stop = CancellationToken::new();
    let refuse: Arc<AtomicBool> = Arc::default();
    let task = tokio::spawn(m.run(
        Arc::new(FakeConnect(Some(logind.clone()), refuse.clone())),
        stop.clone(),
    ));
    Rig {
        logind,
        node,
        tx,
        stop,
        task,
        refuse,
    }
}

#[tokio::test(start_paused = true)]
async fn non_critical_pods_go_first_within_their_share_then_the_lock_is_released() {
    let r = rig(
        Duration::from_secs(30),
        true,
        vec![
            pod("critical", 2_000_001_000, Some(30)),
            pod("normal-long", 0, Some(30)),
            pod("normal-short", 0, Some(2)),
        ],
        &[("critical", 1), ("normal-long", 3), ("normal-short", 1)],
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        r.logind.held.load(Ordering::SeqCst),
        1,
        "lock taken at start"
    );
    assert!(r.logind.overrides.lock().is_empty(), "30s delay suffices");
    r.tx.send(true).expect("signal");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let kills = r.node.kills.lock().clone();
    let s = Duration::from_secs;
    // Both normal pods at once, with min(their own, 6s); the critical pod
    // only after the slower normal pod is gone (3s), with min(30, 4).
    assert_eq!(kills.len(), 3, "{kills:?}");
    assert_eq!((kills[0].pod.as_str(), kills[0].grace), ("normal-long", 6));
    assert_eq!((kills[1].pod.as_str(), kills[1].grace), ("normal-short", 2));
    assert_eq!(kills[1].start, kills[0].start, "together");
    assert_eq!((kills[2].pod.as_str(), kills[2].grace), ("critical", 4));
    assert_eq!(
        kills[2].start - kills[0].start,
        s(3),
        "after the slowest normal pod"
    );
    assert!(
        kills.iter().all(|k| k.locks_held == 1),
        "lock held during kills"
    );
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 0, "released after");
    assert_eq!(*r.node.shutting_down.lock(), vec![true]);
    assert_eq!(
        *r.node.events.lock(),
        vec!["Shutdown manager detected shutdown event".to_string()]
    );
    r.stop.cancel();
    r.task.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn a_group_gets_no_more_than_its_share() {
    // The normal pod never dies: the critical group starts at 6s anyway.
    let r = rig(
        Duration::from_secs(30),
        true,
        vec![pod("stuck", 0, None), pod("critical", 2_000_000_000, None)],
        &[("critical", 100)],
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.tx.send(true).expect("signal");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(r.node.kills.lock().len(), 1);
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 1, "still held");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kills = r.node.kills.lock().clone();
    assert_eq!(kills.len(), 2);
    assert_eq!(kills[0].grace, 6);
    assert_eq!(kills[1].pod, "critical");
    assert_eq!(kills[1].start - kills[0].start, Duration::from_secs(6));
    assert_eq!(kills[1].grace, 4);
    assert_eq!(
        r.logind.held.load(Ordering::SeqCst),
        1,
        "critical pods running"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 0, "released at 10s");
    r.stop.cancel();
    r.task.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_shutdown_makes_the_node_ready_and_takes_the_lock_again() {
    let r = rig(Duration::from_secs(30), true, vec![], &[]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.tx.send(true).expect("signal");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        r.logind.held.load(Ordering::SeqCst),
        0,
        "no pods: released at once"
    );
    r.tx.send(false).expect("signal");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(*r.node.shutting_down.lock(), vec![true, false]);
    assert_eq!(r.logind.inhibits.load(Ordering::SeqCst), 2);
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 1);
    assert_eq!(
        r.node.events.lock().last().map(String::as_str),
        Some("Shutdown manager detected shutdown cancellation")
    );
    r.stop.cancel();
    r.task.await.expect("run ends");
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 0, "released at stop");
}

#[tokio::test(start_paused = true)]
async fn a_short_inhibit_delay_is_raised_through_the_drop_in() {
    let r = rig(Duration::from_secs(5), true, vec![], &[]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(*r.logind.overrides.lock(), vec![Duration::from_secs(10)]);
    assert_eq!(r.logind.reloads.load(Ordering::SeqCst), 1);
    assert_eq!(*r.logind.delay.lock(), Duration::from_secs(10));
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 1);
    r.stop.cancel();
    r.task.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn a_delay_logind_keeps_short_still_takes_the_lock() {
    let r = rig(Duration::from_secs(5), false, vec![], &[]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(r.logind.reloads.load(Ordering::SeqCst), 1);
    assert_eq!(*r.logind.delay.lock(), Duration::from_secs(5));
    assert_eq!(
        r.logind.held.load(Ordering::SeqCst),
        1,
        "what logind allows"
    );
    r.stop.cancel();
    r.task.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn no_bus_means_no_graceful_shutdown_and_no_hang() {
    let node = Arc::new(FakeNode {
        t0: Instant::now(),
        pods: vec![],
        takes: vec![],
        kills: Mutex::new(vec![]),
        shutting_down: Mutex::new(vec![]),
        events: Mutex::new(vec![]),
        held: Arc::default(),
    });
    let m = Manager::new(
        migrate_config(Duration::from_secs(10), Duration::ZERO),
        node.clone(),
    )
    .expect("enabled");
    // Returns on its own, without `stop`.
    m.run(Arc::new(FakeConnect::new(None)), CancellationToken::new())
        .await;
    assert!(node.shutting_down.lock().is_empty());
    assert!(Manager::new(vec![], node).is_none(), "off without ranges");
}

#[tokio::test(start_paused = true)]
async fn a_lost_bus_is_watched_again_and_the_old_lock_kept_until_then() {
    let r = rig(Duration::from_secs(30), true, vec![], &[]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (tx2, rx2) = mpsc::unbounded_channel();
    *r.logind.events.lock() = Some(rx2);
    // The bus goes away and the first reconnects fail.
    r.refuse.store(true, Ordering::SeqCst);
    drop(r.tx);
    tokio::time::sleep(DBUS_RECONNECT_PERIOD * 3 + Duration::from_millis(10)).await;
    assert_eq!(r.logind.inhibits.load(Ordering::SeqCst), 1, "not connected");
    assert_eq!(
        r.logind.held.load(Ordering::SeqCst),
        1,
        "the old lock is kept while reconnecting"
    );
    r.refuse.store(false, Ordering::SeqCst);
    tokio::time::sleep(DBUS_RECONNECT_PERIOD).await;
    assert_eq!(r.logind.inhibits.load(Ordering::SeqCst), 2, "started again");
    assert_eq!(
        r.logind.held.load(Ordering::SeqCst),
        1,
        "the old lock went once the new one was taken"
    );
    tx2.send(true).expect("signal");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(*r.node.shutting_down.lock(), vec![true]);
    r.stop.cancel();
    r.task.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn the_signal_is_watched_before_the_lock_is_taken() {
    let r = rig(Duration::from_secs(30), true, vec![], &[]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(*r.logind.calls.lock(), vec!["monitor", "inhibit"]);
    r.stop.cancel();
    r.task.await.expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn stop_ends_a_hung_relock_after_a_cancelled_shutdown() {
    let r = rig(Duration::from_secs(30), true, vec![], &[]);
    *r.logind.hang_from.lock() = Some(1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.tx.send(true).expect("signal");
    r.tx.send(false).expect("signal");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(r.logind.inhibits.load(Ordering::SeqCst), 2, "relocking");
    r.stop.cancel();
    tokio::time::timeout(Duration::from_secs(1), r.task)
        .await
        .expect("stop is not held up by the hung Inhibit call")
        .expect("run ends");
}

#[tokio::test(start_paused = true)]
async fn a_group_with_no_share_still_has_its_pods_killed() {
    let ranges = vec![
        crate::PriorityGrace {
            priority: 0,
            grace_period_seconds: 0,
        },
        crate::PriorityGrace {
            priority: 100,
            grace_period_seconds: 5,
        },
    ];
    let r = rig_with(
        ranges,
        Duration::from_secs(30),
        true,
        vec![
            pod("a", 0, Some(30)),
            pod("b", 0, None),
            pod("high", 100, Some(30)),
        ],
        &[("high", 1)],
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.tx.send(true).expect("signal");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let kills = r.node.kills.lock().clone();
    let summary: Vec<(&str, i64)> = kills.iter().map(|k| (k.pod.as_str(), k.grace)).collect();
    // `a` and `b` never die: their group's 0s share is over at once, the
    // next group starts, and their kills go on.
    assert_eq!(summary.len(), 3, "{summary:?}");
    assert!(
        summary.contains(&("a", 0)) && summary.contains(&("b", 0)),
        "{summary:?}"
    );
    assert_eq!(summary[2], ("high", 5));
    assert!(kills.iter().all(|k| k.start == kills[0].start));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 0, "released after");
    r.stop.cancel();
    r.task.await.expect("run ends");
}
