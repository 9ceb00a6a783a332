//! The effective configuration as upstream's `/configz` serves it: a
//! `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration` under the
//! `kubeletconfig` key, with durations in Go's spelling. Fields kubelet-rs
//! resolves are written with their effective values; settings it accepts but
//! does not act on appear as given (flag or file), and are absent otherwise.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::settings::SettingValue;
use crate::{GoDuration, KubeletConfig};

fn go(d: Duration) -> String {
    GoDuration::from_std(d).to_string()
}

fn setting_json(v: &SettingValue) -> Value {
    match v {
        SettingValue::Bool(b) => json!(b),
        SettingValue::Int(i) => json!(i),
        SettingValue::Float(f) => json!(f),
        SettingValue::String(s) => json!(s),
        SettingValue::Duration(d) => json!(d.to_string()),
        SettingValue::List(l) => json!(l),
        SettingValue::Map(m) => json!(m),
        SettingValue::Json(j) => j.clone(),
    }
}

/// Sets `path` (dotted) in `obj`, creating objects on the way.
fn set_path(obj: &mut Map<String, Value>, path: &str, v: Value) {
    let mut parts = path.split('.').peekable();
    let mut cur = obj;
    while let Some(key) = parts.next() {
        if parts.peek().is_none() {
            cur.insert(key.to_string(), v);
            return;
        }
        let next = cur
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !next.is_object() {
            *next = Value::Object(Map::new());
        }
        let Value::Object(m) = next else { return };
        cur = m;
    }
}

/// The `/configz` body.
pub fn configz(cfg: &KubeletConfig) -> Value {
    let mut m = Map::new();
    // Settings first, so that effective values below win.
    for (path, v) in &cfg.settings {
        set_path(&mut m, path, setting_json(v));
    }
    let s = &cfg.server;
    let c = &cfg.cluster;
    let effective = json!({
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "enableServer": s.enable_server,
        "staticPodPath": cfg.static_pod_path.as_ref().map(|p| p.display().to_string()),
        "staticPodURL": cfg.static_pod_url,
        "syncFrequency": go(cfg.sync_frequency),
        "fileCheckFrequency": go(cfg.file_check_frequency),
        "httpCheckFrequency": go(cfg.http_check_frequency),
        "address": s.address.to_string(),
        "port": s.port,
        "readOnlyPort": s.read_only_port,
        "tlsCertFile": s.tls_cert_file.as_ref().map(|p| p.display().to_string()),
        "tlsPrivateKeyFile": s.tls_private_key_file.as_ref().map(|p| p.display().to_string()),
        "tlsCipherSuites": if s.tls_cipher_suites.is_empty() { Value::Null } else { json!(s.tls_cipher_suites) },
        "tlsMinVersion": s.tls_min_version,
        "rotateCertificates": c.rotate_certificates,
        "serverTLSBootstrap": s.server_tls_bootstrap,
        "authentication": {
            "x509": {"clientCAFile": s.authentication.client_ca_file.as_ref().map(|p| p.display().to_string())},
            "webhook": {"enabled": s.authentication.webhook_enabled, "cacheTTL": go(s.authentication.webhook_cache_ttl)},
            "anonymous": {"enabled": s.authentication.anonymous_enabled},
        },
        "authorization": {
            "mode": s.authorization.mode.as_str(),
            "webhook": {
                "cacheAuthorizedTTL": go(s.authorization.cache_authorized_ttl),
                "cacheUnauthorizedTTL": go(s.authorization.cache_unauthorized_ttl),
            },
        },
    });
    let more = json!({
        "eventRecordQPS": c.event_record_qps,
        "eventBurst": c.event_burst,
        "enableDebuggingHandlers": s.enable_debugging_handlers,
        "enableDebugFlagsHandler": s.enable_debug_flags_handler,
        "healthzPort": cfg.healthz_port,
        "healthzBindAddress": cfg.healthz_bind_address.to_string(),
        "clusterDomain": cfg.cluster_domain,
        "clusterDNS": cfg.cluster_dns,
        "streamingConnectionIdleTimeout": go(s.streaming_connection_idle_timeout),
        "nodeStatusUpdateFrequency": go(c.node_status_update_frequency),
        "nodeStatusReportFrequency": go(c.node_status_report_frequency),
        "nodeLeaseDurationSeconds": c.node_lease_duration_seconds,
        "cgroupRoot": cfg.cgroup_root,
        "cgroupDriver": cfg.cgroup_driver.as_str(),
        "runtimeRequestTimeout": go(cfg.runtime_request_timeout),
        "maxPods": cfg.max_pods,
        "resolvConf": cfg.resolv_conf,
        "kubeAPIQPS": c.kube_api_qps,
        "kubeAPIBurst": c.kube_api_burst,
        "kubeReserved": c.kube_reserved,
        "systemReserved": c.system_reserved,
        "evictionHard": c.eviction_hard,
        "featureGates": cfg.feature_gates,
        "registerNode": c.register_node,
        "registerWithTaints": cfg.register_with_taints.iter().map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect})).collect::<Vec<_>>(),
        "containerRuntimeEndpoint": cfg.container_runtime_endpoint,
        "imageServiceEndpoint": cfg.image_service_endpoint,
        "podLogsDir": cfg.pod_logs_dir.display().to_string(),
        "providerID": cfg.provider_id,
        "logging": {"verbosity": cfg.verbosity},
    });
    let fields = [effective, more]
        .into_iter()
        .filter_map(|v| match v {
            Value::Object(o) => Some(o),
            _ => None,
        })
        .flatten();
    {
        for (k, v) in fields {
            if v.is_null() {
                continue;
            }
            match (m.get_mut(&k), v) {
                (Some(Value::Object(have)), Value::Object(want)) => {
                    for (k2, v2) in want {
                        have.insert(k2, v2);
                    }
                }
                (_, v) => {
                    m.insert(k, v);
                }
            }
        }
    }
    json!({ "kubeletconfig": Value::Object(m) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Flags;

    #[test]
    fn the_effective_configuration_in_upstreams_shape() {
        let flags = Flags::parse_args([
            "kubelet-rs",
            "--sync-frequency=30s",
            "--image-gc-high-threshold=90",
            "--authorization-mode=Webhook",
        ])
        .expect("flags");
        let cfg = KubeletConfig::resolve(&flags, None, "node-a").expect("config");
        let v = configz(&cfg);
        let k = &v["kubeletconfig"];
        assert_eq!(k["kind"], "KubeletConfiguration");
        assert_eq!(k["apiVersion"], "kubelet.config.k8s.io/v1beta1");
        assert_eq!(k["syncFrequency"], "30s");
        assert_eq!(k["port"], 10250);
        assert_eq!(k["readOnlyPort"], 10255);
        assert_eq!(k["authorization"]["mode"], "Webhook");
        assert_eq!(k["authorization"]["webhook"]["cacheAuthorizedTTL"], "5m0s");
        assert_eq!(k["authentication"]["anonymous"]["enabled"], true);
        assert_eq!(
            k["imageGCHighThresholdPercent"], 90,
            "given settings appear"
        );
        assert_eq!(k["runtimeRequestTimeout"], "2m0s");
        assert!(k.get("tlsCertFile").is_none(), "unset fields are omitted");
    }
}
