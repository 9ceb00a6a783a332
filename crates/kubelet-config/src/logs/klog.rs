//! `--logging-format=text`: klog's text lines (klog `internal/buffer`
//! `FormatHeader` and the structured `InfoS`/`ErrorS` output).
//!
//! ```text
//! I1126 14:28:46.123456   12345 server.rs:123] "Starting kubelet" version="v1.31.0"
//! ```
//!
//! The header is the severity (`I`, `W`, `E`: tracing ERROR is `E`, WARN
//! `W`, the rest `I`), month and day, the time with microseconds, the PID
//! right-aligned in 7 columns and the base name of the source file with its
//! line. The message is always quoted as Go's `strconv.Quote` does, then come
//! `err="…"` first (as `ErrorS` puts it) and the key-values: strings quoted,
//! numbers and bools bare, the enclosing spans' fields last.
//!
//! Unlike klog, the time is UTC, not local time: this crate depends on
//! neither `chrono` nor `time` (and the workspace's `time` is built without
//! `local-offset`), so the header is computed from `SystemTime` with std
//! only. Multi-line strings are quoted on one line
//! (`\n`), not klog's `key=<` block form.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::{Fields, Value, source_of};

/// The klog text event format (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct KlogFormat;

/// Span fields rendered as klog key-values (` key="value"` each), stored
/// with the span and appended to its events' lines.
#[derive(Clone, Copy, Debug, Default)]
pub struct KlogFields;

impl<'w> FormatFields<'w> for KlogFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut f = Fields::default();
        fields.record(&mut f);
        let mut out = String::new();
        for (k, v) in &f.kvs {
            push_kv(&mut out, k, v);
        }
        writer.write_str(&out)
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        // Each key-value brings its own leading space.
        self.format_fields(current.as_writer(), fields)
    }
}

impl<S> FormatEvent<S, KlogFields> for KlogFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, KlogFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::event();
        event.record(&mut fields);
        let meta = event.metadata();
        let mut line = String::with_capacity(160);
        push_header(
            &mut line,
            *meta.level(),
            SystemTime::now(),
            std::process::id(),
            source_of(meta, &fields),
        );
        push_quoted(&mut line, fields.message.as_deref().unwrap_or(""));
        if let Some(err) = &fields.err {
            line.push_str(" err=");
            push_quoted(&mut line, err);
        }
        for (k, v) in &fields.kvs {
            push_kv(&mut line, k, v);
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<FormattedFields<KlogFields>>() {
                    line.push_str(&f.fields);
                }
            }
        }
        line.push('\n');
        writer.write_str(&line)
    }
}

/// klog's severity character for a tracing level.
fn severity(level: Level) -> char {
    match level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// `Lmmdd hh:mm:ss.uuuuuu PPPPPPP file:line] ` (UTC; see the module docs).
fn push_header(
    out: &mut String,
    level: Level,
    now: SystemTime,
    pid: u32,
    source: Option<(&str, u64)>,
) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let (_, month, day) = civil_from_days(days);
    let rem = secs % 86_400;
    let (file, line) = match source {
        // klog's fallback when the caller is unknown.
        None => ("???", 1),
        Some((path, line)) => (path.rsplit(['/', '\\']).next().unwrap_or(path), line),
    };
    let _ = write!(
        out,
        "{}{month:02}{day:02} {:02}:{:02}:{:02}.{:06} {pid:>7} {file}:{line}] ",
        severity(level),
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_micros(),
    );
}

/// Year, month (1-12) and day (1-31) of a day count since 1970-01-01 in
/// the proleptic Gregorian calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

/// ` key=value`: strings quoted, numbers and bools bare.
fn push_kv(out: &mut String, key: &str, value: &Value) {
    out.push(' ');
    out.push_str(key);
    out.push('=');
    let _ = match value {
        Value::Str(s) => {
            push_quoted(out, s);
            Ok(())
        }
        Value::I64(n) => write!(out, "{n}"),
        Value::U64(n) => write!(out, "{n}"),
        Value::I128(n) => write!(out, "{n}"),
        Value::U128(n) => write!(out, "{n}"),
        Value::F64(x) => write!(out, "{x}"),
        Value::Bool(b) => write!(out, "{b}"),
    };
}

/// `s` as Go's `strconv.Quote` writes it: `\a \b \f \n \r \t \v \\ \"`,
/// other ASCII controls as `\xNN`, other non-printable characters as
/// `\uNNNN` / `\UNNNNNNNN`, printable Unicode as is.
pub(crate) fn push_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        let _ = match c {
            '\x07' => out.write_str("\\a"),
            '\x08' => out.write_str("\\b"),
            '\x0c' => out.write_str("\\f"),
            '\n' => out.write_str("\\n"),
            '\r' => out.write_str("\\r"),
            '\t' => out.write_str("\\t"),
            '\x0b' => out.write_str("\\v"),
            '\\' => out.write_str("\\\\"),
            '"' => out.write_str("\\\""),
            c if c < ' ' || c == '\x7f' => write!(out, "\\x{:02x}", u32::from(c)),
            c if c.is_control() && u32::from(c) < 0x1_0000 => {
                write!(out, "\\u{:04x}", u32::from(c))
            }
            c if c.is_control() => write!(out, "\\U{:08x}", u32::from(c)),
            c => out.write_char(c),
        };
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt;

    use super::super::capture::Capture;
    use super::super::{LogFormat, layer};
    use super::*;

    fn capture(f: impl FnOnce()) -> String {
        let out = Capture::default();
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new("trace"))
            .with(layer(LogFormat::Text, out.clone()));
        tracing::subscriber::with_default(subscriber, f);
        out.text()
    }

    /// `Lmmdd hh:mm:ss.uuuuuu PPPPPPP file:line] ` and the rest of the line.
    fn split_header(line: &str) -> (&str, &str) {
        let end = line
            .find("] ")
            .unwrap_or_else(|| panic!("no `] ` in {line:?}"));
        (&line[..end + 2], &line[end + 2..])
    }

    fn check_header(header: &str, sev: char, file: &str) {
        let b = header.as_bytes();
        assert_eq!(b[0] as char, sev, "{header:?}");
        let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
        assert!(digits(1..5), "mmdd in {header:?}");
        assert_eq!(b[5], b' ', "{header:?}");
        assert!(
            digits(6..8) && digits(9..11) && digits(12..14),
            "{header:?}"
        );
        assert_eq!((b[8], b[11], b[14]), (b':', b':', b'.'), "{header:?}");
        assert!(digits(15..21), "microseconds in {header:?}");
        assert_eq!(b[21], b' ', "{header:?}");
        let pid = format!("{:>7}", std::process::id());
        assert_eq!(&header[22..29], pid, "{header:?}");
        assert_eq!(b[29], b' ', "{header:?}");
        let (name, line) = header[30..header.len() - 2]
            .split_once(':')
            .unwrap_or_else(|| panic!("file:line in {header:?}"));
        assert_eq!(name, file, "{header:?}");
        assert!(line.parse::<u32>().is_ok_and(|l| l > 0), "{header:?}");
    }

    #[test]
    fn lines_have_klogs_header_and_quoting() {
        let text = capture(|| {
            tracing::info!(
                version = "v1.31.0",
                pods = 3,
                ready = true,
                "Starting kubelet"
            );
            tracing::warn!(error = %"boom", path = "/x", "Failed \"tick\"\n\tagain");
            tracing::error!(v = 2, "gone");
            tracing::debug!("plain");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let (h, rest) = split_header(lines[0]);
        check_header(h, 'I', "klog.rs");
        assert_eq!(
            rest,
            r#""Starting kubelet" version="v1.31.0" pods=3 ready=true"#
        );
        let (h, rest) = split_header(lines[1]);
        check_header(h, 'W', "klog.rs");
        assert_eq!(rest, r#""Failed \"tick\"\n\tagain" err="boom" path="/x""#);
        let (h, rest) = split_header(lines[2]);
        check_header(h, 'E', "klog.rs");
        assert_eq!(rest, r#""gone""#);
        let (h, rest) = split_header(lines[3]);
        check_header(h, 'I', "klog.rs");
        assert_eq!(rest, r#""plain""#);
    }

    #[test]
    fn span_fields_follow_the_events_own() {
        let text = capture(|| {
            let outer = tracing::info_span!("pod", pod = "default/web");
            let _o = outer.enter();
            let inner = tracing::info_span!("container", container = "nginx", attempt = 1u32);
            let _i = inner.enter();
            tracing::info!(step = "pull", "Syncing");
        });
        let (_, rest) = split_header(text.trim_end());
        assert_eq!(
            rest,
            r#""Syncing" step="pull" pod="default/web" container="nginx" attempt=1"#
        );
    }

    #[test]
    fn header_fields_and_dates() {
        let t = UNIX_EPOCH + Duration::new(1_764_167_326, 123_456_789);
        let mut s = String::new();
        push_header(&mut s, Level::INFO, t, 12345, Some(("app/server.go", 123)));
        assert_eq!(s, "I1126 14:28:46.123456   12345 server.go:123] ");
        let mut s = String::new();
        push_header(&mut s, Level::ERROR, UNIX_EPOCH, 7, None);
        assert_eq!(s, "E0101 00:00:00.000000       7 ???:1] ");
        assert_eq!(civil_from_days(951_782_400 / 86_400), (2000, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn quoting_is_gos() {
        let q = |s: &str| {
            let mut out = String::new();
            push_quoted(&mut out, s);
            out
        };
        assert_eq!(q("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(q("\x07\x08\x0c\r\x0b\x1b\x7f"), r#""\a\b\f\r\v\x1b\x7f""#);
        assert_eq!(q("\u{85}µs"), r#""\u0085µs""#);
    }
}
