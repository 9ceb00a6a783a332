//! The three patch types the apiserver accepts for built-in types:
//! JSON merge patch (RFC 7396), strategic merge patch (lists merged by the
//! `patchMergeKey` of the Go types) and JSON patch (RFC 6902).
//!
//! The strategic merge table covers the core/v1 fields kubelets and
//! controllers patch; fields not listed replace lists whole, like Go fields
//! without a `patchStrategy`.

use serde_json::{Map, Value};

/// Content types.
pub const MERGE: &str = "application/merge-patch+json";
/// Strategic merge patch.
pub const STRATEGIC: &str = "application/strategic-merge-patch+json";
/// JSON patch.
pub const JSON: &str = "application/json-patch+json";

/// Why a patch cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// Unsupported media type.
    #[error(
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
    )]
    UnsupportedMediaType,
    /// Not valid JSON or not applicable.
    #[error("{0}")]
    Invalid(String),
}

/// `patchMergeKey` of list fields with `patchStrategy: merge`, by field name.
/// `None` for merge-by-value lists of scalars (finalizers).
fn merge_key(field: &str) -> Option<Option<&'static str>> {
    Some(match field {
        "conditions" | "addresses" => Some("type"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => Some("name"),
        "ports" => Some("containerPort"),
        "volumeMounts" => Some("mountPath"),
        "ownerReferences" => Some("uid"),
        "podIPs" | "hostIPs" => Some("ip"),
        "finalizers" => None,
        _ => return None,
    })
}

/// Applies a patch of `content_type` to `target`.
pub fn apply(content_type: &str, target: &Value, patch: &[u8]) -> Result<Value, PatchError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    match ct {
        MERGE => {
            let p: Value = parse(patch)?;
            let mut out = target.clone();
            json_patch::merge(&mut out, &p);
            Ok(out)
        }
        STRATEGIC => {
            let p: Value = parse(patch)?;
            Ok(strategic(target, &p))
        }
        JSON => {
            let p: json_patch::Patch = serde_json::from_slice(patch)
                .map_err(|e| PatchError::Invalid(format!("invalid JSON patch: {e}")))?;
            let mut out = target.clone();
            json_patch::patch(&mut out, &p).map_err(|e| PatchError::Invalid(e.to_string()))?;
            Ok(out)
        }
        _ => Err(PatchError::UnsupportedMediaType),
    }
}

fn parse(b: &[u8]) -> Result<Value, PatchError> {
    serde_json::from_slice(b).map_err(|e| PatchError::Invalid(format!("invalid JSON: {e}")))
}

/// Strategic merge of `patch` into `target`.
pub fn strategic(target: &Value, patch: &Value) -> Value {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => Value::Object(merge_map(t, p)),
        _ => strip_directives(patch),
    }
}

fn merge_map(target: &Map<String, Value>, patch: &Map<String, Value>) -> Map<String, Value> {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = patch.clone();
        p.remove("$patch");
        return strip_map(&p);
    }
    let mut out = target.clone();
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Value::Array(del)) = (out.get_mut(field), v) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                out.remove(k);
            }
            Value::Object(pm) => {
                let merged = match target.get(k) {
                    Some(Value::Object(tm)) => merge_map(tm, pm),
                    _ => strip_map(pm),
                };
                out.insert(k.clone(), Value::Object(merged));
            }
            Value::Array(pl)
                if pl
                    .iter()
                    .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace")) =>
            {
                // `{"$patch": "replace"}` in a list: the rest of the list replaces it whole.
                let rest = pl
                    .iter()
                    .filter(|e| e.get("$patch").is_none())
                    .map(strip_directives)
                    .collect();
                out.insert(k.clone(), Value::Array(rest));
            }
            Value::Array(pl) => {
                let merged = match (merge_key(k), target.get(k)) {
                    (Some(Some(key)), Some(Value::Array(tl))) => merge_list(tl, pl, key),
                    (Some(None), Some(Value::Array(tl))) => {
                        let mut l = tl.clone();
                        for x in pl {
                            if !l.contains(x) {
                                l.push(x.clone());
                            }
                        }
                        l
                    }
                    _ => pl
                        .iter()
                        .filter(|e| !is_delete(e))
                        .map(strip_directives)
                        .collect(),
                };
                out.insert(k.clone(), Value::Array(merged));
            }
            other => {
                out.insert(k.clone(), other.clone());
            }
        }
    }
    out
}

fn is_delete(v: &Value) -> bool {
    v.get("$patch").and_then(Value::as_str) == Some("delete")
}

fn merge_list(target: &[Value], patch: &[Value], key: &str) -> Vec<Value> {
    let mut out: Vec<Value> = target.to_vec();
    for p in patch {
        let id = p.get(key);
        let pos = id.and_then(|id| out.iter().position(|t| t.get(key) == Some(id)));
        match (pos, is_delete(p)) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => out[i] = strategic(&out[i], p),
            (None, false) => out.push(strip_directives(p)),
        }
    }
    out
}

fn strip_map(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), strip_directives(v)))
        .collect()
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_map(m)),
        Value::Array(l) => Value::Array(l.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_merge_by_type_and_container_statuses_replace() {
        let pod = json!({"status": {
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "a"}, {"name": "b"}]}});
        let p = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "b", "ready": true}]}});
        let out = strategic(&pod, &p);
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}])
        );
        assert_eq!(
            out["status"]["containerStatuses"],
            json!([{"name": "b", "ready": true}])
        );
    }

    #[test]
    fn directives_and_null_delete() {
        let node = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "1.1.1.1"}, {"type": "Hostname", "address": "h"}]}});
        let p = json!({"metadata": {"labels": {"a": null}, "$deleteFromPrimitiveList/finalizers": ["x"]},
            "status": {"$setElementOrder/addresses": [{"type": "InternalIP"}],
                "addresses": [{"type": "Hostname", "$patch": "delete"}]}});
        let out = strategic(&node, &p);
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(out["metadata"]["finalizers"], json!(["y"]));
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "1.1.1.1"}])
        );
    }

    #[test]
    fn a_replace_directive_replaces_a_merging_list() {
        let node = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"}, {"type": "InternalIP", "address": "fd00::1"},
            {"type": "Hostname", "address": "h"}]}});
        let p = json!({"status": {"addresses": [{"$patch": "replace"},
            {"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "h"}]}});
        assert_eq!(
            strategic(&node, &p)["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "h"}])
        );
    }

    #[test]
    fn merge_patch_replaces_lists() {
        let t = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        let out = apply(MERGE, &t, br#"{"status":{"conditions":[{"type":"B"}]}}"#).unwrap();
        assert_eq!(out["status"]["conditions"], json!([{"type": "B"}]));
        assert!(matches!(
            apply("application/apply-patch+yaml", &t, b"{}"),
            Err(PatchError::UnsupportedMediaType)
        ));
    }
}
