//! QoS class tests, including the fixture table shared with the apiserver double.

use super::*;
use crate::defaults::apply_api_defaults;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
        .unwrap_or_else(|e| panic!("pod: {e}"))
}

fn one(resources: serde_json::Value) -> Pod {
    pod(serde_json::json!({"containers": [{"name": "c", "resources": resources}]}))
}

#[test]
fn zero_quantities_count_for_nothing() {
    // kubelet-rs used to class this Burstable; upstream ignores zero quantities.
    assert_eq!(
        compute_pod_qos(&one(serde_json::json!({"requests": {"cpu": "0"}}))),
        QosClass::BestEffort
    );
    assert_eq!(
        compute_pod_qos(&one(
            serde_json::json!({"limits": {"cpu": "0", "memory": "0m"}})
        )),
        QosClass::BestEffort
    );
    assert_eq!(
        compute_pod_qos(&one(serde_json::json!({"requests": {"cpu": "1m"}}))),
        QosClass::Burstable
    );
}

#[test]
fn guaranteed_needs_cpu_and_memory_limits_in_every_container() {
    let g = serde_json::json!({"limits": {"cpu": "1", "memory": "64Mi"}});
    assert_eq!(compute_pod_qos(&one(g.clone())), QosClass::Guaranteed);
    // Equal by value, whatever the spelling.
    let g2 = serde_json::json!({"requests": {"cpu": "1000m", "memory": "65536Ki"},
        "limits": {"cpu": "1", "memory": "64Mi"}});
    assert_eq!(compute_pod_qos(&one(g2)), QosClass::Guaranteed);
    let cpu_only = serde_json::json!({"limits": {"cpu": "1"}});
    assert_eq!(compute_pod_qos(&one(cpu_only)), QosClass::Burstable);
    let two = pod(serde_json::json!({"containers": [
        {"name": "a", "resources": g},
        {"name": "b"}]}));
    assert_eq!(compute_pod_qos(&two), QosClass::Burstable);
    // Extended resources do not count.
    let gpu = serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi", "example.com/gpu": "1"},
        "requests": {"cpu": "1", "memory": "1Gi"}});
    assert_eq!(compute_pod_qos(&one(gpu)), QosClass::Guaranteed);
}

#[test]
fn status_class_wins_once_set() {
    let mut p = one(serde_json::json!({"limits": {"cpu": "1", "memory": "64Mi"}}));
    assert_eq!(pod_qos(&p), QosClass::Guaranteed);
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        qos_class: Some("Burstable".into()),
        ..Default::default()
    });
    assert_eq!(pod_qos(&p), QosClass::Burstable);
    assert_eq!(compute_pod_qos(&p), QosClass::Guaranteed);
    assert_eq!("BestEffort".parse::<QosClass>(), Ok(QosClass::BestEffort));
    assert!("besteffort".parse::<QosClass>().is_err());
    assert_eq!(QosClass::Guaranteed.to_string(), "Guaranteed");
}

/// One table, shared with the apiserver double: each pod, the pod the
/// apiserver's defaulting makes of it, and the QoS class it computes.
#[test]
fn shared_fixture_table_qos_and_defaults() {
    let table: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../../../../tests/fixtures/pod_defaults.json"))
            .unwrap_or_else(|e| panic!("fixture: {e}"));
    assert!(table.len() >= 10, "fixture has {} entries", table.len());
    let mut zero_cpu_seen = false;
    for entry in table {
        let name = entry["name"].as_str().unwrap_or("?").to_string();
        let input: Pod = serde_json::from_value(entry["pod"].clone())
            .unwrap_or_else(|e| panic!("{name}: pod: {e}"));
        let defaulted: Pod = serde_json::from_value(entry["defaulted"].clone())
            .unwrap_or_else(|e| panic!("{name}: defaulted: {e}"));
        let want: QosClass = entry["qos"]
            .as_str()
            .unwrap_or("")
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(compute_pod_qos(&input), want, "{name}: raw pod");
        assert_eq!(compute_pod_qos(&defaulted), want, "{name}: defaulted pod");
        assert_eq!(pod_qos(&input), want, "{name}");
        zero_cpu_seen |= name == "requests-cpu-zero";

        let mut ours = input.clone();
        apply_api_defaults(&mut ours);
        let ours = serde_json::to_value(&ours).unwrap_or_default();
        let theirs = serde_json::to_value(&defaulted).unwrap_or_default();
        assert_eq!(
            ours, theirs,
            "{name}: defaulting differs:\nours:   {ours}\nwanted: {theirs}"
        );
    }
    assert!(zero_cpu_seen, "the table covers requests: {{cpu: \"0\"}}");
}
