//! Go flag value syntax: the `pflag` scalar types (`strconv.ParseBool`,
//! `ParseInt` with base 0, `time.ParseDuration`, CSV string slices) and the
//! map types of `k8s.io/component-base/cli/flag` (`MapStringString`,
//! `LangleSeparatedMapStringString`, `MapStringBool`,
//! `ColonSeparatedMultimapStringString`), plus the kubelet's own
//! `ReservedMemoryVar`, klog's `Level`, `moduleSpec`, `traceLocation` and
//! `severity`, and `resource.Quantity`.

use std::net::{IpAddr, Ipv4Addr};

use crate::duration::GoDuration;

/// The value type of an upstream flag, named after its pflag `Type()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// `bool`: `--flag`, `--flag=true|false` (and 1, t, T, TRUE, True, 0, f, F, FALSE, False).
    Bool,
    /// `string`.
    String,
    /// `int32`.
    Int32,
    /// `int` / `int64`.
    Int64,
    /// `uint64`.
    Uint64,
    /// `float64`.
    Float64,
    /// `duration`: a Go duration.
    Duration,
    /// `ip`: an IP address (or empty).
    Ip,
    /// `strings`: comma-separated, repeatable (appends).
    StringSlice,
    /// `mapStringString`: `k=v,k2=v2`, repeatable (merges).
    MapStringString,
    /// `mapStringString` without comma splitting: one `k=v` per use.
    MapStringStringNoSplit,
    /// `mapStringString` with `<`: `memory.available<100Mi,...`.
    LangleMap,
    /// `mapStringBool`: `Gate=true,...`.
    MapStringBool,
    /// `colonSeparatedMultimapStringString`: `k:v,k:v2`.
    ColonMultimap,
    /// `[]v1.Taint`: `key=value:Effect,...`.
    Taints,
    /// `reserved-memory`: `0:memory=1Gi,hugepages-1M=2Gi`, repeatable.
    ReservedMemory,
    /// `quantity`: a `resource.Quantity` such as `10Mi`.
    Quantity,
    /// klog `Level`: an int32 verbosity.
    Level,
    /// klog `moduleSpec`: `pattern=N,...`.
    ModuleSpec,
    /// klog `traceLocation`: `file.go:N`.
    TraceLocation,
    /// klog `severity`: INFO, WARNING, ERROR, FATAL or 0-3.
    Severity,
    /// verflag `version`: `--version`, `--version=raw`, `--version=false`.
    Version,
}

impl ValueKind {
    /// Whether the flag may be given without a value (`--flag` means `--flag=true`).
    pub fn is_bool(self) -> bool {
        matches!(self, Self::Bool | Self::Version)
    }

    /// Whether repeated uses accumulate (maps merge, slices append) rather
    /// than the last one winning.
    pub fn accumulates(self) -> bool {
        matches!(
            self,
            Self::StringSlice
                | Self::MapStringString
                | Self::MapStringStringNoSplit
                | Self::LangleMap
                | Self::MapStringBool
                | Self::ColonMultimap
                | Self::Taints
                | Self::ReservedMemory
        )
    }

    /// A value of this type, for help text and tests.
    pub fn sample(self) -> &'static str {
        match self {
            Self::Bool | Self::Version => "true",
            Self::String => "/etc/kubernetes/sample",
            Self::Int32 | Self::Int64 | Self::Uint64 | Self::Level => "3",
            Self::Float64 => "1.5",
            Self::Duration => "1m30s",
            Self::Ip => "0.0.0.0",
            Self::StringSlice => "a,b",
            Self::MapStringString => "memory=100Mi,cpu=100m",
            Self::MapStringStringNoSplit => "full-pcpus-only=true",
            Self::LangleMap => "memory.available<100Mi,nodefs.available<10%",
            Self::MapStringBool => "SomeGate=true",
            Self::ColonMultimap => "a:hello,b:again",
            Self::Taints => "dedicated=infra:NoSchedule",
            Self::ReservedMemory => "0:memory=1Gi",
            Self::Quantity => "10Mi",
            Self::ModuleSpec => "server=2,kube*=4",
            Self::TraceLocation => "server.go:10",
            Self::Severity => "ERROR",
        }
    }

    /// Checks one command-line value as pflag's `Value.Set` would.
    pub fn check(self, v: &str) -> Result<(), String> {
        match self {
            Self::Bool => parse_go_bool(v).map(drop),
            Self::Version => match v {
                "raw" => Ok(()),
                _ if v.starts_with('v') => Ok(()),
                _ => parse_go_bool(v).map(drop),
            },
            Self::String => Ok(()),
            Self::Int32 | Self::Level => parse_go_int(v, 32).map(drop),
            Self::Int64 => parse_go_int(v, 64).map(drop),
            Self::Uint64 => parse_go_uint(v).map(drop),
            Self::Float64 => parse_go_float(v).map(drop),
            Self::Duration => GoDuration::parse(v).map(drop),
            Self::Ip => parse_ip_sloppy(v).map(drop),
            Self::StringSlice => split_csv(v).map(drop),
            Self::MapStringString => parse_pairs(v, '=', true).map(drop),
            Self::MapStringStringNoSplit => parse_pairs(v, '=', false).map(drop),
            Self::LangleMap => parse_pairs(v, '<', true).map(drop),
            Self::ColonMultimap => parse_pairs(v, ':', true).map(drop),
            Self::MapStringBool => {
                for (k, b) in parse_pairs(v, '=', true)? {
                    parse_go_bool(&b).map_err(|e| format!("invalid value of {k}: {e}"))?;
                }
                Ok(())
            }
            Self::Taints => check_taints(v),
            Self::ReservedMemory => check_reserved_memory(v),
            Self::Quantity => parse_quantity(v),
            Self::ModuleSpec => check_module_spec(v),
            Self::TraceLocation => check_trace_location(v),
            Self::Severity => check_severity(v),
        }
    }
}

/// `strconv.ParseBool`.
pub fn parse_go_bool(v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("strconv.ParseBool: parsing {v:?}: invalid syntax")),
    }
}

/// Splits a base prefix off a Go integer literal (`strconv.ParseInt(s, 0, n)`):
/// 0x, 0o, 0b, or a leading 0 for octal. Underscores may separate digits.
fn split_base(digits: &str) -> (u32, &str, bool) {
    let lower = digits.get(..2).map(str::to_ascii_lowercase);
    match lower.as_deref() {
        Some("0x") => (16, &digits[2..], true),
        Some("0o") => (8, &digits[2..], true),
        Some("0b") => (2, &digits[2..], true),
        _ if digits.len() > 1 && digits.starts_with('0') => (8, &digits[1..], true),
        _ => (10, digits, false),
    }
}

fn parse_magnitude(v: &str, digits: &str) -> Result<u128, String> {
    let (radix, body, prefixed) = split_base(digits);
    let syntax = || format!("strconv.ParseInt: parsing {v:?}: invalid syntax");
    // Go integer literal syntax: `_` only between digits or right after a base prefix.
    if body.ends_with('_') || body.contains("__") || (!prefixed && body.starts_with('_')) {
        return Err(syntax());
    }
    let clean: String = body.chars().filter(|c| *c != '_').collect();
    if clean.is_empty() {
        return Err(syntax());
    }
    u128::from_str_radix(&clean, radix).map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow => {
            format!("strconv.ParseInt: parsing {v:?}: value out of range")
        }
        _ => syntax(),
    })
}

/// `strconv.ParseInt(v, 0, bits)`.
pub fn parse_go_int(v: &str, bits: u32) -> Result<i64, String> {
    let (negative, digits) = match v.as_bytes().first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let magnitude = parse_magnitude(v, digits)?;
    let max = 1u128 << (bits - 1);
    let out_of_range = || format!("strconv.ParseInt: parsing {v:?}: value out of range");
    if (!negative && magnitude >= max) || (negative && magnitude > max) {
        return Err(out_of_range());
    }
    let m = i128::try_from(magnitude).map_err(|_| out_of_range())?;
    i64::try_from(if negative { -m } else { m }).map_err(|_| out_of_range())
}

/// `strconv.ParseUint(v, 0, 64)`.
pub fn parse_go_uint(v: &str) -> Result<u64, String> {
    let m = parse_magnitude(v, v)?;
    u64::try_from(m).map_err(|_| format!("strconv.ParseUint: parsing {v:?}: value out of range"))
}

/// `strconv.ParseFloat(v, 64)` for decimal and exponent forms, Inf and NaN.
pub fn parse_go_float(v: &str) -> Result<f64, String> {
    let ok = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_'));
    v.replace('_', "")
        .parse::<f64>()
        .ok()
        .filter(|_| ok)
        .ok_or_else(|| format!("strconv.ParseFloat: parsing {v:?}: invalid syntax"))
}

/// `netutils.ParseIPSloppy`: IPv4 octets may carry leading zeros. Empty is "unset".
pub fn parse_ip_sloppy(v: &str) -> Result<Option<IpAddr>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Ok(Some(ip));
    }
    let octets: Vec<&str> = v.split('.').collect();
    let parsed: Option<Vec<u8>> = (octets.len() == 4)
        .then(|| {
            octets
                .iter()
                .map(|o| {
                    (!o.is_empty() && o.len() <= 3 && o.bytes().all(|b| b.is_ascii_digit()))
                        .then(|| o.parse::<u8>().ok())
                        .flatten()
                })
                .collect()
        })
        .flatten();
    match parsed.as_deref() {
        Some(&[a, b, c, d]) => Ok(Some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))),
        _ => Err(format!("{v:?} is not a valid IP address")),
    }
}

/// pflag `strings`: one CSV record (`encoding/csv`), double quotes allowed.
/// The empty string is the empty list.
pub fn split_csv(v: &str) -> Result<Vec<String>, String> {
    if v.is_empty() {
        return Ok(vec![]);
    }
    let mut out = vec![];
    let mut field = String::new();
    let mut chars = v.chars().peekable();
    let mut at_start = true;
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (false, '"') if at_start => quoted = true,
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => {
                quoted = false;
                if !matches!(chars.peek(), None | Some(',')) {
                    return Err(format!("extraneous \" in field of {v:?}"));
                }
            }
            (false, ',') => {
                out.push(std::mem::take(&mut field));
                at_start = true;
                continue;
            }
            (false, '"') => return Err(format!("bare \" in non-quoted field of {v:?}")),
            (_, c) => field.push(c),
        }
        at_start = false;
    }
    if quoted {
        return Err(format!("extraneous or missing \" in quoted field of {v:?}"));
    }
    out.push(field);
    Ok(out)
}

/// The map types of `component-base/cli/flag`: `key<sep>value` pairs,
/// comma-separated when `split`, trimmed, empty items skipped.
pub fn parse_pairs(v: &str, sep: char, split: bool) -> Result<Vec<(String, String)>, String> {
    let items: Vec<&str> = if split {
        v.split(',').collect()
    } else {
        vec![v]
    };
    let mut out = vec![];
    for item in items.into_iter().map(str::trim) {
        if item.is_empty() && split {
            continue;
        }
        let (k, val) = item
            .split_once(sep)
            .ok_or_else(|| format!("malformed pair {item:?}, expect string{sep}string"))?;
        out.push((k.trim().to_string(), val.trim().to_string()));
    }
    Ok(out)
}

/// `resource.Quantity` syntax: a signed decimal number, then an optional
/// binary (Ki..Ei), decimal (n, u, m, k, M..E) or exponent (e3, E-2) suffix.
pub fn parse_quantity(v: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {v:?}"
        )
    };
    let body = v.strip_prefix(['+', '-']).unwrap_or(v);
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let suffix_ok = match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        s if s.starts_with(['e', 'E']) => {
            let exp = &s[1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    };
    if suffix_ok { Ok(()) } else { Err(bad()) }
}

fn check_taints(v: &str) -> Result<(), String> {
    for t in v.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (kv, effect) = t
            .rsplit_once(':')
            .ok_or_else(|| format!("invalid taint spec {t:?}"))?;
        let key = kv.split_once('=').map_or(kv, |(k, _)| k);
        if key.is_empty() || !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(format!("invalid taint spec {t:?}"));
        }
    }
    Ok(())
}

fn check_reserved_memory(v: &str) -> Result<(), String> {
    for entry in v.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (numa, resources) = entry
            .split_once(':')
            .ok_or_else(|| format!("the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got {entry}"))?;
        parse_go_int(numa.trim(), 32)
            .map_err(|e| format!("failed to parse the NUMA node ID: {e}"))?;
        let pairs = parse_pairs(resources, '=', true)?;
        if pairs.is_empty() {
            return Err(format!("no reserved memory given for NUMA node {numa}"));
        }
        for (name, q) in pairs {
            parse_quantity(&q).map_err(|e| format!("{name}: {e}"))?;
        }
    }
    Ok(())
}

fn check_module_spec(v: &str) -> Result<(), String> {
    for pat in v.split(',').filter(|p| !p.is_empty()) {
        let (name, level) = pat.split_once('=').ok_or_else(|| {
            format!("syntax error: expect comma-separated list of filename=N: {pat:?}")
        })?;
        if name.is_empty() {
            return Err(format!("syntax error: empty pattern in {pat:?}"));
        }
        parse_go_int(level, 32)?;
    }
    Ok(())
}

fn check_trace_location(v: &str) -> Result<(), String> {
    if v.is_empty() || v == ":0" {
        return Ok(());
    }
    let (file, line) = v
        .rsplit_once(':')
        .ok_or_else(|| format!("syntax error: expect file.go:234, got {v:?}"))?;
    if file.is_empty() || line.parse::<u32>().is_err() {
        return Err(format!("syntax error: expect file.go:234, got {v:?}"));
    }
    Ok(())
}

fn check_severity(v: &str) -> Result<(), String> {
    let known = ["INFO", "WARNING", "ERROR", "FATAL"];
    if known.contains(&v.to_ascii_uppercase().as_str()) {
        return Ok(());
    }
    match v.parse::<u8>() {
        Ok(n) if n < 4 => Ok(()),
        _ => Err(format!("unknown severity {v:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_bools_and_ints() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
        assert_eq!(parse_go_int("-999", 32), Ok(-999));
        assert_eq!(parse_go_int("0x10", 32), Ok(16));
        assert_eq!(parse_go_int("010", 32), Ok(8));
        assert_eq!(parse_go_int("0b11", 32), Ok(3));
        assert_eq!(parse_go_int("1_000", 32), Ok(1000));
        assert_eq!(parse_go_int("0x_ff", 32), Ok(255));
        assert!(parse_go_int("_1", 32).is_err());
        assert!(parse_go_int("1__0", 32).is_err());
        assert!(parse_go_int("0x", 32).is_err());
        assert_eq!(parse_go_int("2147483647", 32), Ok(i64::from(i32::MAX)));
        assert_eq!(parse_go_int("-2147483648", 32), Ok(i64::from(i32::MIN)));
        assert!(parse_go_int("2147483648", 32).is_err());
        assert!(parse_go_int("", 32).is_err());
        assert!(parse_go_int("1.5", 64).is_err());
        assert_eq!(parse_go_uint("1800"), Ok(1800));
        assert!(parse_go_uint("-1").is_err());
        assert_eq!(parse_go_float("0.5"), Ok(0.5));
        assert!(parse_go_float("1,5").is_err());
    }

    #[test]
    fn slices_maps_and_addresses() {
        assert_eq!(split_csv("a,b"), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(split_csv(""), Ok(vec![]));
        assert_eq!(split_csv("\"a,b\",c"), Ok(vec!["a,b".into(), "c".into()]));
        assert!(split_csv("a\"b").is_err());
        assert_eq!(
            parse_pairs(" cpu = 100m, ,memory=1Gi", '=', true),
            Ok(vec![
                ("cpu".into(), "100m".into()),
                ("memory".into(), "1Gi".into())
            ])
        );
        assert_eq!(
            parse_pairs("a=b,c=d", '=', false),
            Ok(vec![("a".into(), "b,c=d".into())])
        );
        assert!(parse_pairs("memory.available<1Gi", '=', true).is_err());
        assert!(
            ValueKind::LangleMap
                .check("memory.available<1Gi,nodefs.available<10%")
                .is_ok()
        );
        assert!(ValueKind::MapStringBool.check("A=true,B=False").is_ok());
        assert!(ValueKind::MapStringBool.check("A=yes").is_err());
        assert_eq!(
            parse_ip_sloppy("010.000.0.1").ok().flatten(),
            "10.0.0.1".parse().ok()
        );
        assert_eq!(parse_ip_sloppy(""), Ok(None));
        assert!(parse_ip_sloppy("::1").is_ok());
        assert!(parse_ip_sloppy("300.1.1.1").is_err());
        assert!(parse_ip_sloppy("host").is_err());
    }

    #[test]
    fn quantities_and_klog_values() {
        for q in ["10Mi", "1.5Gi", "100m", "1e3", "2E-2", "+5", "0.5", "1k"] {
            assert!(parse_quantity(q).is_ok(), "{q}");
        }
        for q in ["", "Mi", "10MB", "1.2.3", "ten"] {
            assert!(parse_quantity(q).is_err(), "{q}");
        }
        assert!(
            ValueKind::ReservedMemory
                .check("0:memory=1Gi,hugepages-1M=2Gi")
                .is_ok()
        );
        assert!(ValueKind::ReservedMemory.check("memory=1Gi").is_err());
        assert!(ValueKind::ModuleSpec.check("server=2,kube*=4").is_ok());
        assert!(ValueKind::ModuleSpec.check("server").is_err());
        assert!(ValueKind::TraceLocation.check("main.go:10").is_ok());
        assert!(ValueKind::TraceLocation.check("main.go").is_err());
        assert!(ValueKind::Severity.check("warning").is_ok());
        assert!(ValueKind::Severity.check("7").is_err());
        assert!(ValueKind::Version.check("raw").is_ok());
        assert!(ValueKind::Version.check("v1.30.0").is_ok());
        assert!(ValueKind::Version.check("maybe").is_err());
        assert!(
            ValueKind::Taints
                .check("a=b:NoSchedule,c:NoExecute")
                .is_ok()
        );
        assert!(ValueKind::Taints.check("a=b:Sometimes").is_err());
    }
}
