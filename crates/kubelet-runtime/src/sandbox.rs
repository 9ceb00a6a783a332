//! Pod sandbox configuration (upstream `kuberuntime_sandbox.go`
//! `generatePodSandboxConfig`, `pkg/kubelet/network/dns`, and
//! `kubelet_pods.go` `GeneratePodHostNameAndDomain` with
//! `util.GetNodenameForKernel` for the hostname).

use std::path::Path;

use cri::pb;
use k8s_openapi::api::core::v1::Pod;
use kubelet_types::pod;

use crate::labels;
use crate::runtime_config::RuntimeConfig;
use crate::security_context::sandbox_security_context;
use kubelet_types::CgroupDriver;
use kubelet_types::qos::{QosClass, pod_qos};

/// Upstream `kubecontainer.BuildPodLogsDirectory`: `<podLogsDir>/<ns>_<name>_<uid>`.
pub(crate) fn pod_logs_dir(root: &Path, p: &Pod) -> std::path::PathBuf {
    root.join(format!(
        "{}_{}_{}",
        pod::namespace(p),
        pod::name(p),
        pod::uid(p)
    ))
}

/// The pod's QoS class name (upstream `qos.GetPodQOS`, see [`kubelet_types::qos`]).
pub fn qos_class(p: &Pod) -> &'static str {
    pod_qos(p).as_str()
}

/// The pod's cgroup parent under `cgroupRoot`, in the driver's syntax
/// (upstream `GetPodCgroupParent`): the container manager's answer when the
/// kubelet has one, else the same name computed here; "" (the runtime's
/// default) without `cgroupsPerQOS`. Guaranteed pods sit directly under
/// `kubepods`, the others under their class. For systemd this is the pod's
/// slice as its expanded path (`/kubepods.slice/kubepods-burstable.slice/
/// kubepods-burstable-pod<uid_>.slice`, upstream `cgroupCommon.Name`):
/// containerd takes the last element as runc's slice, and loads the whole
/// path for the sandbox's cgroup stats.
pub(crate) fn cgroup_parent(cfg: &RuntimeConfig, p: &Pod) -> String {
    if let Some(pcm) = &cfg.pod_cgroups {
        return pcm.0.cgroup_parent(p);
    }
    if !cfg.cgroups_per_qos {
        return String::new();
    }
    let kubepods = kubelet_cm::CgroupName::parse_cgroupfs(&cfg.cgroup_root).child("kubepods");
    let parent = match pod_qos(p) {
        QosClass::Guaranteed => kubepods,
        QosClass::Burstable => kubepods.child("burstable"),
        QosClass::BestEffort => kubepods.child("besteffort"),
    };
    let name = parent.child(&format!("pod{}", pod::uid(p)));
    match cfg.cgroup_driver {
        CgroupDriver::Systemd => name.to_systemd(),
        CgroupDriver::Cgroupfs => name.to_cgroupfs(),
    }
}

/// The node's resolver settings from its resolv.conf (upstream
/// `dns.Configurer.getHostDNSConfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HostDns {
    servers: Vec<String>,
    searches: Vec<String>,
    options: Vec<String>,
}

impl HostDns {
    /// Nameservers, search domains and options of a resolv.conf text.
    pub(crate) fn parse(text: &str) -> Self {
        let mut out = Self::default();
        // Upstream `parseResolvConf`: nameservers accumulate; the last
        // `search` and `options` lines win; search paths lose a trailing dot
        // and a lone "." is dropped; `domain` and comments are ignored.
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            let mut f = line.split_whitespace();
            match f.next() {
                Some("nameserver") => out.servers.extend(f.next().map(String::from)),
                Some("search") => {
                    out.searches = f
                        .filter(|s| *s != ".")
                        .map(|s| s.strip_suffix('.').unwrap_or(s).to_string())
                        .collect();
                }
                Some("options") => out.options = f.map(String::from).collect(),
                _ => {}
            }
        }
        out
    }

    fn unreadable(path: &str) -> Self {
        tracing::warn!(
            path,
            "Cannot read resolv.conf; pods with dnsPolicy Default get no DNS config"
        );
        Self::default()
    }

    /// Reads `path` ("" disables host DNS) off the async runtime.
    pub(crate) async fn read(path: &str) -> Self {
        if path.is_empty() {
            return Self::default();
        }
        match tokio::fs::read_to_string(path).await {
            Ok(text) => Self::parse(&text),
            Err(_) => Self::unreadable(path),
        }
    }

    /// Reads `path` on the calling thread, for tools outside the kubelet.
    pub(crate) fn read_blocking(path: &str) -> Self {
        if path.is_empty() {
            return Self::default();
        }
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text),
            Err(_) => Self::unreadable(path),
        }
    }
}

/// DNS for the sandbox by `dnsPolicy` (upstream `dns.Configurer.GetPodDNS`).
pub(crate) fn dns_config(cfg: &RuntimeConfig, p: &Pod, host: &HostDns) -> pb::DnsConfig {
    let (out, warnings) = pod_dns(cfg, p, host);
    for (reason, message) in warnings {
        tracing::warn!(pod = %pod::describe(p), reason, "{message}");
    }
    out
}

/// [`dns_config`] with the Warning events (reason, message) upstream records
/// on the pod: `MissingClusterDNS` when ClusterFirst has no cluster DNS, and
/// `DNSConfigForming` when limits cut the configuration.
pub(crate) fn pod_dns(
    cfg: &RuntimeConfig,
    p: &Pod,
    host: &HostDns,
) -> (pb::DnsConfig, Vec<(&'static str, String)>) {
    let spec = p.spec.as_ref();
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let host_net = pod::host_network(p);
    let cluster_first = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_net,
        _ => false,
    };
    let mut out = pb::DnsConfig::default();
    let mut events = Vec::new();
    let use_cluster = cluster_first && !cfg.cluster_dns.is_empty();
    if cluster_first && !use_cluster {
        events.push((
            "MissingClusterDNS",
            format!(
                "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
                format!("{}_{}({})", pod::name(p), pod::namespace(p), pod::uid(p))
            ),
        ));
    }
    if policy != "None" {
        let HostDns {
            mut servers,
            mut searches,
            options,
        } = host.clone();
        // Upstream: an empty --resolv-conf means the local resolver.
        if cfg.resolv_conf.is_empty() && !use_cluster {
            servers = vec!["127.0.0.1".to_string()];
            searches = vec![".".to_string()];
        }
        if use_cluster {
            out.servers.clone_from(&cfg.cluster_dns);
            let ns = pod::namespace(p);
            let d = cfg.cluster_domain.trim_end_matches('.');
            if !d.is_empty() {
                out.searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.to_string()];
            }
            out.searches.extend(searches);
            out.options = vec!["ndots:5".to_string()];
        } else {
            // ClusterFirst without clusterDNS falls back to the node's resolver, as upstream.
            out.servers = servers;
            out.searches = searches;
            out.options = options;
        }
    }
    if let Some(pdns) = spec.and_then(|s| s.dns_config.as_ref()) {
        // Upstream `appendDNSConfig`: duplicates dropped, options merged by name.
        out.servers
            .extend(pdns.nameservers.iter().flatten().cloned());
        out.servers = omit_duplicates(std::mem::take(&mut out.servers));
        out.searches.extend(pdns.searches.iter().flatten().cloned());
        out.searches = omit_duplicates(std::mem::take(&mut out.searches));
        for o in pdns.options.iter().flatten() {
            let Some(name) = o.name.as_deref() else {
                continue;
            };
            let opt = match o.value.as_deref() {
                Some(v) if !v.is_empty() => format!("{name}:{v}"),
                _ => name.to_string(),
            };
            match out
                .options
                .iter_mut()
                .find(|x| x.split(':').next() == Some(name))
            {
                Some(x) => *x = opt,
                None => out.options.push(opt),
            }
        }
    }
    events.extend(
        fit_limits(&mut out)
            .into_iter()
            .map(|m| ("DNSConfigForming", m)),
    );
    (out, events)
}

/// Upstream `omitDuplicates`: the first of each, in order.
fn omit_duplicates(v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    v.into_iter().filter(|x| seen.insert(x.clone())).collect()
}

/// Upstream `validation.MaxDNSNameservers`.
const MAX_DNS_NAMESERVERS: usize = 3;
/// Upstream `validation.MaxDNSSearchPaths`.
const MAX_DNS_SEARCH_PATHS: usize = 32;
/// Upstream `validation.MaxDNSSearchListChars`.
const MAX_DNS_SEARCH_LIST_CHARS: usize = 2048;
/// Upstream `DNS1123SubdomainMaxLength`: longer search paths are dropped.
const MAX_SEARCH_PATH_LEN: usize = 253;

/// Upstream `formDNSConfigFitsLimits`: at most 3 nameservers; at most 32
/// search paths of at most 253 characters, 2048 in all. Returns the
/// `DNSConfigForming` warning messages for what was cut.
fn fit_limits(out: &mut pb::DnsConfig) -> Vec<String> {
    let mut warnings = Vec::new();
    if out.servers.len() > MAX_DNS_NAMESERVERS {
        out.servers.truncate(MAX_DNS_NAMESERVERS);
        warnings.push(format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
            out.servers.join(" ")
        ));
    }
    let mut exceeded = out.searches.len() > MAX_DNS_SEARCH_PATHS;
    out.searches.truncate(MAX_DNS_SEARCH_PATHS);
    let before = out.searches.len();
    out.searches.retain(|s| s.len() <= MAX_SEARCH_PATH_LEN);
    exceeded |= out.searches.len() != before;
    let mut line = out.searches.join(" ").len();
    if line > MAX_DNS_SEARCH_LIST_CHARS {
        exceeded = true;
        while line > MAX_DNS_SEARCH_LIST_CHARS {
            let Some(last) = out.searches.pop() else {
                break;
            };
            line = line.saturating_sub(last.len() + 1);
        }
    }
    if exceeded {
        warnings.push(format!(
            "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
            out.searches.join(" ")
        ));
    }
    warnings
}

/// Upstream `GeneratePodHostNameAndDomain` and `GetNodenameForKernel`: the
/// hostname (`spec.hostname` or the pod name, cut to 63 characters) and,
/// with a `subdomain`, the domain `<subdomain>.<ns>.svc.<clusterDomain>`; the
/// kernel hostname is `<hostname>.<domain>` under `setHostnameAsFQDN`, which
/// fails past 64 characters.
pub(crate) fn kernel_hostname(cfg: &RuntimeConfig, p: &Pod) -> Result<String, HostnameError> {
    let spec = p.spec.as_ref();
    let host = hostname(p);
    let domain = match spec.and_then(|s| s.subdomain.as_deref()) {
        Some(sub) if !sub.is_empty() => {
            format!("{sub}.{}.svc.{}", pod::namespace(p), cfg.cluster_domain)
        }
        _ => String::new(),
    };
    if domain.is_empty() || spec.and_then(|s| s.set_hostname_as_fqdn) != Some(true) {
        return Ok(host);
    }
    let fqdn = format!("{host}.{domain}");
    if fqdn.len() > FQDN_MAX_LEN {
        return Err(HostnameError::FqdnTooLong { fqdn });
    }
    Ok(fqdn)
}

/// Upstream `hostnameMaxLen`/`fqdnMaxLen`: the kernel's limit.
const FQDN_MAX_LEN: usize = 64;

/// Why the sandbox hostname cannot be formed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostnameError {
    /// `setHostnameAsFQDN` with an FQDN over 64 characters (upstream's message).
    #[error(
        "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long (64 characters is the max, {} characters requested)",
        fqdn.len()
    )]
    FqdnTooLong {
        /// The FQDN that would be the hostname.
        fqdn: String,
    },
}

/// The sandbox hostname: `spec.hostname` or the pod name, at most 63 characters.
fn hostname(p: &Pod) -> String {
    let h = p
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| pod::name(p).to_string());
    let mut h: String = h.chars().take(63).collect();
    while h.ends_with(['-', '.']) {
        h.pop();
    }
    h
}

/// Upstream's `makePortMappings`: every container port of every container.
fn port_mappings(p: &Pod) -> Vec<pb::PortMapping> {
    pod::containers(p)
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|port| pb::PortMapping {
            protocol: match port.protocol.as_deref() {
                Some("UDP") => pb::Protocol::Udp as i32,
                Some("SCTP") => pb::Protocol::Sctp as i32,
                _ => pb::Protocol::Tcp as i32,
            },
            container_port: port.container_port,
            host_port: port.host_port.unwrap_or(0),
            host_ip: port.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// Upstream `ConvertSysctlVariableToDotsSeparator`: a name whose first
/// separator is `/` has its `/` and `.` swapped (`net/ipv4/conf/eth0.100/x`
/// becomes `net.ipv4.conf.eth0/100.x`).
pub(crate) fn dots_separator(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

/// The full `PodSandboxConfig` for `p` at sandbox `attempt`.
pub(crate) fn sandbox_config(
    cfg: &RuntimeConfig,
    p: &Pod,
    attempt: u32,
    host_dns: &HostDns,
) -> pb::PodSandboxConfig {
    let spec = p.spec.as_ref();
    let psc = spec.and_then(|s| s.security_context.as_ref());
    let sysctls = psc
        .and_then(|s| s.sysctls.as_ref())
        .map(|v| {
            v.iter()
                .map(|s| (dots_separator(&s.name), s.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: pod::name(p).to_string(),
            uid: pod::uid(p).to_string(),
            namespace: pod::namespace(p).to_string(),
            attempt,
        }),
        // Host-network pods share the node's UTS namespace: no hostname to set (upstream).
        hostname: if pod::host_network(p) {
            String::new()
        } else {
            kernel_hostname(cfg, p).unwrap_or_else(|e| {
                // Upstream fails the sandbox here; until the manager checks
                // [`kernel_hostname`] first, the too-long FQDN goes to the
                // runtime, which refuses it, so the sandbox fails too.
                tracing::warn!(pod = %pod::describe(p), "{e}");
                match e {
                    HostnameError::FqdnTooLong { fqdn } => fqdn,
                }
            })
        },
        log_directory: pod_logs_dir(&cfg.pod_logs_dir, p)
            .to_string_lossy()
            .into_owned(),
        dns_config: Some(dns_config(cfg, p, host_dns)),
        port_mappings: port_mappings(p),
        labels: labels::sandbox_labels(p),
        annotations: labels::sandbox_annotations(p),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(cfg, p),
            security_context: Some(sandbox_security_context(p)),
            sysctls,
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    fn cfg() -> RuntimeConfig {
        RuntimeConfig {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            resolv_conf: String::new(),
            ..RuntimeConfig::default()
        }
    }

    #[test]
    fn cluster_first_dns() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "a", "namespace": "ns1", "uid": "u"},
            "spec": {"containers": []}}),
        );
        let d = dns_config(&cfg(), &p, &HostDns::default());
        assert_eq!(d.servers, vec!["10.96.0.10"]);
        assert_eq!(
            d.searches,
            vec![
                "ns1.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(d.options, vec!["ndots:5"]);
        // hostNetwork with ClusterFirst uses the node's resolver instead: with
        // no --resolv-conf, the local one (upstream).
        let p = pod(serde_json::json!({"metadata": {"name": "a", "uid": "u"},
            "spec": {"hostNetwork": true, "containers": []}}));
        assert_eq!(
            dns_config(&cfg(), &p, &HostDns::default()).servers,
            vec!["127.0.0.1"]
        );
        // dnsPolicy None takes only the pod's dnsConfig.
        let p = pod(serde_json::json!({"metadata": {"name": "a", "uid": "u"},
            "spec": {"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "options": [{"name": "ndots", "value": "2"}]}, "containers": []}}));
        let d = dns_config(&cfg(), &p, &HostDns::default());
        assert_eq!(d.servers, vec!["1.1.1.1"]);
        assert_eq!(d.options, vec!["ndots:2"]);
    }

    #[test]
    fn qos_and_cgroup_parent() {
        let be = pod(serde_json::json!({"metadata": {"name": "a", "uid": "u-1"},
            "spec": {"containers": [{"name": "c"}]}}));
        assert_eq!(qos_class(&be), "BestEffort");
        assert_eq!(cgroup_parent(&cfg(), &be), "/kubepods/besteffort/podu-1");
        let g = pod(serde_json::json!({"metadata": {"name": "a", "uid": "u-1"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]}}));
        assert_eq!(qos_class(&g), "Guaranteed");
        let mut sd = cfg();
        sd.cgroup_driver = kubelet_types::CgroupDriver::Systemd;
        assert_eq!(
            cgroup_parent(&sd, &g),
            "/kubepods.slice/kubepods-podu_1.slice"
        );
        let b = pod(serde_json::json!({"metadata": {"name": "a", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}}));
        assert_eq!(qos_class(&b), "Burstable");
        // Upstream ignores zero quantities: this pod is BestEffort, not Burstable.
        let zero = pod(serde_json::json!({"metadata": {"name": "a", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "0"}}}]}}));
        assert_eq!(qos_class(&zero), "BestEffort");
        assert_eq!(cgroup_parent(&cfg(), &zero), "/kubepods/besteffort/podu");
    }

    #[test]
    fn sandbox_carries_upstream_labels_and_log_dir() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "web", "namespace": "default", "uid": "u1", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}}),
        );
        let c = sandbox_config(&cfg(), &p, 2, &HostDns::default());
        assert_eq!(
            c.labels.get("io.kubernetes.pod.name").map(String::as_str),
            Some("web")
        );
        assert_eq!(
            c.labels.get("io.kubernetes.pod.uid").map(String::as_str),
            Some("u1")
        );
        assert_eq!(c.labels.get("app").map(String::as_str), Some("x"));
        assert_eq!(c.log_directory, "/var/log/pods/default_web_u1");
        assert_eq!(c.metadata.as_ref().map(|m| m.attempt), Some(2));
        assert_eq!(c.port_mappings[0].host_port, 8080);
        assert_eq!(c.hostname, "web");
        let hn = pod(serde_json::json!({"metadata": {"name": "web", "uid": "u1"},
            "spec": {"hostNetwork": true, "containers": [{"name": "c"}]}}));
        let c = sandbox_config(&cfg(), &hn, 0, &HostDns::default());
        assert_eq!(
            c.hostname, "",
            "runc refuses a hostname without a private UTS namespace"
        );
        let ns = c
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options);
        assert_eq!(ns.map(|n| n.network), Some(pb::NamespaceMode::Node as i32));
    }
}

#[cfg(test)]
mod dns_tests;
