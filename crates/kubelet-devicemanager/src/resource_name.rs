//! Extended resource names (upstream `v1helper.IsExtendedResourceName`): a
//! device plugin may only advertise a domain-prefixed name outside
//! `kubernetes.io/` that stays a qualified name once `requests.` is put in
//! front of it (the form resource quotas use).

const REQUESTS_PREFIX: &str = "requests.";

/// Whether `name` is an extended resource name.
pub fn is_extended_resource_name(name: &str) -> bool {
    if is_native_resource(name) || name.starts_with(REQUESTS_PREFIX) {
        return false;
    }
    is_qualified_name(&format!("{REQUESTS_PREFIX}{name}"))
}

/// Upstream `IsNativeResource`: unprefixed, or under `kubernetes.io/`.
fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// Upstream `validation.IsQualifiedName`: `[prefix/]name`, the prefix a DNS-1123
/// subdomain, the name at most 63 alphanumerics, `-`, `_`, `.`, starting and
/// ending alphanumeric.
fn is_qualified_name(value: &str) -> bool {
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() || !is_dns1123_subdomain(prefix) {
                return false;
            }
            *name
        }
        _ => return false,
    };
    if name.is_empty() || name.len() > 63 {
        return false;
    }
    let b = name.as_bytes();
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter()
            .all(|&c| alnum(c) || c == b'-' || c == b'_' || c == b'.')
}

fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= 253
        && value.split('.').all(|label| {
            let b = label.as_bytes();
            let ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty() && ok(b[0]) && ok(b[b.len() - 1]) && b.iter().all(|&c| ok(c) || c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::is_extended_resource_name;

    #[test]
    fn extended_names_follow_upstream_rules() {
        for ok in [
            "vendor.com/gpu",
            "example.com/resource",
            "nvidia.com/gpu",
            "a.b/c_d.e-f",
        ] {
            assert!(is_extended_resource_name(ok), "{ok}");
        }
        for bad in [
            "gpu",
            "cpu",
            "kubernetes.io/gpu",
            "requests.vendor.com/gpu",
            "Vendor.com/gpu",
            "vendor.com/",
            "vendor.com/-gpu",
            "a/b/c",
            "vendor..com/gpu",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }
}
