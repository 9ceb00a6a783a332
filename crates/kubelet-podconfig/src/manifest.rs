//! Decoding pod manifests (YAML or JSON) as the file and HTTP sources read them
//! (upstream `pkg/kubelet/config/common.go` `tryDecodeSinglePod`/`tryDecodePodList`).

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::Source;
use kubelet_types::defaults::apply_static_defaults;

use crate::validation::{ErrorList, render, validate_static_pod};

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ManifestError(pub String);

/// Manifests larger than this are refused (a manifest URL could send anything).
const MAX_MANIFEST_BYTES: usize = 10 * 1024 * 1024;

fn decode(text: &str) -> Result<serde_json::Value, ManifestError> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError(format!(
            "manifest is larger than {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    let options = serde_saphyr::options! {
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_ALIAS_REPLAYED_EVENTS,
        },
    };
    serde_saphyr::from_str_with_options::<serde_json::Value>(text, options)
        .map_err(|e| ManifestError(format!("invalid YAML/JSON: {e}")))
}

/// How many YAML events aliases may replay in one manifest. A pod written
/// with anchors needs a few hundred; the parser's default (a million) let a
/// 350-byte alias bomb cost seconds of CPU on every poll of a manifest URL
/// (found by the `manifest` fuzz target). Upstream's YAML decoder refuses
/// such documents too ("document contains excessive aliasing").
const MAX_ALIAS_REPLAYED_EVENTS: usize = 10_000;

fn to_pod(
    v: serde_json::Value,
    source: Source,
    origin: &str,
    node: &str,
) -> Result<Pod, ManifestError> {
    let mut pod: Pod =
        serde_json::from_value(v).map_err(|e| ManifestError(format!("invalid pod: {e}")))?;
    // Upstream `tryDecodeSinglePod`: `ValidatePodCreate` on every static pod.
    let errs = validate_static_pod(&pod, node);
    if !errs.is_empty() {
        return Err(ManifestError(format!("invalid pod: {}", render(&errs))));
    }
    apply_static_defaults(&mut pod, source, origin, node)
        .map_err(|e| ManifestError(format!("invalid pod: {e}")))?;
    Ok(pod)
}

/// One pod from a manifest file; `kind: Pod` is required.
pub fn parse_pod_document(
    text: &str,
    source: Source,
    origin: &str,
    node: &str,
) -> Result<Pod, ManifestError> {
    let v = decode(text)?;
    match v.get("kind").and_then(|k| k.as_str()) {
        Some("Pod") => to_pod(v, source, origin, node),
        Some(other) => Err(ManifestError(format!("kind {other:?} is not \"Pod\""))),
        None => Err(ManifestError("Object 'Kind' is missing".into())),
    }
}

/// One manifest file checked as the file source reads it, for
/// `kubelet-rs check`: `Err` when it cannot be decoded into a pod at all,
/// otherwise every validation error (none for a pod the source accepts).
pub fn check_pod_document(text: &str, node: &str) -> Result<ErrorList, ManifestError> {
    let v = decode(text)?;
    match v.get("kind").and_then(|k| k.as_str()) {
        Some("Pod") => {}
        Some(other) => return Err(ManifestError(format!("kind {other:?} is not \"Pod\""))),
        None => return Err(ManifestError("Object 'Kind' is missing".into())),
    }
    let pod: Pod =
        serde_json::from_value(v).map_err(|e| ManifestError(format!("invalid pod: {e}")))?;
    Ok(validate_static_pod(&pod, node))
}

/// A single Pod or a PodList (HTTP source). Any invalid pod refuses the whole document.
pub fn parse_pods_document(
    text: &str,
    source: Source,
    origin: &str,
    node: &str,
) -> Result<Vec<Pod>, ManifestError> {
    let v = decode(text)?;
    match v.get("kind").and_then(|k| k.as_str()) {
        Some("Pod") => Ok(vec![to_pod(v, source, origin, node)?]),
        Some("PodList") => {
            let items = v
                .get("items")
                .and_then(|i| i.as_array())
                .cloned()
                .unwrap_or_default();
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| {
                    to_pod(item, source, origin, node)
                        .map_err(|e| ManifestError(format!("items[{i}]: {e}")))
                })
                .collect()
        }
        Some(other) => Err(ManifestError(format!(
            "kind {other:?} is neither \"Pod\" nor \"PodList\""
        ))),
        None => Err(ManifestError("Object 'Kind' is missing".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: busybox:1}]\n";

    #[test]
    fn single_pod_and_list() {
        let p = parse_pod_document(POD, Source::File, "/m/a.yaml", "n1").expect("pod");
        assert_eq!(p.metadata.name.as_deref(), Some("a-n1"));
        let list = r#"{"apiVersion":"v1","kind":"PodList","items":[
            {"metadata":{"name":"x"},"spec":{"containers":[{"name":"c","image":"i:1"}]}},
            {"metadata":{"name":"y"},"spec":{"containers":[{"name":"c","image":"i:1"}]}}]}"#;
        let pods = parse_pods_document(list, Source::Http, "http://h/p", "n1").expect("list");
        assert_eq!(pods.len(), 2);
        assert_ne!(pods[0].metadata.uid, pods[1].metadata.uid);
    }

    #[test]
    fn an_alias_bomb_is_refused_and_a_pod_with_anchors_is_not() {
        // Five levels of ten aliases each: 10^5 nodes once expanded, under
        // the parser's default limit and far over a pod's needs.
        let mut bomb = String::from("a: &a [x,x,x,x,x,x,x,x,x,x]\n");
        let names: Vec<char> = "abcde".chars().collect();
        for w in names.windows(2) {
            let (prev, next) = (w[0], w[1]);
            let refs = vec![format!("*{prev}"); 10].join(",");
            bomb.push_str(&format!("{next}: &{next} [{refs}]\n"));
        }
        bomb.push_str("kind: Pod\n");
        let e = parse_pod_document(&bomb, Source::Http, "http://h/p", "n").expect_err("bomb");
        assert!(e.0.contains("invalid YAML"), "{e}");

        let anchored = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - &c {name: c, image: busybox:1, env: [{name: A, value: x}]}\n  - {name: d, image: busybox:1, env: [{name: A, value: x}]}\n";
        parse_pod_document(anchored, Source::File, "f", "n").expect("anchors are fine");
    }

    #[test]
    fn bad_manifests_say_why() {
        let e = parse_pod_document("kind: Pod\nspec: [", Source::File, "f", "n").expect_err("yaml");
        assert!(e.0.contains("invalid YAML"), "{e}");
        let e = parse_pod_document("apiVersion: v1\nkind: Service\n", Source::File, "f", "n")
            .expect_err("kind");
        assert!(e.0.contains("Service"), "{e}");
        let e = parse_pod_document(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n",
            Source::File,
            "f",
            "n",
        )
        .expect_err("no containers");
        assert!(e.0.contains("spec.containers"), "{e}");
        let e = parse_pod_document(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: 5}\n",
            Source::File,
            "f",
            "n",
        )
        .expect_err("wrong type");
        assert!(e.0.contains("invalid pod"), "{e}");
    }

    #[test]
    fn an_invalid_pod_is_refused_with_every_field_error() {
        let bad = "apiVersion: v1\nkind: Pod\nmetadata: {name: Web}\nspec:\n  containers: [{name: c, image: i, ports: [{containerPort: 0}]}]\n";
        let e = parse_pod_document(bad, Source::File, "f", "n").expect_err("invalid");
        assert!(
            e.0.starts_with("invalid pod: [metadata.name: Invalid value: \"Web-n\""),
            "{e}"
        );
        assert!(
            e.0.ends_with("spec.containers[0].ports[0].containerPort: Required value]"),
            "{e}"
        );
        let list = format!(
            r#"{{"kind":"PodList","items":[{}]}}"#,
            r#"{"metadata":{"name":"x"},"spec":{"containers":[{"name":"C","image":"i"}]}}"#
        );
        let e = parse_pods_document(&list, Source::Http, "http://h/p", "n").expect_err("list");
        assert!(
            e.0.starts_with("items[0]: invalid pod: [spec.containers[0].name"),
            "{e}"
        );
        let errs = check_pod_document(bad, "n").expect("decodes");
        assert_eq!(errs.len(), 2);
        assert!(check_pod_document(POD, "n").expect("decodes").is_empty());
        assert!(check_pod_document("kind: Service\n", "n").is_err());
    }
}
