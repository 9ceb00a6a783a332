//! Admission as a whole: the handlers' order, upstream's reasons and
//! messages, and the rejected pod's status and event.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kubelet_test_util::RecordingRecorder;
use serde_json::json;

use super::*;

fn node(extra: serde_json::Value) -> Node {
    let mut n = json!({
        "metadata": {"name": "node-1", "labels": {"kubernetes.io/os": "linux", "disk": "ssd"}},
        "spec": {},
        "status": {"allocatable": {"pods": "3", "cpu": "2", "memory": "1Gi", "ephemeral-storage": "10Gi"}}
    });
    if let (Some(n), Some(e)) = (n.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            n.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(n).expect("node")
}

fn pod(spec: serde_json::Value) -> Pod {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "i"}]);
    }
    serde_json::from_value(
        json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec}),
    )
    .expect("pod")
}

fn admitter(n: Node, apparmor: bool) -> (PodAdmitter, Arc<RecordingRecorder>) {
    let rec = Arc::new(RecordingRecorder::default());
    let a = PodAdmitter::new(
        Arc::new(NodeCache::new(n, None)),
        sysctl::Allowlist::new((6, 1), &[]).expect("allowlist"),
        apparmor,
        rec.clone(),
    );
    (a, rec)
}

#[test]
fn each_rejection_has_upstreams_reason_and_message() {
    let (a, _) = admitter(node(json!({})), false);
    let cases = [
        (
            json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "3"}}}]}),
            "OutOfcpu",
            "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000",
        ),
        (
            json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"memory": "2Gi"}}}]}),
            "OutOfmemory",
            "Node didn't have enough resource: memory, requested: 2147483648, used: 0, capacity: 1073741824",
        ),
        (
            json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"ephemeral-storage": "11Gi"}}}]}),
            "OutOfephemeral-storage",
            "Node didn't have enough resource: ephemeral-storage, requested: 11811160064, used: 0, capacity: 10737418240",
        ),
        (
            json!({"nodeSelector": {"disk": "hdd"}}),
            "NodeAffinity",
            "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
        ),
        (
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}]}}}}),
            "NodeAffinity",
            "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
        ),
        (
            json!({"nodeName": "other-node"}),
            "NodeName",
            "Predicate NodeName failed: node(s) didn't match the requested node name",
        ),
        (
            json!({"os": {"name": "windows"}}),
            "PodOSNotSupported",
            "Failed to admit pod as the OS field doesn't match node OS",
        ),
        (
            json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
            "SysctlForbidden",
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted",
        ),
        (
            json!({"containers": [{"name": "c", "image": "i", "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}]}),
            "AppArmor",
            "Cannot enforce AppArmor: AppArmor is not enabled on the host",
        ),
    ];
    for (spec, reason, message) in cases {
        let r = a.admit(&pod(spec.clone()), &[]).expect_err(reason);
        assert_eq!((r.0.as_str(), r.1.as_str()), (reason, message), "{spec}");
    }
    // A matching selector and affinity, an allowed sysctl, an unconfined profile: admitted.
    let ok = pod(json!({"nodeSelector": {"disk": "ssd"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]},
            {"matchExpressions": [{"key": "disk", "operator": "Exists"}], "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}}},
        "securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}],
                            "appArmorProfile": {"type": "Unconfined"}}}));
    assert_eq!(a.admit(&ok, &[]), Ok(()));
}

#[test]
fn the_os_label_must_match_the_node() {
    let (a, _) = admitter(node(json!({})), false);
    let mut p = pod(json!({}));
    p.metadata.labels = Some([("kubernetes.io/os".to_string(), "windows".to_string())].into());
    let r = a.admit(&p, &[]).expect_err("os label");
    assert_eq!(r.0, "PodOSSelectorNodeLabelDoesNotMatch");
}

#[test]
fn used_resources_pods_and_host_ports_count_the_admitted_pods() {
    let (a, _) = admitter(node(json!({})), false);
    let running = pod(json!({"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"cpu": "1500m"}},
        "ports": [{"containerPort": 80, "hostPort": 8080}]}]}));
    let want_cpu = pod(
        json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}),
    );
    let r = a.admit(&want_cpu, &[&running]).expect_err("cpu used");
    assert_eq!(
        r.1,
        "Node didn't have enough resource: cpu, requested: 1000, used: 1500, capacity: 2000"
    );
    let same_port = pod(json!({"containers": [{"name": "c", "image": "i",
        "ports": [{"containerPort": 81, "hostPort": 8080, "hostIP": "127.0.0.1"}]}]}));
    let r = a.admit(&same_port, &[&running]).expect_err("port");
    assert_eq!(
        r,
        (
            "NodePorts".to_string(),
            "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports".to_string()
        )
    );
    let udp = pod(json!({"containers": [{"name": "c", "image": "i",
        "ports": [{"containerPort": 81, "hostPort": 8080, "protocol": "UDP"}]}]}));
    assert_eq!(
        a.admit(&udp, &[&running]),
        Ok(()),
        "another protocol is another port"
    );
    let full = [&running, &running, &running];
    let r = a.admit(&pod(json!({})), &full).expect_err("pods");
    assert_eq!(
        r,
        (
            "OutOfpods".to_string(),
            "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
                .to_string()
        )
    );
}

#[test]
fn untolerated_no_execute_taints_reject_all_but_static_pods() {
    let tainted = node(json!({"spec": {"taints": [
        {"key": "dedicated", "value": "db", "effect": "NoExecute"},
        {"key": "noisy", "effect": "NoSchedule"}]}}));
    let (a, rec) = admitter(tainted, false);
    let p = pod(json!({}));
    let r = a.admit(&p, &[]).expect_err("taint");
    assert_eq!(
        r,
        (
            "TaintToleration".to_string(),
            "Predicate TaintToleration failed: node(s) had untolerated taint".to_string()
        )
    );
    let tolerating = pod(
        json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoExecute"}]}),
    );
    assert_eq!(
        a.admit(&tolerating, &[]),
        Ok(()),
        "NoSchedule taints are the scheduler's"
    );
    let mut static_pod = pod(json!({}));
    static_pod.metadata.annotations = Some(
        [(
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    assert_eq!(a.admit(&static_pod, &[]), Ok(()));

    // The rejected pod: Failed, upstream's message, and a Warning event.
    let s = a.reject(&p, &r);
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("TaintToleration"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was rejected: Predicate TaintToleration failed: node(s) had untolerated taint")
    );
    let events = rec.events.lock().clone();
    assert!(
        events.iter().any(|(reason, _)| reason == "TaintToleration"),
        "{events:?}"
    );
}

#[test]
fn sidecars_add_to_every_later_init_step_and_the_sum() {
    let p = pod(json!({
        "initContainers": [
            {"name": "init1", "image": "i", "resources": {"requests": {"cpu": "2"}}},
            {"name": "side", "image": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"name": "init2", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        "overhead": {"cpu": "100m"}
    }));
    // max(app 1 + sidecar 0.5 = 1.5, init1 2, init2 1 + 0.5) = 2, plus overhead.
    assert_eq!(predicate::pod_requests(&p).get("cpu"), Some(&2100));
}

#[test]
fn pressure_refuses_first_with_evicted() {
    let (a, rec) = admitter(node(json!({})), true);
    let a = a.with_pressure(kubelet_eviction::Pressure::fixed(vec![
        kubelet_eviction::NodeCondition::MemoryPressure,
    ]));
    // BestEffort, and also over the node's pod count: eviction decides first.
    let p = pod(json!({}));
    let others = [&p, &p, &p];
    let r = a.admit(&p, &others).expect_err("refused");
    assert_eq!(r.0, "Evicted");
    let s = a.reject(&p, &r);
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );
    assert!(
        rec.events
            .lock()
            .iter()
            .any(|(reason, _)| reason == "Evicted")
    );
    // A pod with requests passes eviction's handler.
    let burstable = pod(json!({"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"memory": "10Mi"}}}]}));
    assert_eq!(a.admit(&burstable, &[]), Ok(()));
}

#[test]
fn a_node_shutting_down_refuses_every_pod_last() {
    let state = Arc::new(crate::runtime_state::RuntimeState::new(vec![]));
    let (a, _) = admitter(node(json!({})), false);
    let a = a.with_shutdown(state.clone());
    let fits = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
    assert!(a.admit(&fits, &[]).is_ok());
    state.set_shutdown_status(Some("node is shutting down".into()));
    assert_eq!(
        a.admit(&fits, &[]),
        Err((
            "NodeShutdown".to_string(),
            "Pod was rejected as the node is shutting down.".to_string()
        ))
    );
    // An earlier handler still decides first (upstream's order).
    let too_big = pod(
        json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "3"}}}]}),
    );
    assert_eq!(
        a.admit(&too_big, &[]).map_err(|r| r.0),
        Err("OutOfcpu".to_string())
    );
    state.set_shutdown_status(None);
    assert!(a.admit(&fits, &[]).is_ok());
}

/// A device allocator with `free` devices of `example.com/dev`, holding the
/// ones it handed out.
struct Devices {
    free: parking_lot::Mutex<i64>,
    held: parking_lot::Mutex<Vec<String>>,
}

impl ResourceAllocator for Devices {
    fn allocate(&self, p: &Pod) -> Result<(), Rejection> {
        let wants = serde_json::to_string(p)
            .unwrap_or_default()
            .contains("example.com/dev");
        if !wants {
            return Ok(());
        }
        let mut free = self.free.lock();
        if *free == 0 {
            return Err((
                "UnexpectedAdmissionError".into(),
                "Allocate failed due to requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0, which is unexpected".into(),
            ));
        }
        *free -= 1;
        self.held
            .lock()
            .push(p.metadata.uid.clone().unwrap_or_default());
        Ok(())
    }

    fn update_plugin_resources(
        &self,
        p: &Pod,
        allocatable: &mut std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    ) {
        let held = self.held.lock();
        if held.iter().any(|u| Some(u) == p.metadata.uid.as_ref()) {
            allocatable.insert(
                "example.com/dev".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(held.len().to_string()),
            );
        }
    }
}

#[test]
fn devices_are_allocated_before_the_predicates_and_raise_allocatable() {
    // The node reports no device allocatable (its plugin is away), as after a
    // kubelet restart: the pod holding a device still passes the predicate.
    let n = node(
        json!({"status": {"allocatable": {"pods": "3", "cpu": "2", "memory": "1Gi",
        "example.com/dev": "0"}}}),
    );
    let devices = Arc::new(Devices {
        free: parking_lot::Mutex::new(1),
        held: Default::default(),
    });
    let (a, _) = admitter(n, false);
    let a = a.with_allocator(devices.clone());
    let wants = json!({"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"example.com/dev": "1"}, "limits": {"example.com/dev": "1"}}}]});
    assert_eq!(a.admit(&pod(wants.clone()), &[]), Ok(()));
    // The allocator refuses the next before the resource predicate runs.
    let mut second = pod(wants);
    second.metadata.uid = Some("u2".into());
    let (reason, message) = a.admit(&second, &[]).expect_err("no device left");
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert!(message.starts_with("Allocate failed due to requested number of devices unavailable"));
    // A pod without devices is checked against the node as it is.
    let cpu = pod(
        json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "3"}}}]}),
    );
    assert_eq!(a.admit(&cpu, &[]).expect_err("no cpu").0, "OutOfcpu");
}

#[test]
fn finished_pods_are_not_admitted_again_nor_counted() {
    let (a, _) = admitter(node(json!({})), false);
    let mut failed = pod(json!({"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"cpu": "2"}}}]}));
    failed.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Failed".into()),
        ..Default::default()
    });
    // Seen again after a restart, it is not admitted (nor rejected) again.
    let too_big = pod(json!({"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"cpu": "3"}}}]}));
    let mut finished_too_big = too_big.clone();
    finished_too_big.status = failed.status.clone();
    assert_eq!(a.admit(&finished_too_big, &[]), Ok(()));
    // And its requests leave room for the others.
    let one = pod(json!({"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"cpu": "1"}}}]}));
    assert_eq!(a.admit(&one, &[&failed]), Ok(()));
    let mut running = failed.clone();
    running.status = None;
    assert_eq!(a.admit(&one, &[&running]).expect_err("full").0, "OutOfcpu");
}

/// Issue 28: what the node cannot honour is refused at admission, with
/// upstream's reasons, never admitted and run without it.
#[test]
fn strict_supplemental_groups_and_pod_level_resources_are_refused_where_not_honoured() {
    let strict = pod(json!({"securityContext": {"supplementalGroupsPolicy": "Strict"}}));
    let merge = pod(json!({"securityContext": {"supplementalGroupsPolicy": "Merge"}}));
    // No features reported (containerd 1.6), or none yet.
    let (a, _) = admitter(node(json!({})), true);
    assert_eq!(
        a.admit(&strict, &[]),
        Err((
            "SupplementalGroupsPolicyNotSupported".to_string(),
            "SupplementalGroupsPolicy=Strict is not supported in this node".to_string()
        ))
    );
    assert_eq!(a.admit(&merge, &[]), Ok(()));
    // A runtime that honours it (CRI `features.supplemental_groups_policy`).
    let features = Arc::new(crate::runtime_features::RuntimeFeatures::default());
    features.record(&cri::pb::StatusResponse {
        features: Some(cri::pb::RuntimeFeatures {
            supplemental_groups_policy: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    let (a, _) = admitter(node(json!({})), true);
    let a = a.with_runtime_features(features);
    assert_eq!(a.admit(&strict, &[]), Ok(()));

    let pod_level = pod(json!({"resources": {"limits": {"memory": "64Mi"}}}));
    let (reason, message) = a.admit(&pod_level, &[]).expect_err("refused");
    assert_eq!(reason, "PodLevelResourcesNotSupported");
    assert!(
        message.starts_with("PodLevelResources feature gate is disabled"),
        "{message}"
    );
    // An empty `resources` sets nothing.
    assert_eq!(a.admit(&pod(json!({"resources": {}})), &[]), Ok(()));
}

/// Upstream's syncLoop admits nothing before the runtime's first ready
/// answer: a Strict pod is not refused for a runtime that had not answered.
#[tokio::test]
async fn admission_waits_for_the_runtimes_first_ready_answer() {
    let features = Arc::new(crate::runtime_features::RuntimeFeatures::default());
    let (a, _) = admitter(node(json!({})), true);
    let a = a.with_runtime_features(features.clone());
    let wait = std::time::Duration::from_millis(100);
    assert!(tokio::time::timeout(wait, a.runtime_known()).await.is_err());
    features.record(&cri::pb::StatusResponse {
        features: Some(cri::pb::RuntimeFeatures {
            supplemental_groups_policy: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    tokio::time::timeout(wait, a.runtime_known())
        .await
        .expect("known once recorded");
    let strict = pod(json!({"securityContext": {"supplementalGroupsPolicy": "Strict"}}));
    assert_eq!(a.admit(&strict, &[]), Ok(()));
}
