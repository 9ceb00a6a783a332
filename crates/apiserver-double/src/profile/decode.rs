//! Pod fields an older release's codec does not know, dropped on every
//! write (`docs/apiserver-versions.md` §6).
//!
//! A 1.19 apiserver decodes with the non-strict json-iterator
//! (`staging/src/k8s.io/apimachinery/pkg/runtime/serializer/json/json.go`,
//! v1.19.10): a field missing from its `core/v1` types is dropped silently,
//! so it is never stored and never comes back. The same holds for fields
//! whose feature gate is off (`pkg/api/pod/util.go` `dropDisabledFields`).
//! Each entry names the release that first kept the field (its type or its
//! gate turned on by default).

use serde_json::Value;

use super::Profile;

/// `(path, first release that keeps it)`. `[]` walks every array element.
const POD_FIELDS: &[(&str, u32)] = &[
    // EphemeralContainers: alpha (off) until beta in 1.23.
    ("spec.ephemeralContainers", 23),
    ("spec.os", 23),
    // UserNamespacesSupport: alpha (off) from 1.25, beta off in 1.30, on from 1.33.
    ("spec.hostUsers", 33),
    ("spec.schedulingGates", 26),
    ("spec.resourceClaims", 26),
    ("spec.securityContext.appArmorProfile", 30),
    // SupplementalGroupsPolicy: alpha (off) in 1.31, beta (on) from 1.33.
    ("spec.securityContext.supplementalGroupsPolicy", 33),
    // SELinuxChangePolicy: alpha (off) in 1.32, beta (on) from 1.33.
    ("spec.securityContext.seLinuxChangePolicy", 33),
    // PodLevelResources: alpha (off) in 1.32 and 1.33, beta (on) from 1.34.
    ("spec.resources", 34),
    // RecursiveReadOnlyMounts: alpha (off) in 1.30, beta (on) from 1.31.
    ("spec.containers[].volumeMounts[].recursiveReadOnly", 31),
    ("spec.initContainers[].volumeMounts[].recursiveReadOnly", 31),
    ("spec.hostnameOverride", 34),
    // SidecarContainers: the field arrived in 1.28 (alpha), on from 1.29.
    ("spec.initContainers[].restartPolicy", 29),
    ("spec.initContainers[].resizePolicy", 27),
    ("spec.initContainers[].restartPolicyRules", 34),
    ("spec.initContainers[].securityContext.appArmorProfile", 30),
    ("spec.containers[].restartPolicy", 34),
    ("spec.containers[].restartPolicyRules", 34),
    ("spec.containers[].resizePolicy", 27),
    ("spec.containers[].securityContext.appArmorProfile", 30),
    ("spec.containers[].lifecycle.stopSignal", 33),
    ("spec.containers[].lifecycle.postStart.sleep", 29),
    ("spec.containers[].lifecycle.preStop.sleep", 29),
    ("spec.initContainers[].lifecycle.postStart.sleep", 29),
    ("spec.initContainers[].lifecycle.preStop.sleep", 29),
    // PodHostIPs: alpha (off) in 1.28, beta (on) in 1.29.
    ("status.hostIPs", 29),
    ("status.resize", 27),
    ("status.resourceClaimStatuses", 28),
    ("status.observedGeneration", 33),
    ("status.conditions[].observedGeneration", 33),
    ("status.containerStatuses[].allocatedResources", 27),
    ("status.containerStatuses[].resources", 27),
    ("status.containerStatuses[].volumeMounts", 30),
    ("status.containerStatuses[].user", 31),
    ("status.containerStatuses[].allocatedResourcesStatus", 31),
    ("status.containerStatuses[].stopSignal", 33),
    ("status.initContainerStatuses[].allocatedResources", 27),
    ("status.initContainerStatuses[].resources", 27),
    ("status.initContainerStatuses[].volumeMounts", 30),
    ("status.initContainerStatuses[].user", 31),
    (
        "status.initContainerStatuses[].allocatedResourcesStatus",
        31,
    ),
    ("status.initContainerStatuses[].stopSignal", 33),
];

fn drop_path(v: &mut Value, segs: &[&str]) {
    let [seg, rest @ ..] = segs else { return };
    let (name, each) = match seg.strip_suffix("[]") {
        Some(n) => (n, true),
        None => (*seg, false),
    };
    let Some(obj) = v.as_object_mut() else { return };
    if rest.is_empty() && !each {
        obj.remove(name);
        return;
    }
    let Some(child) = obj.get_mut(name) else {
        return;
    };
    if each {
        for el in child.as_array_mut().into_iter().flatten() {
            drop_path(el, rest);
        }
    } else {
        drop_path(child, rest);
    }
}

/// Drops from `obj`, an object of `resource` being written, what `p`'s
/// codec would not keep.
pub fn drop_unknown_fields(p: Profile, resource: &str, obj: &mut Value) {
    if resource != "pods" {
        return;
    }
    for (path, from) in POD_FIELDS {
        if !p.at_least(*from) {
            let segs: Vec<&str> = path.split('.').collect();
            drop_path(obj, &segs);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_1_19_codec_drops_newer_pod_fields() {
        let pod = json!({"spec": {
            "initContainers": [{"name": "side", "restartPolicy": "Always"}],
            "containers": [{"name": "c", "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}}]},
            "status": {"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
                "conditions": [{"type": "Ready", "observedGeneration": 1}]}});
        let mut old = pod.clone();
        drop_unknown_fields(Profile::V1_19, "pods", &mut old);
        assert_eq!(
            old,
            json!({"spec": {
                "initContainers": [{"name": "side"}],
                "containers": [{"name": "c", "lifecycle": {"preStop": {}}}]},
                "status": {"hostIP": "10.0.0.1", "conditions": [{"type": "Ready"}]}})
        );
        let mut new = pod.clone();
        drop_unknown_fields(Profile::V1_35, "pods", &mut new);
        assert_eq!(new, pod);
    }
}
