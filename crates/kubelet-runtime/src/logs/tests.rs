use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::AsyncReadExt;

use super::*;

struct Running(Arc<AtomicBool>);

#[async_trait::async_trait]
impl ContainerRunning for Running {
    async fn is_running(&self, _: &str) -> Result<bool, cri::CriError> {
        Ok(self.0.load(Ordering::SeqCst))
    }
}

fn line(t: &str, stream: &str, tag: &str, text: &str) -> String {
    format!("2024-01-01T00:00:{t}Z {stream} {tag} {text}\n")
}

async fn read(path: &Path, opts: LogOptions) -> String {
    let mut out = Vec::new();
    let running = Running(Arc::new(AtomicBool::new(false)));
    read_logs(
        path,
        "c1",
        &opts,
        &running,
        &mut out,
        &CancellationToken::new(),
    )
    .await
    .expect("read");
    String::from_utf8(out).expect("utf8")
}

fn sample() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("0.log");
    let text = [
        line("01.000000001", "stdout", "F", "one"),
        line("02", "stderr", "P", "two-"),
        line("03", "stderr", "F", "half"),
        line("04", "stdout", "F", "three"),
    ]
    .concat();
    std::fs::write(&path, text).expect("write");
    (dir, path)
}

#[tokio::test]
async fn whole_log_partial_lines_joined_as_written() {
    let (_d, p) = sample();
    assert_eq!(
        read(&p, LogOptions::default()).await,
        "one\ntwo-half\nthree\n"
    );
}

#[tokio::test]
async fn tail_since_limit_and_timestamps() {
    let (_d, p) = sample();
    let tail = LogOptions {
        tail: Some(1),
        ..Default::default()
    };
    assert_eq!(read(&p, tail).await, "three\n");
    let since = LogOptions {
        since: Some("2024-01-01T00:00:03Z".parse().expect("ts")),
        ..Default::default()
    };
    assert_eq!(read(&p, since).await, "half\nthree\n");
    let limit = LogOptions {
        bytes: Some(6),
        ..Default::default()
    };
    assert_eq!(read(&p, limit).await, "one\ntw");
    let ts = LogOptions {
        timestamps: true,
        tail: Some(1),
        ..Default::default()
    };
    assert_eq!(read(&p, ts).await, "2024-01-01T00:00:04.000000000Z three\n");
}

async fn expect(rd: &mut tokio::io::DuplexStream, got: &mut String, want: &str) {
    let mut buf = [0u8; 256];
    while !got.ends_with(want) {
        let n = tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf))
            .await
            .expect("data in time")
            .expect("read");
        assert!(n > 0, "the follow ended early; got {got:?}");
        got.push_str(std::str::from_utf8(&buf[..n]).expect("utf8"));
    }
}

#[tokio::test]
async fn follow_sees_appends_and_rotation_and_ends_when_the_container_stops() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("0.log");
    std::fs::write(&path, line("01", "stdout", "F", "first")).expect("write");
    let running = Arc::new(AtomicBool::new(true));
    let (mut rd, mut wr) = tokio::io::duplex(1 << 16);
    let p = path.clone();
    let r = running.clone();
    let task = tokio::spawn(async move {
        let opts = LogOptions {
            follow: true,
            ..Default::default()
        };
        read_logs(
            &p,
            "c1",
            &opts,
            &Running(r),
            &mut wr,
            &CancellationToken::new(),
        )
        .await
    });
    let mut got = String::new();
    expect(&mut rd, &mut got, "first\n").await;
    // An append, written in two pieces (a partial write mid-line).
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open");
    let l = line("02", "stdout", "F", "second");
    f.write_all(&l.as_bytes()[..10]).expect("half");
    f.flush().expect("flush");
    tokio::time::sleep(Duration::from_millis(50)).await;
    f.write_all(&l.as_bytes()[10..]).expect("rest");
    drop(f);
    expect(&mut rd, &mut got, "second\n").await;
    // Rotation: the runtime renames the file and reopens the path.
    std::fs::rename(&path, dir.path().join("0.log.20240101-000003")).expect("rotate");
    std::fs::write(&path, line("03", "stdout", "F", "after rotation")).expect("new file");
    expect(&mut rd, &mut got, "after rotation\n").await;
    // The container stops: what is left is read, then the follow ends.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open");
    f.write_all(line("04", "stdout", "F", "last words").as_bytes())
        .expect("write");
    running.store(false, Ordering::SeqCst);
    expect(&mut rd, &mut got, "last words\n").await;
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the follow ends")
        .expect("join")
        .expect("ok");
}

/// Rotates the log when the reader, at the end of the file, asks whether
/// the container runs: the runtime wrote one more line to the old file
/// before it reopened the path.
struct RotateOnCheck {
    path: PathBuf,
    armed: AtomicBool,
}

#[async_trait::async_trait]
impl ContainerRunning for RotateOnCheck {
    async fn is_running(&self, _: &str) -> Result<bool, cri::CriError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            use std::io::Write;
            let old = self.path.with_extension("log.20240101-000001");
            std::fs::rename(&self.path, &old).expect("rotate");
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&old)
                .expect("old");
            f.write_all(line("02", "stdout", "F", "late").as_bytes())
                .expect("late line");
            std::fs::write(&self.path, line("03", "stdout", "F", "new")).expect("new file");
        }
        Ok(true)
    }
}

#[tokio::test]
async fn follow_finishes_the_rotated_file_before_the_new_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("0.log");
    std::fs::write(&path, line("01", "stdout", "F", "first")).expect("write");
    let runtime = RotateOnCheck {
        path: path.clone(),
        armed: AtomicBool::new(true),
    };
    let (mut rd, mut wr) = tokio::io::duplex(1 << 16);
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let opts = LogOptions {
            follow: true,
            ..Default::default()
        };
        read_logs(&path, "c1", &opts, &runtime, &mut wr, &s).await
    });
    let mut got = String::new();
    expect(&mut rd, &mut got, "new\n").await;
    assert_eq!(got, "first\nlate\nnew\n");
    stop.cancel();
    task.await.expect("join").expect("ok");
}

#[tokio::test]
async fn a_cancelled_follow_returns() {
    let (_d, p) = sample();
    let stop = CancellationToken::new();
    let running = Running(Arc::new(AtomicBool::new(true)));
    let mut out = Vec::new();
    let opts = LogOptions {
        follow: true,
        ..Default::default()
    };
    let s = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.cancel();
    });
    tokio::time::timeout(
        Duration::from_secs(10),
        read_logs(&p, "c1", &opts, &running, &mut out, &stop),
    )
    .await
    .expect("returns once cancelled")
    .expect("ok");
    assert_eq!(
        String::from_utf8(out).expect("utf8"),
        "one\ntwo-half\nthree\n"
    );
}
