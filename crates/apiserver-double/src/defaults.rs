//! The apiserver's defaulting of v1 Pods, ported on its own (upstream
//! `pkg/apis/core/v1/defaults.go` and the generated `SetObjectDefaults_Pod`
//! in `zz_generated.defaults.go`), plus the quantity re-encoding that
//! decoding and re-encoding a Pod does to every `resource.Quantity`.
//!
//! Kept to what every release from 1.19 to 1.33 does with default feature
//! gates: pod-level resources (`PodLevelResources`) and image volumes
//! (`ImageVolume`) are off there, so they get no defaults here.
//!
//! Deliberately independent of the kubelet's own code: the double must be
//! able to disagree with it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvVar, EphemeralContainer, Lifecycle, ObjectFieldSelector, Pod, PodSecurityContext, PodSpec,
    Probe, ResourceRequirements, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::quantity::{Quantity, QuantityError};

/// `v1.DefaultTerminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
/// `v1.DefaultSchedulerName`.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// `v1.TerminationMessagePathDefault`.
pub const TERMINATION_MESSAGE_PATH_DEFAULT: &str = "/dev/termination-log";
/// The mode of secret, configMap, downwardAPI and projected volumes (0644).
pub const VOLUME_DEFAULT_MODE: i32 = 0o644;

type ResourceList = BTreeMap<String, ApiQuantity>;

/// Parses every quantity in the pod and writes it back as upstream would
/// after decoding (`Quantity.String`), as the apiserver's JSON decoder
/// does before anything else. A malformed quantity fails the decode.
pub fn decode_quantities(pod: &mut Pod) -> Result<(), QuantityError> {
    let mut all: Vec<&mut ApiQuantity> = Vec::new();
    let (lists, others) = quantities_mut(pod);
    for l in lists {
        all.extend(l.values_mut());
    }
    all.extend(others);
    for q in all {
        // The JSON decoder trims surrounding space before parsing (`Quantity.UnmarshalJSON`).
        *q = ApiQuantity(Quantity::parse(q.0.trim())?.to_string());
    }
    Ok(())
}

/// The defaults every container kind gets (`SetDefaults_Container` and the
/// per-field defaults the generated code applies inside a container).
macro_rules! container_defaults {
    ($c:expr) => {{
        let c = $c;
        if is_unset(&c.image_pull_policy) {
            c.image_pull_policy =
                Some(default_pull_policy(c.image.as_deref().unwrap_or("")).into());
        }
        if is_unset(&c.termination_message_path) {
            c.termination_message_path = Some(TERMINATION_MESSAGE_PATH_DEFAULT.into());
        }
        if is_unset(&c.termination_message_policy) {
            c.termination_message_policy = Some("File".into());
        }
        for p in c.ports.iter_mut().flatten() {
            if is_unset(&p.protocol) {
                p.protocol = Some("TCP".into());
            }
        }
        for e in c.env.iter_mut().flatten() {
            if let Some(f) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
                set_defaults_object_field_selector(f);
            }
        }
        for p in [
            &mut c.liveness_probe,
            &mut c.readiness_probe,
            &mut c.startup_probe,
        ]
        .into_iter()
        .flatten()
        {
            set_defaults_probe(p);
        }
        if let Some(l) = c.lifecycle.as_mut() {
            set_defaults_lifecycle(l);
        }
    }};
}

/// Upstream `SetObjectDefaults_Pod`. Expects [`decode_quantities`] to have run.
pub fn set_object_defaults_pod(pod: &mut Pod) {
    set_defaults_pod(pod);
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    set_defaults_pod_spec(spec);
    for v in spec.volumes.iter_mut().flatten() {
        set_defaults_volume(v);
    }
    for c in spec.init_containers.iter_mut().flatten() {
        container_defaults!(c);
    }
    for c in &mut spec.containers {
        container_defaults!(c);
    }
    for c in spec.ephemeral_containers.iter_mut().flatten() {
        let c: &mut EphemeralContainer = c;
        container_defaults!(c);
    }
    // SetDefaults_ResourceList: every resource list in a Pod is rounded up to milli scale.
    let (lists, _) = quantities_mut(pod);
    for list in lists {
        set_defaults_resource_list(list);
    }
}

fn is_unset(s: &Option<String>) -> bool {
    s.as_deref().is_none_or(str::is_empty)
}

fn set_str(s: &mut Option<String>, v: &str) {
    if is_unset(s) {
        *s = Some(v.to_string());
    }
}

fn set_nonzero<T: Default + PartialEq>(n: &mut Option<T>, v: T) {
    if n.as_ref().is_none_or(|n| *n == T::default()) {
        *n = Some(v);
    }
}

/// Upstream `SetDefaults_Pod`.
fn set_defaults_pod(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    // Requests default to limits, for regular and init containers only.
    let resources = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .filter_map(|c| c.resources.as_mut());
    for r in resources {
        requests_from_limits(r);
    }
    if spec.enable_service_links.is_none() {
        spec.enable_service_links = Some(true);
    }
    if spec.host_network == Some(true) {
        // With host networking every container port is a host port.
        let ports = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
            .flat_map(|c| c.ports.iter_mut().flatten());
        for p in ports {
            if p.host_port.unwrap_or(0) == 0 {
                p.host_port = Some(p.container_port);
            }
        }
    }
}

fn requests_from_limits(r: &mut ResourceRequirements) {
    if let Some(limits) = &r.limits {
        let requests = r.requests.get_or_insert_with(BTreeMap::new);
        for (name, q) in limits {
            requests.entry(name.clone()).or_insert_with(|| q.clone());
        }
    }
    // Go leaves empty maps out when it writes the object (`omitempty`).
    if r.requests.as_ref().is_some_and(BTreeMap::is_empty) {
        r.requests = None;
    }
    if r.limits.as_ref().is_some_and(BTreeMap::is_empty) {
        r.limits = None;
    }
}

/// Upstream `SetDefaults_PodSpec`.
fn set_defaults_pod_spec(spec: &mut PodSpec) {
    set_str(&mut spec.dns_policy, "ClusterFirst");
    set_str(&mut spec.restart_policy, "Always");
    if spec.security_context.is_none() {
        spec.security_context = Some(PodSecurityContext::default());
    }
    if spec.termination_grace_period_seconds.is_none() {
        spec.termination_grace_period_seconds = Some(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    }
    set_str(&mut spec.scheduler_name, DEFAULT_SCHEDULER_NAME);
}

/// Upstream `SetDefaults_Container`'s pull policy: `Always` for `:latest` or
/// no tag (and no digest), `IfNotPresent` otherwise.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image_tag(image).as_deref() == Some("latest") {
        "Always"
    } else {
        "IfNotPresent"
    }
}

/// The tag `parsers.ParseImageName` reports: the explicit tag, `latest` when
/// the reference has neither tag nor digest, `None` for a reference that
/// does not parse (upstream ignores the error and gets an empty tag).
fn image_tag(image: &str) -> Option<String> {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest
        && !valid_digest(d)
    {
        return None;
    }
    // A bare 64-hex-digit name would be mistaken for an image ID: refused.
    if name.len() == 64 && is_lower_hex(name) {
        return None;
    }
    // A tag follows the last ':' that comes after the last '/'.
    let last = name.rsplit('/').next().unwrap_or(name);
    let (path, tag) = match last.rsplit_once(':') {
        Some((_, t)) => (&name[..name.len() - t.len() - 1], Some(t)),
        None => (name, None),
    };
    if !valid_name(path) {
        return None;
    }
    match tag {
        Some(t) if valid_tag(t) => Some(t.to_string()),
        Some(_) => None,
        None if digest.is_none() => Some("latest".to_string()),
        None => Some(String::new()),
    }
}

/// A digest of an algorithm upstream knows, with its exact length of lower-case hex.
fn valid_digest(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let len = match alg {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return false,
    };
    is_lower_hex(hex) && hex.len() == len
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(c))
}

/// `[domain/]path`: a domain may have a port and capitals, path components
/// are lower-case alphanumerics joined by `.`, `_`, `__` or dashes.
fn valid_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 {
        return false;
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    let is_domain = parts.len() > 1
        && (first.contains('.')
            || first.contains(':')
            || first == "localhost"
            || first.bytes().any(|b| b.is_ascii_uppercase()));
    if is_domain {
        let (host, port) = match first.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (first, None),
        };
        let host_ok = !host.is_empty()
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !host_ok || !port_ok {
            return false;
        }
        parts.remove(0);
    }
    parts.iter().all(|c| valid_path_component(c))
}

fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_lowercase() && !b[0].is_ascii_digit() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator: '.', '_', '__' or a run of '-', followed by an alphanumeric.
        let sep_end = match b[i] {
            b'.' => i + 1,
            b'_' if b.get(i + 1) == Some(&b'_') => i + 2,
            b'_' => i + 1,
            b'-' => i + b[i..].iter().take_while(|&&x| x == b'-').count(),
            _ => return false,
        };
        if !b.get(sep_end).is_some_and(|&x| alnum(x)) {
            return false;
        }
        i = sep_end;
    }
    true
}

/// Upstream `SetDefaults_Probe`, plus the handler defaults inside it.
fn set_defaults_probe(p: &mut Probe) {
    set_nonzero(&mut p.timeout_seconds, 1);
    set_nonzero(&mut p.period_seconds, 10);
    set_nonzero(&mut p.success_threshold, 1);
    set_nonzero(&mut p.failure_threshold, 3);
    if let Some(h) = p.http_get.as_mut() {
        set_str(&mut h.path, "/");
        set_str(&mut h.scheme, "HTTP");
    }
    if let Some(g) = p.grpc.as_mut()
        && g.service.is_none()
    {
        // `+default=""` since 1.24, when the field went beta.
        g.service = Some(String::new());
    }
}

fn set_defaults_lifecycle(l: &mut Lifecycle) {
    for h in [&mut l.post_start, &mut l.pre_stop].into_iter().flatten() {
        if let Some(h) = h.http_get.as_mut() {
            set_str(&mut h.path, "/");
            set_str(&mut h.scheme, "HTTP");
        }
    }
}

fn set_defaults_object_field_selector(f: &mut ObjectFieldSelector) {
    set_str(&mut f.api_version, "v1");
}

/// Upstream `SetDefaults_Volume` and the defaults of each volume source.
fn set_defaults_volume(v: &mut Volume) {
    if no_source(v) {
        v.empty_dir = Some(Default::default());
    }
    if let Some(h) = v.host_path.as_mut()
        && h.type_.is_none()
    {
        h.type_ = Some(String::new());
    }
    if let Some(s) = v.secret.as_mut() {
        s.default_mode.get_or_insert(VOLUME_DEFAULT_MODE);
    }
    if let Some(c) = v.config_map.as_mut() {
        c.default_mode.get_or_insert(VOLUME_DEFAULT_MODE);
    }
    if let Some(d) = v.downward_api.as_mut() {
        d.default_mode.get_or_insert(VOLUME_DEFAULT_MODE);
        for f in d
            .items
            .iter_mut()
            .flatten()
            .filter_map(|i| i.field_ref.as_mut())
        {
            set_defaults_object_field_selector(f);
        }
    }
    if let Some(p) = v.projected.as_mut() {
        p.default_mode.get_or_insert(VOLUME_DEFAULT_MODE);
        for s in p.sources.iter_mut().flatten() {
            let items = s
                .downward_api
                .iter_mut()
                .flat_map(|d| d.items.iter_mut().flatten());
            for f in items.filter_map(|i| i.field_ref.as_mut()) {
                set_defaults_object_field_selector(f);
            }
            if let Some(t) = s.service_account_token.as_mut() {
                t.expiration_seconds.get_or_insert(3600);
            }
        }
    }
    if let Some(i) = v.iscsi.as_mut() {
        set_str(&mut i.iscsi_interface, "default");
    }
    if let Some(r) = v.rbd.as_mut() {
        set_str(&mut r.pool, "rbd");
        set_str(&mut r.user, "admin");
        set_str(&mut r.keyring, "/etc/ceph/keyring");
    }
    if let Some(a) = v.azure_disk.as_mut() {
        a.caching_mode.get_or_insert_with(|| "ReadWrite".into());
        a.kind.get_or_insert_with(|| "Shared".into());
        a.fs_type.get_or_insert_with(|| "ext4".into());
        a.read_only.get_or_insert(false);
    }
    if let Some(s) = v.scale_io.as_mut() {
        set_str(&mut s.storage_mode, "ThinProvisioned");
        set_str(&mut s.fs_type, "xfs");
    }
    if let Some(t) = v
        .ephemeral
        .as_mut()
        .and_then(|e| e.volume_claim_template.as_mut())
    {
        t.spec
            .volume_mode
            .get_or_insert_with(|| "Filesystem".into());
    }
}

/// Whether no volume source is set (`ptr.AllPtrFieldsNil(&obj.VolumeSource)`).
fn no_source(v: &Volume) -> bool {
    let bare = Volume {
        name: v.name.clone(),
        ..Default::default()
    };
    *v == bare
}

/// Upstream `SetDefaults_ResourceList`: round up to milli scale.
fn set_defaults_resource_list(list: &mut ResourceList) {
    for q in list.values_mut() {
        if let Ok(mut parsed) = Quantity::parse(&q.0) {
            parsed.round_up(-3);
            *q = ApiQuantity(parsed.to_string());
        }
    }
}

/// Every resource list in a pod, and every other quantity (emptyDir size
/// limits, downward API divisors).
fn quantities_mut(pod: &mut Pod) -> (Vec<&mut ResourceList>, Vec<&mut ApiQuantity>) {
    let mut lists: Vec<&mut ResourceList> = Vec::new();
    let mut others: Vec<&mut ApiQuantity> = Vec::new();
    fn reqs<'a>(r: &'a mut Option<ResourceRequirements>, lists: &mut Vec<&'a mut ResourceList>) {
        if let Some(r) = r {
            lists.extend(r.limits.as_mut());
            lists.extend(r.requests.as_mut());
        }
    }
    if let Some(spec) = pod.spec.as_mut() {
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            reqs(&mut c.resources, &mut lists);
            others.extend(divisors(c.env.as_mut()));
        }
        for c in spec.ephemeral_containers.iter_mut().flatten() {
            reqs(&mut c.resources, &mut lists);
            others.extend(divisors(c.env.as_mut()));
        }
        lists.extend(spec.overhead.as_mut());
        reqs(&mut spec.resources, &mut lists);
        for v in spec.volumes.iter_mut().flatten() {
            others.extend(v.empty_dir.as_mut().and_then(|e| e.size_limit.as_mut()));
            let items = v
                .downward_api
                .iter_mut()
                .flat_map(|d| d.items.iter_mut().flatten());
            others.extend(items.filter_map(|i| i.resource_field_ref.as_mut()?.divisor.as_mut()));
            let projected = v
                .projected
                .iter_mut()
                .flat_map(|p| p.sources.iter_mut().flatten())
                .flat_map(|s| s.downward_api.iter_mut())
                .flat_map(|d| d.items.iter_mut().flatten());
            others
                .extend(projected.filter_map(|i| i.resource_field_ref.as_mut()?.divisor.as_mut()));
            if let Some(r) = v
                .ephemeral
                .as_mut()
                .and_then(|e| e.volume_claim_template.as_mut())
                .and_then(|t| t.spec.resources.as_mut())
            {
                lists.extend(r.limits.as_mut());
                lists.extend(r.requests.as_mut());
            }
        }
    }
    if let Some(status) = pod.status.as_mut() {
        let statuses = status
            .container_statuses
            .iter_mut()
            .chain(status.init_container_statuses.iter_mut())
            .chain(status.ephemeral_container_statuses.iter_mut())
            .flatten();
        for s in statuses {
            lists.extend(s.allocated_resources.as_mut());
            reqs(&mut s.resources, &mut lists);
        }
    }
    (lists, others)
}

fn divisors(env: Option<&mut Vec<EnvVar>>) -> Vec<&mut ApiQuantity> {
    env.into_iter()
        .flatten()
        .filter_map(|e| {
            e.value_from
                .as_mut()?
                .resource_field_ref
                .as_mut()?
                .divisor
                .as_mut()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_follows_the_tag() {
        for (image, want) in [
            ("busybox", "Always"),
            ("busybox:latest", "Always"),
            ("busybox:1.36", "IfNotPresent"),
            ("registry.local:5000/team/app", "Always"),
            ("registry.local:5000/team/app:v2", "IfNotPresent"),
            ("localhost/app", "Always"),
            (
                "busybox@sha256:a3ed95caeb02ffe68cdd9fd84406680ae93d633cb16422d00e8a7c22955b46d4",
                "IfNotPresent",
            ),
            (
                "busybox:latest@sha256:a3ed95caeb02ffe68cdd9fd84406680ae93d633cb16422d00e8a7c22955b46d4",
                "Always",
            ),
            // References that do not parse get an empty tag, hence IfNotPresent.
            ("Busybox", "IfNotPresent"),
            ("", "IfNotPresent"),
            ("busybox@sha256:short", "IfNotPresent"),
        ] {
            assert_eq!(default_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn explicit_zero_probe_fields_are_defaulted_but_zero_grace_is_kept() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "i:1",
                    "livenessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 0},
                    "readinessProbe": {"grpc": {"port": 9000}}}]
            }
        }))
        .expect("pod");
        set_object_defaults_pod(&mut pod);
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.termination_grace_period_seconds, Some(0));
        let c = &spec.containers[0];
        let live = c.liveness_probe.as_ref().expect("liveness");
        assert_eq!(live.period_seconds, Some(10));
        let ready = c.readiness_probe.as_ref().expect("readiness");
        assert_eq!(
            ready.grpc.as_ref().and_then(|g| g.service.as_deref()),
            Some("")
        );
    }

    #[test]
    fn quantities_are_trimmed_and_rewritten_on_decode() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i:1",
                "resources": {"limits": {"cpu": " 0.5 ", "memory": 1024}}}]}
        }))
        .expect("pod");
        decode_quantities(&mut pod).expect("decodes");
        let limits = pod.spec.expect("spec").containers[0]
            .resources
            .clone()
            .and_then(|r| r.limits)
            .expect("limits");
        assert_eq!(limits["cpu"].0, "500m");
        assert_eq!(limits["memory"].0, "1024");
    }

    #[test]
    fn empty_limits_leave_no_empty_maps() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i:1", "resources": {"limits": {}}}]}
        }))
        .expect("pod");
        set_object_defaults_pod(&mut pod);
        let r = pod.spec.expect("spec").containers[0]
            .resources
            .clone()
            .expect("resources");
        assert_eq!((r.limits, r.requests), (None, None));
    }
}
