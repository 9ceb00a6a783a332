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
use crate::podconfig::api::MirrorPods;
use crate::sync_loop::DesiredPods;

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

/// Where a pod's status goes: namespace, name and UID of the API object.
fn api_target(p: &Pod, mirror: &MirrorPods) -> Option<(String, String, String, Option<PodStatus>)> {
    let source = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(kubelet_types::labels::CONFIG_SOURCE))
        .map(String::as_str);
    if matches!(source, Some("file" | "http")) {
        let m = mirror.get(&pod::full_name(p))?;
        return Some((
            pod::namespace(&m).to_string(),
            pod::name(&m).to_string(),
            pod::uid(&m).to_string(),
            m.status.clone(),
        ));
    }
    Some((
        pod::namespace(p).to_string(),
        pod::name(p).to_string(),
        pod::uid(p).to_string(),
        p.status.clone(),
    ))
}

/// Patches pod statuses to the apiserver.
pub struct StatusSync {
    /// Client.
    pub client: Client,
    /// Generated statuses.
    pub status: Arc<StatusManager>,
    /// Pods as the sources have them.
    pub desired: DesiredPods,
    /// Mirror pods of static pods.
    pub mirror: MirrorPods,
}

impl StatusSync {
    async fn sync_one(&self, uid: &str, sent: &mut HashMap<String, Value>) {
        let Some(p) = self.desired.read().get(uid).cloned() else {
            sent.remove(uid);
            return;
        };
        let Some(status) = self.status.get_pod_status(uid) else {
            return;
        };
        let Some((ns, name, api_uid, api_status)) = api_target(&p, &self.mirror) else {
            debug!(pod = %pod::describe(&p), "No mirror pod yet; status not sent");
            return;
        };
        let ours = kubelet_view(&status);
        let theirs = api_status.as_ref().map(kubelet_view);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        if theirs.as_ref() != Some(&ours) && sent.get(uid) != Some(&ours) {
            let body = json!({"metadata": {"uid": api_uid}, "status": status});
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
        let mut tick = tokio::time::interval(RESYNC_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                self.sync_one(&uid, &mut sent).await;
            }
            sent.retain(|uid, _| self.desired.read().contains_key(uid));
        }
    }
}
