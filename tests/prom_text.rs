//! A small, independent reader of the Prometheus text format 0.0.4 for
//! tests (it shares nothing with kubelet-metrics): `# HELP`/`# TYPE`
//! descriptors, then samples `name{label="v",...} value [timestamp_ms]`,
//! each of which must belong to a family typed before it.

use std::collections::BTreeMap;

use anyhow::{Context, bail};

/// One sample.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Sample name (with `_bucket`, `_sum`, `_count` for histograms).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
    /// Timestamp in milliseconds, when given.
    pub timestamp_ms: Option<i64>,
}

/// A family: its type and samples.
#[derive(Debug, Default, Clone)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, `summary`, `untyped`.
    pub kind: String,
    /// Help text.
    pub help: String,
    /// Samples.
    pub samples: Vec<Sample>,
}

fn family_of<'a>(name: &str, families: &'a BTreeMap<String, Family>) -> Option<&'a str> {
    if families.contains_key(name) {
        return families.get_key_value(name).map(|(k, _)| k.as_str());
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && families
                .get(base)
                .is_some_and(|f| f.kind == "histogram" || f.kind == "summary")
        {
            return families.get_key_value(base).map(|(k, _)| k.as_str());
        }
    }
    None
}

fn parse_labels(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"").context("label without =\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => bail!("dangling escape"),
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.context("unterminated label value")?;
        out.insert(k.trim_start_matches(',').trim().to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Ok(out)
}

/// Parses an exposition; any malformed line is an error.
pub fn parse(text: &str) -> anyhow::Result<BTreeMap<String, Family>> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let ctx = || format!("line {}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().help = help.to_string();
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').with_context(ctx)?;
            anyhow::ensure!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{}: unknown type",
                ctx()
            );
            families.entry(name.to_string()).or_default().kind = kind.to_string();
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(i) => {
                let close = line.rfind('}').with_context(ctx)?;
                (
                    &line[..i],
                    parse_labels(&line[i + 1..close]).with_context(ctx)?,
                    &line[close + 1..],
                )
            }
            None => {
                let (name, rest) = line.split_once(' ').with_context(ctx)?;
                (name, BTreeMap::new(), rest)
            }
        };
        let mut fields = rest.split_whitespace();
        let value: f64 = match fields.next().with_context(ctx)? {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().with_context(ctx)?,
        };
        let timestamp_ms = fields
            .next()
            .map(str::parse)
            .transpose()
            .with_context(ctx)?;
        let family = family_of(name, &families)
            .with_context(|| format!("{}: no # TYPE for {name}", ctx()))?
            .to_string();
        families
            .get_mut(&family)
            .context("family")?
            .samples
            .push(Sample {
                name: name.to_string(),
                labels,
                value,
                timestamp_ms,
            });
    }
    Ok(families)
}
