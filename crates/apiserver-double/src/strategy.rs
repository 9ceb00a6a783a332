//! Create/update strategies of the core kinds besides pods: Service
//! (upstream `pkg/registry/core/service` with its ClusterIP allocator
//! `pkg/registry/core/service/ipallocator` and the v1 defaults of
//! `pkg/apis/core/v1/defaults.go`), Secret (`stringData` folded into `data`
//! by the v1 conversion, `type` defaulted to `Opaque`), Namespace (the
//! `kubernetes` finalizer, `Active` phase and `kubernetes.io/metadata.name`
//! label), PersistentVolume and PersistentVolumeClaim defaults.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use base64::Engine;
use serde_json::{Value, json};

use crate::field::{BadValue, ErrorType, FieldError};
use crate::store::Store;

/// The service CIDR ClusterIPs come from (kubeadm's default `10.96.0.0/12`).
pub const SERVICE_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 96, 0, 0), 12);

/// The first address of [`SERVICE_CIDR`], reserved for the `kubernetes` Service.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

fn range() -> (u32, u32) {
    let base = u32::from(SERVICE_CIDR.0);
    let size = 1u32 << (32 - u32::from(SERVICE_CIDR.1));
    // Network and broadcast addresses are never handed out.
    (base + 1, base + size - 2)
}

fn in_range(ip: Ipv4Addr) -> bool {
    let (lo, hi) = range();
    (lo..=hi).contains(&u32::from(ip))
}

fn allocated(store: &Store) -> BTreeSet<String> {
    store
        .list("services", None)
        .iter()
        .filter_map(|s| s.pointer("/spec/clusterIP").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

fn ip_error(ip: &str, why: &str) -> FieldError {
    FieldError::invalid(
        "spec.clusterIPs",
        BadValue::Raw(format!("[]string{{{ip:?}}}")),
        format!("failed to allocate IP {ip}: {why}"),
    )
}

/// Applies the kind's create strategy to `obj` (already carrying its metadata).
pub(crate) fn on_create(
    resource: &str,
    store: &Store,
    obj: &mut Value,
) -> Result<(), Vec<FieldError>> {
    match resource {
        "services" => service_on_create(store, obj),
        "secrets" => {
            secret_on_write(obj);
            Ok(())
        }
        "namespaces" => {
            let name = obj["metadata"]["name"].clone();
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
            obj["spec"]["finalizers"] = json!(["kubernetes"]);
            obj["status"] = json!({"phase": "Active"});
            Ok(())
        }
        "persistentvolumeclaims" => {
            default_str(obj, "/spec", "volumeMode", "Filesystem");
            if obj.pointer("/status/phase").is_none() {
                obj["status"] = json!({"phase": "Pending"});
            }
            Ok(())
        }
        "persistentvolumes" => {
            default_str(obj, "/spec", "volumeMode", "Filesystem");
            default_str(obj, "/spec", "persistentVolumeReclaimPolicy", "Retain");
            if obj.pointer("/status/phase").is_none() {
                obj["status"] = json!({"phase": "Pending"});
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Applies the kind's update strategy to `new`, given the stored `old`.
pub(crate) fn on_update(
    resource: &str,
    old: &Value,
    new: &mut Value,
) -> Result<(), Vec<FieldError>> {
    match resource {
        "secrets" => {
            secret_on_write(new);
            Ok(())
        }
        "services" => {
            // An update that leaves the ClusterIP out keeps the allocated one
            // (upstream `patchAllocatedValues`); changing it is invalid.
            for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                let unset = new["spec"]
                    .get(f)
                    .is_none_or(|v| v.is_null() || *v == json!(""));
                if unset && let Some(v) = old["spec"].get(f) {
                    new["spec"][f] = v.clone();
                }
            }
            let old_ip = old
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .unwrap_or("");
            let new_ip = new
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .unwrap_or("");
            if old_ip != new_ip {
                return Err(vec![FieldError::invalid(
                    "spec.clusterIPs[0]",
                    new_ip,
                    "may not change once set",
                )]);
            }
            service_defaults(new);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn default_str(obj: &mut Value, at: &str, field: &str, value: &str) {
    if obj.pointer(at).is_none()
        && let Some(p) = at.strip_prefix('/')
    {
        obj[p] = json!({});
    }
    if let Some(o) = obj.pointer_mut(at).and_then(Value::as_object_mut) {
        let e = o.entry(field).or_insert(json!(""));
        if e.as_str().is_none_or(str::is_empty) {
            *e = json!(value);
        }
    }
}

/// `stringData` is write-only: its keys overwrite `data` (base64) and it is
/// never stored; `type` defaults to `Opaque`.
fn secret_on_write(obj: &mut Value) {
    if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|o| o.remove("stringData")) {
        for (k, v) in sd {
            let text = v.as_str().unwrap_or_default();
            obj["data"][k.as_str()] =
                json!(base64::engine::general_purpose::STANDARD.encode(text.as_bytes()));
        }
    }
    if obj
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        obj["type"] = json!("Opaque");
    }
}

fn service_defaults(obj: &mut Value) {
    default_str(obj, "/spec", "type", "ClusterIP");
    default_str(obj, "/spec", "sessionAffinity", "None");
    let cluster_type = matches!(
        obj.pointer("/spec/type").and_then(Value::as_str),
        Some("ClusterIP" | "NodePort" | "LoadBalancer")
    );
    if cluster_type {
        default_str(obj, "/spec", "internalTrafficPolicy", "Cluster");
    }
    if let Some(ports) = obj.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
        for p in ports {
            if p.get("protocol")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                p["protocol"] = json!("TCP");
            }
            let target_unset = p
                .get("targetPort")
                .is_none_or(|t| t.is_null() || *t == json!(0) || *t == json!(""));
            if target_unset && let Some(port) = p.get("port").cloned() {
                p["targetPort"] = port;
            }
        }
    }
    if obj.get("status").is_none_or(|s| !s.is_object()) {
        obj["status"] = json!({"loadBalancer": {}});
    }
}

fn service_on_create(store: &Store, obj: &mut Value) -> Result<(), Vec<FieldError>> {
    service_defaults(obj);
    let requested = obj
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if obj.pointer("/spec/type").and_then(Value::as_str) == Some("ExternalName") {
        // An ExternalName service is a DNS alias: no address, no ports needed.
        return Ok(());
    }
    let headless = requested == "None";
    let mut errs = Vec::new();
    let ports = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && !headless {
        errs.push(FieldError::required("spec.ports", ""));
    }
    for (i, p) in ports.iter().enumerate() {
        let n = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        crate::field::port_num(
            &format!("spec.ports[{i}].port"),
            i32::try_from(n).unwrap_or(0),
            &mut errs,
        );
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let ip = if headless {
        "None".to_string()
    } else if requested.is_empty() {
        allocate(store).ok_or_else(|| {
            vec![FieldError {
                field: "spec.clusterIPs".into(),
                kind: ErrorType::Invalid(BadValue::Raw("[]string(nil)".into())),
                detail: "failed to allocate a serviceIP: range is full".into(),
            }]
        })?
    } else {
        match requested.parse::<Ipv4Addr>() {
            Ok(ip) if !in_range(ip) => {
                let (net, bits) = SERVICE_CIDR;
                return Err(vec![ip_error(
                    &requested,
                    &format!(
                        "the provided IP ({requested}) is not in the valid range. The range of valid IPs is {net}/{bits}"
                    ),
                )]);
            }
            Ok(_) if allocated(store).contains(&requested) => {
                return Err(vec![ip_error(
                    &requested,
                    "provided IP is already allocated",
                )]);
            }
            Ok(_) => requested,
            Err(_) => {
                return Err(vec![FieldError::invalid(
                    "spec.clusterIPs[0]",
                    requested.as_str(),
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                )]);
            }
        }
    };
    obj["spec"]["clusterIP"] = json!(ip);
    obj["spec"]["clusterIPs"] = json!([ip]);
    obj["spec"]["ipFamilies"] = json!(["IPv4"]);
    obj["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    Ok(())
}

/// A free address of the range, picked at random as upstream's bitmap
/// allocator does (the reserved first address excluded).
fn allocate(store: &Store) -> Option<String> {
    let used = allocated(store);
    let (lo, hi) = range();
    let first = u32::from(KUBERNETES_SERVICE_IP);
    let span = hi - lo + 1;
    let start: u32 = rand::random_range(0..span);
    (0..span)
        .map(|i| lo + (start + i) % span)
        .filter(|a| *a != first)
        .map(|a| Ipv4Addr::from(a).to_string())
        .find(|ip| !used.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Key;

    fn svc(ip: Option<&str>) -> Value {
        let mut s = json!({"metadata": {"name": "s", "namespace": "default"},
            "spec": {"ports": [{"port": 80}]}});
        if let Some(ip) = ip {
            s["spec"]["clusterIP"] = json!(ip);
        }
        s
    }

    #[test]
    fn services_get_a_cluster_ip_in_range_and_defaults() {
        let store = Store::new(10);
        let mut s = svc(None);
        on_create("services", &store, &mut s).expect("valid");
        let ip: Ipv4Addr = s["spec"]["clusterIP"]
            .as_str()
            .expect("ip")
            .parse()
            .expect("ipv4");
        assert!(in_range(ip) && ip != KUBERNETES_SERVICE_IP, "{ip}");
        assert_eq!(s["spec"]["clusterIPs"], json!([ip.to_string()]));
        assert_eq!(s["spec"]["ports"][0]["protocol"], json!("TCP"));
        assert_eq!(s["spec"]["ports"][0]["targetPort"], json!(80));
        assert_eq!(s["spec"]["type"], json!("ClusterIP"));
        let mut h = svc(Some("None"));
        on_create("services", &store, &mut h).expect("headless");
        assert_eq!(h["spec"]["clusterIPs"], json!(["None"]));
    }

    #[test]
    fn a_taken_or_foreign_cluster_ip_is_invalid() {
        let mut store = Store::new(10);
        let mut s = svc(Some("10.96.0.20"));
        on_create("services", &store, &mut s).expect("free");
        store.put(
            Key {
                resource: "services".into(),
                namespace: "default".into(),
                name: "s".into(),
            },
            s,
        );
        let err = on_create("services", &store, &mut svc(Some("10.96.0.20"))).unwrap_err();
        assert_eq!(
            err[0].to_string(),
            "spec.clusterIPs: Invalid value: []string{\"10.96.0.20\"}: failed to allocate IP 10.96.0.20: provided IP is already allocated"
        );
        let err = on_create("services", &store, &mut svc(Some("192.168.0.1"))).unwrap_err();
        assert!(
            err[0].to_string().contains("is not in the valid range"),
            "{}",
            err[0]
        );
        let err =
            on_create("services", &store, &mut json!({"metadata": {}, "spec": {}})).unwrap_err();
        assert_eq!(err[0].to_string(), "spec.ports: Required value");
    }

    #[test]
    fn string_data_is_folded_into_data() {
        let mut s =
            json!({"metadata": {}, "data": {"a": "eA=="}, "stringData": {"b": "hi", "a": "y"}});
        on_create("secrets", &Store::new(1), &mut s).expect("valid");
        assert_eq!(
            s,
            json!({"metadata": {}, "data": {"a": "eQ==", "b": "aGk="}, "type": "Opaque"})
        );
    }
}
