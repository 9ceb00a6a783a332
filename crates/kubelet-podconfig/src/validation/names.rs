//! Name syntaxes of upstream `k8s.io/apimachinery/pkg/util/validation`:
//! `IsDNS1123Label`, `IsDNS1123Subdomain`, `IsValidPortName`
//! (IANA_SVC_NAME), `IsValidPortNum`, `IsRelaxedEnvVarName` and
//! `IsQualifiedName`, each returning upstream's messages.

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

fn max_len(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn is_label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-')
        }
        _ => false,
    }
}

/// Upstream `IsDNS1123Label`.
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut out = vec![];
    if s.len() > DNS1123_LABEL_MAX {
        out.push(max_len(DNS1123_LABEL_MAX));
    }
    if !is_label_chars(s) {
        out.push(LABEL_MSG.to_string());
    }
    out
}

/// Upstream `IsDNS1123Subdomain`.
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut out = vec![];
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        out.push(max_len(DNS1123_SUBDOMAIN_MAX));
    }
    if !s.split('.').all(is_label_chars) {
        out.push(SUBDOMAIN_MSG.to_string());
    }
    out
}

/// Upstream `IsValidPortName` (an IANA_SVC_NAME, RFC 6335).
pub fn port_name(s: &str) -> Vec<String> {
    let mut out = vec![];
    if s.len() > 15 {
        out.push("must be no more than 15 characters".to_string());
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        out.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        out.push("must contain at least one letter (a-z)".into());
    }
    if s.contains("--") {
        out.push("must not contain consecutive hyphens".into());
    }
    if s.starts_with('-') || s.ends_with('-') {
        out.push("must not begin or end with a hyphen".into());
    }
    out
}

/// Upstream `IsValidPortNum`.
pub fn port_num(p: i32) -> Option<&'static str> {
    (!(1..=65535).contains(&p)).then_some("must be between 1 and 65535, inclusive")
}

/// Upstream `IsRelaxedEnvVarName` (the `RelaxedEnvironmentVariableValidation`
/// rule, on by default since 1.32): printable ASCII other than `=`.
pub fn env_var_name(s: &str) -> Vec<String> {
    let mut out = vec![];
    if !s.bytes().all(|c| (b' '..=b'~').contains(&c) && c != b'=') {
        out.push(
            "a valid environment variable name must consist only of printable ASCII characters other than '='"
                .to_string(),
        );
    }
    out
}

const QUALIFIED_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// Upstream `IsQualifiedName`: `[prefix/]name`, a DNS subdomain prefix and
/// a name part of at most 63 characters.
pub fn qualified_name(s: &str) -> Vec<String> {
    let mut out = vec![];
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            out.push("prefix part must be non-empty".to_string());
        } else {
            out.extend(
                dns1123_subdomain(p)
                    .into_iter()
                    .map(|m| format!("prefix part {m}")),
            );
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_string());
        return out;
    }
    if name.len() > 63 {
        out.push("name part must be no more than 63 characters".to_string());
    }
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_alphanumeric();
    let ok = b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter()
            .all(|c| alnum(c) || matches!(c, b'-' | b'_' | b'.'));
    if !ok || s.matches('/').count() > 1 {
        out.push(QUALIFIED_MSG.to_string());
    }
    out
}

const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// Upstream `IsValidLabelValue`.
pub fn label_value(s: &str) -> Vec<String> {
    let mut out = vec![];
    if s.len() > 63 {
        out.push(max_len(63));
    }
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_alphanumeric();
    let ok = s.is_empty()
        || (b.first().is_some_and(alnum)
            && b.last().is_some_and(alnum)
            && b.iter()
                .all(|c| alnum(c) || matches!(c, b'-' | b'_' | b'.')));
    if !ok {
        out.push(LABEL_VALUE_MSG.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        for ok in ["a", "web-1", "0abc", &"a".repeat(63)] {
            assert!(dns1123_label(ok).is_empty(), "{ok}");
        }
        for bad in ["", "Foo", "-a", "a-", "a.b", "a_b"] {
            assert_eq!(dns1123_label(bad), [LABEL_MSG], "{bad}");
        }
        assert_eq!(dns1123_label(&"a".repeat(64)).len(), 1);
        assert!(dns1123_subdomain("kube-apiserver-node.example.com").is_empty());
        for bad in ["Web-node", "a..b", ".a", "a."] {
            assert_eq!(dns1123_subdomain(bad), [SUBDOMAIN_MSG], "{bad}");
        }
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254)),
            ["must be no more than 253 characters"]
        );
    }

    #[test]
    fn port_names_numbers_and_env_names() {
        assert!(port_name("http").is_empty());
        assert!(port_name("metrics-2").is_empty());
        assert_eq!(port_name("123"), ["must contain at least one letter (a-z)"]);
        assert_eq!(port_name("a--b"), ["must not contain consecutive hyphens"]);
        assert_eq!(port_name("-ab"), ["must not begin or end with a hyphen"]);
        assert_eq!(port_name("this-is-far-too-long").len(), 1);
        assert_eq!(port_name("HTTP").len(), 2);
        assert_eq!(port_num(0), Some("must be between 1 and 65535, inclusive"));
        assert!(port_num(65536).is_some());
        assert_eq!(port_num(80), None);
        assert!(env_var_name("MY_VAR.x-1").is_empty());
        assert!(env_var_name("1starts with digit").is_empty());
        assert_eq!(env_var_name("A=B").len(), 1);
        assert_eq!(env_var_name("tab\t").len(), 1);
    }

    #[test]
    fn label_values() {
        for ok in ["", "web", "My_Value.1", &"a".repeat(63)] {
            assert!(label_value(ok).is_empty(), "{ok}");
        }
        assert_eq!(label_value("-x"), [LABEL_VALUE_MSG]);
        assert_eq!(label_value("a b"), [LABEL_VALUE_MSG]);
        assert_eq!(
            label_value(&"a".repeat(64)),
            ["must be no more than 63 characters"]
        );
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name("example.com/gpu").is_empty());
        assert!(qualified_name("gpu").is_empty());
        assert!(!qualified_name("/gpu").is_empty());
        assert!(!qualified_name("Example.com/gpu").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(!qualified_name("example.com/-x").is_empty());
    }
}
