//! The node lease heartbeat (upstream `k8s.io/component-helpers/apimachinery/lease`
//! controller as the kubelet runs it): `kube-node-lease/<node>` with
//! `leaseDurationSeconds` (40) and a renew every quarter of it (10s), by a
//! PUT of the lease the previous renewal got back (upstream `latestLease`:
//! one request per renewal), with its resourceVersion (optimistic
//! concurrency); a GET (or create) only for the first renewal and after a
//! conflict, a missing lease or a failure. It runs on its
//! own task, so a slow node status patch never lets the lease expire. The
//! lease is owned by the Node once the Node's UID is known.
//!
//! After an outage (upstream `retryUpdateLease` and `onRepeatedHeartbeatFailure`):
//! each renewal is bounded by the heartbeat timeout, a failed one is retried
//! after 200 ms doubling to 7 s, and from the second failure in a row every
//! connection of the kubelet's client is closed, so no renewal (nor any
//! other request) waits on a connection whose peer vanished: the first
//! renewal after the apiserver's return dials afresh. A renewal that
//! succeeds after failures asks for a node status sync at once, so the Node's
//! Ready heartbeat follows the lease within a round trip instead of at the
//! next status period.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use kubelet_client::Connections;
use kubelet_client::clock::Clock;

/// Namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Upstream `maxUpdateRetries`.
const MAX_UPDATE_RETRIES: usize = 5;
/// Upstream `maxBackoff` after repeated failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(7);
/// The first retry's delay (upstream starts at 100 ms and doubles before
/// the first sleep).
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// Renews the node lease.
pub struct LeaseController {
    /// Client.
    pub client: Client,
    /// Node name (lease name and holder).
    pub node_name: String,
    /// `nodeLeaseDurationSeconds`.
    pub duration_seconds: i32,
    /// Wall clock for `renewTime`.
    pub clock: Arc<dyn Clock>,
    /// The Node's UID once registered.
    pub node_uid: watch::Receiver<Option<String>>,
    /// The client's connections, all closed on repeated failures (upstream
    /// `onRepeatedHeartbeatFailure`, the kubelet's `closeAllConns`).
    pub connections: Option<Arc<Connections>>,
    /// Notified when a renewal succeeds after failures: the node status
    /// loop syncs at once (the apiserver is back).
    pub recovered: Option<Arc<Notify>>,
}

/// What the renew loop does after one renewal (upstream `controller.sync`
/// with `retryUpdateLease`'s failure handling).
#[derive(Debug, Default)]
pub struct Backoff {
    next: Option<Duration>,
    failures: u32,
}

impl Backoff {
    /// A renewal succeeded: whether it ended a run of failures.
    pub fn succeeded(&mut self) -> bool {
        let recovered = self.failures > 0;
        *self = Self::default();
        recovered
    }

    /// A renewal failed at once (an error): how long until the next try
    /// (200 ms doubling to [`MAX_BACKOFF`]), and whether the failures
    /// repeat, so connections are closed (the second failure in a row and
    /// later ones).
    pub fn failed(&mut self) -> (Duration, bool) {
        let wait = self.next.unwrap_or(FIRST_BACKOFF);
        self.next = Some((wait * 2).min(MAX_BACKOFF));
        self.failures = self.failures.saturating_add(1);
        (wait, self.failures > 1)
    }

    /// A renewal got no answer within its timeout: it waited long enough
    /// already, so the next try starts at once (upstream's update retries
    /// follow each other without a sleep); whether the failures repeat.
    pub fn timed_out(&mut self) -> (Duration, bool) {
        self.failures = self.failures.saturating_add(1);
        (Duration::ZERO, self.failures > 1)
    }
}

/// A conflict is an answer: the connections work, so it does not count
/// towards closing them (upstream leaves `IsConflict` out of
/// `onRepeatedHeartbeatFailure` too).
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaseController {
    /// The renew period: a quarter of the lease duration.
    pub fn renew_interval(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.duration_seconds.max(4)).unwrap_or(40)) / 4
    }

    fn desired(&self, mut lease: Lease) -> Lease {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.node_name.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(self.clock.now()));
        if let Some(uid) = self.node_uid.borrow().clone() {
            let owned = lease
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.uid == uid));
            if !owned {
                lease.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node_name.clone(),
                    uid,
                    ..Default::default()
                }]);
            }
        }
        lease
    }

    /// One heartbeat: get-or-create, then update with retries on conflict.
    pub async fn renew(&self) -> Result<Lease, kube::Error> {
        self.renew_from(&mut None).await
    }

    /// One heartbeat from `latest`, the lease the previous renewal got back
    /// (upstream `latestLease`): a PUT of it alone when it is current; a
    /// GET (or create) when there is none, or when it was stale (conflict)
    /// or gone. `latest` holds the lease this renewal got back, or `None`
    /// after a failure (the next one reads afresh).
    pub async fn renew_from(&self, latest: &mut Option<Lease>) -> Result<Lease, kube::Error> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let conflict = |e: kube::Error| match e {
                kube::Error::Api(s) if s.code == 409 && attempt < MAX_UPDATE_RETRIES => Ok(()),
                other => Err(other),
            };
            let (current, cached) = match latest.take() {
                Some(l) => (l, true),
                None => match api.get_opt(&self.node_name).await? {
                    Some(l) => (l, false),
                    None => {
                        let mut fresh = Lease::default();
                        fresh.metadata.name = Some(self.node_name.clone());
                        fresh.metadata.namespace = Some(LEASE_NAMESPACE.into());
                        match api
                            .create(&PostParams::default(), &self.desired(fresh))
                            .await
                        {
                            Ok(l) => {
                                *latest = Some(l.clone());
                                return Ok(l);
                            }
                            Err(e) => {
                                conflict(e)?;
                                continue;
                            }
                        }
                    }
                },
            };
            match api
                .replace(
                    &self.node_name,
                    &PostParams::default(),
                    &self.desired(current),
                )
                .await
            {
                Ok(l) => {
                    *latest = Some(l.clone());
                    return Ok(l);
                }
                // The kept copy was deleted meanwhile: read (or create) it.
                Err(kube::Error::Api(s)) if cached && s.code == 404 => {
                    debug!("Lease gone; reading it afresh");
                }
                Err(e) => {
                    conflict(e)?;
                    debug!("Lease update conflict; retrying");
                }
            }
        }
    }

    /// Renews every quarter of the lease duration until `stop`; a renewal
    /// gets at most that long (upstream's heartbeat client timeout); after a
    /// failure, retries sooner with backoff (200ms doubling to 7s), and
    /// closes the client's connections when failures repeat, as upstream.
    pub async fn run(self, stop: CancellationToken) {
        let mut backoff = Backoff::default();
        let mut latest = None;
        loop {
            let renewal = self.renew_from(&mut latest);
            let failed = match tokio::time::timeout(self.renew_interval(), renewal).await {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => {
                    warn!(error = %e, "Failed to update lease");
                    let (wait, repeated) = backoff.failed();
                    Some((wait, repeated && !is_conflict(&e)))
                }
                Err(_) => {
                    warn!(after = ?self.renew_interval(), "Lease update timed out");
                    Some(backoff.timed_out())
                }
            };
            let wait = match failed {
                None => {
                    if backoff.succeeded() {
                        info!("Lease renewed again after failures");
                        if let Some(r) = &self.recovered {
                            r.notify_one();
                        }
                    }
                    self.renew_interval()
                }
                Some((wait, repeated)) => {
                    if repeated && let Some(c) = &self.connections {
                        c.close_all();
                    }
                    wait
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_client::clock::TokioClock;
    use kubelet_test_util::Cluster;

    #[test]
    fn only_failures_other_than_conflicts_close_connections() {
        let status = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "Conflict")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(is_conflict(&status(409)));
        assert!(!is_conflict(&status(500)));
        assert!(!is_conflict(&kube::Error::LinesCodecMaxLineLengthExceeded));
    }

    #[tokio::test(start_paused = true)]
    async fn lease_is_created_owned_and_renewed_every_ten_seconds() {
        let c = Cluster::start(Default::default()).await;
        let (uid_tx, uid_rx) = watch::channel(None);
        let lease = LeaseController {
            client: c.node_client("n1").await,
            node_name: "n1".into(),
            duration_seconds: 40,
            clock: Arc::new(TokioClock::default()),
            node_uid: uid_rx,
            connections: None,
            recovered: None,
        };
        assert_eq!(lease.renew_interval(), Duration::from_secs(10));
        let stop = CancellationToken::new();
        let task = tokio::spawn(lease.run(stop.clone()));
        let renew_time = |c: &Cluster| {
            c.api
                .get("leases", LEASE_NAMESPACE, "n1")
                .and_then(|l| l["spec"]["renewTime"].as_str().map(String::from))
        };
        let mut times = vec![];
        for i in 0..4 {
            if i == 1 {
                uid_tx.send_replace(Some("node-uid-1".into()));
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
            let t: jiff::Timestamp = renew_time(&c)
                .expect("lease renewed")
                .parse()
                .expect("time");
            times.push(t);
        }
        for w in times.windows(2) {
            let gap = w[1].duration_since(w[0]).as_secs_f64();
            assert!(
                (9.0..=11.0).contains(&gap),
                "renewals ~10s apart, got {gap}s: {times:?}"
            );
        }
        let l = c.api.get("leases", LEASE_NAMESPACE, "n1").expect("lease");
        assert_eq!(l["spec"]["holderIdentity"], "n1");
        assert_eq!(l["spec"]["leaseDurationSeconds"], 40);
        assert_eq!(l["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(l["metadata"]["ownerReferences"][0]["uid"], "node-uid-1");
        // Each renewal is a PUT with the resourceVersion the last one got back
        // (optimistic concurrency), with no GET after the first.
        let puts = c
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "PUT" && r.path.ends_with("/leases/n1"))
            .count();
        assert!(puts >= 3, "renewals are updates, saw {puts}");
        let gets = c
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/leases/n1"))
            .count();
        assert_eq!(gets, 1, "only the first renewal reads the lease");
        stop.cancel();
        let _ = task.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_apiserver_fails_a_renewal_at_the_deadline_and_renewals_resume() {
        use apiserver_double::Fault;
        use kubelet_client::client::{DEFAULT_REQUEST_TIMEOUT, is_timeout};
        let c = Cluster::start(Default::default()).await;
        let path = c.dir.path().join("n1-kubelet.conf");
        c.api
            .write_cert_kubeconfig(&path, "system:node:n1", &["system:nodes"])
            .expect("kubeconfig");
        let (client, _) = kubelet_client::from_kubeconfig(&path, 50.0, 100)
            .await
            .expect("client");
        let lease = LeaseController {
            client,
            node_name: "n1".into(),
            duration_seconds: 40,
            clock: Arc::new(TokioClock::default()),
            node_uid: watch::channel(None).1,
            connections: None,
            recovered: None,
        };
        lease.renew().await.expect("created");
        c.api.set_fault(Fault::Hang);
        let started = tokio::time::Instant::now();
        let hung = tokio::time::timeout(DEFAULT_REQUEST_TIMEOUT * 2, lease.renew())
            .await
            .expect("the client bounds the renewal, not this guard");
        assert!(matches!(&hung, Err(e) if is_timeout(e)), "{hung:?}");
        assert!(started.elapsed() <= DEFAULT_REQUEST_TIMEOUT + Duration::from_secs(1));

        let renew_time = |c: &Cluster| {
            c.api
                .get("leases", LEASE_NAMESPACE, "n1")
                .and_then(|l| l["spec"]["renewTime"].as_str().map(String::from))
        };
        let stale = renew_time(&c);
        let stop = CancellationToken::new();
        let task = tokio::spawn(lease.run(stop.clone()));
        tokio::time::sleep(Duration::from_secs(30)).await;
        let gets = c
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/leases/n1"))
            .count();
        assert!(gets >= 3, "tries go on during the hang, saw {gets} GETs");
        c.api.set_fault(Fault::None);
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_ne!(renew_time(&c), stale, "renewed once the apiserver answers");
        stop.cancel();
        let _ = task.await;
    }

    #[test]
    fn failures_back_off_to_seven_seconds_and_repeated_ones_close_connections() {
        let ms = Duration::from_millis;
        let mut b = Backoff::default();
        let waits: Vec<(Duration, bool)> = (0..7).map(|_| b.failed()).collect();
        assert_eq!(
            waits,
            [
                (ms(200), false),
                (ms(400), true),
                (ms(800), true),
                (ms(1600), true),
                (ms(3200), true),
                (ms(6400), true),
                (MAX_BACKOFF, true)
            ]
        );
        assert!(b.succeeded(), "a success after failures is a recovery");
        assert!(!b.succeeded(), "and only once");
        assert_eq!(b.timed_out(), (Duration::ZERO, false), "retried at once");
        assert_eq!(b.timed_out(), (Duration::ZERO, true));
        assert_eq!(b.failed(), (ms(200), true), "timeouts leave the backoff");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_half_open_outage_the_lease_is_renewed_within_its_timeout() {
        use kubelet_client::ClientOptions;
        let c = Cluster::start(Default::default()).await;
        let path = c.dir.path().join("n1-kubelet.conf");
        c.api
            .write_cert_kubeconfig(&path, "system:node:n1", &["system:nodes"])
            .expect("kubeconfig");
        let connections = Arc::new(Connections::new());
        let options = ClientOptions::new(50.0, 100).with_connections(connections.clone());
        let (client, _) = kubelet_client::from_kubeconfig_with(&path, options)
            .await
            .expect("client");
        let recovered = Arc::new(Notify::new());
        let lease = LeaseController {
            client,
            node_name: "n1".into(),
            duration_seconds: 40,
            clock: Arc::new(TokioClock::default()),
            node_uid: watch::channel(None).1,
            connections: Some(connections.clone()),
            recovered: Some(recovered.clone()),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(lease.run(stop.clone()));
        let renew_time = |c: &Cluster| {
            c.api
                .get("leases", LEASE_NAMESPACE, "n1")
                .and_then(|l| l["spec"]["renewTime"].as_str().map(String::from))
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(renew_time(&c).is_some(), "created");

        c.api.set_half_open(true);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(c.api.held_connections() > 0, "renewals were held");
        assert!(
            connections.generation() >= 2,
            "repeated timeouts close the connections, closed {} times",
            connections.generation()
        );
        let stale = renew_time(&c);
        // Back: connections held so far stay unanswered, new ones are served.
        c.api.set_half_open(false);
        let back = tokio::time::Instant::now();
        while renew_time(&c) == stale {
            assert!(
                back.elapsed() <= Duration::from_secs(11),
                "not renewed within the renewal timeout of the return"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::timeout(Duration::from_secs(1), recovered.notified())
            .await
            .expect("the recovery asks for a node status sync");
        stop.cancel();
        let _ = task.await;
    }

    #[tokio::test]
    async fn a_conflicting_writer_is_retried_not_fatal() {
        let c = Cluster::start(Default::default()).await;
        let lease = LeaseController {
            client: c.node_client("n2").await,
            node_name: "n2".into(),
            duration_seconds: 40,
            clock: Arc::new(kubelet_client::clock::SystemClock),
            node_uid: watch::channel(None).1,
            connections: None,
            recovered: None,
        };
        let first = lease.renew().await.expect("created");
        // Someone else updates the lease: our copy's resourceVersion is stale now.
        let admin: Api<Lease> = Api::namespaced(c.admin().await, LEASE_NAMESPACE);
        let mut other = first.clone();
        other
            .spec
            .get_or_insert_with(Default::default)
            .holder_identity = Some("intruder".into());
        admin
            .replace("n2", &PostParams::default(), &other)
            .await
            .expect("other writer");
        let stale = admin.replace("n2", &PostParams::default(), &first).await;
        assert!(
            matches!(stale, Err(kube::Error::Api(ref s)) if s.code == 409),
            "double enforces resourceVersion: {stale:?}"
        );
        let renewed = lease.renew().await.expect("renew re-reads and wins");
        assert_eq!(
            renewed.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("n2")
        );
    }

    #[tokio::test]
    async fn a_kept_lease_is_put_alone_and_read_again_after_a_conflict_or_deletion() {
        let c = Cluster::start(Default::default()).await;
        let lease = LeaseController {
            client: c.node_client("n3").await,
            node_name: "n3".into(),
            duration_seconds: 40,
            clock: Arc::new(kubelet_client::clock::SystemClock),
            node_uid: watch::channel(None).1,
            connections: None,
            recovered: None,
        };
        let count = |method: &str| {
            c.api
                .requests()
                .iter()
                .filter(|r| r.method == method && r.path.ends_with("/leases/n3"))
                .count()
        };
        let mut latest = None;
        lease.renew_from(&mut latest).await.expect("created");
        let gets = count("GET");
        // A quiet renewal: one PUT, no GET.
        lease.renew_from(&mut latest).await.expect("renewed");
        lease.renew_from(&mut latest).await.expect("renewed");
        assert_eq!(count("GET"), gets);
        assert_eq!(count("PUT"), 2);

        // Another writer: the kept copy is stale, so the PUT conflicts, the
        // lease is read again and the renewal wins.
        let admin: Api<Lease> = Api::namespaced(c.admin().await, LEASE_NAMESPACE);
        let mut other = admin.get("n3").await.expect("lease");
        other
            .spec
            .get_or_insert_with(Default::default)
            .holder_identity = Some("intruder".into());
        admin
            .replace("n3", &PostParams::default(), &other)
            .await
            .expect("other writer");
        // (The writer's own GET counts too.)
        let gets = count("GET");
        let renewed = lease.renew_from(&mut latest).await.expect("re-read");
        assert_eq!(
            renewed.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("n3")
        );
        assert_eq!(count("GET"), gets + 1);

        // Deleted: read (missing), created again.
        admin
            .delete("n3", &Default::default())
            .await
            .expect("delete");
        lease.renew_from(&mut latest).await.expect("created again");
        assert!(c.api.get("leases", LEASE_NAMESPACE, "n3").is_some());
        assert_eq!(count("GET"), gets + 2);
    }
}
