//! The probe mode of `api_bench` (`API_BENCH_PROBES=1`): each pod runs
//! busybox `httpd` with a 1-second exec readiness probe and a 1-second HTTP
//! liveness probe; once all are Ready the kubelet's CPU and RSS are sampled
//! from /proc over a window, and the probe latencies are read from its
//! `/metrics/probes` histogram (`prober_probe_duration_seconds`).

use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

/// The container of a density-bench pod (`API_BENCH_DENSITY=1`): a
/// sleeping busybox with an exec readiness probe at the default period.
pub fn density_container(image: &str) -> Value {
    json!({"name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "touch /tmp/ready; trap 'exit 0' TERM; while true; do sleep 1; done"],
        "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 10}})
}

/// The container of a probe-bench pod.
pub fn container(image: &str) -> Value {
    json!({"name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "mkdir -p /www && echo ok > /www/index.html && touch /tmp/ready && exec httpd -f -p 8080 -h /www"],
        "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1},
        "livenessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "failureThreshold": 3}})
}

fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces): utime is the 12th, stime the 13th.
    let rest = stat.rsplit(')').next().context("stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?)
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .context("VmRSS")?
        .parse()
        .map_err(Into::into)
}

/// Average cores the process used over `window`, and its RSS at the end.
pub async fn sample(pid: u32, window: Duration) -> anyhow::Result<(f64, u64)> {
    // /proc/<pid>/stat counts in USER_HZ, which the Linux ABI fixes at 100.
    const HZ: f64 = 100.0;
    let t0 = cpu_ticks(pid)?;
    tokio::time::sleep(window).await;
    let t1 = cpu_ticks(pid)?;
    Ok(((t1 - t0) as f64 / HZ / window.as_secs_f64(), rss_kib(pid)?))
}

/// (probes run, p50 ms, p99 ms) of `probe_type` from a `/metrics/probes`
/// text, with Prometheus' `histogram_quantile` interpolation over the
/// buckets summed across containers.
pub fn quantiles(text: &str, probe_type: &str) -> (u64, f64, f64) {
    histogram_quantiles(
        text,
        "prober_probe_duration_seconds",
        &format!("probe_type=\"{probe_type}\""),
    )
}

/// (observations, p50 ms, p99 ms) of the seconds histogram `metric`, over
/// its series whose labels contain `want` (all with `""`).
pub fn histogram_quantiles(text: &str, metric: &str, want: &str) -> (u64, f64, f64) {
    let mut buckets: std::collections::BTreeMap<u64, f64> = Default::default();
    let prefix = format!("{metric}_bucket{{");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix.as_str()) else {
            continue;
        };
        if !rest.contains(want) {
            continue;
        }
        let le = rest
            .split("le=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or("+Inf");
        let le_us = if le == "+Inf" {
            u64::MAX
        } else {
            (le.parse::<f64>().unwrap_or(0.0) * 1e6) as u64
        };
        let count: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0.0);
        *buckets.entry(le_us).or_default() += count;
    }
    let total = buckets.get(&u64::MAX).copied().unwrap_or(0.0);
    let q = |q: f64| {
        let rank = q * total;
        let mut prev = (0u64, 0.0f64);
        for (&le, &c) in &buckets {
            if c >= rank {
                if le == u64::MAX {
                    return prev.0 as f64 / 1e3;
                }
                let span = c - prev.1;
                let frac = if span > 0.0 {
                    (rank - prev.1) / span
                } else {
                    0.0
                };
                return (prev.0 as f64 + frac * (le - prev.0) as f64) / 1e3;
            }
            prev = (le, c);
        }
        0.0
    };
    (total as u64, q(0.5), q(0.99))
}

/// Scrapes `/metrics/probes` from the read-only port.
pub async fn scrape(port: u16) -> anyhow::Result<String> {
    scrape_path(port, "/metrics/probes").await
}

/// Scrapes `path` from the read-only port.
pub async fn scrape_path(port: u16, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out)).await??;
    Ok(out)
}
