//! The ConfigMaps and Secrets a pod names (upstream `podutil.VisitPodSecretNames`
//! and `podutil.VisitPodConfigmapNames`): what the watch-based managers keep a
//! watch open for while the pod is registered. Transitive references (pod →
//! PVC → PV → secret) are not followed; empty names are skipped.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, Pod, PodSpec, Volume};

/// The env and envFrom of every container of `spec`: init, regular and
/// ephemeral (upstream `VisitContainers` with `AllContainers`).
fn container_envs(spec: &PodSpec) -> Vec<(&[EnvFromSource], &[EnvVar])> {
    let regular = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| {
            (
                c.env_from.as_deref().unwrap_or_default(),
                c.env.as_deref().unwrap_or_default(),
            )
        });
    let ephemeral = spec.ephemeral_containers.iter().flatten().map(|c| {
        (
            c.env_from.as_deref().unwrap_or_default(),
            c.env.as_deref().unwrap_or_default(),
        )
    });
    regular.chain(ephemeral).collect()
}

fn volume_sources(spec: &PodSpec) -> impl Iterator<Item = &Volume> {
    spec.volumes.iter().flatten()
}

fn insert(names: &mut BTreeSet<String>, name: &str) {
    if !name.is_empty() {
        names.insert(name.to_string());
    }
}

/// Names of the Secrets `pod` references: imagePullSecrets, env `secretKeyRef`,
/// envFrom `secretRef`, `secret` and projected secret volumes, and the
/// `secretRef` of in-tree volume plugins (azureFile, cephfs, cinder, flexVolume,
/// rbd, scaleIO, iscsi, storageos, csi).
pub fn secret_names(pod: &Pod) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return names;
    };
    for r in spec.image_pull_secrets.iter().flatten() {
        insert(&mut names, &r.name);
    }
    for (env_from, env) in container_envs(spec) {
        for e in env_from {
            if let Some(r) = &e.secret_ref {
                insert(&mut names, &r.name);
            }
        }
        for e in env {
            if let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            {
                insert(&mut names, &r.name);
            }
        }
    }
    for s in volume_sources(spec) {
        // Upstream switches on the first set source; a valid volume has one.
        let name = if let Some(v) = &s.azure_file {
            Some(v.secret_name.as_str())
        } else if let Some(v) = &s.cephfs {
            v.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(v) = &s.cinder {
            v.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(v) = &s.flex_volume {
            v.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(p) = &s.projected {
            for src in p.sources.iter().flatten() {
                if let Some(sec) = &src.secret {
                    insert(&mut names, &sec.name);
                }
            }
            None
        } else if let Some(v) = &s.rbd {
            v.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(v) = &s.secret {
            v.secret_name.as_deref()
        } else if let Some(v) = &s.scale_io {
            Some(v.secret_ref.name.as_str())
        } else if let Some(v) = &s.iscsi {
            v.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(v) = &s.storageos {
            v.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(v) = &s.csi {
            v.node_publish_secret_ref.as_ref().map(|r| r.name.as_str())
        } else {
            None
        };
        if let Some(n) = name {
            insert(&mut names, n);
        }
    }
    names
}

/// Names of the ConfigMaps `pod` references: env `configMapKeyRef`, envFrom
/// `configMapRef`, `configMap` volumes and projected configMap sources (which
/// include `kube-root-ca.crt` in service-account token volumes).
pub fn config_map_names(pod: &Pod) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return names;
    };
    for (env_from, env) in container_envs(spec) {
        for e in env_from {
            if let Some(r) = &e.config_map_ref {
                insert(&mut names, &r.name);
            }
        }
        for e in env {
            if let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.config_map_key_ref.as_ref())
            {
                insert(&mut names, &r.name);
            }
        }
    }
    for s in volume_sources(spec) {
        if let Some(p) = &s.projected {
            for src in p.sources.iter().flatten() {
                if let Some(cm) = &src.config_map {
                    insert(&mut names, &cm.name);
                }
            }
        } else if let Some(cm) = &s.config_map {
            insert(&mut names, &cm.name);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": spec,
        }))
        .expect("pod")
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_kind_of_reference_is_visited() {
        let p = pod(serde_json::json!({
            "imagePullSecrets": [{"name": "pull"}, {"name": ""}],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-sec"}}]}],
            "containers": [{
                "name": "c",
                "envFrom": [{"configMapRef": {"name": "cm-from"}}, {"secretRef": {"name": "sec-from"}}],
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "sec-key", "key": "k"}}},
                    {"name": "C", "value": "plain"}
                ]
            }],
            "ephemeralContainers": [{"name": "e", "env": [
                {"name": "D", "valueFrom": {"configMapKeyRef": {"name": "cm-eph", "key": "k"}}}
            ]}],
            "volumes": [
                {"name": "v1", "configMap": {"name": "cm-vol"}},
                {"name": "v2", "secret": {"secretName": "sec-vol"}},
                {"name": "v3", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"secret": {"name": "sec-proj"}}
                ]}},
                {"name": "v4", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "sec-csi"}}},
                {"name": "v5", "emptyDir": {}}
            ]
        }));
        assert_eq!(
            config_map_names(&p),
            set(&["cm-eph", "cm-from", "cm-key", "cm-vol", "kube-root-ca.crt"])
        );
        assert_eq!(
            secret_names(&p),
            set(&[
                "init-sec", "pull", "sec-csi", "sec-from", "sec-key", "sec-proj", "sec-vol"
            ])
        );
    }

    #[test]
    fn a_pod_without_references_names_nothing() {
        let p = pod(serde_json::json!({"containers": [{"name": "c"}]}));
        assert!(config_map_names(&p).is_empty());
        assert!(secret_names(&p).is_empty());
    }
}
