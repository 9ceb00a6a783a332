//! Annotation key validation for `tokenAttributes` (upstream apimachinery
//! `validation.IsQualifiedName`): an optional DNS-subdomain prefix and `/`,
//! then a name of at most 63 alphanumerics, `-`, `_` and `.`, starting and
//! ending alphanumeric.

const NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

fn name_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn dns_label_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Upstream's messages for what makes `value` no qualified name.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let example = "(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '";
    let parts: Vec<&str> = value.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return vec![format!(
                "a qualified name {NAME_ERR} {example}{NAME_FMT}') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    let mut errs = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else {
            if prefix.len() > 253 {
                errs.push("prefix part must be no more than 253 characters".to_string());
            }
            if !prefix.split('.').all(dns_label_ok) {
                errs.push(format!("prefix part {DNS1123_SUBDOMAIN_ERR}"));
            }
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !name.is_empty() && !name_ok(name) {
        errs.push(format!("name part {NAME_ERR} {example}{NAME_FMT}')"));
    }
    errs
}
