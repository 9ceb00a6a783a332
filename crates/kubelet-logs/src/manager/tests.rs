//! The manager over a fake runtime and a temp directory, on paused time.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use cri::CriError;
use jiff::Timestamp;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::*;

/// Containers with log paths; a reopen makes a new empty file at the path,
/// as containerd does.
#[derive(Default)]
struct Fake {
    running: Mutex<Vec<(String, PathBuf)>>,
    /// Reopen fails with this, per container.
    reopen_err: Mutex<HashMap<String, CriError>>,
    /// Listing never answers.
    list_hangs: bool,
    reopen_delay: Duration,
    active: AtomicUsize,
    peak: AtomicUsize,
    reopens: Mutex<Vec<String>>,
}

#[async_trait]
impl LogRuntime for Fake {
    async fn running_containers(&self) -> Result<Vec<String>, CriError> {
        if self.list_hangs {
            std::future::pending::<()>().await;
        }
        Ok(self
            .running
            .lock()
            .iter()
            .map(|(id, _)| id.clone())
            .collect())
    }

    async fn log_path(&self, id: &str) -> Result<String, CriError> {
        self.running
            .lock()
            .iter()
            .find(|(c, _)| c == id)
            .map(|(_, p)| p.to_string_lossy().into_owned())
            .ok_or_else(|| CriError::NotFound {
                op: "ContainerStatus",
                message: format!("container {id} not found"),
            })
    }

    async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.reopen_delay).await;
        self.active.fetch_sub(1, Ordering::SeqCst);
        self.reopens.lock().push(id.to_string());
        if let Some(e) = self.reopen_err.lock().remove(id) {
            return Err(e);
        }
        let path = self.log_path(id).await?;
        std::fs::File::create(path)
            .map(drop)
            .map_err(|e| CriError::Rpc {
                op: "ReopenContainerLog",
                code: cri::Code::Unknown,
                message: e.to_string(),
            })
    }
}

fn policy(max_files: usize, workers: usize) -> LogRotatePolicy {
    LogRotatePolicy {
        max_size: 1024,
        max_files,
        max_workers: workers,
        monitor_interval: Duration::from_secs(10),
    }
}

/// One second later at each call, from 2024-01-01T00:00:00Z.
fn ticking_clock() -> impl Fn() -> Timestamp + Send + Sync + 'static {
    let s = AtomicI64::new(1_704_067_200);
    move || {
        Timestamp::from_second(s.fetch_add(1, Ordering::SeqCst)).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

fn manager(fake: Arc<Fake>, p: LogRotatePolicy) -> Arc<ContainerLogManager> {
    Arc::new(ContainerLogManager::new(fake, p, Duration::from_secs(2)).with_clock(ticking_clock()))
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn gunzip(p: &Path) -> String {
    let mut out = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(p).expect("open"))
        .read_to_string(&mut out)
        .expect("valid gzip");
    out
}

/// A container `id` logging to `<dir>/<id>/0.log`, holding `bytes` bytes.
fn container(fake: &Fake, dir: &Path, id: &str, bytes: usize) -> PathBuf {
    let d = dir.join(id);
    std::fs::create_dir_all(&d).expect("mkdir");
    let log = d.join("0.log");
    std::fs::write(&log, "x".repeat(bytes)).expect("write");
    fake.running.lock().push((id.to_string(), log.clone()));
    log
}

#[tokio::test(start_paused = true)]
async fn rotates_a_log_above_the_size_and_leaves_one_below() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake::default());
    let big = container(&fake, dir.path(), "big", 2048);
    let small = container(&fake, dir.path(), "small", 1000);
    let m = manager(fake.clone(), policy(3, 1));
    m.rotate_logs().await;
    assert_eq!(
        names(&dir.path().join("big")),
        ["0.log", "0.log.20240101-000000"]
    );
    assert_eq!(std::fs::metadata(&big).expect("reopened").len(), 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("big/0.log.20240101-000000")).expect("rotated"),
        "x".repeat(2048)
    );
    assert_eq!(names(&dir.path().join("small")), ["0.log"]);
    assert_eq!(std::fs::metadata(&small).expect("live").len(), 1000);
    assert_eq!(*fake.reopens.lock(), ["big"]);
    assert_eq!(m.stats().rotations(), 1);
}

#[tokio::test(start_paused = true)]
async fn compresses_older_files_and_keeps_at_most_max_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake::default());
    let log = container(&fake, dir.path(), "c", 0);
    let m = manager(fake.clone(), policy(3, 1));
    for round in 0..5 {
        std::fs::write(&log, format!("round {round}\n").repeat(200)).expect("write");
        m.rotate_logs().await;
        let files = names(&dir.path().join("c"));
        assert!(files.len() <= 3, "round {round}: {files:?}");
    }
    // Live, the newest rotated (plain), one older (gzip).
    assert_eq!(
        names(&dir.path().join("c")),
        ["0.log", "0.log.20240101-000003.gz", "0.log.20240101-000004"]
    );
    assert_eq!(
        gunzip(&dir.path().join("c/0.log.20240101-000003.gz")),
        "round 3\n".repeat(200)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("c/0.log.20240101-000004")).expect("newest"),
        "round 4\n".repeat(200)
    );
    assert_eq!(m.stats().rotations(), 5);
    assert_eq!(m.stats().removed_files(), 3, "rounds 0, 1 and 2 went");
    assert_eq!(
        crate::all_logs(&log).expect("all").len(),
        3,
        "upstream GetAllLogs counts the live file too"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_reopen_renames_the_file_back_and_the_next_pass_rotates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake::default());
    let log = container(&fake, dir.path(), "c", 2048);
    fake.reopen_err.lock().insert(
        "c".into(),
        CriError::Rpc {
            op: "ReopenContainerLog",
            code: cri::Code::Internal,
            message: "boom".into(),
        },
    );
    let m = manager(fake.clone(), policy(3, 1));
    m.rotate_logs().await;
    assert_eq!(names(&dir.path().join("c")), ["0.log"]);
    assert_eq!(std::fs::metadata(&log).expect("back").len(), 2048);
    assert_eq!((m.stats().rotations(), m.stats().failures()), (0, 1));
    m.rotate_logs().await;
    assert_eq!(names(&dir.path().join("c")).len(), 2);
    assert_eq!((m.stats().rotations(), m.stats().failures()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_container_gone_mid_rotation_is_not_a_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake::default());
    let log = container(&fake, dir.path(), "c", 2048);
    fake.reopen_err.lock().insert(
        "c".into(),
        CriError::NotFound {
            op: "ReopenContainerLog",
            message: "not found".into(),
        },
    );
    let m = manager(fake.clone(), policy(3, 1));
    m.rotate_logs().await;
    assert_eq!(std::fs::metadata(&log).expect("back").len(), 2048);
    assert_eq!((m.stats().rotations(), m.stats().failures()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn at_most_max_workers_rotate_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake {
        reopen_delay: Duration::from_secs(1),
        ..Fake::default()
    });
    for i in 0..5 {
        container(&fake, dir.path(), &format!("c{i}"), 2048);
    }
    let m = manager(fake.clone(), policy(3, 2));
    m.rotate_logs().await;
    assert_eq!(fake.peak.load(Ordering::SeqCst), 2);
    let done: HashSet<String> = fake.reopens.lock().iter().cloned().collect();
    assert_eq!(done.len(), 5, "every container rotated: {done:?}");
    assert_eq!(m.stats().rotations(), 5);
}

#[tokio::test(start_paused = true)]
async fn leftover_tmp_and_compressed_twins_are_cleaned_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake::default());
    container(&fake, dir.path(), "c", 2048);
    let d = dir.path().join("c");
    for n in [
        "0.log.20231231-000000.gz.tmp",
        "0.log.20231231-000001",
        "0.log.20231231-000001.gz",
    ] {
        std::fs::write(d.join(n), "old").expect("write");
    }
    let m = manager(fake.clone(), policy(5, 1));
    m.rotate_logs().await;
    assert_eq!(
        names(&d),
        ["0.log", "0.log.20231231-000001.gz", "0.log.20240101-000000"]
    );
    assert_eq!(m.stats().removed_files(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_missing_live_file_is_reopened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake::default());
    let log = container(&fake, dir.path(), "c", 0);
    std::fs::remove_file(&log).expect("remove");
    let m = manager(fake.clone(), policy(3, 1));
    m.rotate_logs().await;
    assert!(log.exists(), "the runtime made it again");
    assert_eq!(*fake.reopens.lock(), ["c"]);
    assert_eq!(m.stats().rotations(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_hung_runtime_is_cut_at_the_deadline() {
    let fake = Arc::new(Fake {
        list_hangs: true,
        ..Fake::default()
    });
    let m = manager(fake, policy(3, 1));
    let started = tokio::time::Instant::now();
    m.rotate_logs().await;
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn the_loop_checks_every_interval_until_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Arc::new(Fake::default());
    let log = container(&fake, dir.path(), "c", 2048);
    let m = manager(fake.clone(), policy(3, 1));
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.clone().run(stop.clone()));
    // The first pass runs at once.
    wait_for(|| m.stats().rotations() == 1).await;
    std::fs::write(&log, "y".repeat(2048)).expect("write");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(m.stats().rotations(), 1, "not before the interval");
    wait_for(|| m.stats().rotations() == 2).await;
    stop.cancel();
    task.await.expect("the loop ends");
}

async fn wait_for(cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("condition not met");
}
