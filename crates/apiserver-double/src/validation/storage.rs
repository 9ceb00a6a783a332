//! Validation of the `storage.k8s.io` kinds a kubelet writes or reads, on
//! its own (upstream `pkg/apis/storage/validation/validation.go`:
//! `ValidateCSINode`, `ValidateCSINodeUpdate`, `ValidateCSIDriver`,
//! `ValidateCSIDriverUpdate`, `ValidateVolumeAttachment`,
//! `ValidateVolumeAttachmentUpdate`; `ValidateCSIDriverName` and
//! `ValidateQualifiedName` of `pkg/apis/core/validation`), as each release
//! words and bounds it:
//! - a CSINode driver's `nodeID` may be 128 bytes in 1.19 and 256 from 1.23
//!   (kubernetes#98753, #101256, #104160: the CSINode strategy always allows
//!   the longer limit);
//! - a driver name longer than 63 bytes is `Too long`, worded "must have at
//!   most 63 bytes" in 1.19 and "may not be more than 63 bytes" in 1.35;
//! - a CSIDriver's whole `spec` is immutable in 1.19; in 1.35 only
//!   `attachRequired` (reported at upstream's `spec.attachedRequired`) and
//!   `volumeLifecycleModes` are;
//! - a CSINode driver entry may not change under the same name, except its
//!   `allocatable` in 1.35 (`MutableCSINodeAllocatableCount`, beta and on);
//!   1.19 reports the change at `CSINodeDriver` and an invalid topology
//!   key with the whole key list as the value.
//!
//! Objects are read as JSON, so any release's shape can be checked.

use std::collections::HashSet;

use serde_json::Value;

use crate::field::{BadValue, FieldError, dns1123_subdomain};
use crate::profile::Profile;

const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";

fn regex_error() -> String {
    format!(
        "{QUALIFIED_NAME_MSG} (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '{QUALIFIED_NAME_FMT}')"
    )
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn items<'a>(v: &'a Value, ptr: &str) -> &'a [Value] {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A string list as Go's `%#v` prints it (`[]string{"a", "b"}`).
fn go_strings(list: &[Value]) -> String {
    let quoted: Vec<String> = list
        .iter()
        .map(|v| format!("{:?}", v.as_str().unwrap_or("")))
        .collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

fn raw(v: &Value) -> BadValue {
    BadValue::Raw(v.to_string())
}

/// Upstream `IsQualifiedName` (`[prefix/]name`), each message reported as
/// an invalid `field`.
pub fn qualified_name(field: &str, value: &str, errs: &mut Vec<FieldError>) {
    let mut msgs: Vec<String> = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                msgs.push("prefix part must be non-empty".into());
            } else {
                let mut sub = Vec::new();
                dns1123_subdomain(field, prefix, &mut sub);
                msgs.extend(sub.into_iter().map(|e| format!("prefix part {}", e.detail)));
            }
            *name
        }
        _ => {
            let err = FieldError::invalid(
                field,
                value,
                format!(
                    "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                    regex_error()
                ),
            );
            errs.push(err);
            return;
        }
    };
    if name.is_empty() {
        msgs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        msgs.push("name part must be no more than 63 characters".into());
    }
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_alphanumeric();
    let ok = !b.is_empty()
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter()
            .all(|c| alnum(c) || matches!(c, b'-' | b'_' | b'.'));
    if !ok {
        msgs.push(format!("name part {}", regex_error()));
    }
    errs.extend(
        msgs.into_iter()
            .map(|m| FieldError::invalid(field, value, m)),
    );
}

/// Upstream `ValidateCSIDriverName`: required, at most 63 bytes, a DNS-1123
/// subdomain once lowercased.
pub fn csi_driver_name(p: Profile, field: &str, name: &str, errs: &mut Vec<FieldError>) {
    if name.is_empty() {
        errs.push(FieldError::required(field, ""));
    }
    if name.len() > 63 {
        let detail = if p.at_least(30) {
            "may not be more than 63 bytes"
        } else {
            "must have at most 63 bytes"
        };
        errs.push(FieldError::too_long(field, detail));
    }
    let mut sub = Vec::new();
    dns1123_subdomain(field, &name.to_lowercase(), &mut sub);
    // The message names the value as written, not lowercased.
    errs.extend(
        sub.into_iter()
            .filter(|e| !e.detail.starts_with("must be no more than"))
            .map(|e| FieldError::invalid(field, name, e.detail)),
    );
}

/// The longest `nodeID` a CSINode driver may have in `p`.
pub fn max_node_id(p: Profile) -> usize {
    if p.at_least(23) { 256 } else { 128 }
}

fn object_name(obj: &Value, errs: &mut Vec<FieldError>) {
    let name = str_at(obj, "/metadata/name");
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        dns1123_subdomain("metadata.name", name, errs);
    }
}

/// Upstream `ValidateCSINode`.
pub fn validate_csi_node(p: Profile, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    object_name(obj, &mut errs);
    let mut names: HashSet<&str> = HashSet::new();
    for (i, d) in items(obj, "/spec/drivers").iter().enumerate() {
        let at = format!("spec.drivers[{i}]");
        let name = str_at(d, "/name");
        csi_driver_name(p, &format!("{at}.name"), name, &mut errs);
        let id = str_at(d, "/nodeID");
        if id.is_empty() {
            errs.push(FieldError::required(&format!("{at}.nodeID"), ""));
        }
        let max = max_node_id(p);
        if id.len() > max {
            errs.push(FieldError::invalid(
                &format!("{at}.nodeID"),
                id,
                format!("must be {max} characters or less"),
            ));
        }
        if let Some(n) = d.pointer("/allocatable/count").and_then(Value::as_i64)
            && n < 0
        {
            errs.push(FieldError::invalid(
                &format!("{at}.allocatable.count"),
                n,
                crate::field::NEGATIVE_MSG,
            ));
        }
        if !names.insert(name) {
            errs.push(FieldError::duplicate(&format!("{at}.name"), name));
        }
        let mut keys: HashSet<&str> = HashSet::new();
        for k in items(d, "/topologyKeys") {
            let key = k.as_str().unwrap_or("");
            if key.is_empty() {
                errs.push(FieldError::required(&at, ""));
            }
            if !keys.insert(key) {
                errs.push(FieldError::duplicate(&at, key));
            }
            if p.at_least(20) {
                qualified_name(&at, key, &mut errs);
            } else {
                // Older releases name the whole key list as the bad value.
                let mut one = Vec::new();
                qualified_name(&at, key, &mut one);
                let list = go_strings(items(d, "/topologyKeys"));
                errs.extend(
                    one.into_iter()
                        .map(|e| FieldError::invalid(&at, BadValue::Raw(list.clone()), e.detail)),
                );
            }
        }
    }
    errs
}

/// Upstream `ValidateCSINodeUpdate`: the new object is valid and a driver
/// entry keeps its fields while it keeps its name.
pub fn validate_csi_node_update(p: Profile, old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = validate_csi_node(p, new);
    let comparable = |d: &Value| {
        let mut d = d.clone();
        if p.at_least(34)
            && let Some(o) = d.as_object_mut()
        {
            o.remove("allocatable");
        }
        d
    };
    for o in items(old, "/spec/drivers") {
        for n in items(new, "/spec/drivers") {
            if str_at(o, "/name") == str_at(n, "/name") && comparable(o) != comparable(n) {
                // 1.19 reports the entry at the type's name.
                let at = if p.at_least(34) {
                    "spec.drivers"
                } else {
                    "CSINodeDriver"
                };
                errs.push(FieldError::invalid(at, raw(n), "field is immutable"));
            }
        }
    }
    errs
}

/// Upstream `ValidateCSIDriver` (on the defaulted object).
pub fn validate_csi_driver(p: Profile, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    object_name(obj, &mut errs);
    let spec = &obj["spec"];
    let mut required = vec![
        ("attachRequired", "attachedRequired"),
        ("podInfoOnMount", "podInfoOnMount"),
    ];
    if p.at_least(24) {
        // storageCapacity is defaulted (and required) once the gate is on.
        required.push(("storageCapacity", "storageCapacity"));
    }
    for (field, path) in required {
        if spec.get(field).and_then(Value::as_bool).is_none() {
            errs.push(FieldError::required(&format!("spec.{path}"), ""));
        }
    }
    if let Some(policy) = spec.get("fsGroupPolicy").and_then(Value::as_str) {
        let allowed = ["File", "None", "ReadWriteOnceWithFSType"];
        if !allowed.contains(&policy) {
            errs.push(FieldError::not_supported(
                "spec.fsGroupPolicy",
                policy,
                &allowed,
            ));
        }
    }
    let mut audiences: HashSet<&str> = HashSet::new();
    for (i, t) in items(spec, "/tokenRequests").iter().enumerate() {
        let at = format!("spec.tokenRequests[{i}]");
        let audience = str_at(t, "/audience");
        if !audiences.insert(audience) {
            errs.push(FieldError::duplicate(&format!("{at}.audience"), audience));
            continue;
        }
        if let Some(s) = t.get("expirationSeconds").and_then(Value::as_i64) {
            if s < 600 {
                errs.push(FieldError::invalid(
                    &format!("{at}.expirationSeconds"),
                    s,
                    "may not specify a duration less than 10 minutes",
                ));
            }
            if s > 1 << 32 {
                errs.push(FieldError::invalid(
                    &format!("{at}.expirationSeconds"),
                    s,
                    "may not specify a duration larger than 2^32 seconds",
                ));
            }
        }
    }
    for m in items(spec, "/volumeLifecycleModes") {
        let mode = m.as_str().unwrap_or("");
        if !matches!(mode, "Persistent" | "Ephemeral") {
            errs.push(FieldError::not_supported(
                "spec.volumeLifecycleModes",
                mode,
                &["Persistent", "Ephemeral"],
            ));
        }
    }
    if let Some(s) = spec
        .get("nodeAllocatableUpdatePeriodSeconds")
        .and_then(Value::as_i64)
        && s < 10
    {
        errs.push(FieldError::invalid(
            "spec.nodeAllocatableUpdatePeriodSeconds",
            s,
            "must be greater than or equal to 10 seconds",
        ));
    }
    errs
}

/// Upstream `ValidateCSIDriverUpdate`.
pub fn validate_csi_driver_update(p: Profile, old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = validate_csi_driver(p, new);
    if !p.at_least(20) {
        if old["spec"] != new["spec"] {
            errs.push(FieldError::invalid(
                "spec",
                raw(&new["spec"]),
                "field is immutable",
            ));
        }
        return errs;
    }
    for (field, path) in [
        ("attachRequired", "spec.attachedRequired"),
        ("volumeLifecycleModes", "spec.volumeLifecycleModes"),
    ] {
        if old["spec"].get(field) != new["spec"].get(field) {
            let v = new["spec"].get(field).cloned().unwrap_or(Value::Null);
            errs.push(FieldError::invalid(path, raw(&v), "field is immutable"));
        }
    }
    errs
}

/// Upstream `ValidateVolumeAttachment` (the spec; the status through its
/// subresource is not checked).
pub fn validate_volume_attachment(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    object_name(obj, &mut errs);
    if str_at(obj, "/spec/attacher").is_empty() {
        errs.push(FieldError::required("spec.attacher", ""));
    }
    let pv = obj.pointer("/spec/source/persistentVolumeName");
    let inline = obj
        .pointer("/spec/source/inlineVolumeSpec")
        .filter(|v| !v.is_null());
    let both = "must specify exactly one of inlineVolumeSpec and persistentVolumeName";
    match (pv.filter(|v| !v.is_null()), inline) {
        (None, None) => errs.push(FieldError::required("spec.source", both)),
        (Some(_), Some(_)) => errs.push(FieldError::forbidden("spec.source", both)),
        (Some(name), None) if name.as_str().is_none_or(str::is_empty) => {
            errs.push(FieldError::required(
                "spec.source.persistentVolumeName",
                "must specify non empty persistentVolumeName",
            ));
        }
        _ => {}
    }
    let node = str_at(obj, "/spec/nodeName");
    dns1123_subdomain("spec.nodeName", node, &mut errs);
    errs
}

/// Upstream `ValidateVolumeAttachmentUpdate`: the spec is read-only.
pub fn validate_volume_attachment_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = validate_volume_attachment(new);
    if old["spec"] != new["spec"] {
        errs.push(FieldError::invalid(
            "spec",
            raw(&new["spec"]),
            "field is immutable",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(drivers: Value) -> Value {
        json!({"metadata": {"name": "n1"}, "spec": {"drivers": drivers}})
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_kubelet_csinode_is_valid_in_both_releases() {
        let n = node(json!([{"name": "hostpath.csi.k8s.io", "nodeID": "n1",
            "topologyKeys": ["topology.hostpath.csi/node"]}]));
        for p in Profile::ALL {
            assert!(validate_csi_node(p, &n).is_empty(), "{p}");
        }
    }

    #[test]
    fn node_ids_are_bounded_per_release() {
        let n = node(json!([{"name": "d.example.com", "nodeID": "a".repeat(200)}]));
        assert_eq!(
            messages(&validate_csi_node(Profile::V1_19, &n)),
            vec![format!(
                "spec.drivers[0].nodeID: Invalid value: {:?}: must be 128 characters or less",
                "a".repeat(200)
            )]
        );
        assert!(validate_csi_node(Profile::V1_35, &n).is_empty());
        let long = node(json!([{"name": "d.example.com", "nodeID": "a".repeat(257)}]));
        assert!(
            messages(&validate_csi_node(Profile::V1_35, &long))[0]
                .ends_with("must be 256 characters or less")
        );
        let empty = node(json!([{"name": "d.example.com", "nodeID": ""}]));
        assert_eq!(
            messages(&validate_csi_node(Profile::V1_35, &empty)),
            vec!["spec.drivers[0].nodeID: Required value"]
        );
    }

    #[test]
    fn driver_names_and_topology_keys_follow_upstream() {
        let n = node(json!([
            {"name": "d.example.com", "nodeID": "x", "topologyKeys": ["zone", "zone", "a/b/c"]},
            {"name": "d.example.com", "nodeID": "y"},
            {"name": "Bad_Name", "nodeID": "z"}]));
        let m = messages(&validate_csi_node(Profile::V1_35, &n));
        assert!(
            m.contains(&"spec.drivers[0]: Duplicate value: \"zone\"".to_string()),
            "{m:?}"
        );
        assert!(
            m.iter().any(|e| e.starts_with(
                "spec.drivers[0]: Invalid value: \"a/b/c\": a qualified name must consist"
            )),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.drivers[1].name: Duplicate value: \"d.example.com\"".to_string())
        );
        assert!(
            m.iter().any(|e| e.starts_with(
                "spec.drivers[2].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"
            )),
            "{m:?}"
        );
        let old_style = messages(&validate_csi_node(Profile::V1_19, &n));
        assert!(
            old_style.iter().any(|e| e.starts_with(
                "spec.drivers[0]: Invalid value: []string{\"zone\", \"zone\", \"a/b/c\"}: a qualified name"
            )),
            "{old_style:?}"
        );
        let long = node(json!([{"name": format!("{}.com", "a".repeat(61)), "nodeID": "x"}]));
        assert_eq!(
            messages(&validate_csi_node(Profile::V1_19, &long)),
            vec!["spec.drivers[0].name: Too long: must have at most 63 bytes"]
        );
        assert_eq!(
            messages(&validate_csi_node(Profile::V1_35, &long)),
            vec!["spec.drivers[0].name: Too long: may not be more than 63 bytes"]
        );
    }

    #[test]
    fn a_driver_entry_is_immutable_under_its_name() {
        let old =
            node(json!([{"name": "d.example.com", "nodeID": "x", "allocatable": {"count": 1}}]));
        let moved =
            node(json!([{"name": "d.example.com", "nodeID": "y", "allocatable": {"count": 1}}]));
        let recounted =
            node(json!([{"name": "d.example.com", "nodeID": "x", "allocatable": {"count": 2}}]));
        for (p, at) in [
            (Profile::V1_19, "CSINodeDriver"),
            (Profile::V1_35, "spec.drivers"),
        ] {
            let m = messages(&validate_csi_node_update(p, &old, &moved));
            assert!(m[0].starts_with(&format!("{at}: Invalid value:")), "{m:?}");
            assert!(m[0].ends_with("field is immutable"));
        }
        assert!(validate_csi_node_update(Profile::V1_35, &old, &recounted).is_empty());
        assert_eq!(
            validate_csi_node_update(Profile::V1_19, &old, &recounted).len(),
            1
        );
        // Adding or removing drivers is fine.
        assert!(validate_csi_node_update(Profile::V1_19, &old, &node(json!([]))).is_empty());
    }

    #[test]
    fn volume_attachments_need_one_source_and_keep_their_spec() {
        let va = json!({"metadata": {"name": "csi-1"}, "spec": {"attacher": "d.example.com",
            "nodeName": "n1", "source": {"persistentVolumeName": "pv1"}}});
        assert!(validate_volume_attachment(&va).is_empty());
        let mut none = va.clone();
        none["spec"]["source"] = json!({});
        assert_eq!(
            messages(&validate_volume_attachment(&none)),
            vec![
                "spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName"
            ]
        );
        let mut moved = va.clone();
        moved["spec"]["nodeName"] = json!("n2");
        assert!(
            messages(&validate_volume_attachment_update(&va, &moved))[0]
                .ends_with("field is immutable")
        );
        let mut attached = va.clone();
        attached["status"] = json!({"attached": true});
        assert!(validate_volume_attachment_update(&va, &attached).is_empty());
    }

    #[test]
    fn csi_driver_updates_follow_the_release() {
        let d = json!({"metadata": {"name": "d.example.com"}, "spec": {"attachRequired": true,
            "podInfoOnMount": false, "storageCapacity": false, "volumeLifecycleModes": ["Persistent"]}});
        let mut pod_info = d.clone();
        pod_info["spec"]["podInfoOnMount"] = json!(true);
        assert!(validate_csi_driver_update(Profile::V1_35, &d, &pod_info).is_empty());
        assert_eq!(
            validate_csi_driver_update(Profile::V1_19, &d, &pod_info).len(),
            1
        );
        let mut attach = d.clone();
        attach["spec"]["attachRequired"] = json!(false);
        assert_eq!(
            messages(&validate_csi_driver_update(Profile::V1_35, &d, &attach)),
            vec!["spec.attachedRequired: Invalid value: false: field is immutable"]
        );
        let mut modes = d.clone();
        modes["spec"]["volumeLifecycleModes"] = json!(["Sometimes"]);
        assert!(messages(&validate_csi_driver(Profile::V1_35, &modes))[0].starts_with(
            "spec.volumeLifecycleModes: Unsupported value: \"Sometimes\": supported values: \"Persistent\", \"Ephemeral\""
        ));
    }
}
