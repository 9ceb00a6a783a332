//! System OOM events (upstream `pkg/kubelet/oom` `realWatcher` over
//! cAdvisor's `utils/oomparser`): the kernel log is read from `/dev/kmsg`
//! (`kmsg`), each OOM kill it reports is parsed into an [`OomInstance`],
//! and one that was not confined to a memory cgroup (its OOM cgroup is the
//! root, `/`) becomes a Warning `SystemOOM` event on the Node. An OOM
//! inside a container's own limit is not a node event: the container ends
//! with the runtime's `OOMKilled` reason instead.
//!
//! Only kills after the kubelet started are reported: the reader starts at
//! the end of the kernel's ring buffer, which otherwise replays old records.

mod kmsg;

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_types::events::{EventType, Recorder};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Upstream `systemOOMEvent`.
pub const SYSTEM_OOM: &str = "SystemOOM";

/// The OOM cgroup of a kill not confined to a memory cgroup (upstream
/// `recordEventContainerName`).
const ROOT_CGROUP: &str = "/";

/// One OOM kill, as the kernel reported it (cAdvisor `OomInstance`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OomInstance {
    /// The killed process's pid (0 when not reported).
    pub pid: u32,
    /// The killed process's name.
    pub process_name: String,
    /// The cgroup of the killed task (`task_memcg`, or the legacy "Task in").
    pub container_name: String,
    /// The memory cgroup whose limit was hit (`oom_memcg`, or the legacy
    /// "limit of"); `/` for a system-wide OOM.
    pub victim_container_name: String,
    /// `CONSTRAINT_NONE`, `CONSTRAINT_CPUSET`, `CONSTRAINT_MEMORY_POLICY`
    /// or `CONSTRAINT_MEMCG` (5.0+ kernels).
    pub constraint: String,
    /// Microseconds since boot of the record that ended it.
    pub timestamp_us: u64,
}

impl OomInstance {
    /// Whether the whole node ran out of memory (upstream compares the
    /// victim cgroup with `/`).
    pub fn is_system_oom(&self) -> bool {
        self.victim_container_name == ROOT_CGROUP
    }

    /// Upstream's event message.
    pub fn event_message(&self) -> String {
        if self.process_name.is_empty() || self.pid == 0 {
            "System OOM encountered".to_string()
        } else {
            format!(
                "System OOM encountered, victim process: {}, pid: {}",
                self.process_name, self.pid
            )
        }
    }
}

/// cAdvisor's `StreamOoms` as a state machine over kernel messages: an
/// `invoked oom-killer:` line opens an OOM report, which ends at its
/// `oom-kill:` summary line (5.0+ kernels) or its `Killed process N (name)`
/// line (older kernels, and global OOMs).
#[derive(Debug, Default)]
pub struct OomParser {
    current: Option<OomInstance>,
}

/// The value of `key=` in a comma-separated summary, up to the next `,key=`.
fn field<'a>(line: &'a str, key: &str, next: &str) -> Option<&'a str> {
    let start = line.find(key)? + key.len();
    let rest = &line[start..];
    Some(rest.find(next).map_or(rest, |end| &rest[..end]))
}

/// The 5.0+ summary: `oom-kill:constraint=C,nodemask=N,cpuset=S,
/// mems_allowed=M,oom_memcg=/a,task_memcg=/b,task=T,pid=P,uid=U`, with
/// `global_oom` in place of `oom_memcg=` when no cgroup limit was hit.
fn parse_summary(line: &str, oom: &mut OomInstance) -> bool {
    let Some(at) = line.find("oom-kill:constraint=") else {
        return false;
    };
    let line = &line[at..];
    let (Some(task), Some(pid)) = (
        field(line, ",task=", ",pid="),
        field(line, ",pid=", ",uid="),
    ) else {
        return false;
    };
    oom.constraint = field(line, "constraint=", ",")
        .unwrap_or_default()
        .to_string();
    oom.victim_container_name = match field(line, ",oom_memcg=", ",task_memcg=") {
        Some(memcg) => memcg.to_string(),
        None => ROOT_CGROUP.to_string(),
    };
    if let Some(memcg) = field(line, ",task_memcg=", ",task=") {
        oom.container_name = memcg.to_string();
    }
    oom.process_name = task.to_string();
    oom.pid = pid.trim().parse().unwrap_or(0);
    true
}

/// The pre-5.0 `Task in /a killed as a result of limit of /b` line.
fn parse_legacy_task(line: &str, oom: &mut OomInstance) {
    let Some(at) = line.find("Task in ") else {
        return;
    };
    let rest = &line[at + "Task in ".len()..];
    if let Some((task, limit)) = rest.split_once(" killed as a result of limit of ") {
        oom.container_name = join_root(task);
        oom.victim_container_name = join_root(limit);
    }
}

/// `path.Join("/", p)`: rooted, without a trailing slash.
fn join_root(p: &str) -> String {
    let parts: Vec<_> = p
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

/// `Killed process N (name)`; the name runs to the line's last `)`, as
/// cAdvisor's greedy pattern reads it.
fn parse_killed(line: &str, oom: &mut OomInstance) -> bool {
    let Some(at) = line.find("Killed process ") else {
        return false;
    };
    let rest = &line[at + "Killed process ".len()..];
    let Some((pid, rest)) = rest.split_once(" (") else {
        return false;
    };
    let (Ok(pid), Some(close)) = (pid.parse::<u32>(), rest.rfind(')')) else {
        return false;
    };
    if close == 0 {
        return false;
    }
    oom.pid = pid;
    oom.process_name = rest[..close].to_string();
    true
}

impl OomParser {
    /// Feeds one kernel message (its text, and its time in microseconds
    /// since boot); returns the OOM kill it completes, if any.
    pub fn feed(&mut self, message: &str, timestamp_us: u64) -> Option<OomInstance> {
        if message.contains("invoked oom-killer:") {
            // A report whose end was lost is dropped for the new one.
            self.current = Some(OomInstance {
                container_name: ROOT_CGROUP.into(),
                victim_container_name: ROOT_CGROUP.into(),
                timestamp_us,
                ..Default::default()
            });
            return None;
        }
        let oom = self.current.as_mut()?;
        let done = parse_summary(message, oom) || {
            parse_legacy_task(message, oom);
            parse_killed(message, oom)
        };
        if !done {
            return None;
        }
        let mut oom = self.current.take()?;
        oom.timestamp_us = timestamp_us;
        Some(oom)
    }
}

/// Records `SystemOOM` for each system-wide OOM kill in `records` (kernel
/// messages with their time since boot).
pub struct Watcher {
    parser: OomParser,
    recorder: Arc<dyn Recorder>,
    node: ObjectReference,
}

impl Watcher {
    /// A watcher reporting on `node` through `recorder`.
    pub fn new(recorder: Arc<dyn Recorder>, node: ObjectReference) -> Self {
        Self {
            parser: OomParser::default(),
            recorder,
            node,
        }
    }

    /// Feeds one kernel message; returns the system OOM it reported, if any.
    pub fn handle(&mut self, message: &str, timestamp_us: u64) -> Option<OomInstance> {
        let oom = self.parser.feed(message, timestamp_us)?;
        if !oom.is_system_oom() {
            tracing::debug!(?oom, "OOM kill within a memory cgroup");
            return None;
        }
        info!(
            pid = oom.pid,
            process = %oom.process_name,
            task_cgroup = %oom.container_name,
            constraint = %oom.constraint,
            "System OOM kill"
        );
        self.recorder.event(
            &self.node,
            EventType::Warning,
            SYSTEM_OOM,
            oom.event_message(),
        );
        Some(oom)
    }
}

/// Reads `/dev/kmsg` from its current end until `stop`, recording a
/// `SystemOOM` event for each system-wide OOM kill. Without a readable
/// `/dev/kmsg` (a container, `dmesg_restrict`), logs once and returns.
pub async fn run(recorder: Arc<dyn Recorder>, node: ObjectReference, stop: CancellationToken) {
    kmsg::watch(Watcher::new(recorder, node), kmsg::DEV_KMSG, stop).await;
}

#[cfg(test)]
mod tests;
