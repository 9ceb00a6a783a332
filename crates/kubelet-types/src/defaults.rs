//! Defaulting and validation of pods read from static sources (upstream
//! `pkg/kubelet/config/common.go` `applyDefaults` + `tryDecodeSinglePod`, and
//! the v1 API defaults the apiserver would otherwise apply).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, Toleration};
use sha2::{Digest, Sha256};

use crate::labels;
use crate::pod::{DEFAULT_GRACE_PERIOD_SECONDS, default_pull_policy};
use crate::pod_update::Source;

/// Applies the defaults the apiserver gives every pod on create.
pub fn apply_api_defaults(pod: &mut Pod) {
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".to_string());
    }
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.restart_policy
        .get_or_insert_with(|| "Always".to_string());
    spec.dns_policy
        .get_or_insert_with(|| "ClusterFirst".to_string());
    spec.termination_grace_period_seconds
        .get_or_insert(DEFAULT_GRACE_PERIOD_SECONDS);
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".to_string());
    spec.security_context
        .get_or_insert_with(PodSecurityContext::default);
    spec.enable_service_links.get_or_insert(true);
    let host_network = spec.host_network.unwrap_or(false);
    let defaults = |c: &mut Container| {
        if c.image_pull_policy.is_none() {
            let policy = default_pull_policy(c.image.as_deref().unwrap_or(""));
            c.image_pull_policy = Some(policy.to_string());
        }
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".to_string());
        c.termination_message_policy
            .get_or_insert_with(|| "File".to_string());
        for p in c.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".to_string());
            if host_network && p.host_port.is_none() {
                p.host_port = Some(p.container_port);
            }
        }
    };
    spec.containers.iter_mut().for_each(defaults);
    spec.init_containers.iter_mut().flatten().for_each(defaults);
}

/// Checks what the apiserver's validation would refuse and the kubelet cannot run.
pub fn validate(pod: &Pod) -> Result<(), String> {
    if pod.metadata.name.as_deref().is_none_or(str::is_empty) {
        return Err("metadata.name: Required value".to_string());
    }
    let spec = pod.spec.as_ref().ok_or("spec: Required value")?;
    if spec.containers.is_empty() {
        return Err("spec.containers: Required value".to_string());
    }
    let mut names = HashSet::new();
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("initContainers", c))
        .chain(spec.containers.iter().map(|c| ("containers", c)));
    for (i, (field, c)) in all.enumerate() {
        if c.name.is_empty() {
            return Err(format!("spec.{field}[{i}].name: Required value"));
        }
        if !names.insert(c.name.as_str()) {
            return Err(format!(
                "spec.{field}[{i}].name: Duplicate value: {:?}",
                c.name
            ));
        }
        if c.image.as_deref().is_none_or(|s| s.trim().is_empty()) {
            return Err(format!("spec.{field}[{i}].image: Required value"));
        }
    }
    match spec.restart_policy.as_deref() {
        None | Some("Always" | "OnFailure" | "Never") => Ok(()),
        Some(other) => Err(format!(
            "spec.restartPolicy: Unsupported value: {other:?}: supported values: \"Always\", \"OnFailure\", \"Never\""
        )),
    }
}

/// Turns a manifest into the pod the kubelet runs, as upstream does for static pods:
/// API defaults, a UID that hashes the node, the manifest's origin and content,
/// name `<name>-<nodeName>`, `spec.nodeName`, the `config.hash` annotation and a
/// toleration of every NoExecute taint. `origin` is the file path or URL.
pub fn apply_static_defaults(
    pod: &mut Pod,
    source: Source,
    origin: &str,
    node_name: &str,
) -> Result<(), String> {
    apply_api_defaults(pod);
    validate(pod)?;
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        let mut h = Sha256::new();
        h.update(format!("host:{node_name}"));
        match source {
            Source::Http => h.update(format!("url:{origin}")),
            _ => h.update(format!("file:{origin}")),
        }
        h.update(serde_json::to_vec(pod).unwrap_or_default());
        let digest = h.finalize();
        let uid: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        pod.metadata.uid = Some(uid);
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{}", node_name.to_lowercase()));
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_string());
    spec.tolerations
        .get_or_insert_with(Vec::new)
        .push(Toleration {
            operator: Some("Exists".to_string()),
            effect: Some("NoExecute".to_string()),
            ..Default::default()
        });
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(labels::CONFIG_HASH.to_string(), uid);
    ann.insert(
        labels::CONFIG_SOURCE.to_string(),
        source.as_str().to_string(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "c", "image": "localhost:5000/busybox:1.35"}]}
        }))
        .expect("valid pod")
    }

    #[test]
    fn static_pod_name_uid_and_annotations() {
        let mut a = manifest();
        apply_static_defaults(&mut a, Source::File, "/etc/k/web.yaml", "Node-1").expect("valid");
        assert_eq!(a.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
        let uid = a.metadata.uid.clone().expect("uid");
        assert_eq!(uid.len(), 32);
        let ann = a.metadata.annotations.clone().expect("annotations");
        assert_eq!(ann.get(labels::CONFIG_HASH), Some(&uid));
        assert_eq!(
            ann.get(labels::CONFIG_SOURCE).map(String::as_str),
            Some("file")
        );
        let spec = a.spec.clone().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );

        // Deterministic: same manifest, node and path give the same UID.
        let mut b = manifest();
        apply_static_defaults(&mut b, Source::File, "/etc/k/web.yaml", "Node-1").expect("valid");
        assert_eq!(b.metadata.uid, a.metadata.uid);
        // Another node, path or content gives another UID.
        for (node, path, image) in [
            ("node-2", "/etc/k/web.yaml", "localhost:5000/busybox:1.35"),
            ("Node-1", "/etc/k/other.yaml", "localhost:5000/busybox:1.35"),
            ("Node-1", "/etc/k/web.yaml", "localhost:5000/busybox:latest"),
        ] {
            let mut c = manifest();
            if let Some(s) = c.spec.as_mut() {
                s.containers[0].image = Some(image.to_string());
            }
            apply_static_defaults(&mut c, Source::File, path, node).expect("valid");
            assert_ne!(c.metadata.uid, a.metadata.uid, "{node} {path} {image}");
        }
    }

    #[test]
    fn explicit_uid_is_kept() {
        let mut a = manifest();
        a.metadata.uid = Some("abc".into());
        apply_static_defaults(&mut a, Source::Http, "http://x/pod", "n").expect("valid");
        assert_eq!(a.metadata.uid.as_deref(), Some("abc"));
    }

    #[test]
    fn invalid_manifests_are_refused_with_the_field() {
        let mut p = manifest();
        if let Some(s) = p.spec.as_mut() {
            s.containers.push(s.containers[0].clone());
        }
        let err = apply_static_defaults(&mut p, Source::File, "f", "n").expect_err("dup");
        assert!(err.contains("Duplicate value"), "{err}");
        let mut p = manifest();
        p.metadata.name = None;
        assert!(validate(&p).is_err());
        let mut p = manifest();
        if let Some(s) = p.spec.as_mut() {
            s.restart_policy = Some("Sometimes".into());
        }
        assert!(validate(&p).expect_err("policy").contains("restartPolicy"));
    }
}
