//! The nested parts of a KubeletConfiguration (v1beta1 `types.go`): the keys
//! each struct-typed field has, so that an unknown nested key
//! (`authentication.x509.bogus`) is reported as upstream's strict decoding
//! would; and the maps keyed by eviction signal or resource name, whose
//! keys and values upstream parses at start (`pkg/kubelet/eviction/api`
//! signals, `ParseThresholdConfig`; `ParseResourceList`).

use kubelet_types::quantity::Quantity;
use serde_json::Value;

use super::FileDoc;
use crate::finding::{Finding, Kind};
use crate::report::Report;

/// A struct-typed field and its keys; a key with children is itself a struct.
struct Shape {
    key: &'static str,
    children: &'static [Shape],
}

const fn leaf(key: &'static str) -> Shape {
    Shape { key, children: &[] }
}

const fn node(key: &'static str, children: &'static [Shape]) -> Shape {
    Shape { key, children }
}

const LOG_FORMAT: &[Shape] = &[leaf("infoBufferSize"), leaf("splitStream")];

/// Struct-typed top-level fields. Maps and lists are not listed.
const STRUCTS: &[Shape] = &[
    node(
        "authentication",
        &[
            node("x509", &[leaf("clientCAFile")]),
            node("webhook", &[leaf("enabled"), leaf("cacheTTL")]),
            node("anonymous", &[leaf("enabled")]),
        ],
    ),
    node(
        "authorization",
        &[
            leaf("mode"),
            node(
                "webhook",
                &[leaf("cacheAuthorizedTTL"), leaf("cacheUnauthorizedTTL")],
            ),
        ],
    ),
    node(
        "logging",
        &[
            leaf("format"),
            leaf("flushFrequency"),
            leaf("verbosity"),
            leaf("vmodule"),
            node(
                "options",
                &[node("json", LOG_FORMAT), node("text", LOG_FORMAT)],
            ),
        ],
    ),
    node("memorySwap", &[leaf("swapBehavior")]),
    node("crashLoopBackOff", &[leaf("maxContainerRestartPeriod")]),
    node(
        "tracing",
        &[leaf("endpoint"), leaf("samplingRatePerMillion")],
    ),
];

/// Eviction signals upstream knows (`pkg/kubelet/eviction/api/types.go`).
const SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// Maps keyed by an eviction signal, and whether their values are durations.
const SIGNAL_MAPS: &[(&str, bool)] = &[
    ("evictionHard", false),
    ("evictionSoft", false),
    ("evictionSoftGracePeriod", true),
    ("evictionMinimumReclaim", false),
];

fn unknown_nested(doc: &FileDoc, prefix: &str, value: &Value, shape: &[Shape], out: &mut Report) {
    let Value::Object(map) = value else { return };
    for (k, v) in map {
        let path = format!("{prefix}.{k}");
        match shape.iter().find(|s| s.key == k) {
            Some(s) if !s.children.is_empty() => unknown_nested(doc, &path, v, s.children, out),
            Some(_) => {}
            None => out.push(doc.finding(
                Finding::warning(
                    Kind::Config,
                    format!("unknown field {path:?}: ignored (strict decoding error; decoded leniently, as upstream)"),
                ),
                &path,
            )),
        }
    }
}

/// `10%` or a quantity such as `100Mi`, not negative.
fn threshold_ok(v: &str) -> bool {
    match v.strip_suffix('%') {
        Some(p) => p.parse::<f64>().is_ok_and(|p| (0.0..=100.0).contains(&p)),
        None => Quantity::parse(v).is_ok_and(|q| q.signum() >= 0),
    }
}

fn signal_maps(doc: &FileDoc, report: &mut Report) {
    for (field, durations) in SIGNAL_MAPS {
        let Some(Value::Object(map)) = doc.value.get(field) else {
            continue;
        };
        for (signal, v) in map {
            let path = [*field, signal.as_str()];
            let line = super::locate(&doc.text, &path.map(|k| super::Step::Key(k.to_string())));
            let at = |f: Finding| {
                f.in_file(&doc.path)
                    .at_line(line)
                    .field(format!("{field}.{signal}"))
            };
            if !SIGNALS.contains(&signal.as_str()) {
                report.push(at(Finding::error(
                    Kind::Config,
                    format!("invalid configuration: {field}: unsupported eviction signal {signal}"),
                )));
                continue;
            }
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let ok = if *durations {
                kubelet_config::GoDuration::parse(&text).is_ok_and(|d| d.as_nanos() >= 0)
            } else {
                threshold_ok(&text)
            };
            if !ok {
                let want = if *durations {
                    "a duration such as 1m30s"
                } else {
                    "a quantity such as 100Mi or a percentage such as 10%"
                };
                report.push(at(Finding::error(
                    Kind::Config,
                    format!("invalid configuration: {field}[{signal}] {text:?}: want {want}"),
                )));
            }
        }
    }
}

fn reserved(doc: &FileDoc, report: &mut Report) {
    for field in ["kubeReserved", "systemReserved"] {
        let Some(Value::Object(map)) = doc.value.get(field) else {
            continue;
        };
        for (name, v) in map {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if Quantity::parse(&text).is_ok_and(|q| q.signum() >= 0) {
                continue;
            }
            let path = [field, name.as_str()].map(|k| super::Step::Key(k.to_string()));
            report.push(
                Finding::error(
                    Kind::Config,
                    format!("invalid configuration: {field}[{name}] {text:?}: want a non-negative quantity such as 100m or 1Gi"),
                )
                .in_file(&doc.path)
                .at_line(super::locate(&doc.text, &path))
                .field(format!("{field}.{name}")),
            );
        }
    }
}

/// Reports unknown nested keys and bad signal or resource maps.
pub(super) fn check(doc: &FileDoc, report: &mut Report) {
    for s in STRUCTS {
        if let Some(v) = doc.value.get(s.key) {
            unknown_nested(doc, s.key, v, s.children, report);
        }
    }
    signal_maps(doc, report);
    reserved(doc, report);
}
