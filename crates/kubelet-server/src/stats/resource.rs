//! The `/metrics/resource` exposition (upstream
//! `pkg/kubelet/metrics/collectors/resource_metrics.go`): node, pod and
//! container CPU, working set and swap from the CPU-and-memory summary, each
//! sample stamped with the time it was taken, plus the scrape error gauges.
//! Written by hand in the Prometheus text format, families sorted by name and
//! labels by name, as the Go client gathers them; HELP carries component-base's
//! stability prefix.

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::summary::{ContainerStats, PodStats, Summary};

/// Content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One family's description.
struct Desc {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
}

const CONTAINER_CPU: Desc = Desc {
    name: "container_cpu_usage_seconds_total",
    help: "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    kind: "counter",
};
const CONTAINER_MEMORY: Desc = Desc {
    name: "container_memory_working_set_bytes",
    help: "[STABLE] Current working set of the container in bytes",
    kind: "gauge",
};
const CONTAINER_START: Desc = Desc {
    name: "container_start_time_seconds",
    help: "[STABLE] Start time of the container since unix epoch in seconds",
    kind: "gauge",
};
const CONTAINER_SWAP_LIMIT: Desc = Desc {
    name: "container_swap_limit_bytes",
    help: "[ALPHA] Current amount of the container swap limit in bytes. Reported only on non-windows systems",
    kind: "gauge",
};
const CONTAINER_SWAP: Desc = Desc {
    name: "container_swap_usage_bytes",
    help: "[ALPHA] Current amount of the container swap usage in bytes. Reported only on non-windows systems",
    kind: "gauge",
};
const NODE_CPU: Desc = Desc {
    name: "node_cpu_usage_seconds_total",
    help: "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    kind: "counter",
};
const NODE_MEMORY: Desc = Desc {
    name: "node_memory_working_set_bytes",
    help: "[STABLE] Current working set of the node in bytes",
    kind: "gauge",
};
const NODE_SWAP: Desc = Desc {
    name: "node_swap_usage_bytes",
    help: "[ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems",
    kind: "gauge",
};
const POD_CPU: Desc = Desc {
    name: "pod_cpu_usage_seconds_total",
    help: "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    kind: "counter",
};
const POD_MEMORY: Desc = Desc {
    name: "pod_memory_working_set_bytes",
    help: "[STABLE] Current working set of the pod in bytes",
    kind: "gauge",
};
const POD_SWAP: Desc = Desc {
    name: "pod_swap_usage_bytes",
    help: "[ALPHA] Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
    kind: "gauge",
};
const RESOURCE_SCRAPE_ERROR: Desc = Desc {
    name: "resource_scrape_error",
    help: "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
    kind: "gauge",
};
const SCRAPE_ERROR: Desc = Desc {
    name: "scrape_error",
    help: "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
    kind: "gauge",
};

/// One sample: sorted label pairs, value, optional timestamp in ms.
type Sample = (Vec<(&'static str, String)>, f64, Option<i64>);

/// Renders the exposition for `summary` (`None` when getting it failed:
/// only the scrape error gauges, set to 1).
pub fn render(summary: Option<&Summary>) -> String {
    let mut families: Vec<(&Desc, Vec<Sample>)> = Vec::new();
    let error = if summary.is_some() { 0.0 } else { 1.0 };
    if let Some(s) = summary {
        let mut c_cpu = Vec::new();
        let mut c_mem = Vec::new();
        let mut c_start = Vec::new();
        let mut c_swap = Vec::new();
        let mut c_swap_limit = Vec::new();
        let mut p_cpu = Vec::new();
        let mut p_mem = Vec::new();
        let mut p_swap = Vec::new();
        for pod in &s.pods {
            for c in &pod.containers {
                let labels = container_labels(pod, c);
                if let Some(t) = c.start_time.as_ref().map(|t| t.0)
                    && t.as_second() > 0
                {
                    c_start.push((labels.clone(), t.as_nanosecond() as f64 / 1e9, None));
                }
                if let Some(cpu) = &c.cpu
                    && let Some(v) = cpu.usage_core_nano_seconds
                {
                    c_cpu.push((labels.clone(), v as f64 / 1e9, ms(&cpu.time)));
                }
                if let Some(m) = &c.memory
                    && let Some(v) = m.working_set_bytes
                {
                    c_mem.push((labels.clone(), v as f64, ms(&m.time)));
                }
                if let Some(sw) = &c.swap {
                    if let Some(v) = sw.swap_usage_bytes {
                        c_swap.push((labels.clone(), v as f64, ms(&sw.time)));
                    }
                    if let Some(avail) = sw.swap_available_bytes {
                        let used = sw.swap_usage_bytes.unwrap_or(0);
                        c_swap_limit.push((labels, (avail + used) as f64, ms(&sw.time)));
                    }
                }
            }
            let labels = pod_labels(pod);
            if let Some(cpu) = &pod.cpu
                && let Some(v) = cpu.usage_core_nano_seconds
            {
                p_cpu.push((labels.clone(), v as f64 / 1e9, ms(&cpu.time)));
            }
            if let Some(m) = &pod.memory
                && let Some(v) = m.working_set_bytes
            {
                p_mem.push((labels.clone(), v as f64, ms(&m.time)));
            }
            if let Some(sw) = &pod.swap
                && let Some(v) = sw.swap_usage_bytes
            {
                p_swap.push((labels, v as f64, ms(&sw.time)));
            }
        }
        let node = &s.node;
        let n_cpu: Vec<Sample> = node
            .cpu
            .as_ref()
            .and_then(|c| {
                Some((
                    Vec::new(),
                    c.usage_core_nano_seconds? as f64 / 1e9,
                    ms(&c.time),
                ))
            })
            .into_iter()
            .collect();
        let n_mem: Vec<Sample> = node
            .memory
            .as_ref()
            .and_then(|m| Some((Vec::new(), m.working_set_bytes? as f64, ms(&m.time))))
            .into_iter()
            .collect();
        // Upstream stamps node swap with the memory sample's time.
        let n_swap: Vec<Sample> = node
            .swap
            .as_ref()
            .and_then(|sw| {
                let t = node.memory.as_ref().map_or(&sw.time, |m| &m.time);
                Some((Vec::new(), sw.swap_usage_bytes? as f64, ms(t)))
            })
            .into_iter()
            .collect();
        families.extend([
            (&CONTAINER_CPU, c_cpu),
            (&CONTAINER_MEMORY, c_mem),
            (&CONTAINER_START, c_start),
            (&CONTAINER_SWAP_LIMIT, c_swap_limit),
            (&CONTAINER_SWAP, c_swap),
            (&NODE_CPU, n_cpu),
            (&NODE_MEMORY, n_mem),
            (&NODE_SWAP, n_swap),
            (&POD_CPU, p_cpu),
            (&POD_MEMORY, p_mem),
            (&POD_SWAP, p_swap),
        ]);
    }
    families.push((&RESOURCE_SCRAPE_ERROR, vec![(Vec::new(), error, None)]));
    families.push((&SCRAPE_ERROR, vec![(Vec::new(), error, None)]));

    let mut out = String::new();
    for (desc, samples) in families {
        if samples.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {} {}", desc.name, escape_help(desc.help));
        let _ = writeln!(out, "# TYPE {} {}", desc.name, desc.kind);
        for (labels, value, ts) in samples {
            out.push_str(desc.name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                }
                out.push('}');
            }
            let _ = write!(out, " {}", format_value(value));
            if let Some(ts) = ts {
                let _ = write!(out, " {ts}");
            }
            out.push('\n');
        }
    }
    out
}

fn container_labels(pod: &PodStats, c: &ContainerStats) -> Vec<(&'static str, String)> {
    vec![
        ("container", c.name.clone()),
        ("namespace", pod.pod_ref.namespace.clone()),
        ("pod", pod.pod_ref.name.clone()),
    ]
}

fn pod_labels(pod: &PodStats) -> Vec<(&'static str, String)> {
    vec![
        ("namespace", pod.pod_ref.namespace.clone()),
        ("pod", pod.pod_ref.name.clone()),
    ]
}

/// A sample's timestamp in milliseconds since the epoch; none for an unset time.
fn ms(t: &Option<Time>) -> Option<i64> {
    t.as_ref().map(|t| t.0.as_millisecond())
}

/// Formats a value as the Go client does: integers without a fraction,
/// others in the shortest form that reads back exactly.
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:e}");
        // Go prints large and small values in exponent form, others plainly.
        if (1e-4..1e21).contains(&v.abs()) {
            format!("{v}")
        } else {
            s
        }
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
