//! Container validation (upstream `validateContainers`,
//! `validateInitContainers`, `validateContainerCommon`, resource
//! requirements, probes and lifecycle handlers in
//! `pkg/apis/core/validation/validation.go`).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, Lifecycle, LifecycleHandler, Probe, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::field::{
    FieldError, NEGATIVE_MSG, dns1123_label, nonnegative, port_name, port_num, port_num_or_name,
    supported,
};
use crate::quantity::Quantity;

/// Upstream `validateContainers`.
pub(super) fn validate_containers(
    containers: &[Container],
    volumes: &HashSet<&str>,
    restart: &str,
    errs: &mut Vec<FieldError>,
) {
    if containers.is_empty() {
        errs.push(FieldError::required("spec.containers", ""));
    }
    let mut names = HashSet::new();
    for (i, c) in containers.iter().enumerate() {
        let path = format!("spec.containers[{i}]");
        validate_container_common(c, &path, volumes, restart, errs);
        if !names.insert(c.name.as_str()) {
            errs.push(FieldError::duplicate(
                &format!("{path}.name"),
                c.name.as_str(),
            ));
        }
        if let Some(l) = &c.lifecycle {
            validate_lifecycle(l, &format!("{path}.lifecycle"), errs);
        }
        validate_probe(
            c.liveness_probe.as_ref(),
            &format!("{path}.livenessProbe"),
            ProbeKind::Liveness,
            errs,
        );
        validate_probe(
            c.readiness_probe.as_ref(),
            &format!("{path}.readinessProbe"),
            ProbeKind::Readiness,
            errs,
        );
        validate_probe(
            c.startup_probe.as_ref(),
            &format!("{path}.startupProbe"),
            ProbeKind::Startup,
            errs,
        );
        if c.restart_policy.is_some() {
            errs.push(FieldError::forbidden(
                &format!("{path}.restartPolicy"),
                "may not be set for non-init containers",
            ));
        }
    }
    host_port_conflicts(containers.iter().enumerate(), "spec.containers", errs);
}

/// Upstream `validateInitContainers`: names unique across regular and init
/// containers, probes and hooks only on restartable (sidecar) ones.
pub(super) fn validate_init_containers(
    init: &[Container],
    regular: &[Container],
    volumes: &HashSet<&str>,
    restart: &str,
    errs: &mut Vec<FieldError>,
) {
    let mut names: HashSet<&str> = regular.iter().map(|c| c.name.as_str()).collect();
    for (i, c) in init.iter().enumerate() {
        let path = format!("spec.initContainers[{i}]");
        validate_container_common(c, &path, volumes, restart, errs);
        let sidecar = match c.restart_policy.as_deref() {
            None => false,
            Some(p) => {
                supported(&format!("{path}.restartPolicy"), Some(p), &["Always"], errs);
                p == "Always"
            }
        };
        if names.contains(c.name.as_str()) {
            errs.push(FieldError::duplicate(
                &format!("{path}.name"),
                c.name.as_str(),
            ));
        } else if !c.name.is_empty() {
            names.insert(c.name.as_str());
        }
        host_port_conflicts(std::iter::once((i, c)), "spec.initContainers", errs);
        if sidecar {
            if let Some(l) = &c.lifecycle {
                validate_lifecycle(l, &format!("{path}.lifecycle"), errs);
            }
            validate_probe(
                c.liveness_probe.as_ref(),
                &format!("{path}.livenessProbe"),
                ProbeKind::Liveness,
                errs,
            );
            validate_probe(
                c.readiness_probe.as_ref(),
                &format!("{path}.readinessProbe"),
                ProbeKind::Readiness,
                errs,
            );
            validate_probe(
                c.startup_probe.as_ref(),
                &format!("{path}.startupProbe"),
                ProbeKind::Startup,
                errs,
            );
        } else {
            let set = [
                ("lifecycle", c.lifecycle.is_some()),
                ("livenessProbe", c.liveness_probe.is_some()),
                ("readinessProbe", c.readiness_probe.is_some()),
                ("startupProbe", c.startup_probe.is_some()),
            ];
            for (f, _) in set.iter().filter(|(_, s)| *s) {
                errs.push(FieldError::forbidden(
                    &format!("{path}.{f}"),
                    "may not be set for init containers without restartPolicy=Always",
                ));
            }
        }
    }
}

/// Upstream `validateContainerCommon` (and `validateContainerOnlyForPod`).
pub(super) fn validate_container_common(
    c: &Container,
    path: &str,
    volumes: &HashSet<&str>,
    pod_restart: &str,
    errs: &mut Vec<FieldError>,
) {
    let name_path = format!("{path}.name");
    if c.name.is_empty() {
        errs.push(FieldError::required(&name_path, ""));
    } else {
        dns1123_label(&name_path, &c.name, errs);
    }
    let image = c.image.as_deref().unwrap_or("");
    if image.is_empty() {
        errs.push(FieldError::required(&format!("{path}.image"), ""));
    } else if image.trim() != image {
        errs.push(FieldError::invalid(
            &format!("{path}.image"),
            image,
            "must not have leading or trailing whitespace",
        ));
    }
    supported(
        &format!("{path}.terminationMessagePolicy"),
        c.termination_message_policy.as_deref(),
        &["File", "FallbackToLogsOnError"],
        errs,
    );
    let mut port_names = HashSet::new();
    for (i, p) in c.ports.iter().flatten().enumerate() {
        let pp = format!("{path}.ports[{i}]");
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            let before = errs.len();
            port_name(&format!("{pp}.name"), n, errs);
            if errs.len() == before && !port_names.insert(n) {
                errs.push(FieldError::duplicate(&format!("{pp}.name"), n));
            }
        }
        if p.container_port == 0 {
            errs.push(FieldError::required(&format!("{pp}.containerPort"), ""));
        } else {
            port_num(&format!("{pp}.containerPort"), p.container_port, errs);
        }
        if let Some(hp) = p.host_port.filter(|hp| *hp != 0) {
            port_num(&format!("{pp}.hostPort"), hp, errs);
        }
        supported(
            &format!("{pp}.protocol"),
            p.protocol.as_deref(),
            &["SCTP", "TCP", "UDP"],
            errs,
        );
    }
    for (i, e) in c.env.iter().flatten().enumerate() {
        let ep = format!("{path}.env[{i}]");
        if e.name.is_empty() {
            errs.push(FieldError::required(&format!("{ep}.name"), ""));
        }
        if let Some(from) = &e.value_from {
            let n = [
                from.field_ref.is_some(),
                from.resource_field_ref.is_some(),
                from.config_map_key_ref.is_some(),
                from.secret_key_ref.is_some(),
            ]
            .iter()
            .filter(|s| **s)
            .count();
            let vp = format!("{ep}.valueFrom");
            if n == 0 {
                errs.push(FieldError::invalid(&vp, "", "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"));
            } else if e.value.as_deref().is_some_and(|v| !v.is_empty()) {
                errs.push(FieldError::invalid(
                    &vp,
                    "",
                    "may not be specified when `value` is not empty",
                ));
            } else if n > 1 {
                errs.push(FieldError::invalid(
                    &vp,
                    "",
                    "may not have more than one field specified at a time",
                ));
            }
        }
    }
    let mut mount_paths = HashSet::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mp = format!("{path}.volumeMounts[{i}]");
        if m.name.is_empty() {
            errs.push(FieldError::required(&format!("{mp}.name"), ""));
        }
        if !volumes.contains(m.name.as_str()) {
            errs.push(FieldError::not_found(&format!("{mp}.name"), &m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(FieldError::required(&format!("{mp}.mountPath"), ""));
        }
        if !mount_paths.insert(m.mount_path.as_str()) {
            errs.push(FieldError::invalid(
                &format!("{mp}.mountPath"),
                m.mount_path.as_str(),
                "must be unique",
            ));
        }
    }
    supported(
        &format!("{path}.imagePullPolicy"),
        c.image_pull_policy.as_deref(),
        &["Always", "IfNotPresent", "Never"],
        errs,
    );
    if let Some(r) = &c.resources {
        validate_resources(r, &format!("{path}.resources"), errs);
    }
    for p in c.resize_policy.iter().flatten() {
        if pod_restart == "Never" && p.restart_policy != "NotRequired" {
            errs.push(FieldError::invalid(
                &format!("{path}.resizePolicy"),
                p.restart_policy.as_str(),
                "must be 'NotRequired' when `restartPolicy` is 'Never'",
            ));
        }
    }
}

fn is_hugepages(name: &str) -> bool {
    name.starts_with("hugepages-")
}

/// Native resources (no domain, or a `kubernetes.io` domain) other than hugepages may be overcommitted.
fn overcommit_allowed(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    native && !is_hugepages(name)
}

pub(super) fn validate_resource_list(
    list: &BTreeMap<String, ApiQuantity>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    for (name, q) in list {
        resource_value(name, q, &format!("{path}[{name}]"), errs);
    }
}

/// Upstream `validateContainerResourceName` and `ValidateResourceQuantityValue`; returns the parsed value.
fn resource_value(
    name: &str,
    q: &ApiQuantity,
    field: &str,
    errs: &mut Vec<FieldError>,
) -> Option<Quantity> {
    if !name.contains('/')
        && !matches!(name, "cpu" | "memory" | "ephemeral-storage")
        && !is_hugepages(name)
    {
        errs.push(FieldError::invalid(
            field,
            name,
            "must be a standard resource for containers",
        ));
    }
    let parsed = Quantity::parse(&q.0).ok()?;
    if parsed.signum() < 0 {
        errs.push(FieldError::invalid(field, q.0.as_str(), NEGATIVE_MSG));
    }
    if !overcommit_allowed(name) && !is_hugepages(name) && !parsed.is_integer() {
        errs.push(FieldError::invalid(
            field,
            q.0.as_str(),
            "must be an integer",
        ));
    }
    if let Some(page) = name.strip_prefix("hugepages-")
        && let Ok(page) = Quantity::parse(page)
        && (page.signum() <= 0 || !parsed.is_multiple_of(&page))
    {
        errs.push(FieldError::invalid(
            field,
            q.0.as_str(),
            format!("{} is not positive integer multiple of {name}", q.0),
        ));
    }
    Some(parsed)
}

/// Upstream `validateResourceRequirements` for a container.
fn validate_resources(r: &ResourceRequirements, path: &str, errs: &mut Vec<FieldError>) {
    let empty = BTreeMap::new();
    let limits = r.limits.as_ref().unwrap_or(&empty);
    let requests = r.requests.as_ref().unwrap_or(&empty);
    let mut cpu_or_memory = false;
    let mut hugepages = false;
    let mut parsed_limits = BTreeMap::new();
    for (name, q) in limits {
        if let Some(v) = resource_value(name, q, &format!("{path}.limits[{name}]"), errs) {
            parsed_limits.insert(name.as_str(), v);
        }
        hugepages |= is_hugepages(name);
        cpu_or_memory |= matches!(name.as_str(), "cpu" | "memory");
    }
    let req_path = format!("{path}.requests");
    for (name, q) in requests {
        let Some(v) = resource_value(name, q, &format!("{req_path}[{name}]"), errs) else {
            continue;
        };
        match parsed_limits.get(name.as_str()) {
            Some(lim) if *lim != v && !overcommit_allowed(name) => errs.push(FieldError::invalid(
                &req_path,
                q.0.as_str(),
                format!("must be equal to {name} limit of {}", limits[name].0),
            )),
            Some(lim) if v > *lim => errs.push(FieldError::invalid(
                &req_path,
                q.0.as_str(),
                format!(
                    "must be less than or equal to {name} limit of {}",
                    limits[name].0
                ),
            )),
            Some(_) => {}
            None if !overcommit_allowed(name) => errs.push(FieldError::required(
                &format!("{path}.limits"),
                "Limit must be set for non overcommitable resources",
            )),
            None => {}
        }
        hugepages |= is_hugepages(name);
        cpu_or_memory |= matches!(name.as_str(), "cpu" | "memory");
    }
    if hugepages && !cpu_or_memory {
        errs.push(FieldError::forbidden(
            path,
            "HugePages require cpu or memory",
        ));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

/// The handler of a probe or lifecycle hook, flattened (upstream `commonHandler`).
struct Handler<'a> {
    exec: Option<&'a [String]>,
    http_get: Option<&'a HTTPGetAction>,
    tcp_port: Option<&'a IntOrString>,
    grpc_port: Option<i32>,
    sleep: bool,
}

fn validate_handler(h: &Handler<'_>, path: &str, errs: &mut Vec<FieldError>) {
    let mut count = 0;
    let mut one = |name: &str, errs: &mut Vec<FieldError>| {
        count += 1;
        if count > 1 {
            errs.push(FieldError::forbidden(
                &format!("{path}.{name}"),
                "may not specify more than 1 handler type",
            ));
            false
        } else {
            true
        }
    };
    if let Some(cmd) = h.exec
        && one("exec", errs)
        && cmd.is_empty()
    {
        errs.push(FieldError::required(&format!("{path}.exec.command"), ""));
    }
    if let Some(g) = h.http_get
        && one("httpGet", errs)
    {
        let gp = format!("{path}.httpGet");
        if g.path.as_deref().unwrap_or("").is_empty() {
            errs.push(FieldError::required(&format!("{gp}.path"), ""));
        }
        port_num_or_name(&format!("{gp}.port"), &g.port, errs);
        let scheme = g.scheme.as_deref().unwrap_or("");
        if !matches!(scheme, "HTTP" | "HTTPS") {
            errs.push(FieldError::not_supported(
                &format!("{gp}.scheme"),
                scheme,
                &["HTTP", "HTTPS"],
            ));
        }
    }
    if let Some(p) = h.tcp_port
        && one("tcpSocket", errs)
    {
        port_num_or_name(&format!("{path}.tcpSocket.port"), p, errs);
    }
    if let Some(p) = h.grpc_port
        && one("grpc", errs)
    {
        port_num(&format!("{path}.grpc.port"), p, errs);
    }
    if h.sleep {
        one("sleep", errs);
    }
    if count == 0 {
        errs.push(FieldError::required(path, "must specify a handler type"));
    }
}

fn validate_lifecycle(l: &Lifecycle, path: &str, errs: &mut Vec<FieldError>) {
    let hooks: [(&str, &Option<LifecycleHandler>); 2] =
        [("postStart", &l.post_start), ("preStop", &l.pre_stop)];
    for (name, h) in hooks {
        if let Some(h) = h {
            let handler = Handler {
                exec: h.exec.as_ref().map(|e| e.command.as_deref().unwrap_or(&[])),
                http_get: h.http_get.as_ref(),
                tcp_port: h.tcp_socket.as_ref().map(|t| &t.port),
                grpc_port: None,
                sleep: h.sleep.is_some(),
            };
            validate_handler(&handler, &format!("{path}.{name}"), errs);
        }
    }
}

fn validate_probe(p: Option<&Probe>, path: &str, kind: ProbeKind, errs: &mut Vec<FieldError>) {
    let Some(p) = p else {
        return;
    };
    let handler = Handler {
        exec: p.exec.as_ref().map(|e| e.command.as_deref().unwrap_or(&[])),
        http_get: p.http_get.as_ref(),
        tcp_port: p.tcp_socket.as_ref().map(|t| &t.port),
        grpc_port: p.grpc.as_ref().map(|g| g.port),
        sleep: false,
    };
    validate_handler(&handler, path, errs);
    for (f, v) in [
        ("initialDelaySeconds", p.initial_delay_seconds),
        ("timeoutSeconds", p.timeout_seconds),
        ("periodSeconds", p.period_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        nonnegative(&format!("{path}.{f}"), v, errs);
    }
    if let Some(g) = p.termination_grace_period_seconds {
        if kind == ProbeKind::Readiness {
            errs.push(FieldError::invalid(
                &format!("{path}.terminationGracePeriodSeconds"),
                g,
                "must not be set for readinessProbes",
            ));
        } else if g <= 0 {
            errs.push(FieldError::invalid(
                &format!("{path}.terminationGracePeriodSeconds"),
                g,
                "must be greater than 0",
            ));
        }
    }
    let success = p.success_threshold.unwrap_or(0);
    if kind != ProbeKind::Readiness && success != 1 {
        errs.push(FieldError::invalid(
            &format!("{path}.successThreshold"),
            success,
            "must be 1",
        ));
    }
}

/// Upstream `AccumulateUniqueHostPorts` over `containers`.
fn host_port_conflicts<'a>(
    containers: impl Iterator<Item = (usize, &'a Container)>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let mut seen = HashSet::new();
    for (i, c) in containers {
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let Some(hp) = p.host_port.filter(|hp| *hp != 0) else {
                continue;
            };
            let key = format!(
                "{}/{}/{hp}",
                p.protocol.as_deref().unwrap_or(""),
                p.host_ip.as_deref().unwrap_or("")
            );
            if !seen.insert(key.clone()) {
                errs.push(FieldError::duplicate(
                    &format!("{path}[{i}].ports[{j}].hostPort"),
                    key.as_str(),
                ));
            }
        }
    }
}
