//! Termination messages (upstream `kuberuntime_container.go`
//! `makeMounts`/`getTerminationMessage`): each container gets a writable file
//! mounted at `terminationMessagePath`; when it exits, the file's contents (at
//! most 4 KiB) become the terminated state's message. With
//! `FallbackToLogsOnError` and a failed, silent container, the last 80 lines
//! (at most 2 KiB) of its log are used instead.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::pod;

const MAX_MESSAGE: u64 = 4096;
const MAX_LOG_LINES: usize = 80;
const MAX_LOG_BYTES: usize = 2048;

/// `<rootDir>/pods/<uid>`: the pod's data directory.
pub(crate) fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

/// Creates the termination message file for a new container instance, off
/// the async runtime, and returns the mount for it, or `None` when the
/// container has no path set.
pub(crate) async fn prepare(
    root: &Path,
    p: &Pod,
    c: &Container,
    restart_count: i32,
) -> std::io::Result<Option<pb::Mount>> {
    let Some(target) = c.termination_message_path.clone().filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let dir = pod_dir(root, pod::uid(p)).join("containers").join(&c.name);
    tokio::task::spawn_blocking(move || create_message_file(&dir, &target, restart_count))
        .await
        .map_err(std::io::Error::other)?
}

fn create_message_file(
    dir: &Path,
    target: &str,
    restart_count: i32,
) -> std::io::Result<Option<pb::Mount>> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join(format!("{restart_count}-{:08x}", rand_suffix()));
    std::fs::File::create(&file)?;
    // Any container user must be able to write it, as upstream.
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
    Ok(Some(pb::Mount {
        container_path: target.to_string(),
        host_path: file.to_string_lossy().into_owned(),
        ..Default::default()
    }))
}

fn rand_suffix() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    t ^ std::process::id().rotate_left(16)
}

fn read_capped(path: &str, cap: u64) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.by_ref().take(cap).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The tail of a CRI log file (`<time> <stream> <tag> <content>` lines), content only.
fn log_tail(path: &str) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let start = len.saturating_sub(64 * 1024);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect();
    let tail = lines[lines.len().saturating_sub(MAX_LOG_LINES)..].join("\n");
    let cut = tail.len().saturating_sub(MAX_LOG_BYTES);
    let cut = (cut..=tail.len())
        .find(|i| tail.is_char_boundary(*i))
        .unwrap_or(tail.len());
    Some(tail[cut..].to_string())
}

/// The message of an exited container, from its termination message file or,
/// with `FallbackToLogsOnError` after a failure, its log, read off the async
/// runtime. `None` keeps the runtime's message.
pub(crate) async fn message(s: &pb::ContainerStatus) -> Option<String> {
    if s.state != pb::ContainerState::ContainerExited as i32 {
        return None;
    }
    let s = s.clone();
    tokio::task::spawn_blocking(move || message_blocking(&s))
        .await
        .ok()
        .flatten()
}

fn message_blocking(s: &pb::ContainerStatus) -> Option<String> {
    if s.state != pb::ContainerState::ContainerExited as i32 {
        return None;
    }
    let path = s
        .annotations
        .get(kubelet_types::labels::CONTAINER_TERMINATION_MESSAGE_PATH)?;
    let from_file = s
        .mounts
        .iter()
        .find(|m| &m.container_path == path)
        .and_then(|m| read_capped(&m.host_path, MAX_MESSAGE))
        .filter(|m| !m.is_empty());
    if from_file.is_some() {
        return from_file;
    }
    let policy = s
        .annotations
        .get(kubelet_types::labels::CONTAINER_TERMINATION_MESSAGE_POLICY)
        .map(String::as_str);
    if policy == Some("FallbackToLogsOnError") && s.exit_code != 0 && !s.log_path.is_empty() {
        return log_tail(&s.log_path).filter(|m| !m.is_empty());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn exited(
        ann: &[(&str, &str)],
        mounts: Vec<pb::Mount>,
        exit: i32,
        log: &str,
    ) -> pb::ContainerStatus {
        pb::ContainerStatus {
            state: pb::ContainerState::ContainerExited as i32,
            exit_code: exit,
            annotations: ann
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            mounts,
            log_path: log.to_string(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn message_from_file_then_from_logs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "terminationMessagePath": "/dev/termination-log"}]}}))
        .expect("pod");
        let c = &pod::containers(&p)[0];
        let mount = prepare(dir.path(), &p, c, 0)
            .await
            .expect("prepare")
            .expect("mount");
        assert_eq!(mount.container_path, "/dev/termination-log");
        assert!(
            mount.host_path.starts_with(
                &dir.path()
                    .join("pods/u/containers/c")
                    .to_string_lossy()
                    .into_owned()
            )
        );
        let ann = [
            (
                kubelet_types::labels::CONTAINER_TERMINATION_MESSAGE_PATH,
                "/dev/termination-log",
            ),
            (
                kubelet_types::labels::CONTAINER_TERMINATION_MESSAGE_POLICY,
                "FallbackToLogsOnError",
            ),
        ];
        // Empty file, failed container: the log's last lines.
        let log = dir.path().join("0.log");
        std::fs::write(&log, "2026-01-01T00:00:00Z stdout F first line\n2026-01-01T00:00:01Z stderr F boom: it broke\n")
            .expect("log");
        let s = exited(&ann, vec![mount.clone()], 1, &log.to_string_lossy());
        assert_eq!(
            message(&s).await.as_deref(),
            Some("first line\nboom: it broke")
        );
        // Exit 0: no fallback.
        assert_eq!(
            message(&exited(
                &ann,
                vec![mount.clone()],
                0,
                &log.to_string_lossy()
            ))
            .await,
            None
        );
        // The file wins when the container wrote it.
        std::fs::write(&mount.host_path, "goodbye").expect("write");
        assert_eq!(message(&s).await.as_deref(), Some("goodbye"));
    }
}
