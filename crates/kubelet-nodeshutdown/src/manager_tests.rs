use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
}

#[async_trait::async_trait]
impl Logind for FakeLogind {
    async fn current_inhibit_delay(&self) -> Result<Duration, Error> {
        Ok(*self.delay.lock())
    }
    async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error> {
        self.inhibits.fetch_add(1, Ordering::SeqCst);
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
        let rx = self.events.lock().take().expect("one watch");
        Ok(tokio_stream_from(rx))
    }
}

fn tokio_stream_from(mut rx: mpsc::UnboundedReceiver<bool>) -> ShutdownEvents {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

struct FakeConnect(Option<Arc<FakeLogind>>);

#[async_trait::async_trait]
impl Connect for FakeConnect {
    async fn connect(&self) -> Result<Arc<dyn Logind>, Error> {
        match &self.0 {
            Some(l) => Ok(l.clone() as Arc<dyn Logind>),
            None => Err(Error::Timeout {
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
}

fn rig(
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
    let ranges = migrate_config(Duration::from_secs(10), Duration::from_secs(4));
    let m = Manager::new(ranges, node.clone()).expect("enabled");
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.run(Arc::new(FakeConnect(Some(logind.clone()))), stop.clone()));
    Rig {
        logind,
        node,
        tx,
        stop,
        task,
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
    m.run(Arc::new(FakeConnect(None)), CancellationToken::new())
        .await;
    assert!(node.shutting_down.lock().is_empty());
    assert!(Manager::new(vec![], node).is_none(), "off without ranges");
}

#[tokio::test(start_paused = true)]
async fn a_lost_bus_is_watched_again() {
    let r = rig(Duration::from_secs(30), true, vec![], &[]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (tx2, rx2) = mpsc::unbounded_channel();
    *r.logind.events.lock() = Some(rx2);
    drop(r.tx);
    tokio::time::sleep(DBUS_RECONNECT_PERIOD + Duration::from_millis(10)).await;
    assert_eq!(r.logind.inhibits.load(Ordering::SeqCst), 2, "started again");
    assert_eq!(r.logind.held.load(Ordering::SeqCst), 1, "the old lock went");
    tx2.send(true).expect("signal");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(*r.node.shutting_down.lock(), vec![true]);
    r.stop.cancel();
    r.task.await.expect("run ends");
}
