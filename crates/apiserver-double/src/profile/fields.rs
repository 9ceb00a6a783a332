//! Field selectors as a release's `ListResource` checks them
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/get.go`): the
//! selector is parsed (`staging/src/k8s.io/apimachinery/pkg/fields/selector.go`),
//! then every label goes through the kind's field label conversion, and
//! either failure is a 400 `BadRequest` carrying the error verbatim.
//!
//! Kinds with a registered conversion (`pkg/apis/core/v1/conversion.go`,
//! `pkg/apis/certificates/v1/conversion.go`) answer an unknown label with
//! `field label not supported: <label>`; the rest fall back on
//! `runtime.DefaultMetaV1FieldSelectorConversion`
//! (`staging/src/k8s.io/apimachinery/pkg/runtime/conversion.go`), which
//! knows `metadata.name` and `metadata.namespace` only. Per-kind label sets:
//! `docs/apiserver-versions.md` §1.2.

use super::Profile;

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The field label.
    pub field: String,
    /// The unescaped value.
    pub value: String,
    /// `=`/`==` (true) or `!=` (false).
    pub equals: bool,
}

/// Splits on unescaped commas (upstream `splitTerms`).
fn split_terms(s: &str) -> Vec<String> {
    let mut terms = vec![];
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            cur.push(c);
            escaped = true;
        } else if c == ',' {
            terms.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    terms.push(cur);
    terms
}

/// The first operator from the left, `!=` before `==` before `=` at each
/// position (upstream `splitTerm`).
fn split_term(term: &str) -> Option<(&str, &str, bool)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op, equals) in [("!=", false), ("==", true), ("=", true)] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], value, equals));
            }
        }
    }
    None
}

/// Upstream `UnescapeValue`. Its `UnescapedRune` error prints the rune with
/// Go's `%v`, i.e. as its code point number.
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut slash = false;
    for c in s.chars() {
        if slash {
            if matches!(c, '\\' | ',' | '=') {
                out.push(c);
                slash = false;
                continue;
            }
            return Err(format!(
                "invalid field selector: invalid escape sequence: \\{c}"
            ));
        }
        match c {
            '\\' => slash = true,
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                ));
            }
            c => out.push(c),
        }
    }
    if slash {
        return Err("invalid field selector: invalid escape sequence: \\".into());
    }
    Ok(out)
}

/// Parses `selector` (upstream `fields.ParseSelector`: terms sorted, empty
/// ones skipped).
pub fn parse(selector: &str) -> Result<Vec<Requirement>, String> {
    let mut parts = split_terms(selector);
    parts.sort();
    let mut out = vec![];
    for part in parts.iter().filter(|p| !p.is_empty()) {
        let Some((field, value, equals)) = split_term(part) else {
            return Err(format!(
                "invalid selector: '{selector}'; can't understand '{part}'"
            ));
        };
        out.push(Requirement {
            field: field.to_string(),
            value: unescape(value)?,
            equals,
        });
    }
    Ok(out)
}

/// The labels a kind's registered conversion function accepts in `p`, or
/// `None` when the kind has none (the generic fallback applies).
fn registered(p: Profile, resource: &str) -> Option<Vec<&'static str>> {
    let meta = ["metadata.name", "metadata.namespace"];
    let labels: Vec<&'static str> = match resource {
        // pkg/apis/core/v1/conversion.go AddFieldLabelConversionsForPod
        // (v1.19.10); `spec.hostNetwork` added in 1.28 (#110477).
        "pods" => {
            let mut l = vec![
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.podIPs",
                "status.nominatedNodeName",
            ];
            if p.at_least(28) {
                l.push("spec.hostNetwork");
            }
            l.extend(meta);
            l
        }
        // AddFieldLabelConversionsForNode: no `metadata.namespace`.
        "nodes" => vec!["metadata.name", "spec.unschedulable"],
        // AddFieldLabelConversionsForService: registered in 1.31 (#123905);
        // before that Services had no function and took the fallback.
        "services" if p.at_least(31) => {
            let mut l = vec!["spec.clusterIP", "spec.type"];
            l.extend(meta);
            l
        }
        // AddFieldLabelConversionsForSecret.
        "secrets" => {
            let mut l = vec!["type"];
            l.extend(meta);
            l
        }
        // AddFieldLabelConversionsForNamespace.
        "namespaces" => vec!["status.phase", "metadata.name"],
        // AddFieldLabelConversionsForEvent.
        "events" => {
            let mut l = vec![
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ];
            l.extend(meta);
            l
        }
        // pkg/apis/certificates/v1/conversion.go.
        "certificatesigningrequests" => vec!["metadata.name", "spec.signerName"],
        _ => return None,
    };
    Some(labels)
}

/// Checks `selector` for a list or watch of `resource` in `p`; the error is
/// the message of upstream's 400 `BadRequest`.
pub fn check(p: Profile, resource: &str, selector: &str) -> Result<Vec<Requirement>, String> {
    let reqs = parse(selector)?;
    for r in &reqs {
        // `spec.host` is the pre-1.0 name of `spec.nodeName`, still converted.
        if resource == "pods" && r.field == "spec.host" {
            continue;
        }
        match registered(p, resource) {
            Some(known) if !known.contains(&r.field.as_str()) => {
                return Err(format!("field label not supported: {}", r.field));
            }
            None if !matches!(r.field.as_str(), "metadata.name" | "metadata.namespace") => {
                return Err(format!(
                    "\"{}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
                    r.field
                ));
            }
            _ => {}
        }
    }
    Ok(reqs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_as_upstream() {
        let r = parse("spec.nodeName==n1,status.phase!=Running").expect("parses");
        assert_eq!(
            r,
            vec![
                Requirement {
                    field: "spec.nodeName".into(),
                    value: "n1".into(),
                    equals: true
                },
                Requirement {
                    field: "status.phase".into(),
                    value: "Running".into(),
                    equals: false
                },
            ]
        );
        assert_eq!(
            parse("spec.nodeName in (a)").unwrap_err(),
            "invalid selector: 'spec.nodeName in (a)'; can't understand 'spec.nodeName in (a)'"
        );
        assert_eq!(
            parse("a=b=c").unwrap_err(),
            "invalid field selector: unescaped character in value: 61"
        );
        assert_eq!(parse(r"a=b\,c").expect("escaped")[0].value, "b,c");
        assert!(parse("").expect("empty").is_empty());
    }

    #[test]
    fn labels_differ_by_release_and_kind() {
        let svc = "spec.clusterIP!=None";
        assert_eq!(
            check(Profile::V1_19, "services", svc).unwrap_err(),
            "\"spec.clusterIP\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
        assert!(check(Profile::V1_35, "services", svc).is_ok());
        assert_eq!(
            check(Profile::V1_35, "services", "spec.foo=x").unwrap_err(),
            "field label not supported: spec.foo"
        );
        assert_eq!(
            check(Profile::V1_19, "pods", "spec.hostNetwork=true").unwrap_err(),
            "field label not supported: spec.hostNetwork"
        );
        assert!(check(Profile::V1_35, "pods", "spec.hostNetwork=true").is_ok());
        assert!(check(Profile::V1_19, "pods", "spec.host=n1").is_ok());
        assert_eq!(
            check(Profile::V1_35, "nodes", "metadata.namespace=x").unwrap_err(),
            "field label not supported: metadata.namespace"
        );
        assert!(check(Profile::V1_19, "secrets", "type=kubernetes.io/tls").is_ok());
        assert!(check(Profile::V1_19, "configmaps", "metadata.name=x").is_ok());
        assert_eq!(
            check(Profile::V1_35, "configmaps", "data.x=y").unwrap_err(),
            "\"data.x\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
    }
}
