//! Upstream flags and KubeletConfiguration fields kubelet-rs accepts but does
//! not act on yet: their values, typed by their Go flag syntax and resolved
//! with upstream precedence (explicit flag over `--config` file over
//! default, as `kubeletConfigFlagPrecedence` does), and the one warning each
//! given flag earns (upstream marks such flags deprecated; kubelet-rs says
//! what it does with them).

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::duration::GoDuration;
use crate::file::KubeletConfiguration;
use crate::flag_table::{FLAGS, FlagKind, UpstreamFlag};
use crate::flags::Flags;
use crate::values::{
    ValueKind, parse_go_bool, parse_go_float, parse_go_int, parse_go_uint, parse_pairs, split_csv,
};
use crate::{ConfigError, invalid};

/// A resolved value of a setting kubelet-rs does not act on yet.
#[derive(Clone, Debug, PartialEq)]
pub enum SettingValue {
    /// A bool.
    Bool(bool),
    /// An integer (int32, int64, uint64 within range).
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (also IPs and quantities, as written).
    String(String),
    /// A Go duration (may be negative, e.g. `volumeStatsAggPeriod: -1s`).
    Duration(GoDuration),
    /// A list (string slices, taints, reserved memory, repeated headers).
    List(Vec<String>),
    /// A map (`k=v` and `k<v` maps, feature-gate style maps, vmodule).
    Map(BTreeMap<String, String>),
    /// A structured config-file value with no flag spelling (e.g. `reservedMemory`).
    Json(Value),
}

impl fmt::Display for SettingValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::String(s) => f.write_str(s),
            Self::Duration(d) => write!(f, "{d}"),
            Self::List(l) => f.write_str(&l.join(",")),
            Self::Map(m) => {
                let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                f.write_str(&items.join(","))
            }
            Self::Json(v) => write!(f, "{v}"),
        }
    }
}

/// Why kubelet-rs warns about a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarningCategory {
    /// Accepted; kubelet-rs does not do this yet.
    NotImplemented,
    /// Removed upstream in this Kubernetes minor version.
    Removed(&'static str),
}

/// One warning about one given flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlagWarning {
    /// The flag's name, without dashes.
    pub flag: &'static str,
    /// The value given, as written (repeated values joined by commas).
    pub value: String,
    /// Why.
    pub category: WarningCategory,
}

impl fmt::Display for FlagWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.category {
            WarningCategory::NotImplemented => write!(
                f,
                "flag --{} is accepted but not implemented by kubelet-rs; ignored",
                self.flag
            ),
            WarningCategory::Removed(v) => write!(
                f,
                "flag --{} was removed upstream in Kubernetes {v} and has no effect",
                self.flag
            ),
        }
    }
}

/// Flags with a typed field in [`Flags`] that kubelet-rs does not act on.
fn native_value(flags: &Flags, name: &str) -> Option<SettingValue> {
    let s = |v: &Option<String>| v.clone().map(SettingValue::String);
    let b = |v: Option<bool>| v.map(SettingValue::Bool);
    match name {
        "anonymous-auth" => b(flags.anonymous_auth),
        "authorization-mode" => s(&flags.authorization_mode),
        "client-ca-file" => s(&flags.client_ca_file),
        "tls-cert-file" => s(&flags.tls_cert_file),
        "tls-private-key-file" => s(&flags.tls_private_key_file),
        "read-only-port" => flags
            .read_only_port
            .map(|p| SettingValue::Int(i64::from(p))),
        "rotate-server-certificates" => b(flags.rotate_server_certificates),
        "fail-swap-on" => b(flags.fail_swap_on),
        "container-runtime" => s(&flags.container_runtime),
        "network-plugin" => s(&flags.network_plugin),
        "cni-bin-dir" => s(&flags.cni_bin_dir),
        "cni-conf-dir" => s(&flags.cni_conf_dir),
        "runtime-cgroups" => s(&flags.runtime_cgroups),
        "pod-infra-container-image" => s(&flags.pod_infra_container_image),
        _ => None,
    }
}

fn last(raw: &[String]) -> &str {
    raw.last().map_or("", String::as_str)
}

/// The typed value of a flag's command-line uses: scalars take the last use,
/// slices append and maps merge, as pflag's `Value.Set` does.
pub fn from_flag(kind: ValueKind, raw: &[String]) -> Result<SettingValue, String> {
    let v = last(raw);
    Ok(match kind {
        ValueKind::Bool => SettingValue::Bool(parse_go_bool(v)?),
        ValueKind::Int32 | ValueKind::Level => SettingValue::Int(parse_go_int(v, 32)?),
        ValueKind::Int64 => SettingValue::Int(parse_go_int(v, 64)?),
        ValueKind::Uint64 => SettingValue::Int(
            i64::try_from(parse_go_uint(v)?).map_err(|_| format!("{v} is out of range"))?,
        ),
        ValueKind::Float64 => SettingValue::Float(parse_go_float(v)?),
        ValueKind::Duration => SettingValue::Duration(GoDuration::parse(v)?),
        ValueKind::String
        | ValueKind::Ip
        | ValueKind::Quantity
        | ValueKind::TraceLocation
        | ValueKind::Severity
        | ValueKind::Version => SettingValue::String(v.to_string()),
        ValueKind::StringSlice => {
            let mut out = vec![];
            for r in raw {
                out.extend(split_csv(r)?);
            }
            SettingValue::List(out)
        }
        ValueKind::Taints | ValueKind::ColonMultimap => SettingValue::List(
            raw.iter()
                .flat_map(|r| r.split(','))
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .map(String::from)
                .collect(),
        ),
        ValueKind::ReservedMemory => SettingValue::List(raw.to_vec()),
        ValueKind::MapStringString
        | ValueKind::MapStringStringNoSplit
        | ValueKind::LangleMap
        | ValueKind::MapStringBool
        | ValueKind::ModuleSpec => {
            let (sep, split) = match kind {
                ValueKind::LangleMap => ('<', true),
                ValueKind::MapStringStringNoSplit => ('=', false),
                _ => ('=', true),
            };
            let mut out = BTreeMap::new();
            for r in raw {
                for (k, val) in parse_pairs(r, sep, split)? {
                    let val = match kind {
                        ValueKind::MapStringBool => parse_go_bool(&val)?.to_string(),
                        _ => val,
                    };
                    out.insert(k, val);
                }
            }
            SettingValue::Map(out)
        }
    })
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The typed value of a config-file field; `None` for null, empty strings and
/// zero durations, which upstream's v1beta1 defaulting treats as unset.
pub fn from_file(kind: ValueKind, v: &Value) -> Result<Option<SettingValue>, String> {
    let want = |what: &str| format!("expected {what}, got {v}");
    if v.is_null() {
        return Ok(None);
    }
    Ok(Some(match kind {
        ValueKind::Bool => SettingValue::Bool(v.as_bool().ok_or_else(|| want("a bool"))?),
        ValueKind::Int32 | ValueKind::Int64 | ValueKind::Uint64 | ValueKind::Level => {
            SettingValue::Int(v.as_i64().ok_or_else(|| want("an integer"))?)
        }
        ValueKind::Float64 => SettingValue::Float(v.as_f64().ok_or_else(|| want("a number"))?),
        ValueKind::Duration => {
            let text = v.as_str().ok_or_else(|| want("a duration string"))?;
            let d = GoDuration::parse(text)?;
            if d.as_nanos() == 0 {
                return Ok(None);
            }
            SettingValue::Duration(d)
        }
        ValueKind::String
        | ValueKind::Ip
        | ValueKind::Quantity
        | ValueKind::TraceLocation
        | ValueKind::Severity
        | ValueKind::Version => {
            let text = scalar_text(v).ok_or_else(|| want("a string"))?;
            if text.is_empty() {
                return Ok(None);
            }
            SettingValue::String(text)
        }
        ValueKind::StringSlice => SettingValue::List(
            v.as_array()
                .ok_or_else(|| want("a list"))?
                .iter()
                .map(|i| scalar_text(i).ok_or_else(|| want("a list of strings")))
                .collect::<Result<_, _>>()?,
        ),
        ValueKind::MapStringString
        | ValueKind::MapStringStringNoSplit
        | ValueKind::LangleMap
        | ValueKind::MapStringBool => SettingValue::Map(
            v.as_object()
                .ok_or_else(|| want("a map"))?
                .iter()
                .map(|(k, i)| {
                    Ok((
                        k.clone(),
                        scalar_text(i).ok_or_else(|| want("a map of scalars"))?,
                    ))
                })
                .collect::<Result<_, String>>()?,
        ),
        ValueKind::ModuleSpec => match v.as_array() {
            // logging.vmodule: [{filePattern: x, verbosity: 2}]
            Some(items) => SettingValue::Map(
                items
                    .iter()
                    .map(|i| {
                        let pattern = i.get("filePattern").and_then(Value::as_str);
                        let level = i.get("verbosity").and_then(scalar_text);
                        match (pattern, level) {
                            (Some(p), Some(l)) => Ok((p.to_string(), l)),
                            _ => Err(want("a list of {filePattern, verbosity}")),
                        }
                    })
                    .collect::<Result<_, String>>()?,
            ),
            None => return Err(want("a list")),
        },
        ValueKind::Taints | ValueKind::ColonMultimap | ValueKind::ReservedMemory => {
            SettingValue::Json(v.clone())
        }
    }))
}

/// The config file's value at a dotted field path.
fn file_value<'a>(file: &'a KubeletConfiguration, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let root = parts.next()?;
    let mut v = if root == "logging" {
        // `logging` has a typed part (verbosity); the rest is kept raw.
        file.logging.as_ref()?.other.get(parts.next()?)?
    } else {
        file.other.get(root)?
    };
    for key in parts {
        v = v.get(key)?;
    }
    Some(v)
}

/// The value given on the command line for a flag, typed.
fn given(flags: &Flags, f: &UpstreamFlag) -> Result<Option<SettingValue>, ConfigError> {
    if let Some(v) = native_value(flags, f.name) {
        return Ok(Some(v));
    }
    let Some(raw) = flags.extra.get(f.name) else {
        return Ok(None);
    };
    from_flag(f.value, raw)
        .map(Some)
        .map_err(|e| invalid(f.field.unwrap_or(f.name), raw.join(","), e))
}

/// KubeletConfiguration fields kubelet-rs does not act on yet, resolved flag
/// over file: field path -> value. Fields neither given nor in the file are
/// absent (upstream's default applies).
pub fn resolve_settings(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<BTreeMap<&'static str, SettingValue>, ConfigError> {
    let mut out = BTreeMap::new();
    for f in FLAGS.iter().filter(|f| f.kind == FlagKind::Config) {
        let Some(field) = f.field else { continue };
        if let Some(v) = given(flags, f)? {
            out.insert(field, v);
        } else if let Some(json) = file_value(file, field)
            && let Some(v) = from_file(f.value, &time_or_meta_duration(field, json))
                .map_err(|e| invalid(field, json.to_string(), e))?
        {
            out.insert(field, v);
        }
    }
    Ok(out)
}

/// component-base's `TimeOrMetaDuration` (`logging.flushFrequency`): a
/// duration string, or a number of nanoseconds, which is what kubeadm
/// writes (`flushFrequency: 0`). Other durations are strings only, as
/// `metav1.Duration`.
fn time_or_meta_duration(field: &str, json: &Value) -> Value {
    match json.as_i64() {
        Some(ns) if field == "logging.flushFrequency" => Value::String(format!("{ns}ns")),
        _ => json.clone(),
    }
}

/// Command-line-only flags kubelet-rs ignores (not implemented or removed
/// upstream), as given: flag name -> value.
pub fn ignored_flags(flags: &Flags) -> Result<BTreeMap<&'static str, SettingValue>, ConfigError> {
    let mut out = BTreeMap::new();
    for f in FLAGS
        .iter()
        .filter(|f| matches!(f.kind, FlagKind::NotImplemented | FlagKind::Removed(_)))
    {
        if let Some(v) = given(flags, f)? {
            out.insert(f.name, v);
        }
    }
    Ok(out)
}

fn honoured(f: &UpstreamFlag, value: &SettingValue) -> bool {
    f.honoured
        .and_then(|h| from_flag(f.value, &[h.to_string()]).ok())
        .is_some_and(|h| &h == value)
}

/// One warning for each given flag kubelet-rs does not act on, in table
/// order: not implemented (config-backed or command-line-only), or removed
/// upstream. A value that asks for what kubelet-rs already does draws none.
pub fn flag_warnings(flags: &Flags) -> Vec<FlagWarning> {
    let mut out = vec![];
    for f in FLAGS {
        let category = match f.kind {
            FlagKind::Implemented => {
                // Only "external" (a cloud-controller-manager owns the node) means something.
                match flags.cloud_provider.as_deref() {
                    Some(c) if f.name == "cloud-provider" && !c.is_empty() && c != "external" => {
                        out.push(FlagWarning {
                            flag: f.name,
                            value: c.to_string(),
                            category: WarningCategory::NotImplemented,
                        });
                    }
                    _ => {}
                }
                continue;
            }
            FlagKind::Config if f.acted_on => continue,
            FlagKind::Config | FlagKind::NotImplemented => WarningCategory::NotImplemented,
            FlagKind::Removed(v) => WarningCategory::Removed(v),
        };
        let value = native_value(flags, f.name).or_else(|| {
            flags.extra.get(f.name).map(|raw| {
                from_flag(f.value, raw).unwrap_or_else(|_| SettingValue::List(raw.to_vec()))
            })
        });
        let Some(value) = value else { continue };
        if category == WarningCategory::NotImplemented && honoured(f, &value) {
            continue;
        }
        out.push(FlagWarning {
            flag: f.name,
            value: value.to_string(),
            category,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut v = vec!["kubelet-rs"];
        v.extend_from_slice(args);
        Flags::parse_args(v).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn repeated_flags_append_merge_or_replace_as_pflag_does() {
        let f = flags(&[
            "--eviction-soft=memory.available<1Gi",
            "--eviction-soft",
            "nodefs.available<15%,memory.available<2Gi",
            "--allowed-unsafe-sysctls=net.core.*",
            "--allowed-unsafe-sysctls",
            "kernel.msg*,net.ipv4.route.min_pmtu",
            "--image-gc-high-threshold=70",
            "--image-gc-high-threshold=0x50",
        ]);
        let s = resolve_settings(&f, &KubeletConfiguration::default()).expect("settings");
        let soft: BTreeMap<String, String> =
            [("memory.available", "2Gi"), ("nodefs.available", "15%")]
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect();
        assert_eq!(s["evictionSoft"], SettingValue::Map(soft));
        assert_eq!(
            s["allowedUnsafeSysctls"],
            SettingValue::List(vec![
                "net.core.*".into(),
                "kernel.msg*".into(),
                "net.ipv4.route.min_pmtu".into()
            ])
        );
        assert_eq!(s["imageGCHighThresholdPercent"], SettingValue::Int(80));
    }

    /// kubeadm writes `logging: {flushFrequency: 0}`: nanoseconds, as
    /// component-base's `TimeOrMetaDuration` accepts (issue 28's idle bench
    /// found kubelet-rs refusing kubeadm's config file).
    #[test]
    fn flush_frequency_may_be_nanoseconds() {
        let resolve = |text: &str| {
            let (file, _) = KubeletConfiguration::parse(&format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{text}"
            ))
            .expect("parse");
            resolve_settings(&Flags::default(), &file)
        };
        let s = resolve("logging: {flushFrequency: 0}").expect("kubeadm's value");
        assert!(!s.contains_key("logging.flushFrequency"), "0 is unset");
        let s = resolve("logging: {flushFrequency: 5000000000}").expect("5 s");
        assert_eq!(s["logging.flushFrequency"].to_string(), "5s");
        assert!(
            resolve("volumeStatsAggPeriod: 60").is_err(),
            "metav1.Duration is a string"
        );
    }

    #[test]
    fn flag_beats_file_beats_default() {
        let (file, _) = KubeletConfiguration::parse(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             serializeImagePulls: false\nimageGCHighThresholdPercent: 90\n\
             streamingConnectionIdleTimeout: 0s\nvolumeStatsAggPeriod: -1s\n\
             authentication: {webhook: {enabled: true, cacheTTL: 2m}}\n\
             logging: {format: json, flushFrequency: 10s, vmodule: [{filePattern: 'server*', verbosity: 4}]}\n\
             enforceNodeAllocatable: [pods, kube-reserved]\n\
             reservedMemory: [{numaNode: 0, limits: {memory: 1Gi}}]\n",
        )
        .expect("file");
        let s =
            resolve_settings(&flags(&["--image-gc-high-threshold=75"]), &file).expect("settings");
        assert_eq!(
            s["imageGCHighThresholdPercent"],
            SettingValue::Int(75),
            "flag wins"
        );
        assert_eq!(
            s["serializeImagePulls"],
            SettingValue::Bool(false),
            "file next"
        );
        assert!(
            !s.contains_key("streamingConnectionIdleTimeout"),
            "0s means default"
        );
        assert!(!s.contains_key("podPidsLimit"), "unset stays unset");
        assert_eq!(
            s["volumeStatsAggPeriod"].to_string(),
            "-1s",
            "negative durations are kept"
        );
        assert_eq!(
            s["authentication.webhook.enabled"],
            SettingValue::Bool(true)
        );
        assert_eq!(s["authentication.webhook.cacheTTL"].to_string(), "2m0s");
        assert_eq!(s["logging.format"], SettingValue::String("json".into()));
        assert_eq!(s["logging.flushFrequency"].to_string(), "10s");
        assert_eq!(s["logging.vmodule"].to_string(), "server*=4");
        assert_eq!(
            s["enforceNodeAllocatable"].to_string(),
            "pods,kube-reserved"
        );
        assert!(matches!(s["reservedMemory"], SettingValue::Json(_)));

        let (bad, _) = KubeletConfiguration::parse(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nserializeImagePulls: sometimes\n",
        )
        .expect("file");
        let e = resolve_settings(&Flags::default(), &bad).expect_err("a string is not a bool");
        assert!(e.to_string().contains("serializeImagePulls"), "{e}");
    }

    #[test]
    fn warnings_name_the_flag_once_and_skip_what_kubelet_rs_already_does() {
        let f = flags(&[
            "--cpu-manager-policy=static",
            "--network-plugin=cni",
            "--cgroups-per-qos=true",
            "--read-only-port=0",
            "--fail-swap-on=false",
            "--logging-format=json",
            "--cloud-provider=aws",
            "--max-pods=30",
        ]);
        let shown: Vec<String> = flag_warnings(&f).iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "flag --cloud-provider is accepted but not implemented by kubelet-rs; ignored",
                "flag --cpu-manager-policy is accepted but not implemented by kubelet-rs; ignored",
                "flag --network-plugin was removed upstream in Kubernetes 1.24 and has no effect",
            ]
        );
        // kubelet-cm acts on both values of --cgroups-per-qos.
        let f = flags(&["--cgroups-per-qos=false", "--cloud-provider=external"]);
        assert!(flag_warnings(&f).is_empty());
        // kubelet-config `logs` writes JSON lines for it.
        assert!(flag_warnings(&flags(&["--logging-format=json"])).is_empty());
        // A flag honoured for one value only warns for the others.
        let w = flag_warnings(&flags(&["--fail-swap-on=true"]));
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].flag, w[0].value.as_str()), ("fail-swap-on", "true"));
        let ignored = ignored_flags(&flags(&[
            "--containerd=/run/containerd/containerd.sock",
            "--log-dir=/var/log",
            // Container GC acts on it (kubelet-config `housekeeping`).
            "--maximum-dead-containers=10",
        ]))
        .expect("ignored");
        assert_eq!(
            ignored["containerd"],
            SettingValue::String("/run/containerd/containerd.sock".into())
        );
        assert_eq!(ignored["log-dir"], SettingValue::String("/var/log".into()));
        assert!(!ignored.contains_key("maximum-dead-containers"));
        let acted = ignored_flags(&flags(&[
            "--image-credential-provider-config=/etc/kubernetes/credential-providers.yaml",
            "--image-credential-provider-bin-dir=/usr/libexec/kubelet",
        ]))
        .expect("ignored");
        assert!(acted.is_empty(), "{acted:?}");
    }
}
