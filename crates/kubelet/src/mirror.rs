//! Mirror pods (upstream `pkg/kubelet/pod/mirror_client.go` and the mirror pod
//! handling of `syncPod` / `HandlePodCleanups`), as a level-triggered
//! reconciler: every static pod has a mirror pod `<name>-<node>` annotated
//! `kubernetes.io/config.mirror: <config hash>` and owned by the Node; a
//! mirror pod that is deleted is recreated, one whose hash no longer matches
//! its static pod is replaced, and one without a static pod is deleted (only
//! once every source has reported).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kubelet_types::{labels, pod};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::pod_manager::PodManager;
use kubelet_podconfig::SourcesReady;

/// How often the reconciler looks even without a change notification.
pub const PERIOD: Duration = Duration::from_secs(2);

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The mirror pod of a static pod (upstream `CreateMirrorPod`).
pub fn mirror_of(static_pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let mut annotations = static_pod.metadata.annotations.clone().unwrap_or_default();
    let hash = annotation(static_pod, labels::CONFIG_HASH)
        .unwrap_or(pod::uid(static_pod))
        .to_string();
    annotations.insert(labels::CONFIG_MIRROR.to_string(), hash);
    Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: static_pod.metadata.namespace.clone(),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.to_string(),
                uid: node_uid.to_string(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: static_pod.spec.clone(),
        status: None,
    }
}

/// Keeps mirror pods in line with static pods.
pub struct MirrorManager {
    /// Client.
    pub client: Client,
    /// Node name.
    pub node_name: String,
    /// Pods the sources want.
    pub desired: PodManager,
    /// Mirror pods the apiserver has.
    pub mirror: PodManager,
    /// Whether every source reported.
    pub sources_ready: Arc<SourcesReady>,
    /// The Node's UID once registered.
    pub node_uid: watch::Receiver<Option<String>>,
}

impl MirrorManager {
    async fn delete(&self, m: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), pod::namespace(m));
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(pod::uid(m).to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(pod::name(m), &dp).await {
            Ok(_) => info!(pod = %pod::describe(m), "Deleted mirror pod"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => warn!(pod = %pod::describe(m), error = %e, "Failed deleting mirror pod"),
        }
    }

    async fn create(&self, static_pod: &Pod, node_uid: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), pod::namespace(static_pod));
        let m = mirror_of(static_pod, &self.node_name, node_uid);
        match api.create(&PostParams::default(), &m).await {
            Ok(_) => info!(pod = %pod::describe(static_pod), "Created mirror pod"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                warn!(pod = %pod::describe(static_pod), error = %e, "Failed creating a mirror pod")
            }
        }
    }

    /// One pass.
    pub async fn reconcile(&self) {
        let Some(node_uid) = self.node_uid.borrow().clone() else {
            return;
        };
        let statics: Vec<Arc<Pod>> = self
            .desired
            .get_pods()
            .into_iter()
            .filter(|p| pod::is_static(p) && p.metadata.deletion_timestamp.is_none())
            .collect();
        for sp in &statics {
            let hash = annotation(sp, labels::CONFIG_HASH).unwrap_or(pod::uid(sp));
            match self.mirror.get_mirror_pod_by_full_name(&pod::full_name(sp)) {
                Some(m)
                    if annotation(&m, labels::CONFIG_MIRROR) == Some(hash)
                        && m.metadata.deletion_timestamp.is_none() => {}
                Some(m) => {
                    info!(pod = %pod::describe(sp), "Mirror pod is outdated; replacing it");
                    self.delete(&m).await;
                    self.create(sp, &node_uid).await;
                }
                None => self.create(sp, &node_uid).await,
            }
        }
        if !self.sources_ready.all_handled() {
            return;
        }
        for m in self.mirror.get_mirror_pods() {
            let full = pod::full_name(&m);
            if !statics.iter().any(|sp| pod::full_name(sp) == full)
                && m.metadata.deletion_timestamp.is_none()
            {
                info!(pod = %pod::describe(&m), "Deleting orphaned mirror pod");
                self.delete(&m).await;
            }
        }
    }

    /// Runs until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut changed = self.mirror.subscribe_mirror();
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = changed.changed() => {}
                _ = tick.tick() => {}
            }
            self.reconcile().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_podconfig::api::ApiSource;
    use kubelet_podconfig::spawn_merger;
    use kubelet_test_util::Cluster;
    use kubelet_types::Source;

    fn static_pod(hash: &str) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "web-n1", "namespace": "default", "uid": hash,
            "annotations": {"kubernetes.io/config.source": "file", "kubernetes.io/config.hash": hash}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}))
        .expect("pod")
    }

    async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let ok = tokio::time::timeout(Duration::from_secs(15), async {
            while !f() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(ok.is_ok(), "{what}");
    }

    #[tokio::test]
    async fn mirror_pods_follow_static_pods() {
        let c = Cluster::start(Default::default()).await;
        let client = c.node_client("n1").await;
        let stop = CancellationToken::new();
        let (tx, _rx, ready) = spawn_merger(
            &tokio_util::task::TaskTracker::new(),
            &[Source::Api],
            stop.clone(),
        );
        let mirror = PodManager::default();
        tokio::spawn(
            ApiSource {
                client: client.clone(),
                node_name: "n1".into(),
                mirror: Arc::new(mirror.clone()),
            }
            .run(tx, stop.clone()),
        );
        let desired = PodManager::default();
        desired.add_pod(Arc::new(static_pod("h1")));
        // NodeRestriction wants a mirror pod owned by the node's real Node.
        let node: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).expect("node");
        let node = kube::Api::<k8s_openapi::api::core::v1::Node>::all(c.admin().await)
            .create(&Default::default(), &node)
            .await
            .expect("create node");
        let node_uid_value = node.metadata.uid.clone().expect("node uid");
        let (_uid_tx, node_uid) = watch::channel(Some(node_uid_value.clone()));
        let m = MirrorManager {
            client,
            node_name: "n1".into(),
            desired: desired.clone(),
            mirror: mirror.clone(),
            sources_ready: ready,
            node_uid,
        };
        tokio::spawn(m.run(stop.clone()));
        let get = || c.api.get("pods", "default", "web-n1");
        wait_for("mirror pod created", || get().is_some()).await;
        let m1 = get().expect("mirror");
        assert_eq!(
            m1["metadata"]["annotations"]["kubernetes.io/config.mirror"],
            "h1"
        );
        assert_eq!(m1["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(
            m1["metadata"]["ownerReferences"][0]["uid"],
            node_uid_value.as_str()
        );
        assert_ne!(
            m1["metadata"]["uid"], "h1",
            "the apiserver gives the mirror its own uid"
        );

        // Someone deletes it (gracefully, as kubectl does): it comes back.
        let admin: Api<Pod> = Api::namespaced(c.admin().await, "default");
        admin
            .delete("web-n1", &Default::default())
            .await
            .expect("delete mirror");
        let first_uid = m1["metadata"]["uid"].clone();
        wait_for("mirror pod recreated", || {
            get().is_some_and(|p| {
                p["metadata"]["uid"] != first_uid && p["metadata"]["deletionTimestamp"].is_null()
            })
        })
        .await;

        // The manifest changes (new hash): the mirror is replaced.
        desired.clear();
        desired.add_pod(Arc::new(static_pod("h2")));
        wait_for("mirror pod updated", || {
            get().is_some_and(|p| {
                p["metadata"]["annotations"]["kubernetes.io/config.mirror"] == "h2"
            })
        })
        .await;

        // The manifest goes away: so does the mirror.
        desired.clear();
        wait_for("mirror pod deleted", || get().is_none()).await;
        stop.cancel();
    }
}
