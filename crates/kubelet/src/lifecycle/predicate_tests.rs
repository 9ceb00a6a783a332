//! The predicates one by one: node affinity operators, tolerations, ports.

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use super::*;

fn node() -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"zone": "a", "cores": "8"}},
        "status": {"allocatable": {"pods": "10"}}
    }))
    .expect("node")
}

fn with_expr(op: &str, key: &str, values: &[&str]) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": op, "values": values}]}]}}}}}))
    .expect("pod")
}

#[test]
fn node_selector_operators() {
    let n = node();
    for (op, key, values, want) in [
        ("In", "zone", vec!["a", "b"], true),
        ("In", "zone", vec!["b"], false),
        ("NotIn", "zone", vec!["b"], true),
        ("NotIn", "missing", vec!["b"], true),
        ("Exists", "zone", vec![], true),
        ("DoesNotExist", "zone", vec![], false),
        ("Gt", "cores", vec!["4"], true),
        ("Lt", "cores", vec!["4"], false),
        ("Gt", "zone", vec!["4"], false),
    ] {
        assert_eq!(
            node_affinity_matches(&with_expr(op, key, &values), &n),
            want,
            "{op} {key} {values:?}"
        );
    }
    let empty_term: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}}}}))
    .expect("pod");
    assert!(
        !node_affinity_matches(&empty_term, &n),
        "a term without requirements matches nothing"
    );
}

#[test]
fn toleration_rules() {
    let taint = |effect: &str| Taint {
        key: "k".into(),
        value: Some("v".into()),
        effect: effect.into(),
        time_added: None,
    };
    let tol =
        |v: serde_json::Value| -> Toleration { serde_json::from_value(v).expect("toleration") };
    assert!(
        tolerates(&tol(json!({"operator": "Exists"})), &taint("NoExecute")),
        "empty key + Exists tolerates all"
    );
    assert!(tolerates(
        &tol(json!({"key": "k", "operator": "Exists"})),
        &taint("NoExecute")
    ));
    assert!(tolerates(
        &tol(json!({"key": "k", "value": "v"})),
        &taint("NoExecute")
    ));
    assert!(!tolerates(
        &tol(json!({"key": "k", "value": "w"})),
        &taint("NoExecute")
    ));
    assert!(!tolerates(
        &tol(json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"})),
        &taint("NoExecute")
    ));
}
