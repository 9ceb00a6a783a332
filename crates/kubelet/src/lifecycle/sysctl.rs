//! Sysctl admission (upstream `pkg/kubelet/sysctl/{allowlist.go,
//! safe_sysctls.go,namespace.go}`): a pod may set the safe sysctls (by
//! kernel version) and the namespaced ones `--allowed-unsafe-sysctls`
//! names or matches with a trailing `*`; net sysctls not with the host's
//! network, ipc ones not with the host's IPC. Anything else is
//! `SysctlForbidden`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// The namespace a sysctl lives in (upstream `utils.Namespace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ns {
    Ipc,
    Net,
}

impl Ns {
    fn as_str(self) -> &'static str {
        match self {
            Ns::Ipc => "ipc",
            Ns::Net => "net",
        }
    }
}

/// Upstream `namespaceOf`: exact names and prefixes of namespaced sysctls.
fn namespace_of(name: &str) -> Option<Ns> {
    const IPC_EXACT: &[&str] = &[
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
    ];
    if IPC_EXACT.contains(&name) || name.starts_with("fs.mqueue.") {
        return Some(Ns::Ipc);
    }
    if name.starts_with("net.") {
        return Some(Ns::Net);
    }
    None
}

/// Upstream `SafeSysctlAllowlist`: (name, minimum kernel (major, minor)).
const SAFE: &[(&str, (u32, u32))] = &[
    ("kernel.shm_rmid_forced", (0, 0)),
    ("net.ipv4.ip_local_port_range", (0, 0)),
    ("net.ipv4.tcp_syncookies", (0, 0)),
    ("net.ipv4.ping_group_range", (0, 0)),
    ("net.ipv4.ip_unprivileged_port_start", (0, 0)),
    ("net.ipv4.ip_local_reserved_ports", (3, 16)),
    ("net.ipv4.tcp_keepalive_time", (4, 5)),
    ("net.ipv4.tcp_fin_timeout", (4, 6)),
    ("net.ipv4.tcp_keepalive_intvl", (4, 5)),
    ("net.ipv4.tcp_keepalive_probes", (4, 5)),
    ("net.ipv4.tcp_rmem", (4, 15)),
    ("net.ipv4.tcp_wmem", (4, 15)),
];

/// Upstream `utils.NormalizeName`: `/` separators become dots (a name that
/// uses dots already is left alone).
pub fn normalize(name: &str) -> String {
    let Some(first) = name.find(['.', '/']) else {
        return name.to_string();
    };
    if name.as_bytes()[first] == b'.' {
        return name.to_string();
    }
    name.chars()
        .map(|c| match c {
            '/' => '.',
            '.' => '/',
            c => c,
        })
        .collect()
}

/// The allowlist of one kubelet.
#[derive(Clone, Debug, Default)]
pub struct Allowlist {
    exact: BTreeMap<String, Ns>,
    prefixes: BTreeMap<String, Ns>,
}

/// A pattern of `--allowed-unsafe-sysctls` that is not a namespaced sysctl
/// (upstream refuses to start with it).
#[derive(Debug, thiserror::Error)]
#[error("the sysctls {0:?} are not known to be namespaced")]
pub struct NotNamespaced(pub String);

impl Allowlist {
    /// The safe sysctls for `kernel` (major, minor) and the allowed unsafe
    /// patterns.
    pub fn new(kernel: (u32, u32), allowed_unsafe: &[String]) -> Result<Self, NotNamespaced> {
        let mut a = Allowlist::default();
        for (name, min) in SAFE {
            if kernel >= *min
                && let Some(ns) = namespace_of(name)
            {
                a.exact.insert(name.to_string(), ns);
            }
        }
        for pattern in allowed_unsafe {
            let p = normalize(pattern);
            match p.strip_suffix('*') {
                Some(prefix) => {
                    let ns = namespace_of(prefix)
                        .or_else(|| {
                            (prefix == "kernel.shm" || prefix == "kernel.msg").then_some(Ns::Ipc)
                        })
                        .ok_or_else(|| NotNamespaced(pattern.clone()))?;
                    a.prefixes.insert(prefix.to_string(), ns);
                }
                None => {
                    let ns = namespace_of(&p).ok_or_else(|| NotNamespaced(pattern.clone()))?;
                    a.exact.insert(p, ns);
                }
            }
        }
        Ok(a)
    }

    /// Upstream `validateSysctl`.
    fn validate(&self, sysctl: &str, host_net: bool, host_ipc: bool) -> Result<(), String> {
        let name = normalize(sysctl);
        let ns = self.exact.get(&name).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| name.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            None => Err(format!("{name:?} not allowlisted")),
            Some(ns @ Ns::Ipc) if host_ipc => Err(format!(
                "{name:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            Some(ns @ Ns::Net) if host_net => Err(format!(
                "{name:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            Some(_) => Ok(()),
        }
    }

    /// Upstream `patternAllowlist.Admit`: `SysctlForbidden` with upstream's message.
    pub fn admit(&self, p: &Pod) -> Result<(), (String, String)> {
        let Some(spec) = p.spec.as_ref() else {
            return Ok(());
        };
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_ref());
        for s in sysctls.into_iter().flatten() {
            self.validate(
                &s.name,
                spec.host_network.unwrap_or(false),
                spec.host_ipc.unwrap_or(false),
            )
            .map_err(|e| {
                (
                    "SysctlForbidden".to_string(),
                    format!("forbidden sysctl: {e}"),
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(sysctls: &[&str], host_net: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"hostNetwork": host_net, "containers": [],
                     "securityContext": {"sysctls": sysctls.iter().map(|n| serde_json::json!({"name": n, "value": "1"})).collect::<Vec<_>>()}}
        }))
        .expect("pod")
    }

    #[test]
    fn safe_sysctls_pass_unsafe_ones_need_the_flag() {
        let a = Allowlist::new((6, 1), &[]).expect("allowlist");
        assert!(
            a.admit(&pod(
                &["kernel.shm_rmid_forced", "net/ipv4/tcp_syncookies"],
                false
            ))
            .is_ok()
        );
        let (reason, message) = a
            .admit(&pod(&["kernel.msgmax"], false))
            .expect_err("unsafe");
        assert_eq!(reason, "SysctlForbidden");
        assert_eq!(
            message,
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
        let a = Allowlist::new((6, 1), &["kernel.msg*".into(), "net.core.somaxconn".into()])
            .expect("allowlist");
        assert!(
            a.admit(&pod(&["kernel.msgmax", "net.core.somaxconn"], false))
                .is_ok()
        );
        assert_eq!(
            a.admit(&pod(&["net.core.somaxconn"], true))
                .expect_err("host net")
                .1,
            "forbidden sysctl: \"net.core.somaxconn\" not allowed with host net enabled"
        );
    }

    #[test]
    fn kernel_version_gates_and_non_namespaced_patterns_are_refused() {
        let old = Allowlist::new((4, 4), &[]).expect("allowlist");
        assert!(old.admit(&pod(&["net.ipv4.tcp_rmem"], false)).is_err());
        assert!(Allowlist::new((4, 4), &["kernel.sysrq".into()]).is_err());
        assert_eq!(
            normalize("net/ipv4/conf/eth0.100/forwarding"),
            "net.ipv4.conf.eth0/100.forwarding"
        );
        assert_eq!(normalize("net.ipv4.ip_forward"), "net.ipv4.ip_forward");
    }
}
