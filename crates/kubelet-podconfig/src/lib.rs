//! Pod configuration sources merged into one stream of pod updates
//! (upstream `pkg/kubelet/config`, `PodConfig`).
//!
//! Each source ([`file`], [`http`], and the apiserver in cluster mode) sends
//! complete snapshots of its pods ([`SourceUpdate`], a SET). One merger task
//! keeps the pods of every source in a [`PodStorage`] and turns each snapshot
//! into ADD / UPDATE / DELETE / REMOVE / RECONCILE updates for the sync loop.
//! [`SourcesReady`] tells the sync loop when every configured source has
//! reported once: no orphan is cleaned up before that.

pub mod api;
pub mod file;
mod file_watch;
pub mod http;
mod manifest;
mod storage;
pub mod validation;

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::{PodUpdate, Source};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use tracing::debug;

pub use api::MirrorPodSink;
pub use manifest::{ManifestError, check_pod_document, parse_pod_document, parse_pods_document};
pub use storage::PodStorage;

/// Why a pod source cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The HTTPS client for the manifest URL cannot be built.
    #[error("TLS setup for the manifest URL failed: {0}")]
    Tls(#[source] rustls::Error),
}

/// A complete snapshot of one source's pods (upstream `PodUpdate{Op: SET}`).
#[derive(Debug, Clone)]
pub struct SourceUpdate {
    /// The source.
    pub source: Source,
    /// All of its pods, defaulted.
    pub pods: Vec<Pod>,
}

/// Which configured sources have sent at least one snapshot (upstream
/// `PodConfig.SeenAllSources`), and which of them had their first update
/// handled by the sync loop (upstream `sourcesReady.AddSource`, called after
/// the sync loop handled an update of that source).
#[derive(Debug, Default)]
pub struct SourcesReady {
    expected: HashSet<Source>,
    seen: Mutex<HashSet<Source>>,
    handled: Mutex<HashSet<Source>>,
}

impl SourcesReady {
    /// Expects the given sources.
    pub fn new(expected: impl IntoIterator<Item = Source>) -> Self {
        Self {
            expected: expected.into_iter().collect(),
            seen: Mutex::new(HashSet::new()),
            handled: Mutex::new(HashSet::new()),
        }
    }

    /// Records that `s` sent a snapshot.
    pub fn mark(&self, s: Source) {
        self.seen.lock().insert(s);
    }

    /// Whether `s` has sent a snapshot.
    pub fn seen(&self, s: Source) -> bool {
        self.seen.lock().contains(&s)
    }

    /// True once every expected source reported.
    pub fn all_ready(&self) -> bool {
        let seen = self.seen.lock();
        self.expected.iter().all(|s| seen.contains(s))
    }

    /// Records that the sync loop handled an update of `s` (upstream
    /// `sourcesReady.AddSource`). The merger records it itself for a first
    /// snapshot that gives the sync loop nothing to handle.
    pub fn mark_handled(&self, s: Source) {
        if self.handled.lock().insert(s) {
            debug!(source = %s, "Pod source handled by the sync loop");
        }
    }

    /// True once every expected source reported and the sync loop handled
    /// its first update (upstream `sourcesReady.AllReady()`): the pods of
    /// every source are then admitted, so a pod the kubelet does not know
    /// is really gone.
    pub fn all_handled(&self) -> bool {
        if !self.all_ready() {
            return false;
        }
        let handled = self.handled.lock();
        self.expected.iter().all(|s| handled.contains(s))
    }
}

/// Handle sources use to send snapshots to the merger.
pub type SourceSender = mpsc::Sender<SourceUpdate>;

/// Starts the merger task: snapshots in, pod updates out.
pub fn spawn_merger(
    tasks: &TaskTracker,
    expected: &[Source],
    stop: CancellationToken,
) -> (SourceSender, mpsc::Receiver<PodUpdate>, Arc<SourcesReady>) {
    let (src_tx, mut src_rx) = mpsc::channel::<SourceUpdate>(64);
    let (out_tx, out_rx) = mpsc::channel::<PodUpdate>(64);
    let ready = Arc::new(SourcesReady::new(expected.iter().copied()));
    let r = ready.clone();
    let mut storage = PodStorage::default();
    let no_sources = expected.is_empty();
    let merger = async move {
        loop {
            let update = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                u = src_rx.recv() => match u {
                    Some(u) => u,
                    // With no source configured, the sync loop keeps running
                    // on nothing until the kubelet stops, as upstream's. When
                    // configured sources are all gone (they end only on stop
                    // or a crash), closing ends the sync loop and the process.
                    None if no_sources => {
                        stop.cancelled().await;
                        return;
                    }
                    None => return,
                },
            };
            let now = jiff::Timestamp::now().to_string();
            let first = !r.seen(update.source);
            let updates = storage.merge(update.source, update.pods, &now);
            r.mark(update.source);
            if first && updates.is_empty() {
                // Nothing for the sync loop to handle (upstream sends it an
                // empty ADD on a source's first SET, so it marks it).
                r.mark_handled(update.source);
            }
            for u in updates {
                debug!(op = ?u.op, source = %u.source, pods = u.pods.len(), "Pod config update");
                if out_tx.send(u).await.is_err() {
                    return;
                }
            }
        }
    };
    tasks.spawn(merger.instrument(tracing::info_span!("pod_config_merger")));
    (src_tx, out_rx, ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With no source configured the update channel stays open until the
    /// kubelet stops: the sync loop must not exit.
    #[tokio::test(start_paused = true)]
    async fn the_update_channel_outlives_the_sources() {
        let stop = CancellationToken::new();
        let (tx, mut rx, ready) = spawn_merger(&TaskTracker::new(), &[], stop.clone());
        drop(tx);
        assert!(ready.all_ready(), "no source to wait for");
        assert!(ready.all_handled(), "no source to wait for");
        let open = tokio::time::timeout(std::time::Duration::from_secs(3600), rx.recv()).await;
        assert!(open.is_err(), "still open an hour later: {open:?}");
        stop.cancel();
        assert!(rx.recv().await.is_none(), "closed once the kubelet stops");
    }

    /// Configured sources that are all gone close the channel (and so end
    /// the sync loop), as before.
    #[tokio::test(start_paused = true)]
    async fn the_update_channel_closes_when_configured_sources_are_gone() {
        let (tx, mut rx, _) = spawn_merger(
            &TaskTracker::new(),
            &[Source::File],
            CancellationToken::new(),
        );
        drop(tx);
        assert!(rx.recv().await.is_none());
    }

    /// A source is handled once the sync loop says so, or at once when its
    /// first snapshot gives the sync loop nothing to do.
    #[tokio::test(start_paused = true)]
    async fn sources_are_handled_after_the_sync_loop_handled_their_first_update() {
        let stop = CancellationToken::new();
        let (tx, mut rx, ready) = spawn_merger(
            &TaskTracker::new(),
            &[Source::File, Source::Http],
            stop.clone(),
        );
        let mut p = Pod::default();
        p.metadata.name = Some("a".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("a".into());
        tx.send(SourceUpdate {
            source: Source::File,
            pods: vec![p],
        })
        .await
        .expect("send");
        let u = rx.recv().await.expect("update");
        tx.send(SourceUpdate {
            source: Source::Http,
            pods: vec![],
        })
        .await
        .expect("send");
        for _ in 0..50 {
            if ready.all_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(ready.all_ready(), "both sources sent a snapshot");
        assert!(
            !ready.all_handled(),
            "the file source's pods are not handled yet"
        );
        ready.mark_handled(u.source);
        assert!(ready.all_handled(), "http had nothing to handle");
        stop.cancel();
    }
}
