//! A strict parser of the Prometheus text format 0.0.4, for tests and tools
//! that read `/metrics` back (as upstream's e2e suite does with expfmt).
//!
//! Stricter than expfmt where a difference would hide a defect: every sample
//! must belong to the family of the `# TYPE` line before it (its name, or for
//! a histogram its `_bucket`/`_sum`/`_count`), a family appears once, and
//! OpenMetrics-only lines (`# EOF`, `# UNIT`) are rejected.

use std::collections::BTreeMap;

/// Why an exposition does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// A line that is not a comment, descriptor or sample.
    #[error("line {line}: {message}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample's name (for histograms with its suffix).
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// One metric family.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricFamily {
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    pub kind: String,
    /// The help text.
    pub help: String,
    /// Its samples.
    pub samples: Vec<Sample>,
}

/// Parses `text` into families by name.
pub fn parse(text: &str) -> Result<BTreeMap<String, MetricFamily>, ParseError> {
    let mut out: BTreeMap<String, MetricFamily> = BTreeMap::new();
    let mut current: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let err = |message: String| ParseError::Syntax {
            line: i + 1,
            message,
        };
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let f = out.entry(name.to_string()).or_default();
            if !f.help.is_empty() || !f.samples.is_empty() {
                return Err(err(format!("family {name} repeated")));
            }
            f.help = help.to_string();
            current = Some(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| err("TYPE without a type".into()))?;
            if !matches!(
                kind,
                "counter" | "gauge" | "histogram" | "summary" | "untyped"
            ) {
                return Err(err(format!("unknown type {kind}")));
            }
            let f = out.entry(name.to_string()).or_default();
            if !f.kind.is_empty() || !f.samples.is_empty() {
                return Err(err(format!("family {name} typed twice")));
            }
            f.kind = kind.to_string();
            current = Some(name.to_string());
        } else if line.starts_with("# EOF") || line.starts_with("# UNIT") {
            return Err(err("OpenMetrics line in 0.0.4 text".into()));
        } else if line.starts_with('#') {
            continue;
        } else {
            let sample = parse_sample(line).map_err(err)?;
            let family = current
                .as_deref()
                .ok_or_else(|| err(format!("sample {} before any TYPE", sample.name)))?;
            let f = out.entry(family.to_string()).or_default();
            let belongs = sample.name == family
                || (f.kind == "histogram"
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| sample.name.strip_suffix(s) == Some(family)));
            if !belongs {
                return Err(err(format!(
                    "sample {} outside its family {family}",
                    sample.name
                )));
            }
            f.samples.push(sample);
        }
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| format!("no value in {line:?}"))?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let (key, r) = rest
                .split_once("=\"")
                .ok_or_else(|| format!("bad label in {line:?}"))?;
            let mut value = String::new();
            let mut chars = r.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => return Err(format!("bad escape in {line:?}")),
                    },
                    Some((j, '"')) => break j,
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("unterminated label value in {line:?}")),
                }
            };
            labels.push((key.to_string(), value));
            rest = &r[end + 1..];
        }
    }
    let mut fields = rest.split_whitespace();
    let value = fields
        .next()
        .ok_or_else(|| format!("no value in {line:?}"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}
