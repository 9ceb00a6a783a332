//! The findings of one `kubelet-rs check` run, and how they are printed:
//! one line per finding, or one JSON document (`-o json`).

use serde::Serialize;

use crate::finding::{Finding, Kind, Severity};

/// Every finding of one run, in the order the checks made them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The findings.
    pub findings: Vec<Finding>,
}

/// `-o`: how the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// One line per finding.
    #[default]
    Text,
    /// `{"findings":[…],"errors":N,"warnings":N}`.
    Json,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    findings: &'a [Finding],
    errors: usize,
    warnings: usize,
}

impl Report {
    /// Adds a finding.
    pub fn push(&mut self, f: Finding) {
        self.findings.push(f);
    }

    /// How many findings have `severity`.
    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// The findings of one kind.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.kind == kind)
    }

    /// Reports the errors of `kinds` as warnings, saying so (kubeadm's
    /// `--ignore-preflight-errors`).
    pub fn ignore(&mut self, kinds: &[Kind]) {
        for f in &mut self.findings {
            if f.severity == Severity::Error && kinds.contains(&f.kind) {
                f.severity = Severity::Warning;
                f.message.push_str(" (ignored: --ignore-preflight-errors)");
            }
        }
    }

    /// 0 when no finding is an error, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.count(Severity::Error) > 0)
    }

    /// The report as printed: text lines, or a JSON document.
    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Text => {
                let mut out = String::new();
                for f in &self.findings {
                    out.push_str(&f.to_string());
                    out.push('\n');
                }
                out
            }
            OutputFormat::Json => {
                let doc = JsonReport {
                    findings: &self.findings,
                    errors: self.count(Severity::Error),
                    warnings: self.count(Severity::Warning),
                };
                // Serialising plain strings and numbers cannot fail.
                let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
                s.push('\n');
                s
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_one_line_per_finding_with_file_line_and_field() {
        let mut r = Report::default();
        r.push(
            Finding::error(Kind::Config, "unknown field\nsecond line")
                .in_file("/etc/k.yaml")
                .at_line(Some(12))
                .field("fooBar"),
        );
        r.push(Finding::warning(Kind::Swap, "swap is on"));
        assert_eq!(
            r.render(OutputFormat::Text),
            "error[config] /etc/k.yaml:12: fooBar: unknown field / second line\nwarning[swap] swap is on\n"
        );
        assert_eq!(r.exit_code(), 1);
        r.ignore(&[Kind::Config]);
        assert_eq!(r.exit_code(), 0);
        assert!(
            r.findings[0]
                .message
                .ends_with("(ignored: --ignore-preflight-errors)")
        );
    }

    #[test]
    fn warnings_alone_exit_zero_and_json_counts_them() {
        let mut r = Report::default();
        r.push(Finding::warning(Kind::Flag, "deprecated").field("--foo"));
        assert_eq!(r.exit_code(), 0);
        let v: serde_json::Value =
            serde_json::from_str(&r.render(OutputFormat::Json)).expect("json");
        assert_eq!(v["errors"], 0);
        assert_eq!(v["warnings"], 1);
        assert_eq!(v["findings"][0]["kind"], "flag");
        assert_eq!(v["findings"][0]["severity"], "warning");
        assert_eq!(v["findings"][0]["field"], "--foo");
        assert!(v["findings"][0].get("file").is_none());
    }
}
