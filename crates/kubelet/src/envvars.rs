//! Service environment variables (upstream `pkg/kubelet/envvars`
//! `FromServices`, and `getServiceEnvVarMap` in `kubelet_pods.go`):
//! `<NAME>_SERVICE_HOST`/`_PORT*` and the Docker-link `<NAME>_PORT*`
//! variables of the `kubernetes` Service and, with `enableServiceLinks`, of
//! the pod namespace's Services.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

/// Upstream `makeEnvVariableName`.
fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// Upstream `IsServiceIPSet`.
fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec
        .as_ref()
        .and_then(|sp| sp.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
}

/// `host:port`, with brackets for IPv6 (Go's `net.JoinHostPort`).
fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Upstream `FromServices`, in its order.
pub fn from_services<'a>(services: impl IntoIterator<Item = &'a Service>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in services {
        let Some(ip) = cluster_ip(s) else { continue };
        let ports = s
            .spec
            .as_ref()
            .and_then(|sp| sp.ports.as_ref())
            .cloned()
            .unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        let prefix = env_name(s.metadata.name.as_deref().unwrap_or(""));
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.push((port_var.clone(), first.port.to_string()));
        for p in &ports {
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{port_var}_{}", env_name(n)), p.port.to_string()));
            }
        }
        // Docker-compatible link variables.
        for (i, p) in ports.iter().enumerate() {
            let proto = p
                .protocol
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("TCP");
            let url = format!("{}://{}", proto.to_lowercase(), join_host_port(ip, p.port));
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.push((pp.clone(), url));
            out.push((format!("{pp}_PROTO"), proto.to_lowercase()));
            out.push((format!("{pp}_PORT"), p.port.to_string()));
            out.push((format!("{pp}_ADDR"), ip.to_string()));
        }
    }
    out
}

/// Upstream `getServiceEnvVarMap`: the `kubernetes` Service of `default`
/// always, the pod namespace's Services when `enable_service_links`.
pub fn service_env_var_map(
    services: &[Service],
    namespace: &str,
    enable_service_links: bool,
) -> BTreeMap<String, String> {
    let mut by_name: BTreeMap<&str, &Service> = BTreeMap::new();
    for s in services {
        if cluster_ip(s).is_none() {
            continue;
        }
        let name = s.metadata.name.as_deref().unwrap_or("");
        let ns = s.metadata.namespace.as_deref().unwrap_or("");
        if ns == "default" && name == "kubernetes" {
            by_name.entry(name).or_insert(s);
        } else if ns == namespace && enable_service_links {
            by_name.insert(name, s);
        }
    }
    from_services(by_name.into_values()).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports}
        }))
        .expect("service")
    }

    #[test]
    fn from_services_as_upstreams_unit_test() {
        let services = [
            svc(
                "default",
                "foo-bar",
                "1.2.3.4",
                serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "https", "port": 8443, "protocol": "TCP"}]),
            ),
            svc(
                "default",
                "abc-123",
                "5.6.7.8",
                serde_json::json!([{"name": "u-d-p", "port": 8081, "protocol": "UDP"}, {"name": "t-c-p", "port": 8443, "protocol": "TCP"}]),
            ),
            svc(
                "default",
                "q-u-u-x",
                "9.8.7.6",
                serde_json::json!([{"port": 8082, "protocol": "TCP"}, {"name": "8083", "port": 8083, "protocol": "TCP"}]),
            ),
            svc(
                "default",
                "svrc-clusterip-none",
                "None",
                serde_json::json!([{"port": 8082, "protocol": "TCP"}]),
            ),
            svc(
                "default",
                "svrc-clusterip-empty",
                "",
                serde_json::json!([{"port": 8082, "protocol": "TCP"}]),
            ),
            svc(
                "default",
                "v6",
                "2001:db8::",
                serde_json::json!([{"port": 8084, "protocol": "TCP"}]),
            ),
        ];
        let vars = from_services(services.iter());
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("FOO_BAR_SERVICE_HOST"), Some("1.2.3.4"));
        assert_eq!(get("FOO_BAR_SERVICE_PORT"), Some("8080"));
        assert_eq!(get("FOO_BAR_SERVICE_PORT_HTTP"), Some("8080"));
        assert_eq!(get("FOO_BAR_SERVICE_PORT_HTTPS"), Some("8443"));
        assert_eq!(get("FOO_BAR_PORT"), Some("tcp://1.2.3.4:8080"));
        assert_eq!(get("FOO_BAR_PORT_8080_TCP"), Some("tcp://1.2.3.4:8080"));
        assert_eq!(get("FOO_BAR_PORT_8080_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("FOO_BAR_PORT_8080_TCP_PORT"), Some("8080"));
        assert_eq!(get("FOO_BAR_PORT_8080_TCP_ADDR"), Some("1.2.3.4"));
        assert_eq!(get("ABC_123_SERVICE_PORT_U_D_P"), Some("8081"));
        assert_eq!(get("ABC_123_PORT"), Some("udp://5.6.7.8:8081"));
        assert_eq!(get("ABC_123_PORT_8081_UDP_PROTO"), Some("udp"));
        assert_eq!(get("Q_U_U_X_SERVICE_PORT_8083"), Some("8083"));
        assert_eq!(get("V6_PORT"), Some("tcp://[2001:db8::]:8084"));
        assert!(
            vars.iter().all(|(n, _)| !n.starts_with("SVRC_")),
            "headless services skipped"
        );
        assert_eq!(vars.len(), 13 + 13 + 12 + 7, "{vars:?}");
    }

    #[test]
    fn the_kubernetes_service_always_and_the_namespace_only_with_links() {
        let services = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443, "protocol": "TCP"}]),
            ),
            svc(
                "default",
                "other",
                "10.96.0.2",
                serde_json::json!([{"port": 80}]),
            ),
            svc("ns", "web", "10.96.0.3", serde_json::json!([{"port": 80}])),
            svc(
                "ns",
                "kubernetes",
                "10.96.0.4",
                serde_json::json!([{"port": 1}]),
            ),
        ];
        let m = service_env_var_map(&services, "ns", false);
        assert_eq!(
            m.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
            Some("10.96.0.1")
        );
        assert_eq!(
            m.get("KUBERNETES_SERVICE_PORT_HTTPS").map(String::as_str),
            Some("443")
        );
        assert!(!m.contains_key("WEB_SERVICE_HOST") && !m.contains_key("OTHER_SERVICE_HOST"));
        let m = service_env_var_map(&services, "ns", true);
        assert_eq!(
            m.get("WEB_SERVICE_HOST").map(String::as_str),
            Some("10.96.0.3")
        );
        assert_eq!(
            m.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
            Some("10.96.0.4"),
            "a same-named service of the pod's namespace wins, as upstream"
        );
    }
}
