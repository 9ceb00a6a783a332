//! One preflight finding, as kubeadm's preflight reports a check's errors and
//! warnings (`cmd/kubeadm/app/preflight`): what kind of input it concerns,
//! how bad it is, where (file and line when there is one) and what is wrong.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

/// What a finding concerns. Each kind has its own checks and fixtures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A command-line flag: unknown, malformed, deprecated or ignored.
    Flag,
    /// The `--config` file: unknown fields, out-of-range values, deprecated settings.
    Config,
    /// A static pod manifest the file source would reject.
    Manifest,
    /// The CRI endpoint: reachable, and the version it answers.
    Runtime,
    /// The cgroup driver against the runtime's.
    CgroupDriver,
    /// The host's cgroup version against `failCgroupV1`.
    Cgroups,
    /// Swap on the node against `failSwapOn`.
    Swap,
    /// A kubeconfig (`--kubeconfig`, `--bootstrap-kubeconfig`).
    Kubeconfig,
    /// A certificate: readable, valid now, not expiring soon.
    Certificate,
    /// A port the kubelet listens on is already taken.
    Port,
}

impl Kind {
    /// The name printed in text output and JSON (`cgroup-driver`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Flag => "flag",
            Kind::Config => "config",
            Kind::Manifest => "manifest",
            Kind::Runtime => "runtime",
            Kind::CgroupDriver => "cgroup-driver",
            Kind::Cgroups => "cgroups",
            Kind::Swap => "swap",
            Kind::Kubeconfig => "kubeconfig",
            Kind::Certificate => "certificate",
            Kind::Port => "port",
        }
    }
}

/// How bad a finding is: an error fails the check (exit 1), as it would stop
/// or break a start; a warning (deprecated, ignored, info) does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The kubelet would refuse to start, or would run broken.
    Error,
    /// The kubelet starts, but the operator should know.
    Warning,
    /// What was checked and found good (the runtime's version).
    Info,
}

impl Severity {
    /// `error`, `warning`, `info`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What it concerns.
    pub kind: Kind,
    /// How bad it is.
    pub severity: Severity,
    /// The file it is in, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The 1-based line in `file`, if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The flag, field path or object the finding is about
    /// (`--max-pods`, `evictionHard.memory.available`, `spec.containers[0].name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong, in upstream's words where upstream has them.
    pub message: String,
}

impl Finding {
    /// A finding with no file, line or field.
    pub fn new(kind: Kind, severity: Severity, message: impl Into<String>) -> Self {
        Self {
            kind,
            severity,
            file: None,
            line: None,
            field: None,
            message: message.into(),
        }
    }

    /// An error finding.
    pub fn error(kind: Kind, message: impl Into<String>) -> Self {
        Self::new(kind, Severity::Error, message)
    }

    /// A warning finding.
    pub fn warning(kind: Kind, message: impl Into<String>) -> Self {
        Self::new(kind, Severity::Warning, message)
    }

    /// An info finding.
    pub fn info(kind: Kind, message: impl Into<String>) -> Self {
        Self::new(kind, Severity::Info, message)
    }

    /// Sets the file.
    pub fn in_file(mut self, file: impl Into<PathBuf>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// Sets the line.
    pub fn at_line(mut self, line: Option<u32>) -> Self {
        self.line = line;
        self
    }

    /// Sets the field.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }
}

/// The 1-based line a decoder's error message names (`… at line 3 column
/// 7`), if it names one: the YAML decoders of the config file, manifests and
/// kubeconfigs all say it this way.
pub(crate) fn error_line(message: &str) -> Option<u32> {
    let at = message.find("line ")?;
    let digits: String = message[at + 5..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok().filter(|l| *l > 0)
}

/// One line: `error[config] /etc/kubelet.yaml:12: evictionHard.memory.available: message`.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.severity.as_str(), self.kind.as_str())?;
        if let Some(file) = &self.file {
            write!(f, " {}", file.display())?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
            f.write_str(":")?;
        }
        if let Some(field) = &self.field {
            write!(f, " {field}:")?;
        }
        // One finding, one line: a multi-line message is joined.
        let mut first = true;
        for part in self.message.lines() {
            f.write_str(if first { " " } else { " / " })?;
            f.write_str(part.trim_end())?;
            first = false;
        }
        Ok(())
    }
}
