//! Ephemeral container validation (upstream `pkg/apis/core/validation`
//! `validateEphemeralContainers`, `allowedEphemeralContainerFields` and
//! `ValidatePodEphemeralContainersUpdate`), ported on its own.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, PodSpec};
use serde_json::Value;

use super::container::validate_container_common;
use super::{MIRROR_POD_ANNOTATION, validate_volumes};
use crate::field::FieldError;

/// Why a field is refused on an ephemeral container (upstream's wording).
const NOT_FOR_EPHEMERAL: &str = "cannot be set for an Ephemeral Container";

/// The container part of an ephemeral container (upstream
/// `EphemeralContainerCommon`): the same JSON without `targetContainerName`.
fn common(ec: &EphemeralContainer) -> Option<Container> {
    let mut v = serde_json::to_value(ec).ok()?;
    v.as_object_mut()?.remove("targetContainerName");
    serde_json::from_value(v).ok()
}

/// The fields an ephemeral container may not set (upstream keeps an allow
/// list; these are the fields of `EphemeralContainerCommon` it leaves out).
fn disallowed(ec: &EphemeralContainer) -> Vec<&'static str> {
    [
        ("ports", ec.ports.is_some()),
        ("resources", ec.resources.is_some()),
        ("resizePolicy", ec.resize_policy.is_some()),
        ("livenessProbe", ec.liveness_probe.is_some()),
        ("readinessProbe", ec.readiness_probe.is_some()),
        ("startupProbe", ec.startup_probe.is_some()),
        ("lifecycle", ec.lifecycle.is_some()),
        ("restartPolicy", ec.restart_policy.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(f, _)| f)
    .collect()
}

/// Upstream `validateEphemeralContainers`.
fn validate_ephemeral_containers(spec: &PodSpec, errs: &mut Vec<FieldError>) {
    let ecs = spec.ephemeral_containers.as_deref().unwrap_or(&[]);
    if ecs.is_empty() {
        return;
    }
    let volumes = validate_volumes(spec.volumes.as_deref().unwrap_or(&[]), &mut Vec::new());
    let restart = spec.restart_policy.as_deref().unwrap_or("");
    let others: HashSet<&str> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    let mut all = others.clone();
    for (i, ec) in ecs.iter().enumerate() {
        let path = format!("spec.ephemeralContainers[{i}]");
        if let Some(c) = common(ec) {
            validate_container_common(&c, &path, &volumes, restart, errs);
        }
        if !all.insert(ec.name.as_str()) {
            errs.push(FieldError::duplicate(
                &format!("{path}.name"),
                ec.name.as_str(),
            ));
        }
        if let Some(t) = ec
            .target_container_name
            .as_deref()
            .filter(|t| !t.is_empty())
            && !others.contains(t)
        {
            errs.push(FieldError::not_found(
                &format!("{path}.targetContainerName"),
                t,
            ));
        }
        for f in disallowed(ec) {
            errs.push(FieldError::forbidden(
                &format!("{path}.{f}"),
                NOT_FOR_EPHEMERAL,
            ));
        }
        for (j, m) in ec.volume_mounts.iter().flatten().enumerate() {
            let set = [
                ("subPath", m.sub_path.as_deref()),
                ("subPathExpr", m.sub_path_expr.as_deref()),
            ];
            for (f, v) in set {
                if v.is_some_and(|v| !v.is_empty()) {
                    errs.push(FieldError::forbidden(
                        &format!("{path}.volumeMounts[{j}].{f}"),
                        NOT_FOR_EPHEMERAL,
                    ));
                }
            }
        }
    }
}

/// Upstream `ValidatePodEphemeralContainersUpdate`: the new ephemeral
/// containers are valid, none of the old ones was removed or changed, and
/// the pod is not a static pod's mirror.
pub fn validate_pod_ephemeral_containers_update(new: &Pod, old: &Pod) -> Vec<FieldError> {
    let mirror = old
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
    if mirror {
        return vec![FieldError::forbidden(
            "",
            "static pods do not support ephemeral containers",
        )];
    }
    let mut errs = Vec::new();
    let empty = PodSpec::default();
    let spec = new.spec.as_ref().unwrap_or(&empty);
    validate_ephemeral_containers(spec, &mut errs);
    let by_name: HashMap<&str, &EphemeralContainer> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|ec| (ec.name.as_str(), ec))
        .collect();
    let olds = old
        .spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or(&[]);
    for o in olds {
        match by_name.get(o.name.as_str()) {
            None => errs.push(FieldError::forbidden(
                "spec.ephemeralContainers",
                &format!(
                    "existing ephemeral containers {:?} may not be removed\n",
                    o.name
                ),
            )),
            Some(n) if !same(o, n) => errs.push(FieldError::forbidden(
                &format!("spec.ephemeralContainers[{}]", o.name),
                &format!(
                    "existing ephemeral containers {:?} may not be changed\n",
                    o.name
                ),
            )),
            Some(_) => {}
        }
    }
    errs
}

/// Semantic equality, as JSON (absent and empty lists alike are compared
/// as written; both went through the same defaulting).
fn same(a: &EphemeralContainer, b: &EphemeralContainer) -> bool {
    let v = |e: &EphemeralContainer| serde_json::to_value(e).unwrap_or(Value::Null);
    v(a) == v(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::aggregate;
    use serde_json::json;

    /// A pod as the double stores it (decoded and defaulted).
    fn pod(ecs: Value, annotations: Value) -> Pod {
        crate::pod::decode(&json!({
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "app", "image": "busybox"}],
                "initContainers": [{"name": "init", "image": "busybox"}],
                "ephemeralContainers": ecs}
        }))
        .expect("pod")
    }

    fn msgs(new: &Pod, old: &Pod) -> String {
        aggregate(&validate_pod_ephemeral_containers_update(new, old))
    }

    #[test]
    fn adding_a_valid_ephemeral_container_is_allowed() {
        let old = pod(json!([]), json!({}));
        let new = pod(
            json!([{"name": "debugger", "image": "busybox", "targetContainerName": "app",
                "stdin": true, "tty": true, "terminationMessagePolicy": "File"}]),
            json!({}),
        );
        assert_eq!(validate_pod_ephemeral_containers_update(&new, &old), vec![]);
    }

    #[test]
    fn workload_fields_names_and_targets_are_checked() {
        let old = pod(json!([]), json!({}));
        let new = pod(
            json!([
                {"name": "app", "image": "busybox"},
                {"name": "d", "image": "busybox", "targetContainerName": "nope",
                 "ports": [{"containerPort": 80}], "livenessProbe": {"exec": {"command": ["true"]}},
                 "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": "x"}]},
                {"name": "e"}
            ]),
            json!({}),
        );
        let m = msgs(&new, &old);
        for want in [
            "spec.ephemeralContainers[0].name: Duplicate value: \"app\"",
            "spec.ephemeralContainers[1].targetContainerName: Not found: \"nope\"",
            "spec.ephemeralContainers[1].ports: Forbidden: cannot be set for an Ephemeral Container",
            "spec.ephemeralContainers[1].livenessProbe: Forbidden: cannot be set for an Ephemeral Container",
            "spec.ephemeralContainers[1].volumeMounts[0].subPath: Forbidden: cannot be set for an Ephemeral Container",
            "spec.ephemeralContainers[2].image: Required value",
        ] {
            assert!(m.contains(want), "{want} not in {m}");
        }
    }

    #[test]
    fn existing_ephemeral_containers_may_not_change_or_go() {
        let d = json!({"name": "debugger", "image": "busybox"});
        let old = pod(json!([d]), json!({}));
        let removed = pod(json!([]), json!({}));
        assert!(
            msgs(&removed, &old).contains(
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debugger\" may not be removed"
            ),
            "{}",
            msgs(&removed, &old)
        );
        let changed = pod(json!([{"name": "debugger", "image": "other"}]), json!({}));
        assert!(
            msgs(&changed, &old).contains(
                "spec.ephemeralContainers[debugger]: Forbidden: existing ephemeral containers \"debugger\" may not be changed"
            ),
            "{}",
            msgs(&changed, &old)
        );
        let added = pod(
            json!([d, {"name": "debugger2", "image": "agnhost"}]),
            json!({}),
        );
        assert_eq!(
            validate_pod_ephemeral_containers_update(&added, &old),
            vec![]
        );
    }

    #[test]
    fn static_pods_do_not_support_them() {
        let old = pod(json!([]), json!({"kubernetes.io/config.mirror": "abc"}));
        let new = pod(
            json!([{"name": "d", "image": "busybox"}]),
            json!({"kubernetes.io/config.mirror": "abc"}),
        );
        assert_eq!(
            msgs(&new, &old),
            ": Forbidden: static pods do not support ephemeral containers"
        );
    }
}
