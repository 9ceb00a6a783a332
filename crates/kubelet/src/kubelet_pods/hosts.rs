//! The kubelet-managed `/etc/hosts` (upstream `kubelet_pods.go`
//! `makeHostsMount`, `ensureHostsFile`, `managedHostsFileContent`,
//! `nodeHostsFileContent`, `hostsEntriesFromHostAliases`) and the pod's
//! hostname and domain (`GeneratePodHostNameAndDomain`).

use std::path::{Path, PathBuf};

use cri::pb;
use k8s_openapi::api::core::v1::{HostAlias, Pod};
use kubelet_types::pod;

/// The header of a managed hosts file.
const MANAGED_HOSTS_HEADER: &str = "# Kubernetes-managed hosts file.\n";
/// The header of a host-network pod's hosts file.
const MANAGED_HOSTS_HEADER_WITH_HOST_NETWORK: &str =
    "# Kubernetes-managed hosts file (host network).\n";

/// Upstream `truncatePodHostnameIfNeeded` + `GeneratePodHostNameAndDomain`:
/// `spec.hostname` or the pod name (cut to 63 characters, without a
/// trailing `-` or `.`), and `<subdomain>.<ns>.svc.<clusterDomain>` when
/// `spec.subdomain` is set.
pub fn pod_hostname_and_domain(p: &Pod, cluster_domain: &str) -> (String, String) {
    let spec = p.spec.as_ref();
    let hostname = match spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
    {
        Some(h) => h.to_string(),
        None => {
            let name = pod::name(p);
            if name.len() <= 63 {
                name.to_string()
            } else {
                name[..63].trim_end_matches(['-', '.']).to_string()
            }
        }
    };
    let domain = match spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|d| !d.is_empty())
    {
        Some(sub) => format!("{sub}.{}.svc.{cluster_domain}", pod::namespace(p)),
        None => String::new(),
    };
    (hostname, domain)
}

/// Upstream `hostsEntriesFromHostAliases`.
fn host_aliases(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.clone().unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{names}\n", a.ip));
    }
    out
}

/// Upstream `managedHostsFileContent`.
pub fn managed_hosts_file_content(
    pod_ips: &[String],
    hostname: &str,
    domain: &str,
    aliases: &[HostAlias],
) -> String {
    let mut out = String::from(MANAGED_HOSTS_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        if domain.is_empty() {
            out.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
        }
    }
    out.push_str(&host_aliases(aliases));
    out
}

/// Upstream `nodeHostsFileContent`: the node's hosts file and the aliases.
pub fn node_hosts_file_content(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!(
        "{MANAGED_HOSTS_HEADER_WITH_HOST_NETWORK}{node_hosts}{}",
        host_aliases(aliases)
    )
}

/// `<pods_dir>/<uid>/etc-hosts`.
pub fn etc_hosts_path(pods_dir: &Path, uid: &str) -> PathBuf {
    pods_dir.join(uid).join("etc-hosts")
}

/// Writes the pod's hosts file (upstream `ensureHostsFile`, mode 0644) and
/// returns its mount on `/etc/hosts` (upstream `makeHostsMount`).
/// `node_hosts` is the node's `/etc/hosts`, read for host-network pods.
pub async fn make_hosts_mount(
    p: &Pod,
    pods_dir: &Path,
    pod_ips: &[String],
    cluster_domain: &str,
    node_hosts: &Path,
) -> std::io::Result<pb::Mount> {
    let (hostname, domain) = pod_hostname_and_domain(p, cluster_domain);
    let aliases = p
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.clone())
        .unwrap_or_default();
    let content = if pod::host_network(p) {
        let node = tokio::fs::read_to_string(node_hosts).await?;
        node_hosts_file_content(&node, &aliases)
    } else {
        managed_hosts_file_content(pod_ips, &hostname, &domain, &aliases)
    };
    let path = etc_hosts_path(pods_dir, pod::uid(p));
    let write = path.clone();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::PermissionsExt;
        if let Some(dir) = write.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&write, content)?;
        std::fs::set_permissions(&write, std::fs::Permissions::from_mode(0o644))
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok(pb::Mount {
        container_path: "/etc/hosts".into(),
        host_path: path.to_string_lossy().into_owned(),
        readonly: false,
        selinux_relabel: true,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alias(ip: &str, names: &[&str]) -> HostAlias {
        HostAlias {
            ip: ip.into(),
            hostnames: Some(names.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn managed_content_as_upstreams_unit_test() {
        let got = managed_hosts_file_content(
            &["203.0.113.1".into()],
            "podFoo",
            "domainFoo",
            &[
                alias("123.45.67.89", &["foo", "bar", "baz"]),
                alias("456.78.90.123", &["park", "doo", "boo"]),
            ],
        );
        assert_eq!(
            got,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n203.0.113.1\tpodFoo.domainFoo\tpodFoo\n\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\tbaz\n456.78.90.123\tpark\tdoo\tboo\n"
        );
        let plain =
            managed_hosts_file_content(&["10.0.0.2".into(), "fd00::2".into()], "web", "", &[]);
        assert!(
            plain.ends_with("fe00::2\tip6-allrouters\n10.0.0.2\tweb\nfd00::2\tweb\n"),
            "{plain}"
        );
    }

    #[test]
    fn host_network_content_is_the_nodes_file_and_the_aliases() {
        let got = node_hosts_file_content("127.0.0.1\tlocalhost\n", &[alias("1.2.3.4", &["x"])]);
        assert_eq!(
            got,
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1\tlocalhost\n\n# Entries added by HostAliases.\n1.2.3.4\tx\n"
        );
    }

    #[test]
    fn hostname_and_domain() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{}-x", "a".repeat(62)), "namespace": "ns", "uid": "u"},
            "spec": {"subdomain": "sub", "containers": []}
        }))
        .expect("pod");
        let (h, d) = pod_hostname_and_domain(&p, "cluster.local");
        assert_eq!(h, "a".repeat(62), "cut to 63 without the trailing '-'");
        assert_eq!(d, "sub.ns.svc.cluster.local");
    }

    #[tokio::test]
    async fn the_file_is_written_0644_and_mounted_on_etc_hosts() {
        let dir = tempfile::tempdir().expect("tmp");
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"hostname": "h", "containers": []}
        }))
        .expect("pod");
        let m = make_hosts_mount(
            &p,
            dir.path(),
            &["10.1.1.1".into()],
            "cluster.local",
            Path::new("/etc/hosts"),
        )
        .await
        .expect("mount");
        assert_eq!(m.container_path, "/etc/hosts");
        let path = dir.path().join("u1/etc-hosts");
        assert_eq!(m.host_path, path.to_string_lossy());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).expect("stat").permissions(),
        );
        assert_eq!(mode & 0o777, 0o644);
        assert!(
            std::fs::read_to_string(&path)
                .expect("read")
                .ends_with("10.1.1.1\th\n")
        );
    }
}
