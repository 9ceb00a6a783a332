//! Issue 20 fault case: the apiserver goes away, first stopped (connections
//! refused, open ones cut; started again on the same address with its state
//! kept), then half-open (connections accepted, open ones included, but never
//! answered: where a client without per-request deadlines hangs for good).
//! Meanwhile pods keep running and a crashing one keeps restarting; once the
//! apiserver is back the lease is renewed and the Node's Ready heartbeat is
//! fresh within seconds (upstream: lease retries back off to 7 s at most, node
//! status every `nodeStatusUpdateFrequency`, 10 s, its heartbeat client
//! bounded by that), every status change made meanwhile reaches the
//! apiserver, and the process's memory stays flat while it waits.
//!
//! Each outage lasts 30 s in CI (the budget is tight); set
//! `KUBELET_RS_OUTAGE_SECS=120` for the 2-minute outage of the issue.

use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubelet_rs_integration::cluster::{Joined, condition, phase, sleeper};
use serde_json::{Value, json};
use tokio::time::Instant;

const RUN: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";
/// The outage's length: `KUBELET_RS_OUTAGE_SECS`, 30 s by default.
const OUTAGE_ENV: &str = "KUBELET_RS_OUTAGE_SECS";
/// How soon after the apiserver's return the lease and the Node's Ready
/// heartbeat must be fresh: upstream's 7 s lease back-off cap and its 10 s
/// status period, plus a try's round trip.
const RESUME_WITHIN: Duration = Duration::from_secs(12);
/// The same after a half-open outage: a renewal sent just before the
/// return waits out its 10 s timeout on a dead connection before the
/// connections are closed and the retry goes through.
const RESUME_WITHIN_HALF_OPEN: Duration = Duration::from_secs(20);
/// How much the process (kubelet and double) may grow while it waits.
const RSS_GROWTH_MAX_KIB: u64 = 48 * 1024;

fn outage() -> Duration {
    let secs = std::env::var(OUTAGE_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(secs)
}

/// `VmRSS` of this process, which runs the kubelet and the double.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn running_and_ready(p: Option<&Value>) -> bool {
    phase(p) == Some("Running") && condition(p, "Ready")
}

fn first_container(p: &Value) -> &Value {
    &p["status"]["containerStatuses"][0]
}

fn api_restarts(j: &Joined, name: &str) -> i64 {
    j.api_pod(name)
        .map(|p| first_container(&p)["restartCount"].as_i64().unwrap_or(0))
        .unwrap_or(0)
}

fn local_restarts(j: &Joined, name: &str) -> i32 {
    j.node
        .status(name)
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.first().map(|c| c.restart_count))
        .unwrap_or(0)
}

fn time_at(v: &Value) -> Option<Timestamp> {
    v.as_str().and_then(|s| s.parse().ok())
}

fn lease_renewed(j: &Joined) -> Option<Timestamp> {
    let l = j.api.get("leases", "kube-node-lease", &j.node.name)?;
    time_at(&l["spec"]["renewTime"])
}

/// The Ready condition's status and heartbeat.
fn ready(j: &Joined) -> Option<(String, Timestamp)> {
    let n = j.api.get("nodes", "", &j.node.name)?;
    let c = n["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    Some((
        c["status"].as_str()?.to_string(),
        time_at(&c["lastHeartbeatTime"])?,
    ))
}

/// What the node lifecycle controller does to a node that stopped posting
/// status (the double runs no controller): Ready Unknown, heartbeat kept.
async fn mark_unknown(j: &Joined) {
    // A fresh admin client: the old one's pooled connections may be held
    // by the half-open double, and would stall this for their deadline.
    let conf = j.node.dir.path().join("admin-after-outage.conf");
    j.api
        .write_admin_kubeconfig(&conf)
        .expect("admin kubeconfig");
    let (admin, _) = kubelet_client::from_kubeconfig(&conf, 1000.0, 1000)
        .await
        .expect("admin client");
    let nodes: Api<Node> = Api::all(admin);
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
        "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."}]}});
    // The first request may race the double's return.
    for _ in 0..3 {
        let r = nodes
            .patch_status(
                &j.node.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await;
        if r.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the node could not be marked Unknown");
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outage {
    Stopped,
    HalfOpen,
}

impl Outage {
    fn set(self, j: &Joined, on: bool) {
        match self {
            Outage::Stopped => j.api.set_up(!on),
            Outage::HalfOpen => j.api.set_half_open(on),
        }
    }
}

/// One outage: a pod finishing during it, the crasher restarting, memory
/// sampled; then how soon everything reaches the apiserver.
async fn survive(j: &Joined, kind: Outage, steady_cid: &str) {
    let length = outage();
    let finisher = format!(
        "finisher-{}",
        if kind == Outage::Stopped { "s" } else { "h" }
    );
    let mut spec = sleeper("sleep 8");
    spec["restartPolicy"] = "Never".into();
    j.create_pod(&finisher, spec).await;
    j.wait_api(
        &finisher,
        Duration::from_secs(60),
        "running",
        running_and_ready,
    )
    .await;
    let restarts_before = api_restarts(j, "crasher");

    kind.set(j, true);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_start = rss_kib();
    let mut rss_max = rss_start;
    while started.elapsed() < length {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_max = rss_max.max(rss_kib());
    }
    let local = j.node.status(&finisher).expect("finisher known locally");
    assert_eq!(
        local.phase.as_deref(),
        Some("Succeeded"),
        "{kind:?}: finished locally"
    );
    assert_eq!(
        phase(j.api_pod(&finisher).as_ref()),
        Some("Running"),
        "{kind:?}: the apiserver has not heard yet"
    );
    let restarts_local = local_restarts(j, "crasher");
    assert!(
        i64::from(restarts_local) >= restarts_before,
        "{kind:?}: local restarts {restarts_local} behind the API's {restarts_before}"
    );
    if kind == Outage::HalfOpen {
        assert!(
            j.api.held_connections() > 0,
            "the kubelet's connections were held"
        );
    }
    let lease_before = lease_renewed(j).expect("a lease");

    kind.set(j, false);
    let back = Instant::now();
    let back_wall = Timestamp::now();
    mark_unknown(j).await;
    let mut lease_at = None;
    let mut ready_at = None;
    let within = match kind {
        Outage::HalfOpen => RESUME_WITHIN_HALF_OPEN,
        Outage::Stopped => RESUME_WITHIN,
    };
    while lease_at.is_none() || ready_at.is_none() {
        assert!(
            back.elapsed() < within,
            "{kind:?}: after {length:?} away, not resumed within {within:?}: lease {lease_at:?} \
             (renewed {:?}, before {lease_before}), ready {ready_at:?} ({:?}), back at {back_wall}",
            lease_renewed(j),
            ready(j)
        );
        if lease_at.is_none() && lease_renewed(j).is_some_and(|t| t > back_wall) {
            lease_at = Some(back.elapsed());
        }
        // Heartbeats carry whole seconds.
        let fresh = |t: Timestamp| t.as_second() >= back_wall.as_second();
        if ready_at.is_none() && ready(j).is_some_and(|(s, t)| s == "True" && fresh(t)) {
            ready_at = Some(back.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{kind:?} outage of {length:?}: lease renewed after {lease_at:?}, Ready after {ready_at:?}, \
         RSS {rss_start} -> max {rss_max} KiB"
    );

    j.wait_api(
        &finisher,
        Duration::from_secs(15),
        "Succeeded in the API",
        |p| phase(p) == Some("Succeeded"),
    )
    .await;
    j.wait_api(
        "crasher",
        Duration::from_secs(15),
        "restarts caught up",
        |p| {
            p.is_some_and(|p| {
                first_container(p)["restartCount"].as_i64().unwrap_or(0)
                    >= i64::from(restarts_local)
            })
        },
    )
    .await;
    let steady = j.api_pod("steady").expect("steady");
    assert_eq!(
        first_container(&steady)["containerID"].as_str(),
        Some(steady_cid),
        "{kind:?}: no container restarted"
    );
    assert_eq!(first_container(&steady)["restartCount"], 0);
    assert!(
        running_and_ready(Some(&steady)),
        "{kind:?}: steady still Running and Ready"
    );
    assert!(
        rss_max.saturating_sub(rss_start) < RSS_GROWTH_MAX_KIB,
        "{kind:?}: memory grew while waiting: {rss_start} -> {rss_max} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_on_and_heartbeats_resume_after_the_apiserver_stops_and_goes_half_open() {
    let j = Joined::start(Options::default()).await;
    j.create_pod("steady", sleeper(RUN)).await;
    j.create_pod("crasher", sleeper("sleep 2; exit 1")).await;
    let steady = j
        .wait_api(
            "steady",
            Duration::from_secs(90),
            "running",
            running_and_ready,
        )
        .await
        .expect("steady");
    let cid = first_container(&steady)["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    j.wait_api("crasher", Duration::from_secs(60), "started", |p| {
        p.is_some_and(|p| first_container(p)["containerID"].is_string())
    })
    .await;
    let restarts_start = local_restarts(&j, "crasher");

    survive(&j, Outage::Stopped, &cid).await;
    survive(&j, Outage::HalfOpen, &cid).await;

    assert!(
        local_restarts(&j, "crasher") > restarts_start,
        "the crashing pod kept restarting locally"
    );
    j.cleanup().await;
}
