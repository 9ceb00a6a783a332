//! Pod validation as the apiserver's `ValidatePodCreate` does it (upstream
//! `pkg/apis/core/validation`), the subset whose fields kubelet-rs runs.
//! Upstream's file and HTTP sources call it on every static pod
//! (`pkg/kubelet/config/common.go` `tryDecodeSinglePod`) and refuse an
//! invalid one with `invalid pod: [<field errors>]`; so do ours, and
//! `kubelet-rs check` reports each error with its field path.
//!
//! The kubelet's own port: it shares nothing with the apiserver double.

mod container;
pub mod field;
pub mod names;

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Pod, PodSpec, Probe, Volume};
use kubelet_types::defaults::apply_api_defaults;

use container::Role;
pub use field::{ErrorList, ErrorType, FieldError, Path, Seg, render};

/// Validates a pod read from a static source as upstream does: after the
/// API defaults and after the name has been given the node suffix
/// (`<name>-<node>`), as `applyDefaults` does before `ValidatePodCreate`.
pub fn validate_static_pod(pod: &Pod, node_name: &str) -> ErrorList {
    let mut p = pod.clone();
    clear_empty_defaulted(&mut p);
    apply_api_defaults(&mut p);
    if let Some(name) = p.metadata.name.as_mut().filter(|n| !n.is_empty()) {
        *name = format!("{name}-{}", node_name.to_lowercase());
    }
    validate_pod(&p)
}

/// Upstream's v1 defaulters (`SetDefaults_PodSpec`, `SetDefaults_Container`,
/// `SetDefaults_ContainerPort`, `SetDefaults_HTTPGetAction`) fill a field
/// that is `""` as well as one that is absent: an explicit empty string is
/// unset, not invalid.
fn clear_empty_defaulted(p: &mut Pod) {
    fn clear(v: &mut Option<String>) {
        if v.as_deref() == Some("") {
            *v = None;
        }
    }
    fn http(h: Option<&mut HTTPGetAction>) {
        if let Some(h) = h {
            clear(&mut h.scheme);
        }
    }
    fn probe(pr: Option<&mut Probe>) {
        if let Some(pr) = pr {
            http(pr.http_get.as_mut());
        }
    }
    fn container(c: &mut Container) {
        clear(&mut c.image_pull_policy);
        clear(&mut c.termination_message_path);
        clear(&mut c.termination_message_policy);
        for port in c.ports.iter_mut().flatten() {
            clear(&mut port.protocol);
        }
        probe(c.liveness_probe.as_mut());
        probe(c.readiness_probe.as_mut());
        probe(c.startup_probe.as_mut());
        if let Some(l) = c.lifecycle.as_mut() {
            http(l.post_start.as_mut().and_then(|h| h.http_get.as_mut()));
            http(l.pre_stop.as_mut().and_then(|h| h.http_get.as_mut()));
        }
    }
    let Some(spec) = p.spec.as_mut() else { return };
    clear(&mut spec.restart_policy);
    clear(&mut spec.dns_policy);
    spec.containers.iter_mut().for_each(container);
    spec.init_containers
        .iter_mut()
        .flatten()
        .for_each(container);
}

/// Upstream `ValidatePodCreate` on a defaulted pod.
pub fn validate_pod(pod: &Pod) -> ErrorList {
    let mut errs = ErrorList::new();
    let meta = Path::new("metadata");
    match pod.metadata.name.as_deref() {
        None | Some("") => errs.push(FieldError::required(
            meta.child("name"),
            "name or generateName is required",
        )),
        Some(n) => {
            for m in names::dns1123_subdomain(n) {
                errs.push(FieldError::invalid(meta.child("name"), n, m));
            }
        }
    }
    if let Some(ns) = pod.metadata.namespace.as_deref() {
        for m in names::dns1123_label(ns) {
            errs.push(FieldError::invalid(meta.child("namespace"), ns, m));
        }
    }
    let labels = meta.child("labels");
    for (k, v) in pod.metadata.labels.iter().flatten() {
        for m in names::qualified_name(k) {
            errs.push(FieldError::invalid(labels.clone(), k, m));
        }
        for m in names::label_value(v) {
            errs.push(FieldError::invalid(labels.clone(), v, m));
        }
    }
    for k in pod.metadata.annotations.iter().flatten().map(|(k, _)| k) {
        for m in names::qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid(meta.child("annotations"), k, m));
        }
    }
    match &pod.spec {
        Some(spec) => validate_spec(spec, &Path::new("spec"), &mut errs),
        None => errs.push(FieldError::required(Path::new("spec"), "")),
    }
    errs
}

/// Upstream `validateProcMountType` with the user namespace rule: an
/// unmasked `/proc` only in a pod's own user namespace.
fn validate_proc_mounts(spec: &PodSpec, p: &Path, errs: &mut ErrorList) {
    let lists = [
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
        ("containers", spec.containers.as_slice()),
    ];
    for (list, containers) in lists {
        for (i, c) in containers.iter().enumerate() {
            let Some(pm) = c
                .security_context
                .as_ref()
                .and_then(|s| s.proc_mount.as_deref())
            else {
                continue;
            };
            let path = p
                .child(list)
                .index(i)
                .child("securityContext")
                .child("procMount");
            match pm {
                "Default" => {}
                "Unmasked" if spec.host_users == Some(false) => {}
                "Unmasked" => errs.push(FieldError::invalid(
                    path,
                    pm,
                    "`hostUsers` must be false to use `Unmasked`",
                )),
                other => errs.push(FieldError::not_supported(
                    path,
                    other,
                    &["Default", "Unmasked"],
                )),
            }
        }
    }
}

fn validate_spec(spec: &PodSpec, p: &Path, errs: &mut ErrorList) {
    let volumes = validate_volumes(spec.volumes.as_deref().unwrap_or_default(), p, errs);
    let mut names = HashSet::new();
    container::validate_containers(
        spec.init_containers.as_deref().unwrap_or_default(),
        Role::Init,
        &volumes,
        &mut names,
        &p.child("initContainers"),
        errs,
    );
    if spec.containers.is_empty() {
        errs.push(FieldError::required(p.child("containers"), ""));
    }
    container::validate_containers(
        &spec.containers,
        Role::Regular,
        &volumes,
        &mut names,
        &p.child("containers"),
        errs,
    );
    validate_proc_mounts(spec, p, errs);
    if let Some(rp) = spec.restart_policy.as_deref() {
        let ok = ["Always", "OnFailure", "Never"];
        if !ok.contains(&rp) {
            errs.push(FieldError::not_supported(p.child("restartPolicy"), rp, &ok));
        }
    }
    if let Some(dp) = spec.dns_policy.as_deref() {
        let ok = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
        if !ok.contains(&dp) {
            errs.push(FieldError::not_supported(p.child("dnsPolicy"), dp, &ok));
        } else if dp == "None" && spec.dns_config.is_none() {
            errs.push(FieldError::required(
                p.child("dnsConfig"),
                "must provide `dnsConfig` when `dnsPolicy` is None",
            ));
        }
    }
    // A negative terminationGracePeriodSeconds is not refused: upstream only
    // warns ("will be treated as 1", `warningsForPodSpec`).
    if let Some(d) = spec.active_deadline_seconds.filter(|d| *d <= 0) {
        errs.push(FieldError::invalid_num(
            p.child("activeDeadlineSeconds"),
            d,
            "must be between 1 and 2147483647, inclusive",
        ));
    }
}

/// Volume sources in the order upstream's `validateVolumeSource` checks them.
const SOURCES: &[&str] = &[
    "hostPath",
    "emptyDir",
    "gitRepo",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "configMap",
    "storageos",
    "csi",
    "ephemeral",
    "image",
];

const HOST_PATH_TYPES: &[&str] = &[
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
];

/// Upstream `ValidateVolumes`; returns the volume names.
fn validate_volumes(vols: &[Volume], p: &Path, errs: &mut ErrorList) -> HashSet<String> {
    let mut names = HashSet::new();
    for (i, v) in vols.iter().enumerate() {
        let vp = p.child("volumes").index(i);
        if v.name.is_empty() {
            errs.push(FieldError::required(vp.child("name"), ""));
        } else {
            for m in names::dns1123_label(&v.name) {
                errs.push(FieldError::invalid(vp.child("name"), &v.name, m));
            }
            if !names.insert(v.name.clone()) {
                errs.push(FieldError::duplicate(vp.child("name"), &v.name));
            }
        }
        // The set source fields, as the JSON keys of the volume.
        let json = serde_json::to_value(v).unwrap_or_default();
        let set: Vec<&str> = SOURCES
            .iter()
            .copied()
            .filter(|s| json.get(s).is_some_and(|x| !x.is_null()))
            .collect();
        match set.as_slice() {
            [] => errs.push(FieldError::required(
                vp.clone(),
                "must specify a volume type",
            )),
            [_, extra @ ..] => {
                for s in extra {
                    errs.push(FieldError::forbidden(
                        vp.child(s),
                        "may not specify more than 1 volume type",
                    ));
                }
            }
        }
        if let Some(h) = &v.host_path {
            let hp = vp.child("hostPath");
            if h.path.is_empty() {
                errs.push(FieldError::required(hp.child("path"), ""));
            } else if h.path.split('/').any(|s| s == "..") {
                errs.push(FieldError::invalid(
                    hp.child("path"),
                    &h.path,
                    "must not contain '..'",
                ));
            }
            if let Some(t) = h.type_.as_deref()
                && !HOST_PATH_TYPES.contains(&t)
            {
                errs.push(FieldError::not_supported(
                    hp.child("type"),
                    t,
                    HOST_PATH_TYPES,
                ));
            }
        }
    }
    names
}

#[cfg(test)]
mod tests;
