//! What the apiserver does to a Pod on its way into storage: decode with the
//! v1 codec (typed fields, quantities re-encoded, defaults), then on create
//! the strategy's `PrepareForCreate` (status reset to Pending with the QoS
//! class) and `Validate` (upstream `pkg/registry/core/pod/strategy.go`);
//! on update the pod's `metadata.generation` (1.33+ `updatePodGeneration`)
//! and the `ephemeralcontainers` subresource's strategy
//! (`podEphemeralContainersStrategy`).

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::{Value, json};

use crate::validation::{
    FieldError, validate_pod_create, validate_pod_ephemeral_containers_update,
};
use crate::{defaults, qos};

/// Why a pod write is refused.
#[derive(Debug)]
pub enum Rejected {
    /// The body does not decode as a v1 Pod (400).
    Decode(String),
    /// Validation failed (422).
    Invalid(Vec<FieldError>),
}

/// Decodes `obj` as a v1 Pod and applies the defaults, as the apiserver's
/// codec does for every write.
pub fn decode(obj: &Value) -> Result<Pod, String> {
    let cannot = |e: &dyn std::fmt::Display| {
        format!("Pod in version \"v1\" cannot be handled as a Pod: {e}")
    };
    let mut pod: Pod = serde_json::from_value(obj.clone()).map_err(|e| cannot(&e))?;
    defaults::decode_quantities(&mut pod).map_err(|e| cannot(&e))?;
    defaults::set_object_defaults_pod(&mut pod);
    Ok(pod)
}

/// Writes a decoded pod back as stored JSON (without `kind` and `apiVersion`,
/// which responses add).
pub fn encode(pod: &Pod) -> Value {
    let mut v = serde_json::to_value(pod).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

/// Upstream `PrepareForCreate`: the status a new pod starts with, and
/// generation 1 (1.33+).
pub fn prepare_for_create(pod: &mut Pod) {
    pod.metadata.generation = Some(1);
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        qos_class: Some(qos::pod_qos(pod).as_str().into()),
        ..Default::default()
    });
}

/// Decodes, defaults, prepares and validates a pod being created, replacing
/// `obj` with what will be stored.
pub fn on_create(obj: &mut Value) -> Result<(), Rejected> {
    let mut pod = decode(obj).map_err(Rejected::Decode)?;
    prepare_for_create(&mut pod);
    let errs = validate_pod_create(&pod);
    if !errs.is_empty() {
        return Err(Rejected::Invalid(errs));
    }
    *obj = encode(&pod);
    Ok(())
}

/// Decodes and defaults a pod being updated or patched, replacing `obj`.
pub fn on_update(obj: &mut Value) -> Result<(), String> {
    let pod = decode(obj)?;
    *obj = encode(&pod);
    Ok(())
}

/// Upstream `updatePodGeneration`: the stored generation, plus one when
/// the spec changed (a client cannot set it).
pub fn update_generation(old: &Value, new: &mut Value) {
    let old_gen = old.pointer("/metadata/generation").and_then(Value::as_i64);
    let changed = old.get("spec") != new.get("spec");
    let generation = if changed {
        Some(old_gen.unwrap_or(0) + 1)
    } else {
        old_gen
    };
    match (generation, new["metadata"].as_object_mut()) {
        (Some(g), Some(m)) => {
            m.insert("generation".into(), json!(g));
        }
        (None, Some(m)) => {
            m.remove("generation");
        }
        _ => {}
    }
}

/// Upstream `dropNonEphemeralContainerUpdates`: a write through the
/// `ephemeralcontainers` subresource changes the stored pod's
/// `spec.ephemeralContainers` and nothing else.
pub fn drop_non_ephemeral_container_updates(old: &Value, new: &Value) -> Value {
    let mut out = old.clone();
    let ecs = new
        .pointer("/spec/ephemeralContainers")
        .filter(|v| !v.is_null())
        .cloned();
    if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
        match ecs {
            Some(v) => {
                spec.insert("ephemeralContainers".into(), v);
            }
            None => {
                spec.remove("ephemeralContainers");
            }
        }
    }
    out
}

/// The update validation of the `ephemeralcontainers` subresource
/// (`ValidatePodEphemeralContainersUpdate`) on stored JSON.
pub fn validate_ephemeral_update(old: &Value, new: &Value) -> Result<(), Rejected> {
    let old = decode(old).map_err(Rejected::Decode)?;
    let new = decode(new).map_err(Rejected::Decode)?;
    let errs = validate_pod_ephemeral_containers_update(&new, &old);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(Rejected::Invalid(errs))
    }
}

/// Upstream `ValidatePodUpdate`, for the one field the double checks: the
/// pod itself may not change `spec.ephemeralContainers` (only the
/// subresource may).
pub fn validate_update(old: &Value, new: &Value) -> Result<(), Rejected> {
    let ecs = |v: &Value| {
        v.pointer("/spec/ephemeralContainers")
            .filter(|e| !e.is_null() && e.as_array().is_none_or(|a| !a.is_empty()))
            .cloned()
    };
    if ecs(old) == ecs(new) {
        return Ok(());
    }
    Err(Rejected::Invalid(vec![FieldError::forbidden(
        "spec",
        "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
    )]))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::validation::aggregate;

    struct Case<'a> {
        name: &'a str,
        pod: &'a Value,
        defaulted: &'a Value,
        qos: &'a str,
    }

    impl<'a> From<&'a Value> for Case<'a> {
        fn from(v: &'a Value) -> Self {
            Self {
                name: v["name"].as_str().unwrap_or("?"),
                pod: &v["pod"],
                defaulted: &v["defaulted"],
                qos: v["qos"].as_str().unwrap_or("?"),
            }
        }
    }

    /// The shared table of upstream defaults and QoS classes
    /// (`tests/fixtures/pod_defaults.json`), checked against the double.
    #[test]
    fn fixture_defaults_and_qos_match_upstream() {
        let cases: Vec<Value> =
            serde_json::from_str(include_str!("../../../tests/fixtures/pod_defaults.json"))
                .expect("fixture parses");
        assert!(cases.len() >= 12, "fixture has {} cases", cases.len());
        for case in cases {
            let c = Case::from(&case);
            let mut pod = decode(c.pod).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let got = serde_json::to_value(&pod).expect("encodes");
            assert_eq!(
                &got,
                c.defaulted,
                "{}: defaulted pod\n got: {}\nwant: {}",
                c.name,
                serde_json::to_string_pretty(&got).unwrap_or_default(),
                serde_json::to_string_pretty(c.defaulted).unwrap_or_default()
            );
            // Defaulting is idempotent, as a second write through the apiserver shows.
            assert_eq!(
                serde_json::to_value(decode(&got).expect("re-decodes")).expect("encodes"),
                got,
                "{}: defaulting twice",
                c.name
            );
            assert_eq!(qos::pod_qos(&pod).as_str(), c.qos, "{}: qosClass", c.name);
            prepare_for_create(&mut pod);
            assert_eq!(
                validate_pod_create(&pod),
                Vec::new(),
                "{}: a fixture pod is valid",
                c.name
            );
        }
    }

    #[test]
    fn create_sets_pending_and_the_qos_class() {
        let mut obj = json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i:1", "resources": {"requests": {"cpu": "0"}}}]}});
        on_create(&mut obj).expect("valid");
        assert_eq!(
            obj["status"],
            json!({"phase": "Pending", "qosClass": "BestEffort"})
        );
        assert!(obj.get("kind").is_none());
    }

    #[test]
    fn malformed_quantities_and_invalid_pods_are_refused() {
        let mut obj = json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i:1", "resources": {"limits": {"cpu": "1x"}}}]}});
        match on_create(&mut obj) {
            Err(Rejected::Decode(m)) => assert!(
                m.starts_with(
                    "Pod in version \"v1\" cannot be handled as a Pod: quantities must match"
                ),
                "{m}"
            ),
            other => panic!("decode error expected: {other:?}"),
        }
        let mut obj = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        match on_create(&mut obj) {
            Err(Rejected::Invalid(errs)) => {
                assert_eq!(aggregate(&errs), "spec.containers: Required value");
            }
            other => panic!("invalid expected: {other:?}"),
        }
    }
}
