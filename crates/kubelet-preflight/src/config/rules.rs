//! Upstream `ValidateKubeletConfiguration` rules whose fields kubelet-rs
//! reads or accepts (`pkg/kubelet/apis/config/validation/validation.go`),
//! on the value a start would use (flag over file, v1beta1 zero values
//! meaning "default"), in upstream's words; and the fields upstream marks
//! deprecated.

use kubelet_config::{GoDuration, flag_table};
use serde_json::Value;

use super::{Argv, FileDoc};
use crate::finding::{Finding, Kind};
use crate::report::Report;

/// Where a value came from.
enum Origin {
    Flag(&'static str),
    File,
}

/// One effective value: what a start would use, and where it was set.
struct Setting {
    field: &'static str,
    value: Value,
    origin: Origin,
}

impl Setting {
    fn num(&self) -> Option<f64> {
        match &self.value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
    }

    fn text(&self) -> Option<String> {
        match &self.value {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    fn duration(&self) -> Option<GoDuration> {
        GoDuration::parse(&self.text()?).ok()
    }

    /// `maxPods (--max-pods)`, as upstream names a field in its messages.
    fn label(&self) -> String {
        match flag_table::by_field(self.field) {
            Some(f) => format!("{} (--{})", self.field, f.name),
            None => self.field.to_string(),
        }
    }
}

struct Ctx<'a> {
    doc: Option<&'a FileDoc>,
    argv: &'a Argv,
}

impl Ctx<'_> {
    fn get(&self, field: &'static str) -> Option<Setting> {
        if let Some(f) = flag_table::by_field(field)
            && let Some(v) = self.argv.value(f.name)
        {
            let value = v
                .parse::<i64>()
                .map(Value::from)
                .or_else(|_| v.parse::<f64>().map(Value::from))
                .unwrap_or(Value::String(v));
            return Some(Setting {
                field,
                value,
                origin: Origin::Flag(f.name),
            });
        }
        let value = self.doc?.get(field)?.clone();
        Some(Setting {
            field,
            value,
            origin: Origin::File,
        })
    }

    fn finding(&self, s: &Setting, f: Finding) -> Finding {
        match (&s.origin, self.doc) {
            (Origin::Flag(name), _) => Finding {
                kind: Kind::Flag,
                ..f
            }
            .field(format!("--{name}")),
            (Origin::File, Some(doc)) => doc.finding(f, s.field),
            (Origin::File, None) => f.field(s.field),
        }
    }

    fn error(&self, s: &Setting, message: String, report: &mut Report) {
        report.push(self.finding(s, Finding::error(Kind::Config, message)));
    }
}

const NON_NEGATIVE: &[&str] = &[
    "eventBurst",
    "eventRecordQPS",
    "kubeAPIBurst",
    "kubeAPIQPS",
    "maxOpenFiles",
    "maxPods",
    "podsPerCore",
    "registryBurst",
    "registryPullQPS",
];

/// (field, low, high, what upstream says is allowed, zero means unset).
const RANGES: &[(&str, f64, f64, &str, bool)] = &[
    (
        "healthzPort",
        1.0,
        65535.0,
        "between 1 and 65535, inclusive",
        true,
    ),
    ("port", 1.0, 65535.0, "between 1 and 65535, inclusive", true),
    (
        "readOnlyPort",
        1.0,
        65535.0,
        "between 0 and 65535, inclusive",
        true,
    ),
    (
        "imageGCHighThresholdPercent",
        0.0,
        100.0,
        "between 0 and 100, inclusive",
        false,
    ),
    (
        "imageGCLowThresholdPercent",
        0.0,
        100.0,
        "between 0 and 100, inclusive",
        false,
    ),
    (
        "iptablesDropBit",
        0.0,
        31.0,
        "between 0 and 31, inclusive",
        false,
    ),
    (
        "iptablesMasqueradeBit",
        0.0,
        31.0,
        "between 0 and 31, inclusive",
        false,
    ),
    (
        "oomScoreAdj",
        -1000.0,
        1000.0,
        "between -1000 and 1000, inclusive",
        false,
    ),
];

/// (field, valid values, upstream's list as printed).
const ENUMS: &[(&str, &[&str], &str)] = &[
    (
        "hairpinMode",
        &["none", "hairpin-veth", "promiscuous-bridge"],
        "Valid options are \"none\", \"hairpin-veth\" or \"promiscuous-bridge\"",
    ),
    (
        "topologyManagerPolicy",
        &["none", "best-effort", "restricted", "single-numa-node"],
        "must be one of: [\"none\" \"best-effort\" \"restricted\" \"single-numa-node\"]",
    ),
    (
        "topologyManagerScope",
        &["container", "pod"],
        "must be one of: \"container\", or \"pod\"",
    ),
];

/// Fields upstream's v1beta1 types mark `Deprecated: no longer has any effect`.
const DEPRECATED: &[&str] = &["iptablesMasqueradeBit", "iptablesDropBit"];

fn ranges(cx: &Ctx<'_>, report: &mut Report) {
    for field in NON_NEGATIVE {
        if let Some(s) = cx.get(field)
            && s.num().is_some_and(|n| n < 0.0)
        {
            let v = s.text().unwrap_or_default();
            let m = format!(
                "invalid configuration: {} {v} must not be a negative number",
                s.label()
            );
            cx.error(&s, m, report);
        }
    }
    for (field, lo, hi, allowed, zero_unset) in RANGES {
        let Some(s) = cx.get(field) else { continue };
        let Some(n) = s.num() else { continue };
        if (*zero_unset && n == 0.0) || (*lo..=*hi).contains(&n) {
            continue;
        }
        let v = s.text().unwrap_or_default();
        let m = format!("invalid configuration: {} {v} must be {allowed}", s.label());
        cx.error(&s, m, report);
    }
    let high = cx.get("imageGCHighThresholdPercent");
    let low = cx.get("imageGCLowThresholdPercent");
    let hn = high.as_ref().and_then(Setting::num).unwrap_or(85.0);
    let ln = low.as_ref().and_then(Setting::num).unwrap_or(80.0);
    if ln >= hn
        && let Some(s) = low.as_ref().or(high.as_ref())
    {
        let m = format!(
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {ln} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {hn}"
        );
        cx.error(s, m, report);
    }
    if let Some(s) = cx.get("nodeStatusMaxImages")
        && s.num().is_some_and(|n| n < -1.0)
    {
        let v = s.text().unwrap_or_default();
        let m = format!(
            "invalid configuration: {} {v} must be -1 or greater",
            s.label()
        );
        cx.error(&s, m, report);
    }
    if let Some(s) = cx.get("nodeLeaseDurationSeconds")
        && s.num().is_some_and(|n| n < 0.0)
    {
        let m = "invalid configuration: nodeLeaseDurationSeconds must be greater than 0".into();
        cx.error(&s, m, report);
    }
    if let Some(s) = cx.get("memoryThrottlingFactor")
        && s.num().is_some_and(|n| n <= 0.0 || n > 1.0)
    {
        let v = s.text().unwrap_or_default();
        let m = format!(
            "invalid configuration: memoryThrottlingFactor {v} must be greater than 0 and less than or equal to 1.0"
        );
        cx.error(&s, m, report);
    }
}

fn logs_and_durations(cx: &Ctx<'_>, report: &mut Report) {
    if let Some(s) = cx.get("containerLogMaxFiles")
        && s.num().is_some_and(|n| n <= 1.0)
    {
        let m = "invalid configuration: containerLogMaxFiles must be greater than 1".into();
        cx.error(&s, m, report);
    }
    if let Some(s) = cx.get("containerLogMaxWorkers")
        && s.num().is_some_and(|n| n < 1.0)
    {
        let m = "invalid configuration: containerLogMaxWorkers must be greater than or equal to 1"
            .into();
        cx.error(&s, m, report);
    }
    if let Some(s) = cx.get("containerLogMonitorInterval")
        && s.duration()
            .is_some_and(|d| d.as_nanos() != 0 && d.as_nanos() < 3_000_000_000)
    {
        let m = "invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal to 3s".into();
        cx.error(&s, m, report);
    }
    for field in ["shutdownGracePeriod", "shutdownGracePeriodCriticalPods"] {
        if let Some(s) = cx.get(field)
            && let Some(d) = s.duration()
            && (d.as_nanos() < 0 || (d.as_nanos() > 0 && d.as_nanos() < 1_000_000_000))
        {
            let m = format!(
                "invalid configuration: {field} {d} must be either zero or otherwise >= 1 sec"
            );
            cx.error(&s, m, report);
        }
    }
    let total = cx.get("shutdownGracePeriod").and_then(|s| s.duration());
    if let Some(s) = cx.get("shutdownGracePeriodCriticalPods")
        && let Some(crit) = s.duration()
        && crit.as_nanos() > total.map_or(0, GoDuration::as_nanos)
    {
        let t = total.unwrap_or_default();
        let m = format!(
            "invalid configuration: shutdownGracePeriodCriticalPods {crit} must be <= shutdownGracePeriod {t}"
        );
        cx.error(&s, m, report);
    }
    for field in ["imageMinimumGCAge", "imageMaximumGCAge"] {
        if let Some(s) = cx.get(field)
            && let Some(d) = s.duration().filter(|d| d.as_nanos() < 0)
        {
            let m = format!("invalid configuration: {field} {d} must not be negative");
            cx.error(&s, m, report);
        }
    }
}

fn enums(cx: &Ctx<'_>, report: &mut Report) {
    for (field, valid, allowed) in ENUMS {
        let Some(s) = cx.get(field) else { continue };
        let Some(v) = s.text().filter(|v| !v.is_empty()) else {
            continue;
        };
        if !valid.contains(&v.as_str()) {
            let m = if *field == "hairpinMode" {
                format!(
                    "invalid configuration: option {v:?} specified for {}. {allowed}",
                    s.label()
                )
            } else {
                format!("invalid configuration: {} {v:?} {allowed}", s.label())
            };
            cx.error(&s, m, report);
        }
    }
    if let Some(s) = cx.get("runOnce")
        && s.value == Value::Bool(true)
    {
        let m = "invalid configuration: runOnce (--runOnce) true, Runonce mode has been deprecated and should not be set".into();
        cx.error(&s, m, report);
    }
    enforce_node_allocatable(cx, report);
}

fn enforce_node_allocatable(cx: &Ctx<'_>, report: &mut Report) {
    let Some(s) = cx.get("enforceNodeAllocatable") else {
        return;
    };
    let items: Vec<String> = match &s.value {
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        Value::String(t) => t.split(',').map(|i| i.trim().to_string()).collect(),
        _ => return,
    };
    let valid = [
        "pods",
        "system-reserved",
        "system-reserved-compressible",
        "kube-reserved",
        "kube-reserved-compressible",
        "none",
    ];
    let mut seen = vec![];
    for v in &items {
        let m = if seen.contains(v) {
            format!(
                "invalid configuration: duplicated enforcements {v:?} in enforceNodeAllocatable (--enforce-node-allocatable)"
            )
        } else if !valid.contains(&v.as_str()) {
            format!(
                "invalid configuration: option {v:?} specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are \"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \"kube-reserved-compressible\" or \"none\""
            )
        } else if v == "none" && items.len() > 1 {
            "invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified".to_string()
        } else {
            seen.push(v.clone());
            continue;
        };
        cx.error(&s, m, report);
    }
}

fn deprecated(cx: &Ctx<'_>, report: &mut Report) {
    for field in DEPRECATED {
        if let Some(s) = cx.get(field)
            && matches!(s.origin, Origin::File)
        {
            let f = Finding::warning(
                Kind::Config,
                format!("{field} is deprecated upstream and no longer has any effect"),
            );
            report.push(cx.finding(&s, f));
        }
    }
}

/// Runs every rule.
pub(super) fn check(doc: Option<&FileDoc>, argv: &Argv, report: &mut Report) {
    let cx = Ctx { doc, argv };
    ranges(&cx, report);
    logs_and_durations(&cx, report);
    enums(&cx, report);
    deprecated(&cx, report);
}
