//! Flags and the `--config` file, checked as a start would read them
//! (upstream `cmd/kubelet/app/options` flag parsing and deprecations, the
//! KubeletConfiguration decoder's strict/lenient decoding, and
//! `pkg/kubelet/apis/config/validation` `ValidateKubeletConfiguration`),
//! each finding with the flag, or the file and line of the offending key.

mod lines;
mod rules;
mod schema;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use kubelet_config::{
    ConfigError, FileError, Flags, KubeletConfig, KubeletConfiguration, deprecated_in_use,
    flag_table, flag_warnings, normalize_args,
};
use serde_json::Value;

use crate::finding::{Finding, Kind, error_line};
use crate::report::Report;

pub(crate) use lines::{Step, locate};

/// Upstream's deprecation notice on every flag that sets a config-file field.
const VIA_CONFIG_FILE: &str = "This parameter should be set via the config file specified by the Kubelet's --config flag. See https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for more information.";

/// The command line as given, normalised (`_` → `-`), for "was this flag
/// given, and with what value" questions.
pub(crate) struct Argv(Vec<String>);

impl Argv {
    fn new(flags: &[OsString]) -> Self {
        let mut all = vec![OsString::from("kubelet")];
        all.extend_from_slice(flags);
        Self(
            normalize_args(all)
                .into_iter()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        )
    }

    /// Flag names given (`max-pods`), in order, once each.
    fn names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = vec![];
        for a in &self.0 {
            if a == "--" {
                break;
            }
            if let Some(n) = a.strip_prefix("--") {
                let n = n.split('=').next().unwrap_or(n);
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        out
    }

    /// The last value given for flag `name`.
    pub(crate) fn value(&self, name: &str) -> Option<String> {
        let long = format!("--{name}");
        let mut last = None;
        let mut it = self.0.iter().peekable();
        while let Some(a) = it.next() {
            if let Some(v) = a.strip_prefix(&long) {
                if let Some(v) = v.strip_prefix('=') {
                    last = Some(v.to_string());
                } else if v.is_empty() {
                    last = match it.peek() {
                        Some(next) if !next.starts_with("--") => it.next().cloned(),
                        _ => Some("true".to_string()),
                    };
                }
            }
        }
        last
    }
}

/// The config file as read: its path, text and generic value.
pub(crate) struct FileDoc {
    pub path: PathBuf,
    pub text: String,
    pub value: Value,
}

impl FileDoc {
    /// The line of the key at a dotted path.
    pub(crate) fn line_of(&self, field: &str) -> Option<u32> {
        locate(&self.text, &lines::keys(field))
    }

    /// The value at a dotted path.
    pub(crate) fn get(&self, field: &str) -> Option<&Value> {
        field
            .split('.')
            .try_fold(&self.value, |v, k| v.get(k))
            .filter(|v| !v.is_null())
    }

    /// A config finding at the key of `field`.
    pub(crate) fn finding(&self, f: Finding, field: &str) -> Finding {
        f.in_file(&self.path)
            .at_line(self.line_of(field))
            .field(field)
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The flag in clap's message (`'--foo'`, `'--max-pods <MAX_PODS>'`).
fn flag_in(message: &str) -> Option<String> {
    message
        .split('\'')
        .skip(1)
        .step_by(2)
        .find(|q| q.starts_with('-'))
        .map(|q| q.split(' ').next().unwrap_or(q).to_string())
}

fn flag_findings(flags: &Flags, argv: &Argv, report: &mut Report) {
    let warnings = flag_warnings(flags);
    for w in &warnings {
        report.push(Finding::warning(Kind::Flag, w.to_string()).field(format!("--{}", w.flag)));
    }
    for (name, value) in deprecated_in_use(flags) {
        if !warnings.iter().any(|w| format!("--{}", w.flag) == name) {
            report.push(
                Finding::warning(Kind::Flag, format!("flag {name}={value} is deprecated"))
                    .field(name),
            );
        }
    }
    for name in argv.names() {
        if let Some(f) = flag_table::lookup(name)
            && f.field.is_some()
        {
            report.push(
                Finding::warning(
                    Kind::Flag,
                    format!("Flag --{name} has been deprecated, {VIA_CONFIG_FILE}"),
                )
                .field(format!("--{name}")),
            );
        }
    }
}

/// Reads and decodes the config file; reports why a start would refuse it.
fn load_file(path: &Path, report: &mut Report) -> Option<(FileDoc, KubeletConfiguration)> {
    let (file, ignored) = match KubeletConfiguration::load(path) {
        Ok(v) => v,
        Err(e @ FileError::Read { .. }) => {
            report.push(Finding::error(Kind::Config, e.to_string()).in_file(path));
            return None;
        }
        Err(FileError::Decode { message, .. }) => {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let field = ["kind", "apiVersion"]
                .into_iter()
                .find(|k| message.starts_with(&format!("{k}:")));
            let line = match field {
                Some(k) => locate(&text, &lines::keys(k)),
                None => error_line(&message),
            };
            // The decoder's first line; the rest is a snippet of the file.
            let first = message.lines().next().unwrap_or_default();
            let first = first.strip_prefix("error: ").unwrap_or(first);
            let mut f = Finding::error(
                Kind::Config,
                format!("failed to decode kubelet config file: {first}"),
            )
            .in_file(path)
            .at_line(line);
            if let Some(k) = field {
                f = f.field(k);
            }
            report.push(f);
            return None;
        }
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let value = serde_saphyr::from_str::<Value>(&text).unwrap_or(Value::Null);
    let doc = FileDoc {
        path: path.to_path_buf(),
        text,
        value,
    };
    for field in ignored {
        report.push(doc.finding(
            Finding::warning(
                Kind::Config,
                format!("unknown field {field:?}: ignored (strict decoding error; decoded leniently, as upstream)"),
            ),
            &field,
        ));
    }
    schema::check(&doc, report);
    Some((doc, file))
}

/// Reports a refusal of `KubeletConfig::resolve` unless a rule already
/// reported the same field.
fn resolve_error(e: &ConfigError, doc: Option<&FileDoc>, argv: &Argv, report: &mut Report) {
    let ConfigError::Invalid { field, .. } = e else {
        report.push(Finding::error(Kind::Config, e.to_string()));
        return;
    };
    let flag = if field.starts_with("--") {
        Some(field.to_string())
    } else {
        flag_table::by_field(field)
            .map(|f| f.name)
            .filter(|n| argv.value(n).is_some())
            .map(|n| format!("--{n}"))
    };
    let already = report.findings.iter().any(|f| {
        f.severity == crate::Severity::Error
            && (f.field.as_deref() == Some(*field) || f.field.as_deref() == flag.as_deref())
    });
    if already {
        return;
    }
    let message = format!("invalid configuration: {e}");
    match (flag, doc) {
        (Some(flag), _) => report.push(Finding::error(Kind::Flag, message).field(flag)),
        (None, Some(doc)) => report.push(doc.finding(Finding::error(Kind::Config, message), field)),
        (None, None) => report.push(Finding::error(Kind::Config, message).field(*field)),
    }
}

/// Parses the flags and the config file; reports what is wrong and returns
/// the resolved configuration when a start would get that far.
pub(crate) fn check(flags: &[OsString], report: &mut Report) -> Option<KubeletConfig> {
    let argv = Argv::new(flags);
    let mut all = vec![OsString::from("kubelet")];
    all.extend_from_slice(flags);
    let parsed = match Flags::parse_args(all) {
        Ok(f) => f,
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            let first = first.strip_prefix("error: ").unwrap_or(first);
            let mut f = Finding::error(Kind::Flag, first.to_string());
            if let Some(name) = flag_in(first) {
                f = f.field(name);
            }
            report.push(f);
            return None;
        }
    };
    flag_findings(&parsed, &argv, report);
    let loaded = match &parsed.config {
        Some(path) => Some(load_file(path, report)?),
        None => None,
    };
    let doc = loaded.as_ref().map(|(d, _)| d);
    rules::check(doc, &argv, report);
    match KubeletConfig::resolve(&parsed, loaded.as_ref().map(|(_, f)| f), &hostname()) {
        Ok(cfg) => Some(cfg),
        Err(e) => {
            resolve_error(&e, doc, &argv, report);
            None
        }
    }
}

#[cfg(test)]
mod tests;
