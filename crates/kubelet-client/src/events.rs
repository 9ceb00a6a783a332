//! Writing events to the apiserver (client-go's event broadcaster as the
//! kubelet configures it): core/v1 `Event` objects, pod events in the pod's
//! namespace and node events in `default`; a bounded queue that drops when
//! full (never blocks a pod worker); the correlator that turns a repeat of the
//! same event into a PATCH of `count` and `lastTimestamp`; and a token bucket
//! with `eventRecordQPS`/`eventBurst`.
//!
//! As client-go's `recordToSink`: a write that fails in transport, a request
//! deadline included, is tried again up to 12 times, 10s apart (the first wait
//! randomised so that nodes do not retry in step); one the apiserver refuses
//! is dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubelet_types::events::{EventType, Recorder};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::client::TokenBucket;
use crate::clock::Clock;

/// Upstream `maxQueuedEvents`.
pub const QUEUE: usize = 1000;
/// Correlation cache size (upstream `maxLruCacheEntries`).
const CACHE: usize = 4096;
/// Upstream `maxTriesPerEvent`.
pub const MAX_TRIES: u32 = 12;
/// Upstream `defaultSleepDuration` between tries.
pub const RETRY_SLEEP: Duration = Duration::from_secs(10);

/// What became of one try to write an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// Written, or refused by the apiserver (no point trying again).
    Done,
    /// The apiserver could not be reached or did not answer in time.
    Retry,
}

/// Whether a failed write may succeed later (upstream `recordEvent`: retry
/// transport errors, never the apiserver's refusals or a malformed request).
fn retryable(e: &kube::Error) -> bool {
    matches!(
        e,
        kube::Error::Service(_) | kube::Error::HyperError(_) | kube::Error::Auth(_)
    )
}

struct Pending {
    object: ObjectReference,
    kind: EventType,
    reason: String,
    message: String,
}

/// What makes two events the same: object uid, fieldPath, reason, message, type.
type EventKey = (String, String, String, String, &'static str);

/// The recorder handed to the rest of the kubelet.
#[derive(Clone)]
pub struct EventRecorder {
    tx: mpsc::Sender<Pending>,
}

impl Recorder for EventRecorder {
    fn event(&self, object: &ObjectReference, kind: EventType, reason: &str, message: String) {
        let p = Pending {
            object: object.clone(),
            kind,
            reason: reason.to_string(),
            message,
        };
        if self.tx.try_send(p).is_err() {
            debug!(reason, "Event queue full; dropping event");
        }
    }
}

/// Writes queued events.
pub struct EventSink {
    client: Client,
    node_name: String,
    limiter: TokenBucket,
    clock: Arc<dyn Clock>,
    rx: mpsc::Receiver<Pending>,
    /// (object uid, fieldPath, reason, message, type) -> (namespace, event name, count).
    seen: HashMap<EventKey, (String, String, i32)>,
}

/// A recorder and the sink that drains it.
pub fn channel(
    client: Client,
    node_name: &str,
    qps: f64,
    burst: u32,
    clock: Arc<dyn Clock>,
) -> (EventRecorder, EventSink) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        EventRecorder { tx },
        EventSink {
            client,
            node_name: node_name.to_string(),
            limiter: TokenBucket::new(qps, burst),
            clock,
            rx,
            seen: HashMap::new(),
        },
    )
}

impl EventSink {
    fn build(&self, p: &Pending, now: &jiff::Timestamp) -> Event {
        let namespace = p
            .object
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string());
        let name = format!(
            "{}.{:x}",
            p.object.name.clone().unwrap_or_default(),
            now.as_nanosecond()
        );
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                ..Default::default()
            },
            involved_object: p.object.clone(),
            reason: Some(p.reason.clone()),
            message: Some(p.message.clone()),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(self.node_name.clone()),
            }),
            first_timestamp: Some(Time(*now)),
            last_timestamp: Some(Time(*now)),
            count: Some(1),
            type_: Some(p.kind.as_str().to_string()),
            event_time: None::<MicroTime>,
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.node_name.clone()),
            ..Default::default()
        }
    }

    async fn write(&mut self, p: &Pending) -> Written {
        self.limiter.acquire().await;
        let now = self.clock.now();
        let key = (
            p.object.uid.clone().unwrap_or_default(),
            p.object.field_path.clone().unwrap_or_default(),
            p.reason.clone(),
            p.message.clone(),
            p.kind.as_str(),
        );
        if let Some((ns, name, count)) = self.seen.get(&key).cloned() {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
            let body = serde_json::json!({"count": count + 1, "lastTimestamp": Time(now), "message": p.message});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Strategic(body))
                .await
            {
                Ok(_) => {
                    self.seen.insert(key, (ns, name, count + 1));
                    return Written::Done;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.seen.remove(&key);
                }
                Err(e) => {
                    warn!(reason = %p.reason, error = %e, "Unable to update event");
                    return if retryable(&e) {
                        Written::Retry
                    } else {
                        Written::Done
                    };
                }
            }
        }
        let ev = self.build(p, &now);
        let ns = ev.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        match api.create(&PostParams::default(), &ev).await {
            Ok(created) => {
                if self.seen.len() >= CACHE {
                    self.seen.clear();
                }
                self.seen
                    .insert(key, (ns, created.metadata.name.unwrap_or_default(), 1));
                Written::Done
            }
            Err(e) => {
                warn!(reason = %p.reason, error = %e, "Unable to write event");
                if retryable(&e) {
                    Written::Retry
                } else {
                    Written::Done
                }
            }
        }
    }

    /// Writes one event, trying again after transport failures; false if stopped.
    async fn record(&mut self, p: &Pending, stop: &CancellationToken) -> bool {
        for tries in 1..=MAX_TRIES {
            let written = tokio::select! {
                () = stop.cancelled() => return false,
                w = self.write(p) => w,
            };
            if written == Written::Done {
                return true;
            }
            if tries == MAX_TRIES {
                warn!(reason = %p.reason, "Unable to write event (retry limit exceeded)");
                break;
            }
            let wait = if tries == 1 {
                RETRY_SLEEP.mul_f64(rand::random::<f64>())
            } else {
                RETRY_SLEEP
            };
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(wait) => {}
            }
        }
        true
    }

    /// Drains the queue until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            let p = tokio::select! {
                () = stop.cancelled() => return,
                p = self.rx.recv() => match p { Some(p) => p, None => return },
            };
            if !self.record(&p, &stop).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use kubelet_test_util::Cluster;
    use kubelet_types::events::{node_ref, pod_ref};
    use std::time::Duration;

    #[tokio::test]
    async fn core_v1_events_are_written_and_repeats_correlated() {
        let c = Cluster::start(Default::default()).await;
        let (rec, sink) = channel(
            c.node_client("n1").await,
            "n1",
            50.0,
            100,
            Arc::new(SystemClock),
        );
        let stop = CancellationToken::new();
        tokio::spawn(sink.run(stop.clone()));
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "team-a", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        .expect("pod");
        rec.event(
            &pod_ref(&p, Some("c")),
            EventType::Normal,
            "Pulling",
            "Pulling image \"busybox\"".into(),
        );
        rec.event(
            &pod_ref(&p, Some("c")),
            EventType::Warning,
            "BackOff",
            "Back-off restarting failed container c".into(),
        );
        rec.event(
            &pod_ref(&p, Some("c")),
            EventType::Warning,
            "BackOff",
            "Back-off restarting failed container c".into(),
        );
        rec.event(
            &node_ref("n1"),
            EventType::Normal,
            "NodeReady",
            "status is now: NodeReady".into(),
        );
        let ok = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let evs = c.api.list("events");
                if evs.len() == 3 && evs.iter().any(|e| e["count"] == 2) {
                    return evs;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let evs = ok.expect("events written");
        let backoff = evs
            .iter()
            .find(|e| e["reason"] == "BackOff")
            .expect("BackOff");
        assert_eq!(backoff["count"], 2, "a repeat patches the count");
        assert_eq!(backoff["type"], "Warning");
        assert_eq!(backoff["metadata"]["namespace"], "team-a");
        assert_eq!(backoff["involvedObject"]["fieldPath"], "spec.containers{c}");
        assert_eq!(backoff["source"]["component"], "kubelet");
        assert_eq!(backoff["source"]["host"], "n1");
        let node = evs
            .iter()
            .find(|e| e["reason"] == "NodeReady")
            .expect("node event");
        assert_eq!(node["metadata"]["namespace"], "default");
        assert_eq!(node["involvedObject"]["kind"], "Node");
        assert!(
            node["involvedObject"]["namespace"].is_null(),
            "core/v1 node events have no involvedObject namespace"
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_apiserver_fails_the_write_at_the_deadline_and_it_is_retried() {
        use apiserver_double::Fault;
        let c = Cluster::start(Default::default()).await;
        let path = c.dir.path().join("n1-kubelet.conf");
        c.api
            .write_cert_kubeconfig(&path, "system:node:n1", &["system:nodes"])
            .expect("kubeconfig");
        let (client, _) = crate::from_kubeconfig(&path, 50.0, 100)
            .await
            .expect("client");
        let (rec, sink) = channel(client, "n1", 50.0, 100, Arc::new(SystemClock));
        let stop = CancellationToken::new();
        tokio::spawn(sink.run(stop.clone()));
        let posts = |c: &Cluster| {
            c.api
                .requests()
                .iter()
                .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
                .count()
        };
        c.api.set_fault(Fault::Hang);
        rec.event(
            &node_ref("n1"),
            EventType::Normal,
            "Starting",
            "Starting kubelet.".into(),
        );
        tokio::time::sleep(Duration::from_secs(150)).await;
        assert!(
            posts(&c) >= 2,
            "the hung write ends at the deadline and is tried again, saw {} POSTs",
            posts(&c)
        );
        assert!(c.api.list("events").is_empty());
        // Later events wait behind the one being retried, in order (upstream too).
        rec.event(
            &node_ref("n1"),
            EventType::Normal,
            "NodeReady",
            "status is now: NodeReady".into(),
        );
        c.api.set_fault(Fault::None);
        tokio::time::sleep(Duration::from_secs(80)).await;
        let reasons: Vec<String> = c
            .api
            .list("events")
            .iter()
            .filter_map(|e| e["reason"].as_str().map(String::from))
            .collect();
        assert!(reasons.contains(&"Starting".to_string()), "{reasons:?}");
        assert!(reasons.contains(&"NodeReady".to_string()), "{reasons:?}");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_event_is_not_retried() {
        use apiserver_double::Fault;
        let c = Cluster::start(Default::default()).await;
        let (rec, sink) = channel(
            c.node_client("n1").await,
            "n1",
            50.0,
            100,
            Arc::new(SystemClock),
        );
        let stop = CancellationToken::new();
        tokio::spawn(sink.run(stop.clone()));
        c.api.set_fault(Fault::ServerError);
        rec.event(
            &node_ref("n1"),
            EventType::Normal,
            "Starting",
            "Starting kubelet.".into(),
        );
        tokio::time::sleep(Duration::from_secs(300)).await;
        let posts = c
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .count();
        assert_eq!(posts, 1, "an apiserver error status is final");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_instead_of_blocking() {
        let c = Cluster::start(Default::default()).await;
        // No sink running: the queue fills and further events are dropped at once.
        let (rec, _sink) = channel(
            c.node_client("n1").await,
            "n1",
            5.0,
            10,
            Arc::new(SystemClock),
        );
        let start = tokio::time::Instant::now();
        for i in 0..(QUEUE + 10) {
            rec.event(
                &node_ref("n1"),
                EventType::Normal,
                "Starting",
                format!("{i}"),
            );
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
