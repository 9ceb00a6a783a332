//! Container log rotation (upstream `test/e2e_node/container_log_rotation_test.go`) on real containerd.
//!
//! A container writes a few MiB per second with `containerLogMaxSize: 1Mi`,
//! `containerLogMaxFiles: 3` and the shortest monitor interval upstream
//! allows (3 s). As upstream's spec: the container's logs (upstream
//! `GetAllLogs`) reach three files and never more. Besides: the directory
//! itself never holds more than three files, its total size stays bounded,
//! the older rotated files are gzip holding CRI log lines, and a
//! `kubectl logs -f` (`/containerLogs?follow=true`) goes on across the
//! rotations.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;

const MAX_FILES: usize = 3;
const MAX_SIZE: u64 = 1024 * 1024;
const INTERVAL: Duration = Duration::from_secs(3);
/// What the container may write between two checks, generously: it writes
/// about 3 MiB/s; a check can come up to an interval late on a busy machine.
const BETWEEN_CHECKS: u64 = 8 * 3 * 1024 * 1024;

/// About 100 KiB per round, each line `seq <round> <1000 zeros>`.
const WRITER: &str = "x=$(printf '%01000d' 0); i=0; while true; do i=$((i+1)); j=0; \
     while [ $j -lt 100 ]; do j=$((j+1)); echo \"seq $i $x\"; done; sleep 0.02; done";

/// Upstream `GetAllLogs`: rotated files in use (not `.tmp`, not a plain
/// file whose `.gz` exists) plus the live one.
fn all_logs(log: &Path) -> Vec<PathBuf> {
    let files = rotated(log);
    let mut inuse: Vec<PathBuf> = files
        .iter()
        .filter(|f| {
            let s = f.to_string_lossy();
            !s.ends_with(".tmp")
                && (s.ends_with(".gz") || !files.contains(&PathBuf::from(format!("{s}.gz"))))
        })
        .cloned()
        .collect();
    inuse.push(log.to_path_buf());
    inuse
}

/// Files named `<log>.*` beside it.
fn rotated(log: &Path) -> Vec<PathBuf> {
    let name = format!(
        "{}.",
        log.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    let mut v: Vec<PathBuf> = std::fs::read_dir(log.parent().expect("a log directory"))
        .expect("read the log directory")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&name))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Every file in the directory, and their total size (files may go while
/// they are listed).
fn dir_usage(dir: &Path) -> (Vec<String>, u64) {
    let mut names = Vec::new();
    let mut total = 0;
    for e in std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(Result::ok)
    {
        names.push(e.file_name().to_string_lossy().into_owned());
        total += e.metadata().map(|m| m.len()).unwrap_or(0);
    }
    names.sort();
    (names, total)
}

/// The highest round the follow saw, while it reads.
fn follow(mut body: hyper::body::Incoming, seen: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            rest.extend_from_slice(&data);
            let Some(end) = rest.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            for line in rest[..end].split(|&b| b == b'\n') {
                let round = std::str::from_utf8(line)
                    .ok()
                    .and_then(|l| l.strip_prefix("seq "))
                    .and_then(|l| l.split(' ').next())
                    .and_then(|n| n.parse::<u64>().ok());
                if let Some(n) = round {
                    seen.fetch_max(n, Ordering::SeqCst);
                }
            }
            rest.drain(..=end);
        }
    })
}

/// A rotated file's timestamp suffix.
fn stamp(rotated: &Path) -> String {
    let name = rotated
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let name = name.unwrap_or_default();
    let rest = name.split_once(".log.").map_or("", |(_, r)| r);
    rest.split('.').next().unwrap_or_default().to_string()
}

/// The round of the first line of `log` (written after its rotation).
fn first_round(log: &Path) -> Option<u64> {
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(log).ok()?.read(&mut head).ok()?;
    let text = String::from_utf8_lossy(&head[..n]);
    let line = text.lines().next()?;
    line.split(" seq ").nth(1)?.split(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_rotated_and_limited_to_max_files_while_a_follow_goes_on() -> anyhow::Result<()> {
    let conf = tempfile::tempdir()?;
    let file = conf.path().join("kubelet.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: {MAX_FILES}\n\
             containerLogMonitorInterval: {}s\n\
             authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\n\
             authorization: {{mode: AlwaysAllow}}\n",
            INTERVAL.as_secs()
        ),
    )?;
    let node = Node::start(|f| f.config = Some(file.clone())).await;
    node.write_manifest("rot.yaml", &pod_yaml("rot", "Never", BUSYBOX, WRITER));
    let s = node
        .wait_status("rot", Duration::from_secs(60), "running", |s| {
            is_running(s, "c")
        })
        .await?;
    let id = container_id(&s, "c")
        .ctx("container id")?
        .trim_start_matches("containerd://")
        .to_string();
    let log = PathBuf::from(
        cri::RuntimeService::container_status(&node.runtime, &id)
            .await?
            .log_path,
    );
    let dir = log.parent().ctx("log directory")?.to_path_buf();

    // kubectl logs -f, from the start.
    let addr = node.handle().server_addr.ctx("server port")?;
    let client = NodeApiClient::new(addr, &node.serving_ca(), &node.name, Credentials::None)?;
    let resp = client
        .send(
            Method::GET,
            &format!(
                "/containerLogs/default/{}/c?follow=true&tailLines=1",
                node.pod_name("rot")
            ),
            &[],
            Bytes::new(),
        )
        .await?;
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = Arc::new(AtomicU64::new(0));
    let reader = follow(resp.into_body(), seen.clone());
    let before: BTreeSet<String> = rotated(&log).iter().map(|f| stamp(f)).collect();

    // Upstream: eventually MAX_FILES logs; meanwhile never more files in
    // the directory, nor more bytes than the bound.
    let bound = MAX_FILES as u64 * (MAX_SIZE + BETWEEN_CHECKS);
    let mut stamps = BTreeSet::new();
    let mut after_second_rotation = None;
    let mut gzips_checked = 0;
    let check = |stamps: &mut BTreeSet<String>| -> anyhow::Result<()> {
        let (names, total) = dir_usage(&dir);
        anyhow::ensure!(names.len() <= MAX_FILES, "too many files: {names:?}");
        anyhow::ensure!(total <= bound, "{total} bytes in {names:?}, bound {bound}");
        let inuse = all_logs(&log);
        anyhow::ensure!(inuse.len() <= MAX_FILES, "too many logs: {inuse:?}");
        stamps.extend(rotated(&log).iter().map(|f| stamp(f)));
        Ok(())
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        check(&mut stamps)?;
        // The follow has gone on into the file that a second rotation
        // (since the follow began) opened.
        if after_second_rotation.is_none() && stamps.difference(&before).count() >= 2 {
            after_second_rotation = first_round(&log);
        }
        for gz in rotated(&log)
            .into_iter()
            .filter(|f| f.to_string_lossy().ends_with(".gz"))
        {
            // A file removed by the next rotation meanwhile is skipped.
            let Ok(f) = std::fs::File::open(&gz) else {
                continue;
            };
            let mut text = String::new();
            flate2::read::GzDecoder::new(f).read_to_string(&mut text)?;
            let first = text.lines().next().ctx("a line in the gzip")?;
            assert!(
                first.contains(" stdout F seq "),
                "a CRI log line: {first:.80}"
            );
            gzips_checked += 1;
        }
        let logs = all_logs(&log).len();
        let followed = after_second_rotation.is_some_and(|r| seen.load(Ordering::SeqCst) > r);
        if logs == MAX_FILES && followed && gzips_checked > 0 && stamps.len() >= 3 {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "not rotated to {MAX_FILES} files with a follow going on: {logs} logs, \
             rotations {stamps:?}, follow at round {}, second rotation at round {after_second_rotation:?}",
            seen.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Upstream's Consistently, over a few more rotations.
    let until = tokio::time::Instant::now() + 4 * INTERVAL;
    while tokio::time::Instant::now() < until {
        check(&mut stamps)?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(stamps.len() >= 5, "rotations seen: {stamps:?}");
    let at = seen.load(Ordering::SeqCst);
    tokio::time::sleep(INTERVAL).await;
    assert!(
        seen.load(Ordering::SeqCst) > at,
        "the follow still yields lines"
    );
    reader.abort();
    node.remove_manifest("rot.yaml");
    node.cleanup().await;
    Ok(())
}
