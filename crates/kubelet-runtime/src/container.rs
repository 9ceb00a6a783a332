//! Container configuration (upstream `kuberuntime_container.go`
//! `generateContainerConfig` and `kuberuntime_container_linux.go`).

use std::collections::HashMap;

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::pod;
use tracing::warn;

use crate::container_resources::resources;
use crate::expansion::expand;
use crate::labels;
use crate::runtime_config::RuntimeConfig;
use crate::security_context::security_context;

/// Plain `env` values, each expanded against the variables defined before it,
/// for a manager without a [`crate::RuntimeHelper`] (unit tests): `valueFrom`
/// and `envFrom` need the kubelet and are skipped with a warning.
fn envs(c: &Container) -> (Vec<pb::KeyValue>, HashMap<String, String>) {
    let mut out = Vec::new();
    let mut vars = HashMap::new();
    for e in c.env.iter().flatten() {
        if e.value_from.is_some() {
            warn!(container = %c.name, env = %e.name, "env valueFrom is not supported yet; variable left unset");
            continue;
        }
        let value = expand(e.value.as_deref().unwrap_or(""), &vars);
        vars.insert(e.name.clone(), value.clone());
        out.push(pb::KeyValue {
            key: e.name.clone(),
            value,
        });
    }
    (out, vars)
}

/// The `ContainerConfig` for instance `restart_count` of `c`, running `image_ref`.
pub(crate) fn container_config(
    cfg: &RuntimeConfig,
    p: &Pod,
    c: &Container,
    restart_count: i32,
    image_ref: &str,
    opts: Option<crate::RunContainerOptions>,
) -> pb::ContainerConfig {
    let mut devices = crate::RunContainerOptions::default();
    let (envs, vars, mounts) = match opts {
        Some(o) => {
            let vars = o
                .envs
                .iter()
                .map(|kv| (kv.key.clone(), kv.value.clone()))
                .collect();
            devices.devices = o.devices;
            devices.annotations = o.annotations;
            devices.cdi_devices = o.cdi_devices;
            (o.envs, vars, o.mounts)
        }
        None => {
            let (envs, vars) = envs(c);
            (envs, vars, vec![])
        }
    };
    // Device plugin annotations first; the kubelet's own win (upstream
    // `makeContainerAnnotations` builds on `opts.Annotations`).
    let mut annotations: HashMap<String, String> = devices.annotations.into_iter().collect();
    annotations.extend(labels::container_annotations(p, c, restart_count));
    let expand_all = |v: &Option<Vec<String>>| -> Vec<String> {
        v.iter().flatten().map(|s| expand(s, &vars)).collect()
    };
    pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: c.name.clone(),
            attempt: u32::try_from(restart_count).unwrap_or(0),
        }),
        image: Some(pb::ImageSpec {
            image: image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: expand_all(&c.command),
        args: expand_all(&c.args),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels: labels::container_labels(p, c),
        annotations,
        devices: devices.devices,
        cdi_devices: devices.cdi_devices,
        log_path: format!("{}/{}.log", c.name, restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(resources(cfg, p, c)),
            security_context: Some(security_context(p, c, &cfg.root_dir, cfg.seccomp_default)),
        }),
    }
}

/// Key for a container's crash-loop backoff (upstream `getStableKey`).
pub(crate) fn backoff_key(p: &Pod, c: &Container) -> String {
    format!(
        "{}_{}_{}_{}",
        pod::full_name(p),
        pod::uid(p),
        c.name,
        pod::container_hash(c)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_upstream_labels_log_path_and_env() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"terminationGracePeriodSeconds": 5, "containers": [{"name": "c", "image": "busybox:1",
                "command": ["sh"], "args": ["-c", "echo $(A) $(C) $$(A)"], "workingDir": "/tmp",
                "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "C", "value": "x-$(A)"}],
                "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m", "memory": "64Mi"}}}]}
        }))
        .expect("pod");
        let c = &pod::containers(&p)[0];
        let cfg = RuntimeConfig::default();
        let cc = container_config(&cfg, &p, c, 3, "sha256:abc", None);
        assert_eq!(cc.metadata.as_ref().map(|m| m.attempt), Some(3));
        assert_eq!(cc.log_path, "c/3.log");
        assert_eq!(
            cc.labels
                .get("io.kubernetes.container.name")
                .map(String::as_str),
            Some("c")
        );
        assert_eq!(
            cc.labels
                .get("io.kubernetes.pod.namespace")
                .map(String::as_str),
            Some("ns")
        );
        assert_eq!(
            cc.annotations
                .get("io.kubernetes.container.restartCount")
                .map(String::as_str),
            Some("3")
        );
        assert_eq!(
            cc.annotations
                .get("io.kubernetes.pod.terminationGracePeriod")
                .map(String::as_str),
            Some("5")
        );
        let env: Vec<(&str, &str)> = cc
            .envs
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(env, vec![("A", "1"), ("C", "x-1")]);
        assert_eq!(cc.command, vec!["sh"]);
        assert_eq!(cc.args, vec!["-c", "echo 1 x-1 $(A)"]);
        let res = cc.linux.and_then(|l| l.resources).expect("resources");
        assert_eq!(res.cpu_shares, 256);
        assert_eq!(res.cpu_quota, 50_000);
        assert_eq!(res.memory_limit_in_bytes, 64 * 1024 * 1024);
    }

    #[test]
    fn device_plugin_devices_annotations_and_cdi_devices_reach_the_config() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}
        }))
        .expect("pod");
        let c = &pod::containers(&p)[0];
        let opts = crate::RunContainerOptions {
            envs: vec![pb::KeyValue {
                key: "STUB_DEVICES".into(),
                value: "dev-1".into(),
            }],
            devices: vec![pb::Device {
                container_path: "/dev/example-dev-1".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
            annotations: vec![
                ("example.com/stub".into(), "yes".into()),
                // The kubelet's own annotation wins over a plugin's.
                ("io.kubernetes.container.restartCount".into(), "99".into()),
            ],
            cdi_devices: vec![pb::CdiDevice {
                name: "example.com/dev=dev-1".into(),
            }],
            ..Default::default()
        };
        let cc = container_config(&RuntimeConfig::default(), &p, c, 0, "sha256:x", Some(opts));
        assert_eq!(cc.devices.len(), 1);
        assert_eq!(cc.devices[0].host_path, "/dev/null");
        assert_eq!(cc.devices[0].container_path, "/dev/example-dev-1");
        assert_eq!(cc.devices[0].permissions, "rw");
        assert_eq!(cc.cdi_devices[0].name, "example.com/dev=dev-1");
        assert_eq!(
            cc.annotations.get("example.com/stub").map(String::as_str),
            Some("yes")
        );
        assert_eq!(
            cc.annotations
                .get("io.kubernetes.container.restartCount")
                .map(String::as_str),
            Some("0")
        );
        assert_eq!(cc.envs[0].key, "STUB_DEVICES");
    }
}
