//! Defaulting and validation of pods read from static sources (upstream
//! `pkg/kubelet/config/common.go` `applyDefaults` + `tryDecodeSinglePod`, and
//! the v1 API defaults of `pkg/apis/core/v1/defaults.go` the apiserver would
//! otherwise apply).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, ObjectFieldSelector, Pod, PodSecurityContext, Probe, Toleration,
    Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use sha2::{Digest, Sha256};

use crate::labels;
use crate::pod::{DEFAULT_GRACE_PERIOD_SECONDS, default_pull_policy};
use crate::pod_update::Source;
use crate::quantity::Quantity;

/// Upstream `SetDefaults_*` mode for configMap, secret, downwardAPI and projected volumes (0644).
const DEFAULT_MODE: i32 = 0o644;

/// Applies the defaults the apiserver gives every pod on create.
pub fn apply_api_defaults(pod: &mut Pod) {
    hashed_defaults(pod);
    later_defaults(pod);
}

/// The defaults kubelet-rs applied before static pod UIDs were frozen: the UID
/// of a static pod hashes the manifest with exactly these, so a kubelet-rs
/// that learns more defaults does not rename, and so restart, static pods.
/// Add new defaults to [`later_defaults`], never here.
fn hashed_defaults(pod: &mut Pod) {
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

/// Upstream `SetDefaults_ResourceList`: every quantity rounded up to milli
/// scale, written in canonical form; a value that does not parse is left for
/// validation.
fn round_to_milli(list: &mut BTreeMap<String, ApiQuantity>) {
    for q in list.values_mut() {
        if let Ok(v) = Quantity::from_api(q) {
            *q = v.round_up_milli().into();
        }
    }
}

/// Upstream `SetDefaults_Probe` and `SetDefaults_HTTPGetAction`.
fn probe_defaults(p: &mut Probe) {
    p.timeout_seconds.get_or_insert(1);
    p.period_seconds.get_or_insert(10);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
    if let Some(h) = p.http_get.as_mut() {
        http_get_defaults(h);
    }
}

fn http_get_defaults(h: &mut HTTPGetAction) {
    h.path.get_or_insert_with(|| "/".to_string());
    h.scheme.get_or_insert_with(|| "HTTP".to_string());
}

/// Upstream `SetDefaults_ObjectFieldSelector`.
fn field_ref_defaults(f: &mut ObjectFieldSelector) {
    f.api_version.get_or_insert_with(|| "v1".to_string());
}

/// Upstream `SetDefaults_Volume` and the volume sources' defaults.
fn volume_defaults(v: &mut Volume) {
    let sourceless = Volume {
        name: v.name.clone(),
        ..Default::default()
    };
    if *v == sourceless {
        v.empty_dir = Some(Default::default());
    }
    if let Some(s) = v.config_map.as_mut() {
        s.default_mode.get_or_insert(DEFAULT_MODE);
    }
    if let Some(s) = v.secret.as_mut() {
        s.default_mode.get_or_insert(DEFAULT_MODE);
    }
    if let Some(h) = v.host_path.as_mut() {
        h.type_.get_or_insert_with(String::new);
    }
    if let Some(d) = v.downward_api.as_mut() {
        d.default_mode.get_or_insert(DEFAULT_MODE);
        for i in d.items.iter_mut().flatten() {
            i.field_ref.iter_mut().for_each(field_ref_defaults);
        }
    }
    if let Some(p) = v.projected.as_mut() {
        p.default_mode.get_or_insert(DEFAULT_MODE);
        for s in p.sources.iter_mut().flatten() {
            if let Some(t) = s.service_account_token.as_mut() {
                t.expiration_seconds.get_or_insert(3600);
            }
            for i in s
                .downward_api
                .iter_mut()
                .flat_map(|d| d.items.iter_mut().flatten())
            {
                i.field_ref.iter_mut().for_each(field_ref_defaults);
            }
        }
    }
}

/// v1 defaults kubelet-rs learnt after static pod UIDs were frozen (see
/// [`hashed_defaults`]): resources (a limit is also the request, quantities
/// at milli scale), probes, lifecycle handlers, field references, volumes.
fn later_defaults(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let defaults = |c: &mut Container| {
        if let Some(r) = c.resources.as_mut() {
            if let Some(limits) = r.limits.as_ref() {
                let requests = r.requests.get_or_insert_with(BTreeMap::new);
                for (k, v) in limits {
                    requests.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            r.limits.iter_mut().for_each(round_to_milli);
            r.requests.iter_mut().for_each(round_to_milli);
        }
        for p in [
            &mut c.liveness_probe,
            &mut c.readiness_probe,
            &mut c.startup_probe,
        ] {
            p.iter_mut().for_each(probe_defaults);
        }
        if let Some(l) = c.lifecycle.as_mut() {
            for h in [&mut l.post_start, &mut l.pre_stop].into_iter().flatten() {
                h.http_get.iter_mut().for_each(http_get_defaults);
            }
        }
        for e in c.env.iter_mut().flatten() {
            if let Some(f) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
                field_ref_defaults(f);
            }
        }
    };
    spec.containers.iter_mut().for_each(defaults);
    spec.init_containers.iter_mut().flatten().for_each(defaults);
    spec.volumes.iter_mut().flatten().for_each(volume_defaults);
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
    hashed_defaults(pod);
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
    later_defaults(pod);
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
    fn static_pod_uid_is_pinned_across_versions() {
        // A manifest with a limit, a probe and a volume: fields that later
        // defaults fill. Its UID must not move when kubelet-rs learns defaults,
        // or an upgrade would replace (restart) the static pod.
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                "resources": {"limits": {"cpu": "0.5", "memory": "64Mi"}},
                "livenessProbe": {"httpGet": {"port": 80}}}],
                "volumes": [{"name": "v"}]}
        }))
        .expect("valid pod");
        apply_static_defaults(&mut p, Source::File, "/etc/k/web.yaml", "node-1").expect("valid");
        assert_eq!(
            p.metadata.uid.as_deref(),
            Some("d46d35c342cca314d618aa7df2144c37")
        );
        // The later defaults were applied all the same.
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        assert_eq!(
            req.and_then(|r| r.get("cpu")).map(|q| q.0.as_str()),
            Some("500m")
        );
        let probe = c.liveness_probe.as_ref().expect("probe");
        assert_eq!(probe.period_seconds, Some(10));
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
