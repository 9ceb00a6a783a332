//! Strategies of the `storage.k8s.io` kinds (upstream
//! `pkg/registry/storage/{csidriver,csinode,volumeattachment,storageclass}/strategy.go`
//! and the v1 defaults of `pkg/apis/storage/v1/defaults.go`), per release:
//!
//! - CSIDriver: `attachRequired` defaults to true, `podInfoOnMount` to
//!   false and `volumeLifecycleModes` to `[Persistent]` in both releases
//!   (`CSIInlineVolume` is beta and on in 1.19). 1.19 does not know
//!   `requiresRepublish`, `tokenRequests`, `seLinuxMount` or
//!   `nodeAllocatableUpdatePeriodSeconds` (its codec drops them), and drops
//!   `storageCapacity` and `fsGroupPolicy` because their gates
//!   (`CSIStorageCapacity`, `CSIVolumeFSGroupPolicy`) are alpha and off
//!   there, so neither is defaulted. 1.35 defaults `storageCapacity` and
//!   `requiresRepublish` to false, `fsGroupPolicy` to
//!   `ReadWriteOnceWithFSType` and `seLinuxMount` to false.
//! - CSINode and VolumeAttachment: no defaults; validated on create and
//!   update ([`crate::validation::storage`]).
//! - StorageClass: `reclaimPolicy` defaults to `Delete` and
//!   `volumeBindingMode` to `Immediate`.
//!
//! None of this is shared with the kubelet.

use serde_json::{Value, json};

use crate::field::FieldError;
use crate::profile::Profile;
use crate::validation::storage as v;

/// The `storage.k8s.io` kinds this module handles.
pub fn is_storage(resource: &str) -> bool {
    matches!(
        resource,
        "csidrivers" | "csinodes" | "volumeattachments" | "storageclasses"
    )
}

/// CSIDriver spec fields a 1.19 apiserver does not keep.
const CSI_DRIVER_FIELDS_AFTER_1_19: &[&str] = &[
    "storageCapacity",
    "fsGroupPolicy",
    "requiresRepublish",
    "tokenRequests",
    "seLinuxMount",
    "nodeAllocatableUpdatePeriodSeconds",
];

fn default_field(obj: &mut Value, field: &str, value: Value) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    if let Some(spec) = obj["spec"].as_object_mut() {
        let e = spec.entry(field).or_insert(Value::Null);
        let empty = e.is_null() || e.as_array().is_some_and(Vec::is_empty);
        if empty {
            *e = value;
        }
    }
}

/// The release's decoding and defaulting of a CSIDriver.
pub fn default_csi_driver(p: Profile, obj: &mut Value) {
    if !p.at_least(20)
        && let Some(spec) = obj["spec"].as_object_mut()
    {
        for f in CSI_DRIVER_FIELDS_AFTER_1_19 {
            spec.remove(*f);
        }
    }
    default_field(obj, "attachRequired", json!(true));
    default_field(obj, "podInfoOnMount", json!(false));
    default_field(obj, "volumeLifecycleModes", json!(["Persistent"]));
    if p.at_least(20) {
        default_field(obj, "storageCapacity", json!(false));
        default_field(obj, "fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
        default_field(obj, "requiresRepublish", json!(false));
    }
    if p.at_least(28) {
        default_field(obj, "seLinuxMount", json!(false));
    }
}

fn default_storage_class(obj: &mut Value) {
    for (field, value) in [
        ("reclaimPolicy", "Delete"),
        ("volumeBindingMode", "Immediate"),
    ] {
        let unset = obj
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if unset {
            obj[field] = json!(value);
        }
    }
}

/// NodeRestriction's `admitCSINode` on create: a node creates only the
/// CSINode named like itself (the authorizer checks the name of every other
/// verb). The error is the 403 message.
pub(crate) fn admit_create(
    who: &crate::auth::Identity,
    resource: &str,
    name: &str,
) -> Result<(), String> {
    match who.node_name() {
        Some(node) if resource == "csinodes" && name != node => Err(format!(
            "csinodes.storage.k8s.io \"{name}\" is forbidden: can only access CSINode with the same name as the requesting node"
        )),
        _ => Ok(()),
    }
}

/// The create strategy of `resource` on `obj` (metadata already set).
pub(crate) fn on_create(
    p: Profile,
    resource: &str,
    obj: &mut Value,
) -> Result<(), Vec<FieldError>> {
    let errs = match resource {
        "csidrivers" => {
            default_csi_driver(p, obj);
            v::validate_csi_driver(p, obj)
        }
        "csinodes" => v::validate_csi_node(p, obj),
        "volumeattachments" => {
            // Status is set through its subresource only.
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
            v::validate_volume_attachment(obj)
        }
        "storageclasses" => {
            default_storage_class(obj);
            Vec::new()
        }
        _ => Vec::new(),
    };
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

/// The update strategy of `resource` (the main resource, not a
/// subresource) on `new`, given the stored `old`.
pub(crate) fn on_update(
    p: Profile,
    resource: &str,
    old: &Value,
    new: &mut Value,
) -> Result<(), Vec<FieldError>> {
    let errs = match resource {
        "csidrivers" => {
            default_csi_driver(p, new);
            v::validate_csi_driver_update(p, old, new)
        }
        "csinodes" => v::validate_csi_node_update(p, old, new),
        "volumeattachments" => v::validate_volume_attachment_update(old, new),
        "storageclasses" => {
            default_storage_class(new);
            Vec::new()
        }
        _ => Vec::new(),
    };
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csi_driver_defaults_follow_the_release() {
        let written = json!({"metadata": {"name": "d.example.com"}, "spec": {
            "fsGroupPolicy": "File", "requiresRepublish": true, "storageCapacity": true}});
        let mut old = written.clone();
        on_create(Profile::V1_19, "csidrivers", &mut old).expect("valid");
        assert_eq!(
            old["spec"],
            json!({"attachRequired": true, "podInfoOnMount": false,
                "volumeLifecycleModes": ["Persistent"]})
        );
        let mut new = json!({"metadata": {"name": "d.example.com"}, "spec": {}});
        on_create(Profile::V1_35, "csidrivers", &mut new).expect("valid");
        assert_eq!(
            new["spec"],
            json!({"attachRequired": true, "podInfoOnMount": false,
                "volumeLifecycleModes": ["Persistent"], "storageCapacity": false,
                "fsGroupPolicy": "ReadWriteOnceWithFSType", "requiresRepublish": false,
                "seLinuxMount": false})
        );
        let mut kept = written;
        on_create(Profile::V1_35, "csidrivers", &mut kept).expect("valid");
        assert_eq!(kept["spec"]["fsGroupPolicy"], json!("File"));
        assert_eq!(kept["spec"]["requiresRepublish"], json!(true));
    }

    #[test]
    fn storage_classes_get_their_policies() {
        let mut sc = json!({"metadata": {"name": "fast"}, "provisioner": "d.example.com"});
        on_create(Profile::V1_35, "storageclasses", &mut sc).expect("valid");
        assert_eq!(sc["reclaimPolicy"], json!("Delete"));
        assert_eq!(sc["volumeBindingMode"], json!("Immediate"));
    }
}
