//! The exposition upstream's `/metrics` serves: the classic Prometheus text
//! format, version 0.0.4 (what component-base's `legacyregistry.Handler()`
//! negotiates for a scraper that does not ask for OpenMetrics).
//!
//! `prometheus-client` encodes OpenMetrics text, which differs in three ways
//! a 0.0.4 parser notices: a counter family is named without `_total` on its
//! `# HELP`/`# TYPE` lines while its samples carry it, the help gets a full
//! stop appended, and the exposition ends in `# EOF`. [`KubeletMetrics::render`]
//! rewrites the descriptor lines with the upstream name and help, names
//! samples of counters upstream exposes without `_total` (`kubelet_evictions`)
//! as upstream does, and drops `# EOF`.

use std::fmt::Write as _;

use prometheus_client::encoding::text::encode_registry;

use crate::KubeletMetrics;

/// The `Content-Type` of [`KubeletMetrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How a registered family is exposed.
#[derive(Debug)]
pub(crate) struct Descriptor {
    /// The upstream name (with `_total` for counters that have it).
    pub(crate) name: &'static str,
    /// The upstream help text, verbatim (with component-base's stability prefix).
    pub(crate) help: String,
}

impl KubeletMetrics {
    /// Every family in the Prometheus text format 0.0.4 ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        render_registry(self.registry(), |r| self.descriptor(r))
    }
}

/// A registry in the Prometheus text format 0.0.4, each family under the
/// upstream name and help `descriptor` gives for its registered name.
pub(crate) fn render_registry<'a>(
    registry: &prometheus_client::registry::Registry,
    descriptor: impl Fn(&str) -> Option<&'a Descriptor>,
) -> String {
    {
        let mut om = String::new();
        if let Err(e) = encode_registry(&mut om, registry) {
            // Writing into a String only fails if a metric's encoder does; keep what was written.
            tracing::warn!(error = %e, "Encoding metrics failed");
        }
        let mut out = String::with_capacity(om.len());
        // (registered name, exposed name, is a counter) of the family being written.
        let mut current: Option<(&str, &'static str)> = None;
        let mut counter = false;
        for line in om.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let registered = rest.split(' ').next().unwrap_or_default();
                match descriptor(registered) {
                    Some(d) => {
                        current = Some((registered, d.name));
                        let _ = writeln!(out, "# HELP {} {}", d.name, d.help);
                    }
                    None => {
                        current = None;
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                let registered = parts.next().unwrap_or_default();
                let kind = parts.next().unwrap_or_default();
                counter = kind == "counter";
                match current.filter(|(r, _)| *r == registered) {
                    Some((_, exposed)) => {
                        let _ = writeln!(out, "# TYPE {exposed} {kind}");
                    }
                    None => {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            } else if line.starts_with("# EOF") || line.starts_with("# UNIT ") {
                continue;
            } else if counter
                && let Some((registered, exposed)) = current
                && let Some(rest) = line
                    .strip_prefix(registered)
                    .and_then(|r| r.strip_prefix("_total"))
            {
                out.push_str(exposed);
                out.push_str(rest);
                out.push('\n');
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
