//! The ServiceAccount admission plugin (upstream
//! `plugin/pkg/admission/serviceaccount/admission.go`), on when
//! [`crate::Options::service_account_admission`] is set: a pod gets
//! `serviceAccountName: default` when it names none, the service account
//! must exist, its `imagePullSecrets` are copied to a pod that has none, and
//! unless automounting is switched off (pod first, then service account)
//! every init and app container mounts a `kube-api-access-<suffix>` projected
//! volume (token, `kube-root-ca.crt`, namespace) at
//! `/var/run/secrets/kubernetes.io/serviceaccount`. Mirror pods are only
//! validated: no service account, no secrets, no token projections.

use serde_json::{Value, json};

use crate::store::{Key, Store};

/// Where the API access volume is mounted (upstream `DefaultAPITokenMountPath`).
pub const API_TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Prefix of the API access volume's name (upstream `ServiceAccountVolumeName`).
pub const API_ACCESS_VOLUME: &str = "kube-api-access";
/// Lifetime the volume's token projection asks for (upstream
/// `WarnOnlyBoundTokenExpirationSeconds`).
pub const API_ACCESS_TOKEN_SECONDS: i64 = crate::token::WARN_ONLY_EXPIRATION_SECONDS;

/// The projected volume source upstream's `TokenVolumeSource` builds.
pub fn api_access_volume(name: &str) -> Value {
    json!({"name": name, "projected": {"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": API_ACCESS_TOKEN_SECONDS}},
        {"configMap": {"name": crate::controllers::ROOT_CA_CONFIGMAP,
            "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}})
}

/// Admits `pod` being created in `namespace`; the error is the reason of a
/// 403 (upstream `admission.NewForbidden`).
pub(crate) fn admit_pod(store: &Store, namespace: &str, pod: &mut Value) -> Result<(), String> {
    let mirror = pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    if mirror {
        return validate_mirror(pod);
    }
    let sa_name = match pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
    {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => "default".to_string(),
    };
    pod["spec"]["serviceAccountName"] = json!(sa_name);
    let sa = store
        .get(&Key {
            resource: "serviceaccounts".into(),
            namespace: namespace.into(),
            name: sa_name.clone(),
        })
        .cloned()
        .ok_or_else(|| {
            format!(
                "error looking up service account {namespace}/{sa_name}: serviceaccount \"{sa_name}\" not found"
            )
        })?;
    let automount = pod
        .pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            sa.get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true);
    if automount {
        mount_token(pod);
    }
    let pod_pulls = pod
        .pointer("/spec/imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if let Some(pulls) = sa.get("imagePullSecrets").filter(|p| p.is_array())
        && !pod_pulls
    {
        pod["spec"]["imagePullSecrets"] = pulls.clone();
    }
    Ok(())
}

fn validate_mirror(pod: &Value) -> Result<(), String> {
    if pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Err("a mirror pod may not reference service accounts".into());
    }
    if !crate::graph::pod_refs(pod).secrets.is_empty() {
        return Err("a mirror pod may not reference secrets".into());
    }
    let projects_token = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
        .flatten()
        .any(|s| s.get("serviceAccountToken").is_some());
    if projects_token {
        return Err("a mirror pod may not use ServiceAccountToken volume projections".into());
    }
    Ok(())
}

fn mount_token(pod: &mut Value) {
    let prefix = format!("{API_ACCESS_VOLUME}-");
    let existing = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .find(|n| n.starts_with(&prefix))
        .map(str::to_string);
    let name = existing.clone().unwrap_or_else(|| {
        let suffix: String = (0..5)
            .map(|_| char::from(b"bcdfghjklmnpqrstvwxz2456789"[rand::random_range(0..27)]))
            .collect();
        format!("{prefix}{suffix}")
    });
    let mount = json!({"name": name, "readOnly": true, "mountPath": API_TOKEN_MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        let Some(cs) = pod["spec"].get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs {
            let has = c
                .get("volumeMounts")
                .and_then(Value::as_array)
                .is_some_and(|m| {
                    m.iter().any(|m| {
                        m.get("mountPath").and_then(Value::as_str) == Some(API_TOKEN_MOUNT_PATH)
                    })
                });
            if has {
                continue;
            }
            match c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                Some(m) => m.push(mount.clone()),
                None => c["volumeMounts"] = json!([mount.clone()]),
            }
            needed = true;
        }
    }
    if existing.is_none() && needed {
        match pod["spec"].get_mut("volumes").and_then(Value::as_array_mut) {
            Some(v) => v.push(api_access_volume(&name)),
            None => pod["spec"]["volumes"] = json!([api_access_volume(&name)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with_sa(sa: Value) -> Store {
        let mut s = Store::new(10);
        s.put(
            Key {
                resource: "serviceaccounts".into(),
                namespace: "ns".into(),
                name: "default".into(),
            },
            sa,
        );
        s
    }

    #[test]
    fn pods_get_the_api_access_volume_and_the_pull_secrets() {
        let store = store_with_sa(json!({"metadata": {"name": "default"},
            "imagePullSecrets": [{"name": "reg"}]}));
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "i"}],
            "containers": [{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "x", "mountPath": API_TOKEN_MOUNT_PATH}]}]}});
        admit_pod(&store, "ns", &mut pod).expect("admitted");
        assert_eq!(pod["spec"]["serviceAccountName"], json!("default"));
        assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": "reg"}]));
        let vol = &pod["spec"]["volumes"][0];
        let name = vol["name"].as_str().expect("name");
        assert!(
            name.starts_with("kube-api-access-") && name.len() == 21,
            "{name}"
        );
        assert_eq!(
            vol["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            json!(3607)
        );
        let mount = json!({"name": name, "readOnly": true, "mountPath": API_TOKEN_MOUNT_PATH});
        assert_eq!(
            pod["spec"]["initContainers"][0]["volumeMounts"],
            json!([mount])
        );
        assert_eq!(pod["spec"]["containers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(
            pod["spec"]["containers"][1]["volumeMounts"]
                .as_array()
                .map(Vec::len),
            Some(1),
            "an existing mount at the path wins"
        );
    }

    #[test]
    fn automount_off_missing_accounts_and_mirror_pods() {
        let store = store_with_sa(json!({"metadata": {"name": "default"},
            "automountServiceAccountToken": false}));
        let mut pod = json!({"spec": {"containers": [{"name": "a"}]}});
        admit_pod(&store, "ns", &mut pod).expect("admitted");
        assert!(pod["spec"].get("volumes").is_none());
        let mut pod =
            json!({"spec": {"automountServiceAccountToken": true, "containers": [{"name": "a"}]}});
        admit_pod(&store, "ns", &mut pod).expect("admitted");
        assert_eq!(pod["spec"]["volumes"].as_array().map(Vec::len), Some(1));
        let mut pod = json!({"spec": {"serviceAccountName": "robot", "containers": []}});
        assert_eq!(
            admit_pod(&store, "ns", &mut pod).unwrap_err(),
            "error looking up service account ns/robot: serviceaccount \"robot\" not found"
        );
        let mut mirror = json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}},
            "spec": {"containers": [{"name": "a"}]}});
        admit_pod(&Store::new(1), "ns", &mut mirror).expect("mirror pods are not mutated");
        assert!(mirror["spec"].get("serviceAccountName").is_none());
        mirror["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "s"}}]);
        assert_eq!(
            admit_pod(&Store::new(1), "ns", &mut mirror).unwrap_err(),
            "a mirror pod may not reference secrets"
        );
    }
}
