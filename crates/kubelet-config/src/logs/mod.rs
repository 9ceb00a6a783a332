//! Logging setup (upstream `component-base/logs`): klog-style `--v` levels
//! mapped onto tracing filters, the `--logging-format` choice between klog's
//! text lines ([`klog`]) and component-base's JSON logger ([`json`]), and
//! the run-time verbosity change behind `/debug/flags/v` (upstream
//! `logs.GlogSetter`).
//!
//! Both formats see the same fields: an event's `message`, its `error` (or
//! `err`) field, which klog's `ErrorS` and zapr render as `err`, a numeric
//! `v` field overriding the verbosity the level implies, the other fields as
//! key-values in call order, and then the fields of the spans the event is
//! in, outermost first (the per-pod spans carry `pod`).

pub mod json;
pub mod klog;

use std::fmt;
use std::sync::OnceLock;

use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt;

use crate::{ConfigError, Flags, KubeletConfiguration, invalid};

/// `--logging-format` / `logging.format`: the registered log formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `text`: klog's header and structured key-values (the default).
    #[default]
    Text,
    /// `json`: component-base's zap-based JSON logger, one object a line.
    Json,
}

impl LogFormat {
    /// The accepted names, as upstream lists them.
    pub const NAMES: &'static str = "text, json";

    /// Parses a format name; empty means the default, as upstream.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "" | "text" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// `--logging-format` (the last given) over `logging.format`, else text;
/// another name is upstream's `format: Invalid value: "x": Unsupported log
/// format`, naming the flag or field given and the accepted names.
pub(crate) fn resolve_format(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<LogFormat, ConfigError> {
    let from_flag = flags
        .extra
        .get("logging-format")
        .and_then(<[String]>::last)
        .map(|v| ("--logging-format", v.clone()));
    let from_file = file
        .logging
        .as_ref()
        .and_then(|l| l.other.get("format"))
        .map(|v| {
            let name = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            ("logging.format", name)
        });
    let Some((field, name)) = from_flag.or(from_file) else {
        return Ok(LogFormat::default());
    };
    LogFormat::parse(&name).ok_or_else(|| {
        invalid(
            field,
            name,
            format!("Unsupported log format (accepted: {})", LogFormat::NAMES),
        )
    })
}

/// The tracing filter for a klog verbosity: 0-2 info, 3-4 debug, 5+ trace.
/// `RUST_LOG`, when set, wins.
pub fn filter_for(verbosity: u8) -> EnvFilter {
    if let Ok(f) = EnvFilter::try_from_default_env() {
        return f;
    }
    level_filter(verbosity)
}

fn level_filter(verbosity: u8) -> EnvFilter {
    let level = match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    // Dependencies stay at warn unless asked for trace.
    let deps = if verbosity >= 6 { "debug" } else { "warn" };
    EnvFilter::new(format!(
        "{deps},kubelet={level},kubelet_runtime={level},kubelet_config={level},kubelet_client={level},kubelet_node={level},kubelet_server={level},kubelet_podconfig={level},kubelet_metrics={level},cri={level},kubelet_types={level},kubelet_rs={level}"
    ))
}

/// The formatting layer for `format`, writing whole lines to `writer`
/// (no ANSI colours in either format).
pub fn layer<S, W>(format: LogFormat, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let base = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(writer);
    match format {
        LogFormat::Text => base
            .fmt_fields(klog::KlogFields)
            .event_format(klog::KlogFormat)
            .boxed(),
        LogFormat::Json => base
            .fmt_fields(json::JsonFields)
            .event_format(json::JsonFormat)
            .boxed(),
    }
}

type Handle = reload::Handle<EnvFilter, tracing_subscriber::Registry>;

static RELOAD: OnceLock<Handle> = OnceLock::new();

/// Installs the global subscriber writing `format` lines to stderr (once per
/// process; later calls are no-ops).
pub fn init(verbosity: u8, format: LogFormat) {
    let (filter, handle) = reload::Layer::new(filter_for(verbosity));
    if tracing_subscriber::registry()
        .with(filter)
        .with(layer(format, std::io::stderr))
        .try_init()
        .is_ok()
    {
        let _ = RELOAD.set(handle);
    }
}

/// Why a verbosity change was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerbosityError {
    /// Above klog's useful range.
    #[error("verbosity {0} is out of range 0 to 10")]
    OutOfRange(u8),
    /// [`init`] did not install the subscriber (tests, embedders).
    #[error("the log subscriber was not installed by kubelet-rs")]
    NotInstalled,
    /// The filter could not be swapped.
    #[error("reloading the log filter: {0}")]
    Reload(#[from] reload::Error),
}

/// Changes the verbosity of the subscriber [`init`] installed, as klog's `-v`.
pub fn set_verbosity(verbosity: u8) -> Result<(), VerbosityError> {
    if verbosity > 10 {
        return Err(VerbosityError::OutOfRange(verbosity));
    }
    let handle = RELOAD.get().ok_or(VerbosityError::NotInstalled)?;
    handle.reload(level_filter(verbosity))?;
    tracing::info!(verbosity, "Log verbosity changed");
    Ok(())
}

/// One field value, typed as far as tracing tells.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    /// Strings, and anything recorded with `%` or `?`.
    Str(String),
    I64(i64),
    U64(u64),
    I128(i128),
    U128(u128),
    F64(f64),
    Bool(bool),
}

/// The fields of one event or span, sorted into what both formats treat
/// specially and the rest.
#[derive(Debug, Default)]
struct Fields {
    /// Sort out `message`, `error`/`err` and `v` (events); spans keep all as key-values.
    special: bool,
    message: Option<String>,
    err: Option<String>,
    v: Option<u64>,
    kvs: Vec<(&'static str, Value)>,
    /// `log.file` / `log.line` of a `log` crate record bridged by tracing-log.
    log_file: Option<String>,
    log_line: Option<u64>,
}

impl Fields {
    fn event() -> Self {
        Self {
            special: true,
            ..Self::default()
        }
    }

    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if let Some(log) = name.strip_prefix("log.") {
            match (log, value) {
                ("file", Value::Str(s)) => self.log_file = Some(s),
                ("line", Value::U64(n)) => self.log_line = Some(n),
                ("line", Value::I64(n)) => self.log_line = u64::try_from(n).ok(),
                _ => {}
            }
            return;
        }
        if !self.special {
            self.kvs.push((name, value));
            return;
        }
        match (name, value) {
            ("message", Value::Str(s)) => self.message = Some(s),
            ("error" | "err", Value::Str(s)) => self.err = Some(s),
            ("v", Value::U64(n)) => self.v = Some(n),
            ("v", Value::I64(n)) if n >= 0 => self.v = u64::try_from(n).ok(),
            (_, value) => self.kvs.push((name, value)),
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::Str(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_string()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.put(field, Value::I128(value));
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.put(field, Value::U128(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        // Go errors carry their causes in their text (`fmt.Errorf("…: %w")`).
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        self.put(field, Value::Str(text));
    }
}

/// The verbosity an event is logged at: its own `v` field, else by level
/// (INFO and WARN 0, DEBUG 4, TRACE 6).
fn verbosity_of(level: tracing::Level, fields: &Fields) -> u64 {
    fields.v.unwrap_or(match level {
        tracing::Level::DEBUG => 4,
        tracing::Level::TRACE => 6,
        _ => 0,
    })
}

/// The source file and line of an event: tracing's metadata, or the
/// bridged `log` record's.
fn source_of<'a>(meta: &'a tracing::Metadata<'a>, fields: &'a Fields) -> Option<(&'a str, u64)> {
    if let Some(file) = fields.log_file.as_deref() {
        return Some((file, fields.log_line.unwrap_or(0)));
    }
    meta.file().map(|f| (f, meta.line().map_or(0, u64::from)))
}

#[cfg(test)]
pub(crate) mod capture {
    //! A `MakeWriter` into a shared buffer, for tests of both formats.
    #![allow(
        clippy::disallowed_types,
        reason = "parking_lot is not a dependency of this crate; test only"
    )]

    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    /// Everything written, shared with the subscriber.
    #[derive(Clone, Default)]
    pub(crate) struct Capture(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl Capture {
        /// The captured text.
        pub(crate) fn text(&self) -> String {
            let buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
            String::from_utf8_lossy(&buf).into_owned()
        }
    }

    impl io::Write for Capture {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            let mut buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
            buf.extend_from_slice(data);
            Ok(data.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_as_klog_does() {
        assert!(level_filter(0).to_string().contains("kubelet=info"));
        assert!(level_filter(4).to_string().contains("kubelet=debug"));
        assert!(level_filter(6).to_string().contains("kubelet=trace"));
        assert!(matches!(
            set_verbosity(11),
            Err(VerbosityError::OutOfRange(11))
        ));
    }

    #[test]
    fn format_names_are_upstreams() {
        assert_eq!(LogFormat::parse("text"), Some(LogFormat::Text));
        assert_eq!(LogFormat::parse(""), Some(LogFormat::Text));
        assert_eq!(LogFormat::parse("json"), Some(LogFormat::Json));
        assert_eq!(LogFormat::parse("JSON"), None);
        assert_eq!(LogFormat::Json.to_string(), "json");
    }

    #[test]
    fn format_resolves_flag_over_file_and_names_bad_values() {
        let flags = |args: &[&str]| {
            let mut v = vec!["kubelet-rs"];
            v.extend_from_slice(args);
            Flags::parse_args(v).unwrap_or_else(|e| panic!("{args:?}: {e}"))
        };
        let file = |text: &str| {
            KubeletConfiguration::parse(text)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .0
        };
        let json = file(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nlogging: {format: json}\n",
        );
        let none = KubeletConfiguration::default();
        let r = |a: &[&str], f: &KubeletConfiguration| resolve_format(&flags(a), f);
        assert_eq!(r(&[], &none).ok(), Some(LogFormat::Text));
        assert_eq!(r(&[], &json).ok(), Some(LogFormat::Json));
        assert_eq!(
            r(&["--logging-format=text"], &json).ok(),
            Some(LogFormat::Text)
        );
        assert_eq!(
            r(&["--logging-format=text", "--logging-format=json"], &none).ok(),
            Some(LogFormat::Json)
        );
        let e = r(&["--logging-format=x"], &json).map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err(r#"invalid value for --logging-format: "x": Unsupported log format (accepted: text, json)"#.into())
        );
        let bad = file(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nlogging: {format: yaml}\n",
        );
        let e = r(&[], &bad).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("logging.format") && e.contains("\"yaml\"")),
            "{e:?}"
        );
        // The resolved configuration carries it.
        let c = crate::KubeletConfig::resolve(&flags(&["--logging-format=json"]), None, "n")
            .map(|c| c.logging_format)
            .map_err(|e| e.to_string());
        assert_eq!(c, Ok(LogFormat::Json));
    }
}
