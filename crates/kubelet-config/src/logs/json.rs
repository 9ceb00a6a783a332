//! `--logging-format=json`: component-base's JSON logger (`logs/json`, zap
//! behind zapr), one object a line.
//!
//! ```text
//! {"ts":1764167326123.456,"caller":"app/server.rs:1193","msg":"Starting kubelet","v":0,"version":"v1.31.0"}
//! {"ts":1764167326123.456,"caller":"app/pods.rs:88","msg":"failed","pod":"ns/web","err":"some error"}
//! ```
//!
//! Keys in zap's order: `ts` (float epoch milliseconds), `caller` (the last
//! directory and file, zap's `ShortCallerEncoder`), `msg`; then for info
//! lines `v` (INFO and WARN 0, DEBUG 4, TRACE 6, or the event's own numeric
//! `v`) and the key-values in call order with the event's `error` as `err`
//! in its place; for ERROR lines no `v`, the key-values, and `err` last
//! (zapr's `Error`). The enclosing spans' fields follow the event's own.
//! Strings are escaped by serde_json, so every line is valid JSON.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::{Fields, Value, source_of, verbosity_of};

/// The JSON event format (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonFormat;

/// Span fields rendered as JSON members (`,"key":value` each), stored with
/// the span and appended to its events' objects.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut f = Fields::default();
        fields.record(&mut f);
        let mut out = String::new();
        for (k, v) in &f.kvs {
            push_member(&mut out, k, v);
        }
        writer.write_str(&out)
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        // Each member brings its own leading comma.
        self.format_fields(current.as_writer(), fields)
    }
}

impl<S> FormatEvent<S, JsonFields> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::event();
        event.record(&mut fields);
        let meta = event.metadata();
        let is_error = *meta.level() == Level::ERROR;
        let mut line = String::with_capacity(200);
        line.push_str("{\"ts\":");
        push_float(&mut line, epoch_millis(SystemTime::now()));
        line.push_str(",\"caller\":");
        push_string(&mut line, &caller(source_of(meta, &fields)));
        line.push_str(",\"msg\":");
        push_string(&mut line, fields.message.as_deref().unwrap_or(""));
        if !is_error {
            let _ = write!(line, ",\"v\":{}", verbosity_of(*meta.level(), &fields));
            if let Some(err) = &fields.err {
                // An info line's error is one key-value among the others.
                push_member(&mut line, "err", &Value::Str(err.clone()));
            }
        }
        for (k, v) in &fields.kvs {
            push_member(&mut line, k, v);
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<FormattedFields<JsonFields>>() {
                    line.push_str(&f.fields);
                }
            }
        }
        if is_error && let Some(err) = &fields.err {
            push_member(&mut line, "err", &Value::Str(err.clone()));
        }
        line.push_str("}\n");
        writer.write_str(&line)
    }
}

/// `float64(UnixNano) / 1e6`, as component-base's time encoder writes `ts`.
fn epoch_millis(now: SystemTime) -> f64 {
    // Nanoseconds since 1970 fit an f64 to well under a microsecond until
    // the year 2255; precision is what Go's float64 gives too.
    let nanos = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    #[allow(clippy::cast_precision_loss, reason = "as upstream's float64")]
    let nanos = nanos as f64;
    nanos / 1e6
}

/// zap's `ShortCallerEncoder`: `dir/file:line`, the last directory kept.
fn caller(source: Option<(&str, u64)>) -> String {
    let Some((path, line)) = source else {
        return "undefined".to_string();
    };
    let path = path.replace('\\', "/");
    let short = match path.rfind('/') {
        Some(last) => match path[..last].rfind('/') {
            Some(dir) => &path[dir + 1..],
            None => &path[..],
        },
        None => &path[..],
    };
    format!("{short}:{line}")
}

/// `,"key":value`.
fn push_member(out: &mut String, key: &str, value: &Value) {
    out.push(',');
    push_string(out, key);
    out.push(':');
    let _ = match value {
        Value::Str(s) => {
            push_string(out, s);
            Ok(())
        }
        Value::I64(n) => write!(out, "{n}"),
        Value::U64(n) => write!(out, "{n}"),
        Value::I128(n) => write!(out, "{n}"),
        Value::U128(n) => write!(out, "{n}"),
        Value::F64(x) => {
            push_float(out, *x);
            Ok(())
        }
        Value::Bool(b) => write!(out, "{b}"),
    };
}

/// A finite float in plain decimal (Rust's `Display` never uses an
/// exponent, so this is valid JSON); NaN and infinities as zap writes
/// them, strings.
fn push_float(out: &mut String, x: f64) {
    if x.is_finite() {
        let _ = write!(out, "{x}");
    } else if x.is_nan() {
        out.push_str("\"NaN\"");
    } else if x > 0.0 {
        out.push_str("\"+Inf\"");
    } else {
        out.push_str("\"-Inf\"");
    }
}

/// A JSON string, escaped by serde_json.
fn push_string(out: &mut String, s: &str) {
    match serde_json::to_string(s) {
        Ok(q) => out.push_str(&q),
        // Serialising a str cannot fail; keep the line valid regardless.
        Err(_) => out.push_str("\"\""),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value as Json;
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt;

    use super::super::capture::Capture;
    use super::super::{LogFormat, layer};
    use super::*;

    fn capture(f: impl FnOnce()) -> Vec<(String, serde_json::Map<String, Json>)> {
        let out = Capture::default();
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new("trace"))
            .with(layer(LogFormat::Json, out.clone()));
        tracing::subscriber::with_default(subscriber, f);
        out.text()
            .lines()
            .map(|l| {
                let v: Json =
                    serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}"));
                match v {
                    Json::Object(m) => (l.to_string(), m),
                    other => panic!("not an object: {other}"),
                }
            })
            .collect()
    }

    fn now_ms() -> f64 {
        epoch_millis(SystemTime::now())
    }

    fn check_common(raw: &str, obj: &serde_json::Map<String, Json>, msg: &str) {
        let ts = obj["ts"].as_f64().unwrap_or_else(|| panic!("ts in {raw}"));
        let now = now_ms();
        assert!(
            (now - 1e5..now + 1e5).contains(&ts),
            "ts {ts} is not epoch ms near {now}"
        );
        let caller = obj["caller"].as_str().unwrap_or_default();
        let (file, line) = caller
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("caller {caller}"));
        assert_eq!(file, "logs/json.rs", "{raw}");
        assert!(line.parse::<u32>().is_ok_and(|l| l > 0), "{raw}");
        assert_eq!(obj["msg"], msg, "{raw}");
        assert!(
            raw.starts_with("{\"ts\":") && raw.contains(",\"caller\":\"logs/json.rs:"),
            "{raw}"
        );
    }

    #[test]
    fn info_lines_have_v_and_key_values_in_order() {
        let lines = capture(|| {
            tracing::info!(
                version = "v1.31.0",
                pods = 3,
                ready = true,
                "Starting kubelet"
            );
            tracing::debug!(ratio = 0.5, "dbg \"q\"\n");
            tracing::trace!("tr");
            tracing::info!(v = 2, "leveled");
            tracing::warn!(error = %"disk slow", path = "/x", "Slow");
        });
        assert_eq!(lines.len(), 5);
        let (raw, obj) = &lines[0];
        check_common(raw, obj, "Starting kubelet");
        assert!(
            raw.ends_with(
                r#","msg":"Starting kubelet","v":0,"version":"v1.31.0","pods":3,"ready":true}"#
            ),
            "{raw}"
        );
        let (raw, obj) = &lines[1];
        check_common(raw, obj, "dbg \"q\"\n");
        assert_eq!(obj["v"], 4);
        assert_eq!(obj["ratio"], 0.5);
        assert_eq!(lines[2].1["v"], 6);
        assert_eq!(lines[3].1["v"], 2);
        let (raw, obj) = &lines[4];
        check_common(raw, obj, "Slow");
        assert!(
            raw.ends_with(r#","v":0,"err":"disk slow","path":"/x"}"#),
            "{raw}"
        );
    }

    #[test]
    fn error_lines_have_no_v_and_err_last() {
        let lines = capture(|| {
            let pod = tracing::info_span!("pod", pod = "default/web");
            let _p = pod.enter();
            tracing::error!(error = %"invalid namespace:default", ns = "default", podnum = 2, "wrong namespace");
            tracing::error!("failed");
        });
        let (raw, obj) = &lines[0];
        check_common(raw, obj, "wrong namespace");
        assert!(!obj.contains_key("v"), "{raw}");
        assert_eq!(obj["pod"], "default/web");
        assert!(
            raw.ends_with(
                r#","msg":"wrong namespace","ns":"default","podnum":2,"pod":"default/web","err":"invalid namespace:default"}"#
            ),
            "{raw}"
        );
        let keys: Vec<&String> = obj.keys().collect();
        assert_eq!(keys.len(), 7, "{keys:?}");
        let (raw, obj) = &lines[1];
        check_common(raw, obj, "failed");
        assert!(
            raw.ends_with(r#","msg":"failed","pod":"default/web"}"#),
            "{raw}"
        );
    }

    #[test]
    fn span_fields_follow_the_events_own() {
        let lines = capture(|| {
            let outer =
                tracing::info_span!("pod", pod = "default/web", uid = tracing::field::Empty);
            let _o = outer.enter();
            outer.record("uid", "1234");
            let inner = tracing::info_span!("container", attempt = 1u32);
            let _i = inner.enter();
            tracing::info!(step = "pull", "Syncing");
        });
        let (raw, _) = &lines[0];
        assert!(
            raw.ends_with(r#""v":0,"step":"pull","pod":"default/web","uid":"1234","attempt":1}"#),
            "{raw}"
        );
    }

    #[test]
    fn callers_and_floats_as_zap_writes_them() {
        assert_eq!(
            caller(Some(("crates/kubelet/src/app/server.rs", 12))),
            "app/server.rs:12"
        );
        assert_eq!(caller(Some(("main.rs", 3))), "main.rs:3");
        assert_eq!(caller(None), "undefined");
        let mut s = String::new();
        push_float(&mut s, 1_764_167_326_123.456);
        push_float(&mut s, f64::NAN);
        assert_eq!(s, "1764167326123.456\"NaN\"");
        let t = UNIX_EPOCH + std::time::Duration::new(1_764_167_326, 123_456_000);
        assert!((epoch_millis(t) - 1_764_167_326_123.456).abs() < 1e-3);
    }
}
