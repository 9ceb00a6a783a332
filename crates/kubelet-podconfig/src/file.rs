//! Static pods from a directory or file (upstream `pkg/kubelet/config/file.go`,
//! `file_linux.go`): every regular file in the directory whose name does not
//! start with a dot is one pod (upstream's `[^.]*` glob: GCE names them
//! `*.manifest`); subdirectories are not entered. Re-read when the path changes (debounced 50 ms; the
//! inotify events that count are listed in [`crate::file_watch`], never the
//! source's own reads) and every `fileCheckFrequency`. A file that cannot be
//! read or parsed is reported with its name and reason and left out; the
//! other pods are unaffected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::Source;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::file_watch::{PathWatch, Retarget, is_manifest_name};
use super::manifest::parse_pod_document;
use super::{SourceSender, SourceUpdate};

/// Manifest files that were refused, with the reason (for tests, logs and later events).
pub type ManifestErrors = Arc<Mutex<BTreeMap<PathBuf, String>>>;

/// The static pod file source.
pub struct FileSource {
    path: PathBuf,
    node_name: String,
    period: Duration,
    errors: ManifestErrors,
}

fn is_manifest(p: &Path) -> bool {
    p.file_name().is_some_and(is_manifest_name)
}

/// Why the static pod path yields no files.
#[derive(Debug, thiserror::Error)]
pub enum ManifestPathError {
    /// The path does not exist (upstream logs it and keeps watching).
    #[error("Static pod path does not exist")]
    Missing,
    /// The path cannot be examined.
    #[error("cannot read static pod path: {0}")]
    Stat(#[source] std::io::Error),
    /// The directory cannot be listed.
    #[error("cannot list static pod directory: {0}")]
    List(#[source] std::io::Error),
}

/// The manifest files the source reads from `path`, sorted: the file
/// itself, or a directory's regular files that are not dotfiles.
pub fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, ManifestPathError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ManifestPathError::Missing),
        Err(e) => Err(ManifestPathError::Stat(e)),
        Ok(m) if m.is_dir() => {
            let rd = std::fs::read_dir(path).map_err(ManifestPathError::List)?;
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_manifest(p) && p.is_file())
                .collect();
            v.sort();
            Ok(v)
        }
        Ok(_) => Ok(vec![path.to_path_buf()]),
    }
}

impl FileSource {
    /// A source reading `path` for node `node_name`, re-read every `period`.
    pub fn new(path: PathBuf, node_name: String, period: Duration) -> Self {
        Self {
            path,
            node_name,
            period,
            errors: Arc::default(),
        }
    }

    /// The refused manifests, shared.
    pub fn errors(&self) -> ManifestErrors {
        self.errors.clone()
    }

    /// Reads every manifest now. Never fails: problems are recorded per file.
    pub fn read_pods(&self) -> Vec<Pod> {
        let mut errors = BTreeMap::new();
        let mut pods = Vec::new();
        let files = match manifest_files(&self.path) {
            Ok(files) => files,
            Err(e @ ManifestPathError::Missing) => {
                debug!(path = %self.path.display(), "{e}");
                vec![]
            }
            Err(e) => {
                errors.insert(self.path.clone(), e.to_string());
                vec![]
            }
        };
        for f in files {
            let origin = f.display().to_string();
            let res = std::fs::read_to_string(&f)
                .map_err(|e| format!("cannot read file: {e}"))
                .and_then(|text| {
                    parse_pod_document(&text, Source::File, &origin, &self.node_name)
                        .map_err(|e| e.0)
                });
            match res {
                Ok(p) => pods.push(p),
                Err(reason) => {
                    errors.insert(f, reason);
                }
            }
        }
        let mut current = self.errors.lock();
        for (f, reason) in &errors {
            if current.get(f) != Some(reason) {
                warn!(file = %f.display(), %reason, "Could not process manifest file");
            }
        }
        for f in current.keys() {
            if !errors.contains_key(f) {
                info!(file = %f.display(), "Manifest file is readable again");
            }
        }
        *current = errors;
        pods
    }

    /// Points the watch where the path is now, then reads every manifest,
    /// off the async runtime: a manifest on a slow or hung filesystem (or a
    /// FIFO) must not stall other tasks.
    async fn read_pods_blocking(self: &Arc<Self>, watch: Option<Retarget>) -> Vec<Pod> {
        let this = self.clone();
        let read = move || {
            if let Some(w) = watch {
                w.ensure();
            }
            this.read_pods()
        };
        match tokio::task::spawn_blocking(read).await {
            Ok(pods) => pods,
            Err(e) => {
                warn!(error = %e, "Reading static pod manifests failed");
                vec![]
            }
        }
    }

    /// Sends a snapshot now, after every change of the path (debounced), and
    /// every period, until `stop`.
    pub async fn run(self, tx: SourceSender, stop: CancellationToken) {
        let this = Arc::new(self);
        let mut watch = match PathWatch::new(&this.path) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(path = %this.path.display(), error = %e, "Cannot watch static pod path; polling only");
                None
            }
        };
        let retarget = watch.as_ref().map(PathWatch::retarget);
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + this.period, this.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let pods = this.read_pods_blocking(retarget.clone()).await;
            if tx
                .send(SourceUpdate {
                    source: Source::File,
                    pods,
                })
                .await
                .is_err()
            {
                return;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = changed(&mut watch) => {
                    // Editors write in several steps; let them finish.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if let Some(w) = watch.as_mut() {
                        w.drain();
                    }
                }
                _ = tick.tick() => {}
            }
        }
    }
}

async fn changed(watch: &mut Option<PathWatch>) {
    match watch {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec:\n  containers: [{name: c, image: 'busybox:1'}]\n";

    #[test]
    fn reads_manifests_skips_dotfiles_and_reports_bad_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).expect("write");
        std::fs::write(dir.path().join("b.json"), r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"i:1"}]}}"#).expect("write");
        std::fs::write(dir.path().join(".hidden.yaml"), POD.replace("NAME", "h")).expect("write");
        std::fs::write(dir.path().join("etcd.manifest"), POD.replace("NAME", "e")).expect("write");
        std::fs::create_dir(dir.path().join("sub.yaml")).expect("a directory is not read");
        std::fs::write(
            dir.path().join("broken.yaml"),
            "apiVersion: v1\nkind: Pod\nspec: [",
        )
        .expect("write");
        let src = FileSource::new(
            dir.path().to_path_buf(),
            "n".into(),
            Duration::from_secs(20),
        );
        let pods = src.read_pods();
        let mut names: Vec<_> = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        // Every non-dot regular file, as upstream (GCE's `*.manifest`).
        assert_eq!(names, vec!["a-n", "b-n", "e-n"]);
        let errors = src.errors().lock().clone();
        assert_eq!(errors.len(), 1);
        let (file, reason) = errors.iter().next().expect("one error");
        assert!(file.ends_with("broken.yaml"));
        assert!(reason.contains("invalid YAML"), "{reason}");
        // Fixed: the error clears.
        std::fs::write(dir.path().join("broken.yaml"), POD.replace("NAME", "x")).expect("write");
        assert_eq!(src.read_pods().len(), 4);
        assert!(src.errors().lock().is_empty());
    }

    #[test]
    fn missing_path_is_an_empty_snapshot() {
        let src = FileSource::new(
            "/nonexistent/kubelet-rs".into(),
            "n".into(),
            Duration::from_secs(20),
        );
        assert!(src.read_pods().is_empty());
        assert!(src.errors().lock().is_empty());
    }

    #[tokio::test]
    async fn inotify_picks_up_new_files_quickly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = FileSource::new(
            dir.path().to_path_buf(),
            "n".into(),
            Duration::from_secs(3600),
        );
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let stop = CancellationToken::new();
        tokio::spawn(src.run(tx, stop.clone()));
        let first = rx.recv().await.expect("initial snapshot");
        assert!(first.pods.is_empty());
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).expect("write");
        let next = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let u = rx.recv().await.expect("snapshot");
                if !u.pods.is_empty() {
                    return u;
                }
            }
        })
        .await
        .expect("change seen well before the hour-long period");
        assert_eq!(next.pods.len(), 1);
        stop.cancel();
    }

    /// Issue 7 fix 4.8: reading a manifest that blocks (here a FIFO with no
    /// writer) must not block the async runtime the source runs on.
    #[test]
    fn a_blocking_manifest_read_does_not_stall_the_runtime() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("pod.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let (tx, _rx) = tokio::sync::mpsc::channel(1);
                let stop = CancellationToken::new();
                let src = FileSource::new(path, "n".into(), Duration::from_secs(20));
                tokio::spawn(src.run(tx, stop.clone()));
                // Other tasks on this runtime still run while the read blocks.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = done_tx.send(());
                stop.cancel();
            });
        });
        let answered = done_rx.recv_timeout(Duration::from_secs(5));
        // Unblock the reader, whatever happened.
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        assert!(
            answered.is_ok(),
            "the runtime stalled on a blocking manifest read"
        );
    }
}
