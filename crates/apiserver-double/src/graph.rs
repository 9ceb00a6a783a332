//! The Node authorizer's graph (upstream
//! `plugin/pkg/auth/authorizer/node/graph_populator.go` and the pod visitors
//! of `pkg/api/v1/pod/util.go`, `VisitPodSecretNames` /
//! `VisitPodConfigmapNames`): which secrets, configmaps, persistent volume
//! claims, persistent volumes and service accounts a node reaches through
//! the pods bound to it, the secrets CSI persistent volumes name
//! (`VisitPVSecretNames`), and the VolumeAttachments for the node. The
//! double computes the edges from the store on
//! each request instead of keeping an incremental graph.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::store::Store;

/// What one pod references, by name in its namespace.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodRefs {
    /// Secrets: pull secrets, secret volumes, projected secrets, env and
    /// envFrom, and the secret refs of plugin volumes.
    pub secrets: BTreeSet<String>,
    /// ConfigMaps: configMap volumes, projected configMaps, env and envFrom.
    pub configmaps: BTreeSet<String>,
    /// Claims: persistentVolumeClaim volumes and ephemeral volumes' claims.
    pub pvcs: BTreeSet<String>,
    /// The service account (`default` when unset, as admission sets it).
    pub service_account: String,
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn items<'a>(v: &'a Value, ptr: &str) -> impl Iterator<Item = &'a Value> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Volume types whose `secretRef.name` names a secret of the pod's namespace.
const SECRET_REF_VOLUMES: &[&str] = &[
    "cephfs",
    "cinder",
    "flexVolume",
    "iscsi",
    "rbd",
    "scaleIO",
    "storageos",
];

/// The references of `pod` (upstream's visitors over every container kind).
pub fn pod_refs(pod: &Value) -> PodRefs {
    let mut r = PodRefs {
        service_account: str_at(pod, "/spec/serviceAccountName")
            .unwrap_or("default")
            .to_string(),
        ..PodRefs::default()
    };
    let pod_name = str_at(pod, "/metadata/name").unwrap_or_default();
    let add = |set: &mut BTreeSet<String>, n: Option<&str>| {
        if let Some(n) = n {
            set.insert(n.to_string());
        }
    };
    for s in items(pod, "/spec/imagePullSecrets") {
        add(&mut r.secrets, str_at(s, "/name"));
    }
    for list in [
        "/spec/initContainers",
        "/spec/containers",
        "/spec/ephemeralContainers",
    ] {
        for c in items(pod, list) {
            for e in items(c, "/envFrom") {
                add(&mut r.secrets, str_at(e, "/secretRef/name"));
                add(&mut r.configmaps, str_at(e, "/configMapRef/name"));
            }
            for e in items(c, "/env") {
                add(&mut r.secrets, str_at(e, "/valueFrom/secretKeyRef/name"));
                add(
                    &mut r.configmaps,
                    str_at(e, "/valueFrom/configMapKeyRef/name"),
                );
            }
        }
    }
    for v in items(pod, "/spec/volumes") {
        add(&mut r.secrets, str_at(v, "/secret/secretName"));
        add(&mut r.secrets, str_at(v, "/azureFile/secretName"));
        add(&mut r.secrets, str_at(v, "/csi/nodePublishSecretRef/name"));
        for t in SECRET_REF_VOLUMES {
            add(&mut r.secrets, str_at(v, &format!("/{t}/secretRef/name")));
        }
        add(&mut r.configmaps, str_at(v, "/configMap/name"));
        for s in items(v, "/projected/sources") {
            add(&mut r.secrets, str_at(s, "/secret/name"));
            add(&mut r.configmaps, str_at(s, "/configMap/name"));
        }
        add(&mut r.pvcs, str_at(v, "/persistentVolumeClaim/claimName"));
        if v.get("ephemeral").is_some_and(Value::is_object)
            && let Some(vol) = str_at(v, "/name")
        {
            // Upstream `ephemeral.VolumeClaimName`.
            r.pvcs.insert(format!("{pod_name}-{vol}"));
        }
    }
    r
}

/// The pods bound to `node` in `namespace`.
fn pods_on(store: &Store, node: &str, namespace: &str) -> Vec<Value> {
    store
        .list("pods", Some(namespace))
        .into_iter()
        .filter(|p| str_at(p, "/spec/nodeName") == Some(node))
        .collect()
}

/// Whether a pod bound to `node` references `resource` `namespace/name`
/// (secrets, configmaps, persistentvolumeclaims, serviceaccounts).
pub fn node_reaches(
    store: &Store,
    node: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> bool {
    if resource == "secrets" && node_reaches_pv_secret(store, node, namespace, name) {
        return true;
    }
    pods_on(store, node, namespace).iter().any(|p| {
        let r = pod_refs(p);
        match resource {
            "secrets" => r.secrets.contains(name),
            "configmaps" => r.configmaps.contains(name),
            "persistentvolumeclaims" => r.pvcs.contains(name),
            "serviceaccounts" => r.service_account == name,
            _ => false,
        }
    })
}

/// Whether VolumeAttachment `name` is for `node` (upstream's graph edge
/// from a VolumeAttachment to the node in its `spec.nodeName`).
pub fn node_reaches_va(store: &Store, node: &str, name: &str) -> bool {
    store
        .get(&crate::store::Key {
            resource: "volumeattachments".into(),
            namespace: String::new(),
            name: name.into(),
        })
        .is_some_and(|va| str_at(va, "/spec/nodeName") == Some(node))
}

/// The secrets a persistent volume names, as `(namespace, name)` (upstream
/// `VisitPVSecretNames`, here for CSI volumes: the controller publish,
/// node stage, node publish, controller expand and node expand secrets).
pub fn pv_secrets(pv: &Value) -> Vec<(String, String)> {
    [
        "controllerPublishSecretRef",
        "nodeStageSecretRef",
        "nodePublishSecretRef",
        "controllerExpandSecretRef",
        "nodeExpandSecretRef",
    ]
    .iter()
    .filter_map(|r| {
        let ns = str_at(pv, &format!("/spec/csi/{r}/namespace"))?;
        let name = str_at(pv, &format!("/spec/csi/{r}/name"))?;
        Some((ns.to_string(), name.to_string()))
    })
    .collect()
}

/// Whether a persistent volume that `node` reaches names secret
/// `namespace/name` (node <- pod <- pvc <- pv <- secret).
pub fn node_reaches_pv_secret(store: &Store, node: &str, namespace: &str, name: &str) -> bool {
    store.list("persistentvolumes", None).iter().any(|pv| {
        pv_secrets(pv)
            .iter()
            .any(|(ns, n)| ns == namespace && n == name)
            && str_at(pv, "/metadata/name").is_some_and(|pv| node_reaches_pv(store, node, pv))
    })
}

/// Whether persistent volume `name` is bound (`spec.claimRef`) to a claim a
/// pod bound to `node` uses.
pub fn node_reaches_pv(store: &Store, node: &str, name: &str) -> bool {
    let Some(pv) = store.get(&crate::store::Key {
        resource: "persistentvolumes".into(),
        namespace: String::new(),
        name: name.into(),
    }) else {
        return false;
    };
    let (Some(ns), Some(claim)) = (
        str_at(pv, "/spec/claimRef/namespace"),
        str_at(pv, "/spec/claimRef/name"),
    ) else {
        return false;
    };
    node_reaches(store, node, "persistentvolumeclaims", ns, claim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_of_reference_is_an_edge() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {
            "imagePullSecrets": [{"name": "pull"}],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "ef-s"}}]}],
            "containers": [{"name": "c", "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "env-s", "key": "k"}}}],
                "envFrom": [{"configMapRef": {"name": "ef-cm"}}]}],
            "volumes": [
                {"name": "a", "secret": {"secretName": "vol-s"}},
                {"name": "b", "configMap": {"name": "vol-cm"}},
                {"name": "c", "projected": {"sources": [{"configMap": {"name": "kube-root-ca.crt"}},
                    {"secret": {"name": "proj-s"}}, {"serviceAccountToken": {"path": "t"}}]}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "claim"}},
                {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "f", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi-s"}}}]}});
        let r = pod_refs(&pod);
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            r.secrets,
            set(&["csi-s", "ef-s", "env-s", "proj-s", "pull", "vol-s"])
        );
        assert_eq!(
            r.configmaps,
            set(&["ef-cm", "env-cm", "kube-root-ca.crt", "vol-cm"])
        );
        assert_eq!(r.pvcs, set(&["claim", "p-e"]));
        assert_eq!(r.service_account, "default");
    }
}
