//! What the control plane's controllers publish, done synchronously on the
//! writes that would trigger them: the system namespaces and the
//! `kubernetes` Service (upstream `pkg/controlplane/controller/systemnamespaces`
//! and `kubernetesservice`), the `default` ServiceAccount of every namespace
//! (kube-controller-manager's `serviceaccount` controller) and the
//! `kube-root-ca.crt` ConfigMap of every namespace (`root-ca-cert-publisher`).
//! Deleting or editing a published object gets it back, as the controllers'
//! resync does.

use serde_json::{Value, json};

use crate::rest::{new_uid, now};
use crate::store::{Key, Store};
use crate::strategy::KUBERNETES_SERVICE_IP;

/// Namespaces that exist from the start.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Name of the ConfigMap holding the cluster CA in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

fn key(resource: &str, namespace: &str, name: &str) -> Key {
    Key {
        resource: resource.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn meta(namespace: &str, name: &str) -> Value {
    let mut m = json!({"name": name, "uid": new_uid(), "creationTimestamp": now()});
    if !namespace.is_empty() {
        m["namespace"] = json!(namespace);
    }
    m
}

fn root_ca(namespace: &str, ca_pem: &str) -> Value {
    let mut m = meta(namespace, ROOT_CA_CONFIGMAP);
    m["annotations"] = json!({"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."});
    json!({"metadata": m, "data": {"ca.crt": ca_pem}})
}

/// Creates the namespace if it does not exist (with its published objects).
pub(crate) fn ensure_namespace(store: &mut Store, namespace: &str, ca_pem: &str) {
    if namespace.is_empty() || store.get(&key("namespaces", "", namespace)).is_some() {
        return;
    }
    let mut ns = json!({"metadata": meta("", namespace)});
    // Namespace defaults never fail.
    let _ = crate::strategy::on_create("namespaces", store, &mut ns);
    store.put(key("namespaces", "", namespace), ns);
    publish(store, namespace, ca_pem);
}

/// The `default` ServiceAccount and `kube-root-ca.crt` of a namespace,
/// created when missing and the CA restored when changed.
pub(crate) fn publish(store: &mut Store, namespace: &str, ca_pem: &str) {
    let alive = store
        .get(&key("namespaces", "", namespace))
        .is_some_and(|n| n.pointer("/metadata/deletionTimestamp").is_none());
    if !alive {
        return;
    }
    let sa = key("serviceaccounts", namespace, "default");
    if store.get(&sa).is_none() {
        store.put(sa, json!({"metadata": meta(namespace, "default")}));
    }
    let cm = key("configmaps", namespace, ROOT_CA_CONFIGMAP);
    match store.get(&cm).cloned() {
        None => {
            store.put(cm, root_ca(namespace, ca_pem));
        }
        Some(mut old) if old.pointer("/data/ca.crt").and_then(Value::as_str) != Some(ca_pem) => {
            old["data"] = json!({"ca.crt": ca_pem});
            store.put(cm, old);
        }
        Some(_) => {}
    }
}

/// After a write to `key`: a published object deleted or changed is put back.
pub(crate) fn reconcile(store: &mut Store, written: &Key, ca_pem: &str) {
    let published = match written.resource.as_str() {
        "serviceaccounts" => written.name == "default",
        "configmaps" => written.name == ROOT_CA_CONFIGMAP,
        _ => false,
    };
    if published {
        publish(store, &written.namespace, ca_pem);
    }
}

/// The state a fresh cluster starts in: system namespaces with their
/// published objects, and the `kubernetes` Service pointing at `port`.
pub(crate) fn bootstrap(store: &mut Store, ca_pem: &str, port: u16) {
    for ns in SYSTEM_NAMESPACES {
        ensure_namespace(store, ns, ca_pem);
    }
    let mut m = meta("default", "kubernetes");
    m["labels"] = json!({"component": "apiserver", "provider": "kubernetes"});
    let ip = KUBERNETES_SERVICE_IP.to_string();
    let svc = json!({"metadata": m, "spec": {
        "type": "ClusterIP",
        "clusterIP": ip,
        "clusterIPs": [ip],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "internalTrafficPolicy": "Cluster",
        "sessionAffinity": "None",
        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
    }, "status": {"loadBalancer": {}}});
    store.put(key("services", "default", "kubernetes"), svc);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_objects_come_back() {
        let mut s = Store::new(100);
        bootstrap(&mut s, "CA", 6443);
        for ns in SYSTEM_NAMESPACES {
            assert!(
                s.get(&key("serviceaccounts", ns, "default")).is_some(),
                "{ns}"
            );
            let cm = s
                .get(&key("configmaps", ns, ROOT_CA_CONFIGMAP))
                .expect("root ca");
            assert_eq!(cm["data"]["ca.crt"], json!("CA"));
        }
        let cm = key("configmaps", "default", ROOT_CA_CONFIGMAP);
        s.delete(&cm);
        reconcile(&mut s, &cm, "CA");
        assert!(s.get(&cm).is_some());
        let mut edited = s.get(&cm).cloned().expect("cm");
        edited["data"]["ca.crt"] = json!("evil");
        s.put(cm.clone(), edited);
        reconcile(&mut s, &cm, "CA");
        assert_eq!(s.get(&cm).expect("cm")["data"]["ca.crt"], json!("CA"));
        ensure_namespace(&mut s, "team", "CA");
        assert!(s.get(&key("serviceaccounts", "team", "default")).is_some());
        assert_eq!(
            s.get(&key("namespaces", "", "team")).expect("ns")["status"]["phase"],
            json!("Active")
        );
    }
}
