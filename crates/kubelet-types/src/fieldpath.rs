//! Downward API field and resource selectors (upstream `pkg/fieldpath`
//! `ExtractFieldPathAsString`/`FormatMap`/`SplitMaybeSubscriptedPath`, and
//! `pkg/api/v1/resource` `ExtractContainerResourceValue`,
//! `MergeContainerResourceLimits`), shared by the downward API volume and
//! the container environment.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::quantity::Quantity;

/// A selector that cannot be resolved; messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldPathError {
    /// Not a field the downward API exposes.
    #[error("unsupported fieldPath: {0}")]
    Unsupported(String),
    /// A subscript on a field that has none.
    #[error("fieldPath {0:?} does not support subscript")]
    Subscript(String),
    /// Not a resource the downward API exposes.
    #[error("unsupported container resource : {0}")]
    Resource(String),
    /// `containerName` names no container of the pod.
    #[error("container {0} not found")]
    Container(String),
    /// A quantity that does not parse.
    #[error("invalid quantity {0:?}")]
    Quantity(String),
}

/// Upstream `SplitMaybeSubscriptedPath`: `metadata.labels['k']` →
/// (`metadata.labels`, `k`).
pub fn split_maybe_subscripted_path(field_path: &str) -> Option<(&str, &str)> {
    let s = field_path.strip_suffix("']")?;
    let (path, subscript) = s.split_once("['")?;
    (!path.is_empty()).then_some((path, subscript))
}

/// Go's `%q` of a string (`strconv.Quote`).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                let n = c as u32;
                if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Upstream `FormatMap`: `key="value"` lines, keys sorted, no trailing newline.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Upstream `ExtractFieldPathAsString` on a pod: `metadata.name`,
/// `metadata.namespace`, `metadata.uid`, `metadata.labels`,
/// `metadata.annotations` (whole maps as [`format_map`]) and
/// `metadata.labels['k']`/`metadata.annotations['k']`. Fields only the
/// kubelet knows (`spec.nodeName`, `status.podIP`, ...) are resolved by the
/// environment code before it falls back to this.
pub fn extract_field_path_as_string(pod: &Pod, field_path: &str) -> Result<String, FieldPathError> {
    let md = &pod.metadata;
    if let Some((path, subscript)) = split_maybe_subscripted_path(field_path) {
        let map = match path {
            "metadata.annotations" => md.annotations.as_ref(),
            "metadata.labels" => md.labels.as_ref(),
            _ => return Err(FieldPathError::Subscript(field_path.to_string())),
        };
        return Ok(map
            .and_then(|m| m.get(subscript))
            .cloned()
            .unwrap_or_default());
    }
    let empty = BTreeMap::new();
    Ok(match field_path {
        "metadata.annotations" => format_map(md.annotations.as_ref().unwrap_or(&empty)),
        "metadata.labels" => format_map(md.labels.as_ref().unwrap_or(&empty)),
        "metadata.name" => md.name.clone().unwrap_or_default(),
        "metadata.namespace" => md.namespace.clone().unwrap_or_default(),
        "metadata.uid" => md.uid.clone().unwrap_or_default(),
        _ => return Err(FieldPathError::Unsupported(field_path.to_string())),
    })
}

fn quantity(q: Option<&ApiQuantity>) -> Result<Quantity, FieldPathError> {
    match q {
        Some(q) => Quantity::from_api(q).map_err(|_| FieldPathError::Quantity(q.0.clone())),
        None => Ok(Quantity::from_milli(0)),
    }
}

/// `ceil(a / b)`; 0 when `b` is 0 (upstream divides floats and would give
/// +Inf; validation forbids a zero divisor). The one quotient past `i64`
/// (`i64::MIN / -1`, from a static pod's negative limit and divisor, which
/// no apiserver would accept) saturates instead of panicking.
fn ceil_div(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let (Some(q), Some(r)) = (a.checked_div(b), a.checked_rem(b)) else {
        return i64::MAX;
    };
    if r != 0 && ((r > 0) == (b > 0)) {
        q + 1
    } else {
        q
    }
}

/// Upstream `ExtractContainerResourceValue`: `limits.*`/`requests.*` of
/// cpu (in units of the divisor, default 1, rounded up), memory,
/// ephemeral-storage and hugepages-*.
pub fn extract_container_resource_value(
    fs: &ResourceFieldSelector,
    c: &Container,
) -> Result<String, FieldPathError> {
    let divisor = match &fs.divisor {
        Some(d) if !quantity(Some(d))?.is_zero() => quantity(Some(d))?,
        _ => Quantity::from_milli(1000),
    };
    let res = c.resources.as_ref();
    let (list, name) = if let Some(n) = fs.resource.strip_prefix("limits.") {
        (res.and_then(|r| r.limits.as_ref()), n)
    } else if let Some(n) = fs.resource.strip_prefix("requests.") {
        (res.and_then(|r| r.requests.as_ref()), n)
    } else {
        return Err(FieldPathError::Resource(fs.resource.clone()));
    };
    let q = quantity(list.and_then(|l| l.get(name)))?;
    let v = match name {
        "cpu" => ceil_div(q.milli_value(), divisor.milli_value()),
        "memory" | "ephemeral-storage" => ceil_div(q.value(), divisor.value()),
        n if n.starts_with("hugepages-") => ceil_div(q.value(), divisor.value()),
        _ => return Err(FieldPathError::Resource(fs.resource.clone())),
    };
    Ok(v.to_string())
}

/// Upstream `MergeContainerResourceLimits`: unset (or zero) cpu, memory and
/// ephemeral-storage limits become the node's allocatable.
pub fn merge_container_resource_limits(
    c: &Container,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Container {
    let mut c = c.clone();
    let res = c.resources.get_or_insert_with(Default::default);
    let limits = res.limits.get_or_insert_with(BTreeMap::new);
    for name in ["cpu", "memory", "ephemeral-storage"] {
        let unset = limits
            .get(name)
            .is_none_or(|q| Quantity::from_api(q).map(|q| q.is_zero()).unwrap_or(true));
        if unset && let Some(a) = allocatable.get(name) {
            limits.insert(name.to_string(), a.clone());
        }
    }
    c
}

/// Upstream `ExtractResourceValueByContainerNameAndNodeAllocatable`: the
/// value for `fs.containerName` (or `c` when it is empty), with unset limits
/// falling back to `allocatable`.
pub fn extract_resource_value(
    fs: &ResourceFieldSelector,
    pod: &Pod,
    c: &Container,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<String, FieldPathError> {
    let target = match fs.container_name.as_deref().filter(|n| !n.is_empty()) {
        None => c.clone(),
        Some(name) => pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .find(|x| x.name == name)
            .cloned()
            .ok_or_else(|| FieldPathError::Container(name.to_string()))?,
    };
    extract_container_resource_value(fs, &merge_container_resource_limits(&target, allocatable))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                "labels": {"a": "1", "b": "x\"y"}, "annotations": {"k8s.io/n": "v\nw"}},
            "spec": {"containers": [
                {"name": "c", "image": "i", "resources": {
                    "requests": {"cpu": "250m", "memory": "32Mi"},
                    "limits": {"cpu": "1250m", "memory": "64Mi"}}},
                {"name": "d", "image": "i"}]}
        }))
        .expect("pod")
    }

    #[test]
    fn metadata_fields_maps_and_subscripts() {
        let p = pod();
        let f = |path: &str| extract_field_path_as_string(&p, path);
        assert_eq!(f("metadata.name").as_deref(), Ok("p"));
        assert_eq!(f("metadata.namespace").as_deref(), Ok("ns"));
        assert_eq!(f("metadata.uid").as_deref(), Ok("u1"));
        assert_eq!(f("metadata.labels").as_deref(), Ok("a=\"1\"\nb=\"x\\\"y\""));
        assert_eq!(
            f("metadata.annotations").as_deref(),
            Ok("k8s.io/n=\"v\\nw\"")
        );
        assert_eq!(f("metadata.labels['a']").as_deref(), Ok("1"));
        assert_eq!(f("metadata.annotations['missing']").as_deref(), Ok(""));
        assert_eq!(
            f("spec.nodeName").map_err(|e| e.to_string()),
            Err("unsupported fieldPath: spec.nodeName".to_string())
        );
        assert_eq!(
            f("metadata.name['x']").map_err(|e| e.to_string()),
            Err("fieldPath \"metadata.name['x']\" does not support subscript".to_string())
        );
    }

    #[test]
    fn resources_round_up_by_divisor_and_fall_back_to_allocatable() {
        let p = pod();
        let spec = p.spec.as_ref().expect("spec");
        let alloc: BTreeMap<String, ApiQuantity> = [
            ("cpu".to_string(), ApiQuantity("2".into())),
            ("memory".to_string(), ApiQuantity("1Gi".into())),
        ]
        .into();
        let get = |res: &str, divisor: Option<&str>, c: usize| {
            let fs = ResourceFieldSelector {
                resource: res.into(),
                divisor: divisor.map(|d| ApiQuantity(d.into())),
                container_name: None,
            };
            extract_resource_value(&fs, &p, &spec.containers[c], &alloc)
        };
        assert_eq!(
            get("limits.cpu", None, 0).as_deref(),
            Ok("2"),
            "1250m rounds up"
        );
        assert_eq!(get("limits.cpu", Some("1m"), 0).as_deref(), Ok("1250"));
        assert_eq!(get("requests.cpu", Some("1m"), 0).as_deref(), Ok("250"));
        assert_eq!(get("limits.memory", Some("1Mi"), 0).as_deref(), Ok("64"));
        assert_eq!(get("requests.memory", None, 0).as_deref(), Ok("33554432"));
        assert_eq!(
            get("limits.cpu", None, 1).as_deref(),
            Ok("2"),
            "allocatable"
        );
        assert_eq!(get("limits.memory", None, 1).as_deref(), Ok("1073741824"));
        assert_eq!(get("requests.cpu", None, 1).as_deref(), Ok("0"));
        assert_eq!(
            get("limits.gpu", None, 0).map_err(|e| e.to_string()),
            Err("unsupported container resource : limits.gpu".to_string())
        );
        let fs = ResourceFieldSelector {
            resource: "limits.memory".into(),
            divisor: Some(ApiQuantity("1Mi".into())),
            container_name: Some("c".into()),
        };
        assert_eq!(
            extract_resource_value(&fs, &p, &spec.containers[1], &alloc).as_deref(),
            Ok("64"),
            "containerName picks the other container"
        );
    }

    #[test]
    fn a_quotient_past_i64_saturates() {
        assert_eq!(ceil_div(i64::MIN, -1), i64::MAX);
        assert_eq!(ceil_div(i64::MIN, 1), i64::MIN);
        assert_eq!(ceil_div(-3, -2), 2);
        assert_eq!(ceil_div(3, -2), -1);
        assert_eq!(ceil_div(5, 0), 0);
        // The static pod the fuzzer found (corpus/manifest/hostile_resource_divisor.json).
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {"limits": {"cpu": "-9223372036854775808"}}
        }))
        .expect("container");
        let fs = ResourceFieldSelector {
            resource: "limits.cpu".into(),
            divisor: Some(ApiQuantity("-1m".into())),
            container_name: None,
        };
        assert_eq!(
            extract_container_resource_value(&fs, &c).as_deref(),
            Ok("9223372036854775807")
        );
    }
}
