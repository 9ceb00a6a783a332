//! Container validation of upstream `pkg/apis/core/validation`
//! (`validateContainers`, `validateInitContainers`, `validateContainerPorts`,
//! `ValidateResourceRequirements`, `validateProbe`, `validateHandler`,
//! `ValidateVolumeMounts`, `ValidateEnv`) on a defaulted pod.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Container, EnvVar, Probe, ResourceRequirements, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_types::quantity::Quantity;

use super::field::{ErrorList, FieldError, Path};
use super::names;

const QUANTITY_MSG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Which list a container is in: init containers may not have probes or
/// lifecycle hooks unless they are sidecars (`restartPolicy: Always`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Init,
    Regular,
}

/// Validates one list of containers; `names` holds every container name
/// seen so far (init containers come first, as upstream validates them).
pub(super) fn validate_containers(
    list: &[Container],
    role: Role,
    volumes: &HashSet<String>,
    names: &mut HashSet<String>,
    path: &Path,
    errs: &mut ErrorList,
) {
    for (i, c) in list.iter().enumerate() {
        let p = path.index(i);
        validate_name(&c.name, &p, names, errs);
        match c.image.as_deref() {
            None | Some("") => errs.push(FieldError::required(p.child("image"), "")),
            Some(img) if img.trim() != img => errs.push(FieldError::invalid(
                p.child("image"),
                img,
                "must not have leading or trailing whitespace",
            )),
            Some(_) => {}
        }
        if let Some(pp) = c.image_pull_policy.as_deref() {
            let ok = ["Always", "IfNotPresent", "Never"];
            if !ok.contains(&pp) {
                errs.push(FieldError::not_supported(
                    p.child("imagePullPolicy"),
                    pp,
                    &ok,
                ));
            }
        }
        if let Some(tp) = c.termination_message_policy.as_deref() {
            let ok = ["File", "FallbackToLogsOnError"];
            if !ok.contains(&tp) {
                errs.push(FieldError::not_supported(
                    p.child("terminationMessagePolicy"),
                    tp,
                    &ok,
                ));
            }
        }
        validate_ports(c, &p, errs);
        for (j, e) in c.env.iter().flatten().enumerate() {
            validate_env(e, &p.child("env").index(j), errs);
        }
        if let Some(r) = &c.resources {
            validate_resources(r, &p.child("resources"), errs);
        }
        validate_mounts(
            c.volume_mounts.as_deref().unwrap_or_default(),
            volumes,
            &p.child("volumeMounts"),
            errs,
        );
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        if role == Role::Init && !sidecar {
            for (name, set) in [
                ("lifecycle", c.lifecycle.is_some()),
                ("livenessProbe", c.liveness_probe.is_some()),
                ("readinessProbe", c.readiness_probe.is_some()),
                ("startupProbe", c.startup_probe.is_some()),
            ] {
                if set {
                    errs.push(FieldError::forbidden(
                        p.child(name),
                        "may not be set for init containers without restartPolicy=Always",
                    ));
                }
            }
            continue;
        }
        for (name, probe, single_success) in [
            ("livenessProbe", &c.liveness_probe, true),
            ("readinessProbe", &c.readiness_probe, false),
            ("startupProbe", &c.startup_probe, true),
        ] {
            if let Some(pr) = probe {
                validate_probe(pr, &p.child(name), single_success, errs);
            }
        }
    }
}

fn validate_name(name: &str, p: &Path, names: &mut HashSet<String>, errs: &mut ErrorList) {
    let np = p.child("name");
    if name.is_empty() {
        errs.push(FieldError::required(np, ""));
        return;
    }
    for m in names::dns1123_label(name) {
        errs.push(FieldError::invalid(np.clone(), name, m));
    }
    if !names.insert(name.to_string()) {
        errs.push(FieldError::duplicate(np, name));
    }
}

fn validate_ports(c: &Container, p: &Path, errs: &mut ErrorList) {
    let mut port_names = HashSet::new();
    for (i, port) in c.ports.iter().flatten().enumerate() {
        let pp = p.child("ports").index(i);
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            for m in names::port_name(name) {
                errs.push(FieldError::invalid(pp.child("name"), name, m));
            }
            if !port_names.insert(name) {
                errs.push(FieldError::duplicate(pp.child("name"), name));
            }
        }
        if port.container_port == 0 {
            errs.push(FieldError::required(pp.child("containerPort"), ""));
        } else if let Some(m) = names::port_num(port.container_port) {
            errs.push(FieldError::invalid_num(
                pp.child("containerPort"),
                port.container_port.into(),
                m,
            ));
        }
        if let Some(h) = port.host_port.filter(|h| *h != 0)
            && let Some(m) = names::port_num(h)
        {
            errs.push(FieldError::invalid_num(pp.child("hostPort"), h.into(), m));
        }
        match port.protocol.as_deref() {
            None | Some("") => errs.push(FieldError::required(pp.child("protocol"), "")),
            Some("TCP" | "UDP" | "SCTP") => {}
            Some(other) => errs.push(FieldError::not_supported(
                pp.child("protocol"),
                other,
                &["SCTP", "TCP", "UDP"],
            )),
        }
    }
}

fn validate_env(e: &EnvVar, p: &Path, errs: &mut ErrorList) {
    if e.name.is_empty() {
        errs.push(FieldError::required(p.child("name"), ""));
    } else {
        for m in names::env_var_name(&e.name) {
            errs.push(FieldError::invalid(p.child("name"), &e.name, m));
        }
    }
    if e.value_from.is_some() && e.value.as_deref().is_some_and(|v| !v.is_empty()) {
        errs.push(FieldError::invalid(
            p.child("valueFrom"),
            "",
            "may not be specified when `value` is not empty",
        ));
    }
}

fn is_standard_container_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-")
}

/// A name in the `kubernetes.io` namespace (no domain, or `*kubernetes.io/`).
fn is_native(name: &str) -> bool {
    match name.split_once('/') {
        None => true,
        Some((prefix, _)) => prefix.ends_with("kubernetes.io"),
    }
}

fn validate_resource_name(name: &str, p: &Path, errs: &mut ErrorList) -> bool {
    let before = errs.len();
    for m in names::qualified_name(name) {
        errs.push(FieldError::invalid(p.clone(), name, m));
    }
    if !name.contains('/') {
        if !is_standard_container_resource(name) {
            errs.push(FieldError::invalid(
                p.clone(),
                name,
                "must be a standard resource for containers",
            ));
        }
    } else if !is_native(name) && name.starts_with("requests.") {
        errs.push(FieldError::invalid(
            p.clone(),
            name,
            "doesn't follow extended resource name standard",
        ));
    }
    errs.len() == before
}

/// Parses and checks one resource list. Entries equal to the same entry of
/// `copied_from` (limits that defaulting copied into requests) were checked
/// there and are skipped.
fn quantities(
    list: Option<&BTreeMap<String, ApiQuantity>>,
    copied_from: Option<&BTreeMap<String, ApiQuantity>>,
    p: &Path,
    errs: &mut ErrorList,
) -> BTreeMap<String, Quantity> {
    let mut out = BTreeMap::new();
    for (name, q) in list.into_iter().flatten() {
        if copied_from.and_then(|c| c.get(name)) == Some(q) {
            continue;
        }
        let qp = p.key(name);
        if !validate_resource_name(name, &qp, errs) {
            continue;
        }
        let Ok(v) = Quantity::from_api(q) else {
            errs.push(FieldError::invalid(qp, &q.0, QUANTITY_MSG));
            continue;
        };
        if v.signum() < 0 {
            errs.push(FieldError::invalid(
                qp,
                &v.to_string(),
                "must be greater than or equal to 0",
            ));
            continue;
        }
        if !is_standard_container_resource(name) && v.milli_value() % 1000 != 0 {
            errs.push(FieldError::invalid(
                qp,
                &v.to_string(),
                "must be an integer",
            ));
            continue;
        }
        out.insert(name.clone(), v);
    }
    out
}

fn validate_resources(r: &ResourceRequirements, p: &Path, errs: &mut ErrorList) {
    let limits = quantities(r.limits.as_ref(), None, &p.child("limits"), errs);
    let requests = quantities(
        r.requests.as_ref(),
        r.limits.as_ref(),
        &p.child("requests"),
        errs,
    );
    for (name, req) in &requests {
        let rp = p.child("requests").key(name);
        let overcommit = is_native(name);
        match limits.get(name) {
            Some(lim) if overcommit && req > lim => errs.push(FieldError::invalid(
                rp,
                &req.to_string(),
                format!("must be less than or equal to {name} limit of {lim}"),
            )),
            Some(lim) if !overcommit && req != lim => errs.push(FieldError::invalid(
                rp,
                &req.to_string(),
                format!("must be equal to {name} limit of {lim}"),
            )),
            None if !overcommit => errs.push(FieldError::forbidden(
                p.child("limits"),
                "Limit must be set for non overcommitable resources",
            )),
            _ => {}
        }
    }
}

fn validate_port_ref(port: &IntOrString, p: Path, errs: &mut ErrorList) {
    match port {
        IntOrString::Int(n) => {
            if let Some(m) = names::port_num(*n) {
                errs.push(FieldError::invalid_num(p, (*n).into(), m));
            }
        }
        IntOrString::String(s) => {
            for m in names::port_name(s) {
                errs.push(FieldError::invalid(p.clone(), s, m));
            }
        }
    }
}

fn validate_probe(pr: &Probe, p: &Path, single_success: bool, errs: &mut ErrorList) {
    let mut handlers = 0;
    let mut handler = |name: &str, set: bool, errs: &mut ErrorList| {
        if !set {
            return false;
        }
        handlers += 1;
        if handlers > 1 {
            errs.push(FieldError::forbidden(
                p.child(name),
                "may not specify more than 1 handler type",
            ));
            return false;
        }
        true
    };
    if handler("exec", pr.exec.is_some(), errs)
        && pr
            .exec
            .as_ref()
            .is_some_and(|e| e.command.as_ref().is_none_or(Vec::is_empty))
    {
        errs.push(FieldError::required(p.child("exec").child("command"), ""));
    }
    if handler("httpGet", pr.http_get.is_some(), errs)
        && let Some(h) = &pr.http_get
    {
        let hp = p.child("httpGet");
        validate_port_ref(&h.port, hp.child("port"), errs);
        if let Some(s) = h.scheme.as_deref()
            && !matches!(s, "HTTP" | "HTTPS")
        {
            errs.push(FieldError::not_supported(
                hp.child("scheme"),
                s,
                &["HTTP", "HTTPS"],
            ));
        }
    }
    if handler("tcpSocket", pr.tcp_socket.is_some(), errs)
        && let Some(t) = &pr.tcp_socket
    {
        validate_port_ref(&t.port, p.child("tcpSocket").child("port"), errs);
    }
    if handler("grpc", pr.grpc.is_some(), errs)
        && let Some(g) = &pr.grpc
        && let Some(m) = names::port_num(g.port)
    {
        errs.push(FieldError::invalid_num(
            p.child("grpc").child("port"),
            g.port.into(),
            m,
        ));
    }
    if handlers == 0 {
        errs.push(FieldError::required(
            p.clone(),
            "must specify a handler type",
        ));
    }
    for (name, v) in [
        ("initialDelaySeconds", pr.initial_delay_seconds),
        ("timeoutSeconds", pr.timeout_seconds),
        ("periodSeconds", pr.period_seconds),
        ("successThreshold", pr.success_threshold),
        ("failureThreshold", pr.failure_threshold),
    ] {
        if let Some(v) = v.filter(|v| *v < 0) {
            errs.push(FieldError::invalid_num(
                p.child(name),
                v.into(),
                "must be greater than or equal to 0",
            ));
        }
    }
    // Zero means "unset", which defaulting turns into 1.
    let success = pr.success_threshold.filter(|v| *v != 0).unwrap_or(1);
    if single_success && success != 1 && success > 0 {
        errs.push(FieldError::invalid_num(
            p.child("successThreshold"),
            success.into(),
            "must be 1",
        ));
    }
}

/// Upstream `validateLocalDescendingPath`.
fn validate_sub_path(s: &str, p: Path, errs: &mut ErrorList) {
    if s.starts_with('/') {
        errs.push(FieldError::invalid(p.clone(), s, "must be a relative path"));
    }
    if s.split('/').any(|part| part == "..") {
        errs.push(FieldError::invalid(p, s, "must not contain '..'"));
    }
}

fn validate_mounts(
    mounts: &[VolumeMount],
    volumes: &HashSet<String>,
    p: &Path,
    errs: &mut ErrorList,
) {
    let mut points = HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let mp = p.index(i);
        if m.name.is_empty() {
            errs.push(FieldError::required(mp.child("name"), ""));
        } else if !volumes.contains(&m.name) {
            errs.push(FieldError::not_found(mp.child("name"), &m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(FieldError::required(mp.child("mountPath"), ""));
        } else if !points.insert(m.mount_path.as_str()) {
            errs.push(FieldError::invalid(
                mp.child("mountPath"),
                &m.mount_path,
                "must be unique",
            ));
        }
        if let Some(s) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            validate_sub_path(s, mp.child("subPath"), errs);
        }
    }
}
