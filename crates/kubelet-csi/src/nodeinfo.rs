//! The node's CSI facts in the API (upstream
//! `nodeinfomanager/nodeinfomanager.go`): a registered driver's topology
//! becomes Node labels, its node ID goes into the Node's
//! `csi.volume.kubernetes.io/nodeid` annotation, and the CSINode object of
//! this node lists the driver with its node ID, topology keys and volume
//! limit.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::client::NodeInfo;
use crate::{CsiHost, Error, Result};

/// The Node annotation mapping driver names to their node IDs.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// How many times an update that lost a race is retried.
const UPDATE_ATTEMPTS: usize = 5;

/// One driver's Node and CSINode update at a time (upstream
/// `nodeInfoManager.lock`): the node-ID annotation is read, rewritten and
/// patched back whole, so two drivers registering together (the usual case
/// at boot) would otherwise drop one another's entry.
static NODE_INFO_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Records driver `driver` with `info` on the Node and the CSINode.
pub async fn install_driver(host: &dyn CsiHost, driver: &str, info: &NodeInfo) -> Result<()> {
    let _one_at_a_time = NODE_INFO_LOCK.lock().await;
    update_node(host, driver, Some(info))
        .await
        .map_err(|e| Error::NodeInfo {
            object: "Node",
            source: Box::new(e),
        })?;
    let mut last = None;
    for _ in 0..UPDATE_ATTEMPTS {
        match update_csi_node(host, driver, Some(info)).await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::NodeInfo {
        object: "CSINode",
        source: Box::new(last.unwrap_or_else(|| Error::InvalidSpec("no attempt".into()))),
    })
}

/// Removes driver `driver` from the CSINode and from the Node's node-ID
/// annotation (topology labels stay, as upstream).
pub async fn uninstall_driver(host: &dyn CsiHost, driver: &str) -> Result<()> {
    let _one_at_a_time = NODE_INFO_LOCK.lock().await;
    let mut last = None;
    for _ in 0..UPDATE_ATTEMPTS {
        match update_csi_node(host, driver, None).await {
            Ok(()) => {
                last = None;
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        return Err(Error::NodeInfo {
            object: "CSINode",
            source: Box::new(e),
        });
    }
    update_node(host, driver, None)
        .await
        .map_err(|e| Error::NodeInfo {
            object: "Node",
            source: Box::new(e),
        })
}

/// Creates this node's CSINode with no drivers if it does not exist
/// (upstream `InitializeCSINodeWithAnnotation`, run at kubelet start).
pub async fn initialize_csi_node(host: &dyn CsiHost) -> Result<()> {
    if host.csi_node(host.node_name()).await?.is_none() {
        host.create_csi_node(new_csi_node(host).await?).await?;
    }
    Ok(())
}

/// Sets (or with `info` `None`, removes) the driver's labels and node ID on the Node.
async fn update_node(host: &dyn CsiHost, driver: &str, info: Option<&NodeInfo>) -> Result<()> {
    let node = host.node().await?;
    let meta = node.as_ref().map(|n| &n.metadata);
    let labels = meta.and_then(|m| m.labels.clone()).unwrap_or_default();
    let annotations = meta.and_then(|m| m.annotations.clone()).unwrap_or_default();

    let mut label_patch = BTreeMap::new();
    if let Some(info) = info {
        for (key, value) in &info.topology {
            match labels.get(key) {
                Some(existing) if existing == value => {}
                Some(existing) => {
                    return Err(Error::TopologyCollision {
                        key: key.clone(),
                        new: value.clone(),
                        existing: existing.clone(),
                    });
                }
                None => {
                    label_patch.insert(key.clone(), Some(value.clone()));
                }
            }
        }
    }

    let mut ids: BTreeMap<String, String> = annotations
        .get(NODE_ID_ANNOTATION)
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    let before = ids.clone();
    match info {
        Some(info) => {
            ids.insert(driver.to_string(), info.node_id.clone());
        }
        None => {
            ids.remove(driver);
        }
    }
    let mut annotation_patch = BTreeMap::new();
    if ids != before {
        let value = if ids.is_empty() {
            None
        } else {
            Some(
                serde_json::to_string(&ids).map_err(|source| Error::VolData {
                    path: NODE_ID_ANNOTATION.into(),
                    source,
                })?,
            )
        };
        annotation_patch.insert(NODE_ID_ANNOTATION.to_string(), value);
    }
    if label_patch.is_empty() && annotation_patch.is_empty() {
        return Ok(());
    }
    tracing::info!(
        driver,
        labels = label_patch.len(),
        "Updating Node with CSI driver node info"
    );
    host.patch_node_metadata(label_patch, annotation_patch)
        .await
}

/// A CSINode for this node, owned by the Node object when it exists.
async fn new_csi_node(host: &dyn CsiHost) -> Result<CSINode> {
    let owner = host.node().await?.and_then(|n| {
        Some(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: n.metadata.name?,
            uid: n.metadata.uid?,
            ..Default::default()
        })
    });
    Ok(CSINode {
        metadata: ObjectMeta {
            name: Some(host.node_name().to_string()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: Vec::new(),
        },
    })
}

/// Puts the driver entry into (or with `info` `None`, takes it out of) the CSINode.
async fn update_csi_node(host: &dyn CsiHost, driver: &str, info: Option<&NodeInfo>) -> Result<()> {
    let existing = host.csi_node(host.node_name()).await?;
    let exists = existing.is_some();
    let mut csi_node = match existing {
        Some(n) => n,
        None if info.is_none() => return Ok(()),
        None => new_csi_node(host).await?,
    };
    let before = csi_node.spec.drivers.clone();
    csi_node.spec.drivers.retain(|d| d.name != driver);
    if let Some(info) = info {
        let keys: Vec<String> = info.topology.keys().cloned().collect();
        csi_node.spec.drivers.push(CSINodeDriver {
            name: driver.to_string(),
            node_id: info.node_id.clone(),
            topology_keys: Some(keys),
            allocatable: (info.max_volumes_per_node > 0).then(|| VolumeNodeResources {
                count: i32::try_from(info.max_volumes_per_node).ok(),
            }),
        });
    }
    if exists && before == csi_node.spec.drivers {
        return Ok(());
    }
    if exists {
        host.update_csi_node(csi_node).await?;
    } else {
        host.create_csi_node(csi_node).await?;
    }
    Ok(())
}
