//! Node registration (upstream `registerWithAPIServer`, `initialNode`,
//! `tryRegisterWithAPIServer`): create the Node with the default labels,
//! `--node-labels`, `--register-with-taints`, `--provider-id`, the
//! controller-managed-attach-detach and TTL annotations and a full initial
//! status. If it already exists, reconcile the default labels and the
//! attach-detach annotation, as upstream does, and keep everything else.
//! Retries with backoff (100ms doubling to 7s) until it succeeds.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{NodeStatusManager, log_registered};

/// Annotation: the attach/detach controller manages this node's volumes.
pub const CMAD_ANNOTATION: &str = "volumes.kubernetes.io/controller-managed-attach-detach";
/// Annotation: TTL of cached objects for this node.
pub const TTL_ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";
/// Taint until a cloud-controller-manager initialized the node.
pub const EXTERNAL_CLOUD_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Annotation: the `--node-ip` the kubelet was given, for the cloud-controller-manager.
pub const PROVIDED_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";

/// The Node to create.
pub fn initial_node(m: &NodeStatusManager, status: &NodeStatus) -> Node {
    let mut labels = m.default_labels();
    labels.extend(m.node_labels.clone());
    let mut annotations: BTreeMap<String, String> = [
        (CMAD_ANNOTATION.to_string(), "true".to_string()),
        (TTL_ANNOTATION.to_string(), "0".to_string()),
    ]
    .into_iter()
    .collect();
    if m.cfg.external_cloud_provider && !m.provided_node_ips.is_empty() {
        let ips: Vec<String> = m
            .provided_node_ips
            .iter()
            .map(ToString::to_string)
            .collect();
        annotations.insert(PROVIDED_IP_ANNOTATION.to_string(), ips.join(","));
    }
    let mut taints: Vec<Taint> = m
        .taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: t.effect.clone(),
            time_added: None,
        })
        .collect();
    if m.cfg.external_cloud_provider {
        // Upstream: the cloud-controller-manager removes it once it initialized the node.
        taints.push(Taint {
            key: EXTERNAL_CLOUD_TAINT.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    let mut node = Node {
        spec: Some(NodeSpec {
            provider_id: m.provider_id.clone(),
            taints: (!taints.is_empty()).then_some(taints),
            ..Default::default()
        }),
        status: Some(status.clone()),
        ..Default::default()
    };
    node.metadata.name = Some(m.node_name.clone());
    node.metadata.labels = Some(labels);
    node.metadata.annotations = Some(annotations);
    node
}

/// A patch that brings an existing node's default labels and the attach-detach
/// annotation in line, or `None` when they already are.
pub fn reconcile_patch(existing: &Node, m: &NodeStatusManager) -> Option<serde_json::Value> {
    let labels = existing.metadata.labels.clone().unwrap_or_default();
    let wrong: BTreeMap<String, String> = m
        .default_labels()
        .into_iter()
        .filter(|(k, v)| labels.get(k) != Some(v))
        .collect();
    let cmad = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CMAD_ANNOTATION))
        .map(String::as_str);
    let mut patch = serde_json::json!({"metadata": {}});
    if !wrong.is_empty() {
        patch["metadata"]["labels"] = serde_json::json!(wrong);
    }
    if cmad != Some("true") {
        patch["metadata"]["annotations"] = serde_json::json!({ CMAD_ANNOTATION: "true" });
    }
    (patch["metadata"] != serde_json::json!({})).then_some(patch)
}

/// The registered Node, and whether this registration created it.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The Node as the apiserver returned it.
    pub node: Node,
    /// Created just now with this process's initial status (else it existed:
    /// its status is whatever was posted last, perhaps by an earlier process).
    pub created: bool,
}

async fn try_register(
    m: &NodeStatusManager,
    status: &NodeStatus,
) -> Result<Registered, kube::Error> {
    let api: Api<Node> = Api::all(m.client.clone());
    match api
        .create(&PostParams::default(), &initial_node(m, status))
        .await
    {
        Ok(node) => {
            log_registered(&m.node_name, true);
            Ok(Registered {
                node,
                created: true,
            })
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api.get(&m.node_name).await?;
            let mut node = match reconcile_patch(&existing, m) {
                Some(p) => {
                    api.patch(&m.node_name, &PatchParams::default(), &Patch::Strategic(p))
                        .await?
                }
                None => existing,
            };
            // Upstream `reconcileExtendedResource`: a Node that outlived the
            // device manager's checkpoint has no devices allocated here.
            if let Some(p) = node.status.as_ref().and_then(super::extended::reset_patch)
                && m.extended.should_reset_capacity().await
            {
                tracing::info!(node = %m.node_name, "Zeroing the extended resources of the existing Node: no device manager checkpoint");
                node = api
                    .patch_status(&m.node_name, &PatchParams::default(), &Patch::Strategic(p))
                    .await?;
            }
            log_registered(&m.node_name, false);
            Ok(Registered {
                node,
                created: false,
            })
        }
        Err(e) => Err(e),
    }
}

/// Registers (or, with `registerNode: false`, waits for) the node; `None` if stopped first.
pub async fn register_until_done(
    m: &NodeStatusManager,
    status: &NodeStatus,
    stop: &CancellationToken,
) -> Option<Node> {
    register(m, status, stop).await.map(|r| r.node)
}

/// Registers (or, with `registerNode: false`, waits for) the node, saying
/// whether it was created; `None` if stopped first. A request to a hung
/// apiserver ends at the client's deadline and is retried like any error.
pub async fn register(
    m: &NodeStatusManager,
    status: &NodeStatus,
    stop: &CancellationToken,
) -> Option<Registered> {
    let mut backoff = Duration::from_millis(100);
    let api: Api<Node> = Api::all(m.client.clone());
    loop {
        let result = if m.cfg.register_node {
            tokio::select! {
                () = stop.cancelled() => return None,
                r = try_register(m, status) => r,
            }
        } else {
            tokio::select! {
                () = stop.cancelled() => return None,
                r = api.get(&m.node_name) => r.map(|node| Registered {
                    node,
                    created: false,
                }),
            }
        };
        match result {
            Ok(r) => return Some(r),
            Err(e) => {
                warn!(node = %m.node_name, error = %e, "Unable to register node with API server")
            }
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(7));
    }
}
