//! The OOM parser on kernel log samples from several kernel versions
//! (cAdvisor `oomparser_test.go`'s idea), and the watcher's events.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_types::events::node_ref;
use parking_lot::Mutex;

use super::kmsg::{Record, parse_record};
use super::*;

/// One recorded event.
#[derive(Debug)]
struct Ev {
    object: ObjectReference,
    kind: EventType,
    reason: String,
    message: String,
}

#[derive(Default)]
struct RecordingRecorder(Mutex<Vec<Ev>>);

impl Recorder for RecordingRecorder {
    fn event(&self, object: &ObjectReference, kind: EventType, reason: &str, message: String) {
        self.0.lock().push(Ev {
            object: object.clone(),
            kind,
            reason: reason.to_string(),
            message,
        });
    }
}

impl RecordingRecorder {
    fn events(&self) -> Vec<Ev> {
        std::mem::take(&mut *self.0.lock())
    }
}

fn parse_all(lines: &[&str]) -> Vec<OomInstance> {
    let mut p = OomParser::default();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| p.feed(l, 1000 + i as u64))
        .collect()
}

/// 5.15, cgroup v2, a container over its own limit.
const MEMCG_5_15: &[&str] = &[
    "stress invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=939",
    "CPU: 0 PID: 5136 Comm: stress Not tainted 5.15.0-91-generic #101-Ubuntu",
    "memory: usage 102400kB, limit 102400kB, failcnt 63",
    "Tasks state (memory values in pages):",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-containerd-4c1c.scope,mems_allowed=0,oom_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1e7d.slice/cri-containerd-4c1c.scope,task_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1e7d.slice/cri-containerd-4c1c.scope,task=stress,pid=5137,uid=0",
    "Memory cgroup out of memory: Killed process 5137 (stress) total-vm:110636kB, anon-rss:101884kB, file-rss:268kB, shmem-rss:0kB, UID:0 pgtables:244kB oom_score_adj:939",
];

/// 6.1, the whole node out of memory.
const GLOBAL_6_1: &[&str] = &[
    "chrome invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=300",
    "Mem-Info:",
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/session-2.scope,task=chrome,pid=4321,uid=1000",
    "Out of memory: Killed process 4321 (chrome) total-vm:34058844kB, anon-rss:1021532kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:5632kB oom_score_adj:300",
];

/// 4.14, the whole node out of memory (no summary line yet).
const GLOBAL_4_14: &[&str] = &[
    "java invoked oom-killer: gfp_mask=0x14280ca(GFP_HIGHUSER_MOVABLE|__GFP_ZERO), nodemask=(null),  order=0, oom_score_adj=0",
    "java cpuset=/ mems_allowed=0",
    "Out of memory: Kill process 1234 (java) score 877 or sacrifice child",
    "Killed process 1234 (java) total-vm:5000000kB, anon-rss:3000000kB, file-rss:0kB, shmem-rss:0kB",
    "oom_reaper: reaped process 1234 (java), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
];

/// 4.14, cgroup v1, a container over its own limit.
const MEMCG_4_14: &[&str] = &[
    "stress invoked oom-killer: gfp_mask=0x14000c0(GFP_KERNEL), nodemask=(null),  order=0, oom_score_adj=-998",
    "stress cpuset=abc mems_allowed=0",
    "Task in /kubepods/besteffort/pod12/abc killed as a result of limit of /kubepods/besteffort/pod12/abc/",
    "memory: usage 10240kB, limit 10240kB, failcnt 10",
    "Memory cgroup out of memory: Kill process 555 (stress) score 1000 or sacrifice child",
    "Killed process 555 (stress) total-vm:7468kB, anon-rss:9812kB, file-rss:4kB, shmem-rss:0kB",
];

/// 4.19, cgroup v1, with the summary line.
const MEMCG_4_19: &[&str] = &[
    "sh invoked oom-killer: gfp_mask=0x6000c0(GFP_KERNEL), nodemask=(null), order=0, oom_score_adj=968",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/burstable/pod9,task_memcg=/kubepods/burstable/pod9/c1,task=sh,pid=2345,uid=0",
    "Memory cgroup out of memory: Killed process 2345 (sh) total-vm:1000kB, anon-rss:500kB, file-rss:0kB, shmem-rss:0kB",
];

#[test]
fn a_container_oom_on_5_15_is_not_a_system_oom() {
    let ooms = parse_all(MEMCG_5_15);
    assert_eq!(ooms.len(), 1);
    let o = &ooms[0];
    assert_eq!((o.pid, o.process_name.as_str()), (5137, "stress"));
    assert_eq!(o.constraint, "CONSTRAINT_MEMCG");
    assert!(
        o.victim_container_name
            .ends_with("cri-containerd-4c1c.scope")
    );
    assert_eq!(o.timestamp_us, 1004, "the summary line ends it");
    assert!(!o.is_system_oom());
}

#[test]
fn a_global_oom_on_6_1_is_a_system_oom() {
    let ooms = parse_all(GLOBAL_6_1);
    assert_eq!(ooms.len(), 1);
    let o = &ooms[0];
    assert!(o.is_system_oom());
    assert_eq!((o.pid, o.process_name.as_str()), (4321, "chrome"));
    assert_eq!(
        o.container_name,
        "/user.slice/user-1000.slice/session-2.scope"
    );
    assert_eq!(
        o.event_message(),
        "System OOM encountered, victim process: chrome, pid: 4321"
    );
}

#[test]
fn a_global_oom_on_4_14_ends_at_killed_process() {
    let ooms = parse_all(GLOBAL_4_14);
    assert_eq!(ooms.len(), 1);
    assert!(ooms[0].is_system_oom());
    assert_eq!((ooms[0].pid, ooms[0].process_name.as_str()), (1234, "java"));
}

#[test]
fn legacy_and_4_19_container_ooms_name_their_cgroups() {
    let o = &parse_all(MEMCG_4_14)[0];
    assert_eq!(o.victim_container_name, "/kubepods/besteffort/pod12/abc");
    assert_eq!(o.container_name, "/kubepods/besteffort/pod12/abc");
    assert_eq!((o.pid, o.process_name.as_str()), (555, "stress"));
    assert!(!o.is_system_oom());
    let o = &parse_all(MEMCG_4_19)[0];
    assert_eq!(o.victim_container_name, "/kubepods/burstable/pod9");
    assert_eq!(o.container_name, "/kubepods/burstable/pod9/c1");
    assert_eq!((o.pid, o.process_name.as_str()), (2345, "sh"));
}

#[test]
fn lines_outside_a_report_and_unfinished_reports_yield_nothing() {
    assert!(parse_all(&["Killed process 1 (init)", "eth0: link up"]).is_empty());
    // A report whose end was lost is replaced by the next one.
    let mut lines = vec!["a invoked oom-killer: gfp_mask=0x0, order=0, oom_score_adj=0"];
    lines.extend_from_slice(GLOBAL_6_1);
    let ooms = parse_all(&lines);
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0].process_name, "chrome");
}

#[test]
fn only_system_ooms_become_node_events() {
    let recorder = Arc::new(RecordingRecorder::default());
    let mut w = Watcher::new(recorder.clone(), node_ref("node-1"));
    let mut system = 0;
    for (i, l) in MEMCG_5_15
        .iter()
        .chain(GLOBAL_6_1)
        .chain(MEMCG_4_14)
        .chain(GLOBAL_4_14)
        .enumerate()
    {
        system += usize::from(w.handle(l, i as u64).is_some());
    }
    assert_eq!(system, 2);
    let events = recorder.events();
    assert_eq!(events.len(), 2, "{events:?}");
    for e in &events {
        assert_eq!(e.kind, EventType::Warning);
        assert_eq!(e.reason, SYSTEM_OOM);
        assert_eq!(e.object.kind.as_deref(), Some("Node"));
        assert_eq!(e.object.name.as_deref(), Some("node-1"));
    }
    assert_eq!(
        events[1].message,
        "System OOM encountered, victim process: java, pid: 1234"
    );
    // Without the victim's name and pid, upstream's short message.
    assert_eq!(
        OomInstance::default().event_message(),
        "System OOM encountered"
    );
}

#[test]
fn kmsg_records_parse_with_facility_and_continuations() {
    assert_eq!(
        parse_record("6,19187,10578584036,-;Out of memory: Killed process 1 (x)\n SUBSYSTEM=mem\n"),
        Some(Record {
            facility: 0,
            seq: 19187,
            timestamp_us: 10_578_584_036,
            message: "Out of memory: Killed process 1 (x)",
        })
    );
    // Written by a process: the user facility (1).
    assert_eq!(parse_record("12,5,10,-;hello").map(|r| r.facility), Some(1));
    assert_eq!(parse_record("garbage"), None);
    assert_eq!(parse_record("x,1,2,-;m"), None);
}

#[tokio::test]
async fn a_missing_kernel_log_ends_the_watch_quietly() {
    let recorder = Arc::new(RecordingRecorder::default());
    let w = Watcher::new(recorder.clone(), node_ref("n"));
    let stop = CancellationToken::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        kmsg::watch(w, "/nonexistent/kmsg", stop),
    )
    .await
    .expect("returns at once");
    assert!(recorder.events().is_empty());
}

#[tokio::test]
async fn the_real_kernel_log_is_watched_until_stopped() {
    if std::fs::File::open(kmsg::DEV_KMSG).is_err() {
        return; // no readable /dev/kmsg here
    }
    let recorder = Arc::new(RecordingRecorder::default());
    let w = Watcher::new(recorder.clone(), node_ref("n"));
    let stop = CancellationToken::new();
    let task = tokio::spawn(kmsg::watch(w, kmsg::DEV_KMSG, stop.clone()));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!task.is_finished(), "it waits for records");
    stop.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(10), task)
        .await
        .expect("stops with its token")
        .expect("no panic");
    assert!(recorder.events().is_empty(), "old records are not replayed");
}
