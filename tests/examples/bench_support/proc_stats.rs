//! What a process costs, read from `/proc` and strace: CPU seconds, resident
//! memory, wake-ups (context switches of all its threads: each is a thread
//! that blocked, or was preempted, and ran again) and system calls by kind.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;

/// utime + stime in seconds (USER_HZ is 100 on Linux).
pub fn cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit(')').next().context("stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks =
        f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

/// Per thread: on-CPU nanoseconds (`schedstat`) and context switches.
fn threads(pid: u32) -> anyhow::Result<HashMap<u64, (u64, u64)>> {
    let mut out = HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let task = task?;
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let (Ok(sched), Ok(status)) = (
            std::fs::read_to_string(task.path().join("schedstat")),
            std::fs::read_to_string(task.path().join("status")),
        ) else {
            continue;
        };
        let ns = sched
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let switches = status_field(&status, "voluntary_ctxt_switches:").unwrap_or(0)
            + status_field(&status, "nonvoluntary_ctxt_switches:").unwrap_or(0);
        out.insert(tid, (ns, switches));
    }
    Ok(out)
}

/// On-CPU milliseconds (each thread's `schedstat`, nanoseconds: finer than
/// the 10 ms ticks of `stat`) and wake-ups (context switches) of all the
/// process's threads over `window`, counting threads that start or exit in
/// it: the threads are read every 500 ms and a thread that exits keeps its
/// last reading (the runtime's blocking threads exit after 10 s idle, so
/// nothing of theirs falls between two readings).
pub async fn cpu_ms_and_wakeups(pid: u32, window: Duration) -> anyhow::Result<(f64, u64)> {
    let base = threads(pid)?;
    let mut last = base.clone();
    let end = tokio::time::Instant::now() + window;
    loop {
        let now = tokio::time::Instant::now();
        if now >= end {
            break;
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(500))).await;
        last.extend(threads(pid)?);
    }
    let (mut ns, mut switches) = (0u64, 0u64);
    for (tid, (n, w)) in &last {
        let (n0, w0) = base.get(tid).copied().unwrap_or((0, 0));
        ns += n.saturating_sub(n0);
        switches += w.saturating_sub(w0);
    }
    Ok((ns as f64 / 1e6, switches))
}

fn status_field(status: &str, name: &str) -> anyhow::Result<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .with_context(|| name.to_string())?
        .parse()
        .map_err(Into::into)
}

/// (VmRSS, RssAnon) in KiB.
pub fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok((
        status_field(&status, "VmRSS:")?,
        status_field(&status, "RssAnon:")?,
    ))
}

/// `strace -c -f` attached for `window`: the total system calls and the
/// calls per kind, most first.
pub async fn syscalls(pid: u32, window: Duration) -> anyhow::Result<(u64, Vec<(String, u64)>)> {
    let out = tempfile::NamedTempFile::new()?;
    let mut child = tokio::process::Command::new("strace")
        .args(["-c", "-f", "-q", "-o"])
        .arg(out.path())
        .args(["-p", &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("strace (apt-get install strace)")?;
    tokio::time::sleep(window).await;
    if let Some(id) = child.id() {
        // SIGINT: strace detaches and writes its summary.
        let _ = std::process::Command::new("kill")
            .args(["-INT", &id.to_string()])
            .status();
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let text = std::fs::read_to_string(out.path())?;
    let mut kinds = Vec::new();
    let mut total = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors,] syscall
        let (Some(name), Some(calls)) = (f.last(), f.get(3).and_then(|c| c.parse::<u64>().ok()))
        else {
            continue;
        };
        if *name == "total" {
            total = calls;
        } else if f.len() >= 5 {
            kinds.push(((*name).to_string(), calls));
        }
    }
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    Ok((total, kinds))
}
