//! NodeRestriction's audience rule for the tokens a node requests
//! (upstream `validateNodeServiceAccountAudience` and
//! `podReferencesAudience`, feature `ServiceAccountNodeAudienceRestriction`,
//! on by default from 1.33): a node asks for at most one audience, and it
//! must be one the bound pod uses — a projected `serviceAccountToken`
//! volume's, or a `tokenRequests` audience of the CSIDriver of one of the
//! pod's CSI volumes (inline, through a claim's PV, or a generic ephemeral
//! volume's claim) — or one RBAC lets the node request
//! (`request-serviceaccounts-token-audience` on the audience as resource).
//!
//! Written from the upstream behaviour, independent of the kubelet.

use serde_json::Value;

/// Reads an object of the store: (resource, namespace, name).
pub(crate) type Getter<'a> = dyn Fn(&str, &str, &str) -> Option<Value> + 'a;

/// What the rule needs to know of the request and its caller.
pub(crate) struct NodeTokenRequest<'a> {
    /// The audiences as the node sent them, before defaulting.
    pub audiences: &'a [String],
    /// The bound pod.
    pub pod: &'a Value,
    /// The node's name.
    pub node: &'a str,
    /// Whether RBAC lets the node request tokens for this audience.
    pub rbac_allows: &'a dyn Fn(&str) -> bool,
}

fn str_at<'v>(v: &'v Value, p: &str) -> &'v str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// `Err` carries the forbidden reason, upstream's text.
pub(crate) fn check(r: &NodeTokenRequest<'_>, get: &Getter<'_>) -> Result<(), String> {
    let audience = match r.audiences {
        [] => "",
        [one] => one.as_str(),
        _ => return Err("node may only request 0 or 1 audiences".into()),
    };
    if pod_references(r.pod, audience, get) || (r.rbac_allows)(audience) {
        return Ok(());
    }
    Err(format!(
        "audience {audience:?} not found in pod spec volume, system:node:{} is not authorized to request tokens for this audience",
        r.node
    ))
}

fn pod_references(pod: &Value, audience: &str, get: &Getter<'_>) -> bool {
    let namespace = str_at(pod, "/metadata/namespace");
    let pod_name = str_at(pod, "/metadata/name");
    let volumes = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for v in volumes {
        let projected = v
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        for s in projected {
            if let Some(t) = s.get("serviceAccountToken")
                && str_at(t, "/audience") == audience
            {
                return true;
            }
        }
        let claim = if v.get("persistentVolumeClaim").is_some() {
            Some(str_at(v, "/persistentVolumeClaim/claimName").to_string())
        } else if v.get("ephemeral").is_some() {
            Some(format!("{pod_name}-{}", str_at(v, "/name")))
        } else {
            None
        };
        let driver = if v.get("csi").is_some() {
            str_at(v, "/csi/driver").to_string()
        } else if let Some(claim) = claim {
            csi_of_claim(namespace, &claim, get)
        } else {
            String::new()
        };
        if !driver.is_empty() && driver_has_audience(&driver, audience, get) {
            return true;
        }
    }
    false
}

/// Upstream `getCSIFromPVC`: the CSI driver of the claim's bound PV.
fn csi_of_claim(namespace: &str, claim: &str, get: &Getter<'_>) -> String {
    let Some(pvc) = get("persistentvolumeclaims", namespace, claim) else {
        return String::new();
    };
    let pv_name = str_at(&pvc, "/spec/volumeName");
    if pv_name.is_empty() {
        return String::new();
    }
    get("persistentvolumes", "", pv_name)
        .map(|pv| str_at(&pv, "/spec/csi/driver").to_string())
        .unwrap_or_default()
}

/// Upstream `csiDriverHasAudience`.
fn driver_has_audience(driver: &str, audience: &str, get: &Getter<'_>) -> bool {
    get("csidrivers", "", driver).is_some_and(|d| {
        d.pointer("/spec/tokenRequests")
            .and_then(Value::as_array)
            .is_some_and(|rs| rs.iter().any(|t| str_at(t, "/audience") == audience))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store(key: (&str, &str, &str)) -> Option<Value> {
        match key {
            ("persistentvolumeclaims", "ns", "claim")
            | ("persistentvolumeclaims", "ns", "p-eph") => {
                Some(json!({"spec": {"volumeName": "pv"}}))
            }
            ("persistentvolumes", "", "pv") => Some(json!({"spec": {"csi": {"driver": "d"}}})),
            ("csidrivers", "", "d") => {
                Some(json!({"spec": {"tokenRequests": [{"audience": "vault"}]}}))
            }
            _ => None,
        }
    }

    fn check_with(volumes: Value, audiences: &[&str], rbac: bool) -> Result<(), String> {
        let pod =
            json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"volumes": volumes}});
        let audiences: Vec<String> = audiences.iter().map(|a| a.to_string()).collect();
        let allow = move |_: &str| rbac;
        check(
            &NodeTokenRequest {
                audiences: &audiences,
                pod: &pod,
                node: "n1",
                rbac_allows: &allow,
            },
            &|r, n, name| store((r, n, name)),
        )
    }

    #[test]
    fn audiences_the_pod_uses_are_allowed() {
        let projected = json!([{"name": "t", "projected": {"sources": [
            {"serviceAccountToken": {"path": "t"}},
            {"serviceAccountToken": {"path": "u", "audience": "aud"}}]}}]);
        assert_eq!(check_with(projected.clone(), &[], false), Ok(()));
        assert_eq!(check_with(projected.clone(), &["aud"], false), Ok(()));
        assert_eq!(
            check_with(projected, &["other"], false),
            Err("audience \"other\" not found in pod spec volume, system:node:n1 is not authorized to request tokens for this audience".into())
        );
        for v in [
            json!([{"name": "c", "csi": {"driver": "d"}}]),
            json!([{"name": "c", "persistentVolumeClaim": {"claimName": "claim"}}]),
            json!([{"name": "eph", "ephemeral": {"volumeClaimTemplate": {}}}]),
        ] {
            assert_eq!(check_with(v.clone(), &["vault"], false), Ok(()), "{v}");
            assert!(check_with(v, &["nope"], false).is_err());
        }
    }

    #[test]
    fn rbac_grants_and_the_one_audience_limit() {
        assert_eq!(check_with(json!([]), &["registry"], true), Ok(()));
        assert!(check_with(json!([]), &["registry"], false).is_err());
        assert_eq!(
            check_with(json!([]), &["a", "b"], true),
            Err("node may only request 0 or 1 audiences".into())
        );
    }
}
