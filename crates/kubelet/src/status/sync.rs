//! Sending pod status to the apiserver (upstream `status_manager.go`
//! `syncBatch`/`syncPod`): a changed status is patched to `pods/status` as a
//! strategic merge patch with the pod's UID as precondition, only when the
//! kubelet-owned part differs from what the apiserver has; every 10s all pods
//! are compared again (resync). Static pods report through their mirror pod.
//! A deleted pod whose containers were stopped is removed with grace period 0:
//! the kubelet confirms graceful deletion.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kubelet_types::pod;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::StatusManager;
use super::compared::Compared;
use crate::pod_manager::PodManager;

/// Upstream `syncPeriod` of the status manager.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(10);

/// Conditions the kubelet owns (others, such as DisruptionTarget, belong to controllers).
const KUBELET_CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

/// The part of a status the kubelet writes, in wire form (times in seconds),
/// for comparison (upstream `isPodStatusByKubeletEqual`).
pub fn kubelet_view(s: &PodStatus) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    if let Some(conds) = v.get_mut("conditions").and_then(Value::as_array_mut) {
        conds.retain(|c| {
            c.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| KUBELET_CONDITIONS.contains(&t))
        });
        for c in conds.iter_mut() {
            if let Some(m) = c.as_object_mut() {
                m.remove("lastProbeTime");
            }
        }
        conds.sort_by(|a, b| a["type"].as_str().cmp(&b["type"].as_str()));
    }
    if let Some(m) = v.as_object_mut() {
        m.remove("nominatedNodeName");
        m.remove("resize");
    }
    v
}

/// Whether the apiserver already has every field the kubelet writes, as written.
/// Fields the kubelet does not write (set by others) do not count.
pub fn up_to_date(ours: &Value, theirs: &Value) -> bool {
    ours.as_object()
        .is_some_and(|o| o.iter().all(|(k, v)| theirs.get(k) == Some(v)))
}

/// The status as a strategic merge patch: a field the kubelet owns but no
/// longer sets is sent as null, so the apiserver drops it (a Ready condition
/// that turned True loses its old reason and message), as upstream's two-way
/// patch does.
pub fn status_patch(s: &PodStatus) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        for k in ["reason", "message"] {
            m.entry(k).or_insert(Value::Null);
        }
    }
    if let Some(conds) = v.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conds.iter_mut().filter_map(Value::as_object_mut) {
            for k in ["reason", "message"] {
                c.entry(k).or_insert(Value::Null);
            }
        }
    }
    v
}

/// Where a pod's status goes: the API object (the pod, or a static pod's
/// mirror pod).
struct Target {
    namespace: String,
    name: String,
    uid: String,
    status: Option<PodStatus>,
    /// Its resourceVersion.
    version: Option<String>,
}

impl Target {
    fn of(p: &Pod) -> Self {
        Self {
            namespace: pod::namespace(p).to_string(),
            name: pod::name(p).to_string(),
            uid: pod::uid(p).to_string(),
            status: p.status.clone(),
            version: p.metadata.resource_version.clone(),
        }
    }
}

fn api_target(p: &Pod, mirror: &PodManager) -> Option<Target> {
    let source = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(kubelet_types::labels::CONFIG_SOURCE))
        .map(String::as_str);
    if matches!(source, Some("file" | "http")) {
        let m = mirror.get_mirror_pod_by_full_name(&pod::full_name(p))?;
        return Some(Target::of(&m));
    }
    Some(Target::of(p))
}

/// Patches pod statuses to the apiserver.
pub struct StatusSync {
    /// Client.
    pub client: Client,
    /// Generated statuses.
    pub status: Arc<StatusManager>,
    /// Pods as the sources have them.
    pub desired: PodManager,
    /// Mirror pods of static pods.
    pub mirror: PodManager,
}

impl StatusSync {
    async fn sync_one(
        &self,
        uid: &str,
        sent: &mut HashMap<String, Value>,
        compared: &mut Compared,
    ) {
        let Some(p) = self.desired.get_pod_by_uid(uid) else {
            sent.remove(uid);
            return;
        };
        let Some(status) = self.status.get_pod_status(uid) else {
            return;
        };
        let Some(target) = api_target(&p, &self.mirror) else {
            debug!(pod = %pod::describe(&p), "No mirror pod yet; status not sent");
            return;
        };
        let Target {
            namespace: ns,
            name,
            uid: api_uid,
            status: api_status,
            version,
        } = target;
        let mut rendered = None;
        let current = compared.up_to_date(uid, &status, version.as_deref(), || {
            let ours = kubelet_view(&status);
            let current = api_status
                .as_ref()
                .map(kubelet_view)
                .is_some_and(|theirs| up_to_date(&ours, &theirs));
            rendered = Some(ours);
            current
        });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let ours = match (current, rendered) {
            (true, _) => None,
            (false, Some(ours)) => Some(ours),
            (false, None) => Some(kubelet_view(&status)),
        };
        if let Some(ours) = ours
            && sent.get(uid) != Some(&ours)
        {
            let body = json!({"metadata": {"uid": api_uid}, "status": status_patch(&status)});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(body))
                .await
            {
                Ok(_) => {
                    debug!(pod = %pod::describe(&p), "Patched pod status");
                    sent.insert(uid.to_string(), ours);
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    debug!(pod = %pod::describe(&p), code = s.code, "Pod gone or replaced; status not applied");
                }
                Err(e) => {
                    warn!(pod = %pod::describe(&p), error = %e, "Failed to update status for pod");
                    sent.remove(uid);
                }
            }
        }
        // Graceful deletion is confirmed once the containers are stopped.
        let api_pod = p.metadata.deletion_timestamp.is_some() && api_uid == uid;
        if api_pod && self.status.is_terminated(uid) {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(api_uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {
                    info!(pod = %pod::describe(&p), "Pod fully terminated and removed from etcd")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => warn!(pod = %pod::describe(&p), error = %e, "Failed to delete pod"),
            }
        }
    }

    /// Runs until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut sent: HashMap<String, Value> = HashMap::new();
        let mut compared = Compared::default();
        let mut tick = tokio::time::interval(RESYNC_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first resync is one period in: changes are sent as they come.
        tick.reset();
        loop {
            let uids = tokio::select! {
                () = stop.cancelled() => return,
                () = self.status.changed() => self.status.take_dirty(),
                _ = tick.tick() => {
                    // Resync: compare every pod with what the apiserver has.
                    sent.clear();
                    self.status.uids()
                }
            };
            for uid in uids {
                if stop.is_cancelled() {
                    return;
                }
                self.sync_one(&uid, &mut sent, &mut compared).await;
            }
            sent.retain(|uid, _| self.desired.contains(uid));
            compared.retain(|uid| self.desired.contains(uid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodCondition;
    use kube::api::PostParams;
    use kubelet_test_util::Cluster;

    fn bound(name: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}))
        .expect("pod")
    }

    fn running() -> PodStatus {
        let cond = |t: &str| PodCondition {
            type_: t.into(),
            status: "True".into(),
            ..Default::default()
        };
        PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.88.0.7".into()),
            conditions: Some(vec![
                cond("Initialized"),
                cond("Ready"),
                cond("ContainersReady"),
                cond("PodScheduled"),
            ]),
            ..Default::default()
        }
    }

    fn patches(c: &Cluster, name: &str) -> usize {
        let path = format!("/api/v1/namespaces/default/pods/{name}/status");
        c.api
            .requests()
            .iter()
            .filter(|r| {
                r.method == "PATCH" && r.path == path && r.user.as_deref() == Some("system:node:n1")
            })
            .count()
    }

    async fn refresh(c: &Cluster, desired: &PodManager, api: &Api<Pod>, name: &str) -> Pod {
        let p = api.get(name).await.expect("pod");
        desired.add_pod(Arc::new(p.clone()));
        let _ = c;
        p
    }

    #[tokio::test(start_paused = true)]
    async fn patches_only_changes_keeps_others_conditions_and_confirms_deletion() {
        let c = Cluster::start(Default::default()).await;
        let admin: Api<Pod> = Api::namespaced(c.admin().await, "default");
        let created = admin
            .create(&PostParams::default(), &bound("p"))
            .await
            .expect("pod");
        let uid = pod::uid(&created).to_string();
        // Somebody else owns a condition on the pod.
        admin
            .patch_status(
                "p",
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "DisruptionTarget", "status": "False"}]}})),
            )
            .await
            .expect("controller condition");
        let desired = PodManager::default();
        let status = Arc::new(StatusManager::default());
        refresh(&c, &desired, &admin, "p").await;
        let stop = CancellationToken::new();
        let sync = StatusSync {
            client: c.node_client("n1").await,
            status: status.clone(),
            desired: desired.clone(),
            mirror: PodManager::default(),
        };
        tokio::spawn(sync.run(stop.clone()));

        status.set_pod_status(&uid, running());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(patches(&c, "p"), 1);
        let p = refresh(&c, &desired, &admin, "p").await;
        let st = p.status.expect("status");
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.pod_ip.as_deref(), Some("10.88.0.7"));
        let types: Vec<_> = st
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert!(
            types.contains(&"DisruptionTarget") && types.contains(&"Ready"),
            "{types:?}"
        );

        // The same status again, and three resyncs: nothing sent.
        status.set_pod_status(&uid, running());
        tokio::time::sleep(RESYNC_PERIOD * 3).await;
        assert_eq!(patches(&c, "p"), 1, "unchanged status is not re-sent");

        // A change is sent.
        let mut unready = running();
        for c in unready
            .conditions
            .iter_mut()
            .flatten()
            .filter(|c| c.type_ == "Ready")
        {
            c.status = "False".into();
            c.reason = Some("ContainersNotReady".into());
            c.message = Some("containers with unready status: [c]".into());
        }
        status.set_pod_status(&uid, unready);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(patches(&c, "p"), 2);
        refresh(&c, &desired, &admin, "p").await;

        // Ready again: the old reason and message go away (sent as null).
        status.set_pod_status(&uid, running());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(patches(&c, "p"), 3);
        let p = refresh(&c, &desired, &admin, "p").await;
        let ready = p
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .expect("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason, ready.message),
            ("True", None, None)
        );
        tokio::time::sleep(RESYNC_PERIOD * 2).await;
        assert_eq!(patches(&c, "p"), 3, "and then nothing more to send");

        // Graceful deletion: once the containers are stopped the kubelet removes the object.
        admin
            .delete("p", &Default::default())
            .await
            .expect("delete");
        refresh(&c, &desired, &admin, "p").await;
        tokio::time::sleep(RESYNC_PERIOD).await;
        assert!(
            c.api.get("pods", "default", "p").is_some(),
            "not before the containers are stopped"
        );
        status.mark_terminated(&uid);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            c.api.get("pods", "default", "p").is_none(),
            "deleted with grace 0"
        );
        let del = c
            .api
            .requests()
            .into_iter()
            .find(|r| r.method == "DELETE" && r.user.as_deref() == Some("system:node:n1"));
        assert!(del.is_some(), "the kubelet confirmed the deletion");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_recreated_pod_of_the_same_name_is_not_patched() {
        let c = Cluster::start(Default::default()).await;
        let admin: Api<Pod> = Api::namespaced(c.admin().await, "default");
        let old = admin
            .create(&PostParams::default(), &bound("q"))
            .await
            .expect("pod");
        let desired = PodManager::default();
        desired.add_pod(Arc::new(old.clone()));
        admin
            .delete(
                "q",
                &kube::api::DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await
            .expect("delete");
        let new = admin
            .create(&PostParams::default(), &bound("q"))
            .await
            .expect("recreated");
        let status = Arc::new(StatusManager::default());
        status.set_pod_status(pod::uid(&old), running());
        let sync = StatusSync {
            client: c.node_client("n1").await,
            status,
            desired,
            mirror: PodManager::default(),
        };
        let mut sent = HashMap::new();
        sync.sync_one(pod::uid(&old), &mut sent, &mut Compared::default())
            .await;
        let now = c.api.get("pods", "default", "q").expect("pod");
        assert_eq!(now["metadata"]["uid"], pod::uid(&new));
        assert_eq!(
            now["status"]["phase"], "Pending",
            "the uid precondition kept the old pod's status off the new pod"
        );
    }
}
