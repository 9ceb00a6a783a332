//! The part of the apiserver's Pod validation on create that a kubelet can
//! run into, ported on its own (upstream `pkg/apis/core/validation`
//! `ValidatePodCreate`, `ValidatePodSpec`, `validateContainers`,
//! `validateInitContainers`, `validateContainerCommon`, resource, port,
//! probe and volume checks), with upstream's field paths and messages
//! (`k8s.io/apimachinery/pkg/util/validation/field`).
//!
//! Left out: affinity, tolerations, topology spread, security contexts,
//! DNS config details, sysctls, resource claims, volume source internals.
//! Where messages changed between releases, the newest wording is used.

mod container;
mod ephemeral;
pub mod storage;

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Pod, PodSpec, Volume};

pub use crate::field::{FieldError, aggregate, causes};
use crate::field::{dns1123_label, dns1123_subdomain, supported};
pub use ephemeral::validate_pod_ephemeral_containers_update;

/// The annotation a mirror pod carries (`v1.MirrorPodAnnotationKey`).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Upstream `ValidatePodCreate`, restricted as the module says.
pub fn validate_pod_create(pod: &Pod) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        dns1123_subdomain("metadata.name", name, &mut errs);
    }
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    if let Some(v) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR_POD_ANNOTATION))
        && spec.node_name.as_deref().unwrap_or("").is_empty()
    {
        errs.push(FieldError::invalid(
            &format!("metadata.annotations[{MIRROR_POD_ANNOTATION}]"),
            v.as_str(),
            "must set spec.nodeName if mirror pod annotation is set",
        ));
    }
    validate_pod_spec(spec, &mut errs);
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        errs.push(FieldError::forbidden(
            "spec.ephemeralContainers",
            "cannot be set on create",
        ));
    }
    errs
}

fn validate_pod_spec(spec: &PodSpec, errs: &mut Vec<FieldError>) {
    if spec.termination_grace_period_seconds.is_none() {
        errs.push(FieldError::required(
            "spec.terminationGracePeriodSeconds",
            "",
        ));
    }
    let volumes = validate_volumes(spec.volumes.as_deref().unwrap_or(&[]), errs);
    let restart = spec.restart_policy.as_deref().unwrap_or("");
    container::validate_containers(&spec.containers, &volumes, restart, errs);
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    container::validate_init_containers(init, &spec.containers, &volumes, restart, errs);
    if spec.host_network == Some(true) {
        for (i, c) in spec.containers.iter().enumerate() {
            for (j, p) in c.ports.iter().flatten().enumerate() {
                let hp = p.host_port.unwrap_or(0);
                if hp != p.container_port {
                    errs.push(FieldError::invalid(
                        &format!("spec.containers[{i}].ports[{j}].hostPort"),
                        hp,
                        "must match `containerPort` when `hostNetwork` is true",
                    ));
                }
            }
        }
    }
    supported(
        "spec.restartPolicy",
        spec.restart_policy.as_deref(),
        &["Always", "OnFailure", "Never"],
        errs,
    );
    let dns = spec.dns_policy.as_deref();
    supported(
        "spec.dnsPolicy",
        dns,
        &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
        errs,
    );
    if dns == Some("None") && spec.dns_config.is_none() {
        errs.push(FieldError::required(
            "spec.dnsConfig",
            "must provide `dnsConfig` when `dnsPolicy` is None",
        ));
    }
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        dns1123_subdomain("spec.nodeName", n, errs);
    }
    if let Some(d) = spec.active_deadline_seconds
        && !(1..=i64::from(i32::MAX)).contains(&d)
    {
        errs.push(FieldError::invalid(
            "spec.activeDeadlineSeconds",
            d,
            format!("must be between 1 and {}, inclusive", i32::MAX),
        ));
    }
    if let Some(h) = spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        dns1123_label("spec.hostname", h, errs);
    }
    if let Some(o) = &spec.overhead {
        container::validate_resource_list(o, "spec.overhead.limits", errs);
    }
}

/// Upstream `ValidateVolumes` (names and the number of sources); returns the volume names.
fn validate_volumes<'a>(volumes: &'a [Volume], errs: &mut Vec<FieldError>) -> HashSet<&'a str> {
    let mut names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let path = format!("spec.volumes[{i}]");
        let sources = serde_json::to_value(v)
            .ok()
            .and_then(|v| {
                v.as_object()
                    .map(|o| o.keys().filter(|k| *k != "name").count())
            })
            .unwrap_or(0);
        match sources {
            0 => errs.push(FieldError::required(&path, "must specify a volume type")),
            1 => {}
            _ => errs.push(FieldError::forbidden(
                &path,
                "may not specify more than 1 volume type",
            )),
        }
        let name_path = format!("{path}.name");
        if v.name.is_empty() {
            errs.push(FieldError::required(&name_path, ""));
        } else {
            dns1123_label(&name_path, &v.name, errs);
        }
        if !names.insert(v.name.as_str()) {
            errs.push(FieldError::duplicate(&name_path, v.name.as_str()));
        }
        if let Some(h) = &v.host_path {
            let types = [
                "",
                "DirectoryOrCreate",
                "Directory",
                "FileOrCreate",
                "File",
                "Socket",
                "CharDevice",
                "BlockDevice",
            ];
            let t = h.type_.as_deref().unwrap_or("");
            if !types.contains(&t) {
                errs.push(FieldError::not_supported(
                    &format!("{path}.hostPath.type"),
                    t,
                    &types,
                ));
            }
            if h.path.is_empty() {
                errs.push(FieldError::required(&format!("{path}.hostPath.path"), ""));
            }
        }
        let modes = [
            ("secret", v.secret.as_ref().and_then(|s| s.default_mode)),
            (
                "configMap",
                v.config_map.as_ref().and_then(|s| s.default_mode),
            ),
            (
                "downwardAPI",
                v.downward_api.as_ref().and_then(|s| s.default_mode),
            ),
            (
                "projected",
                v.projected.as_ref().and_then(|s| s.default_mode),
            ),
        ];
        for (src, mode) in modes {
            if let Some(m) = mode.filter(|m| !(0..=0o777).contains(m)) {
                errs.push(FieldError::invalid(
                    &format!("{path}.{src}.defaultMode"),
                    m,
                    "must be a number between 0 and 0777 (octal), both inclusive",
                ));
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(v: Value) -> Pod {
        let mut p: Pod = serde_json::from_value(v).expect("pod");
        crate::defaults::set_object_defaults_pod(&mut p);
        p
    }

    fn messages(p: &Pod) -> Vec<String> {
        validate_pod_create(p)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_plain_pod_is_valid() {
        let p = pod(
            json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]}}),
        );
        assert_eq!(messages(&p), Vec::<String>::new());
    }

    #[test]
    fn messages_as_upstream_writes_them() {
        let p = pod(json!({"metadata": {"name": "Web"}, "spec": {
        "restartPolicy": "Sometimes",
        "initContainers": [{"name": "c", "image": "busybox", "livenessProbe": {"exec": {"command": ["true"]}}}],
        "containers": [
            {"name": "c", "image": ""},
            {"name": "d", "image": "x:1", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
             "ports": [{"containerPort": 70000}],
             "volumeMounts": [{"name": "missing", "mountPath": "/m"}]}
        ]}}));
        let got = messages(&p);
        for want in [
            "metadata.name: Invalid value: \"Web\": a lowercase RFC 1123 subdomain must consist of",
            "spec.containers[0].image: Required value",
            "spec.containers[1].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
            "spec.containers[1].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
            "spec.containers[1].volumeMounts[0].name: Not found: \"missing\"",
            "spec.initContainers[0].name: Duplicate value: \"c\"",
            "spec.initContainers[0].livenessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
        ] {
            assert!(
                got.iter().any(|m| m.starts_with(want)),
                "{want}\nin {got:#?}"
            );
        }
        let one = [FieldError::required("spec.containers", "")];
        assert_eq!(aggregate(&one), "spec.containers: Required value");
        let two = [
            one[0].clone(),
            FieldError::forbidden("spec", "no"),
            one[0].clone(),
        ];
        assert_eq!(
            aggregate(&two),
            "[spec.containers: Required value, spec: Forbidden: no]"
        );
    }

    #[test]
    fn resource_rules() {
        let p = pod(json!({"metadata": {"name": "r"}, "spec": {"containers": [
            {"name": "a", "image": "i:1", "resources": {"limits": {"hugepages-2Mi": "3Mi"}}},
            {"name": "b", "image": "i:1", "resources": {"requests": {"example.com/gpu": "1"}}},
            {"name": "c", "image": "i:1", "resources": {"limits": {"gpus": "1"}}},
            {"name": "e", "image": "i:1", "resources": {"requests": {"memory": "-1"}}}
        ]}}));
        let got = messages(&p);
        for want in [
            "spec.containers[0].resources.limits[hugepages-2Mi]: Invalid value: \"3Mi\": 3Mi is not positive integer multiple of hugepages-2Mi",
            "spec.containers[0].resources: Forbidden: HugePages require cpu or memory",
            "spec.containers[1].resources.limits: Required value: Limit must be set for non overcommitable resources",
            "spec.containers[2].resources.limits[gpus]: Invalid value: \"gpus\": must be a standard resource for containers",
            "spec.containers[3].resources.requests[memory]: Invalid value: \"-1\": must be greater than or equal to 0",
        ] {
            assert!(got.iter().any(|m| m == want), "{want}\nin {got:#?}");
        }
    }

    #[test]
    fn probes_and_host_network() {
        let p = pod(
            json!({"metadata": {"name": "p", "annotations": {MIRROR_POD_ANNOTATION: "x"}}, "spec": {
            "hostNetwork": true,
            "containers": [{"name": "a", "image": "i:1",
                "ports": [{"containerPort": 80, "hostPort": 81}],
                "livenessProbe": {"exec": {"command": ["x"]}, "tcpSocket": {"port": 80}, "successThreshold": 2},
                "readinessProbe": {}}]}}),
        );
        let got = messages(&p);
        for want in [
            "metadata.annotations[kubernetes.io/config.mirror]: Invalid value: \"x\": must set spec.nodeName if mirror pod annotation is set",
            "spec.containers[0].ports[0].hostPort: Invalid value: 81: must match `containerPort` when `hostNetwork` is true",
            "spec.containers[0].livenessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
            "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
            "spec.containers[0].readinessProbe: Required value: must specify a handler type",
        ] {
            assert!(got.iter().any(|m| m == want), "{want}\nin {got:#?}");
        }
    }
}
