//! The apiserver pod source (upstream `pkg/kubelet/config/apiserver.go`): a
//! watch of pods with `spec.nodeName=<node>` (kube-runtime's watcher: list,
//! watch from the list's resourceVersion, relist on 410 Gone, backoff on
//! errors) kept in a store that sends a full SET snapshot on every change
//! (upstream `UndeltaStore`).
//!
//! Mirror pods are bound to the node too, but they are the apiserver's view of
//! static pods, never pods to run: they go to a [`MirrorPodSink`] (the agent's
//! pod manager) instead.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use kubelet_types::{Source, labels, pod};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{SourceSender, SourceUpdate};

/// Where the apiserver source puts the mirror pods it sees, by pod full name
/// (upstream: the pod manager's mirror pods).
pub trait MirrorPodSink: Send + Sync + 'static {
    /// Replaces the set of mirror pods.
    fn set_mirror_pods(&self, pods: HashMap<String, Pod>);
}

/// Whether a pod object is a mirror pod.
pub fn is_mirror(p: &Pod) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(labels::CONFIG_MIRROR))
}

/// Watches this node's pods.
pub struct ApiSource {
    /// Client.
    pub client: Client,
    /// Node name.
    pub node_name: String,
    /// Where mirror pods go.
    pub mirror: std::sync::Arc<dyn MirrorPodSink>,
}

impl ApiSource {
    fn publish(&self, store: &HashMap<String, Pod>) -> SourceUpdate {
        let mut pods = vec![];
        let mut mirrors = HashMap::new();
        for p in store.values() {
            if is_mirror(p) {
                mirrors.insert(pod::full_name(p), p.clone());
            } else {
                pods.push(p.clone());
            }
        }
        self.mirror.set_mirror_pods(mirrors);
        SourceUpdate {
            source: Source::Api,
            pods,
        }
    }

    /// Runs until `stop`; pods keep running whatever the apiserver does.
    pub async fn run(self, tx: SourceSender, stop: CancellationToken) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let stream = watcher::watcher(api, cfg).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut store: HashMap<String, Pod> = HashMap::new();
        let mut pending: Option<HashMap<String, Pod>> = None;
        let mut healthy = true;
        let mut refusals = kubelet_client::refusal::Refusals::default();
        loop {
            let ev = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                ev = stream.next() => match ev { Some(ev) => ev, None => return },
            };
            let changed = match ev {
                Ok(Event::Init) => {
                    pending = Some(HashMap::new());
                    false
                }
                Ok(Event::InitApply(p)) => {
                    if let Some(m) = pending.as_mut() {
                        m.insert(pod::uid(&p).to_string(), p);
                    }
                    false
                }
                Ok(Event::InitDone) => {
                    store = pending.take().unwrap_or_default();
                    info!(pods = store.len(), "Listed pods bound to this node");
                    true
                }
                Ok(Event::Apply(p)) => {
                    store.insert(pod::uid(&p).to_string(), p);
                    true
                }
                Ok(Event::Delete(p)) => store.remove(pod::uid(&p)).is_some(),
                Err(e) => {
                    match kubelet_client::refusal::refused(&e) {
                        Some(code) if refusals.report(code) => error!(error = %e, code,
                            "The apiserver refuses to list or watch the pods bound to this node; no new pod starts until it allows it; retrying with backoff"),
                        Some(_) => debug!(error = %e, "Pod watch still refused"),
                        None if healthy => warn!(error = %e,
                            "Pod watch failed; pods keep running, retrying with backoff"),
                        None => debug!(error = %e, "Pod watch still failing"),
                    }
                    healthy = false;
                    continue;
                }
            };
            if !healthy {
                info!("Pod watch recovered");
                healthy = true;
                refusals.recovered();
            }
            if changed && tx.send(self.publish(&store)).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spawn_merger;
    use kube::api::PostParams;
    use kubelet_test_util::Cluster;
    use kubelet_types::{PodOperation, PodUpdate};
    use std::time::Duration;
    use tokio::sync::mpsc;

    /// Mirror pods as the agent's pod manager would keep them.
    #[derive(Default)]
    struct Mirrors(parking_lot::Mutex<HashMap<String, Pod>>);

    impl MirrorPodSink for Mirrors {
        fn set_mirror_pods(&self, pods: HashMap<String, Pod>) {
            *self.0.lock() = pods;
        }
    }

    impl Mirrors {
        fn get_mirror_pod_by_full_name(&self, full_name: &str) -> Option<Pod> {
            self.0.lock().get(full_name).cloned()
        }
    }

    fn pod(name: &str, node: &str, mirror: bool) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod");
        if mirror {
            p.metadata.annotations =
                Some([(labels::CONFIG_MIRROR.to_string(), "h".to_string())].into());
        }
        p
    }

    fn names(u: &PodUpdate) -> Vec<String> {
        u.pods.iter().map(|p| pod::name(p).to_string()).collect()
    }

    async fn next(rx: &mut mpsc::Receiver<PodUpdate>) -> PodUpdate {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an update in time")
            .expect("channel open")
    }

    async fn create(admin: &Api<Pod>, name: &str, node: &str, mirror: bool) {
        admin
            .create(&PostParams::default(), &pod(name, node, mirror))
            .await
            .expect("create pod");
    }

    /// An api source for node n1 feeding a merger.
    async fn start(
        c: &Cluster,
        stop: &CancellationToken,
    ) -> (
        mpsc::Receiver<PodUpdate>,
        std::sync::Arc<crate::SourcesReady>,
        std::sync::Arc<Mirrors>,
    ) {
        let (tx, rx, ready) = spawn_merger(
            &tokio_util::task::TaskTracker::new(),
            &[Source::Api],
            stop.clone(),
        );
        let mirror = std::sync::Arc::new(Mirrors::default());
        let src = ApiSource {
            client: c.node_client("n1").await,
            node_name: "n1".into(),
            mirror: mirror.clone(),
        };
        tokio::spawn(src.run(tx, stop.clone()));
        (rx, ready, mirror)
    }

    async fn quiet(rx: &mut mpsc::Receiver<PodUpdate>, d: Duration) {
        if let Ok(Some(u)) = tokio::time::timeout(d, rx.recv()).await {
            panic!("unexpected update {:?} for {:?}", u.op, names(&u));
        }
    }

    #[tokio::test]
    async fn expired_resource_version_relists_without_duplicate_updates() {
        let c = Cluster::start(Default::default()).await;
        let admin: Api<Pod> = Api::namespaced(c.admin().await, "default");
        create(&admin, "a", "n1", false).await;
        create(&admin, "elsewhere", "n2", false).await;
        create(&admin, "static-n1", "n1", true).await;
        let stop = CancellationToken::new();
        let (mut rx, ready, mirror) = start(&c, &stop).await;
        let u = next(&mut rx).await;
        assert_eq!(u.op, PodOperation::Add);
        assert_eq!(names(&u), ["a"], "only this node's pods, mirrors apart");
        assert!(ready.all_ready());
        assert!(
            mirror
                .get_mirror_pod_by_full_name("static-n1_default")
                .is_some(),
            "mirror pods are tracked, not run"
        );

        // The watch history is compacted and the watch dropped: the watcher gets 410 and relists.
        let lists_before = c
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && !r.query.contains("watch=true"))
            .count();
        // A change this watch does not see moves the revision past the client's.
        create(&admin, "elsewhere-2", "n2", false).await;
        c.api.compact();
        c.api.close_watches();
        quiet(&mut rx, Duration::from_secs(2)).await;
        let lists_after = c
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && !r.query.contains("watch=true"))
            .count();
        assert!(
            lists_after > lists_before,
            "relisted after 410 ({lists_before} -> {lists_after})"
        );

        // And the stream still works afterwards.
        create(&admin, "b", "n1", false).await;
        let u = next(&mut rx).await;
        assert_eq!(
            (u.op, names(&u)),
            (PodOperation::Add, vec!["b".to_string()])
        );
        admin
            .delete("a", &Default::default())
            .await
            .expect("delete a");
        let u = next(&mut rx).await;
        assert_eq!(
            u.op,
            PodOperation::Delete,
            "graceful deletion of a bound pod sets deletionTimestamp"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn pods_survive_an_unreachable_apiserver() {
        let c = Cluster::start(Default::default()).await;
        let admin: Api<Pod> = Api::namespaced(c.admin().await, "default");
        create(&admin, "a", "n1", false).await;
        let stop = CancellationToken::new();
        let (mut rx, _, _) = start(&c, &stop).await;
        assert_eq!(next(&mut rx).await.op, PodOperation::Add);
        c.api.set_up(false);
        quiet(&mut rx, Duration::from_secs(3)).await;
        c.api.set_up(true);
        // Back: nothing to do for the pod that was there all along.
        quiet(&mut rx, Duration::from_secs(3)).await;
        create(&admin, "b", "n1", false).await;
        let u = next(&mut rx).await;
        assert_eq!(
            (u.op, names(&u)),
            (PodOperation::Add, vec!["b".to_string()])
        );
        stop.cancel();
    }

    /// Bootstraps `node` with the double's bootstrap token: (kubeconfig, cert dir).
    async fn bootstrapped(c: &Cluster, node: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = c.dir.path();
        let bootstrap = dir.join("bootstrap-kubelet.conf");
        c.api
            .write_token_kubeconfig(&bootstrap, apiserver_double::BOOTSTRAP_TOKEN)
            .expect("bootstrap kubeconfig");
        let (kubeconfig, pki) = (dir.join("kubelet.conf"), dir.join("pki"));
        kubelet_client::certificate::bootstrap::load_client_cert(
            &kubeconfig,
            Some(&bootstrap),
            &pki,
            node,
        )
        .await
        .expect("bootstrap");
        (kubeconfig, pki)
    }

    /// Rotation of the client certificate does not drop the pod watch.
    #[tokio::test]
    async fn rotation_switches_credentials_without_dropping_the_watch() {
        let lifetime = std::time::Duration::from_secs(6);
        let c = Cluster::start(apiserver_double::Options {
            cert_lifetime: lifetime,
            backdate: std::time::Duration::ZERO,
            ..apiserver_double::Options::default()
        })
        .await;
        let (kubeconfig, pki) = bootstrapped(&c, "n1").await;
        let started = tokio::time::Instant::now();
        // Later certificates live long.
        c.api
            .set_cert_lifetime(std::time::Duration::from_secs(3600));
        let (client, cert) = kubelet_client::from_kubeconfig(&kubeconfig, 50.0, 100)
            .await
            .expect("client");
        let admin: kube::Api<Pod> = kube::Api::namespaced(c.admin().await, "default");
        let pod = |name: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}))
            .expect("pod")
        };
        admin
            .create(&PostParams::default(), &pod("early"))
            .await
            .expect("pod");
        let stop = CancellationToken::new();
        let (tx, mut rx, _) = spawn_merger(
            &tokio_util::task::TaskTracker::new(),
            &[kubelet_types::Source::Api],
            stop.clone(),
        );
        tokio::spawn(
            ApiSource {
                client: client.clone(),
                node_name: "n1".into(),
                mirror: std::sync::Arc::new(Mirrors::default()),
            }
            .run(tx, stop.clone()),
        );
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await;
        assert!(matches!(first, Ok(Some(_))), "initial list delivered");
        tokio::spawn(
            kubelet_client::certificate::manager::CertManager {
                client: client.clone(),
                cert_dir: pki.clone(),
                cert: cert.clone(),
                node: "n1".into(),
            }
            .run(stop.clone()),
        );
        let rotated = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while cert.generation() < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(rotated.is_ok(), "rotated at 70-90% of a 6s lifetime");
        // Past the first certificate's expiry, the client still works: new connections use the new one.
        tokio::time::sleep_until(started + lifetime + std::time::Duration::from_secs(1)).await;
        admin
            .create(&PostParams::default(), &pod("late"))
            .await
            .expect("pod");
        let u = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await;
        assert!(
            matches!(u, Ok(Some(ref u)) if u.pods.iter().any(|p| p.metadata.name.as_deref() == Some("late"))),
            "the watch opened with the first certificate still delivers: {u:?}"
        );
        kube::Api::<k8s_openapi::api::core::v1::Node>::all(client)
            .get_opt("n1")
            .await
            .expect("a request after expiry succeeds");
        let node_reqs: Vec<_> = c
            .api
            .requests()
            .into_iter()
            .filter(|r| r.user.as_deref() == Some("system:node:n1"))
            .collect();
        let serials: std::collections::HashSet<_> =
            node_reqs.iter().filter_map(|r| r.serial.clone()).collect();
        assert!(
            serials.len() >= 2,
            "requests made with both certificates: {serials:?}"
        );
        let lists = node_reqs
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch=true"))
            .count();
        let watches = node_reqs
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && r.query.contains("watch=true"))
            .count();
        assert_eq!(
            (lists, watches),
            (1, 1),
            "one list and one watch: the watch was never dropped"
        );
        stop.cancel();
    }
}
