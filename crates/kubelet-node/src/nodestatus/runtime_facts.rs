//! What node status reads from the container runtime (upstream `VersionInfo`
//! and `Images` setters in `pkg/kubelet/nodestatus/setters.go`, and
//! `runtimeState` for readiness).
//!
//! Upstream's setters read the runtime version and the image manager's cached
//! image list; neither can hold up a status report, and the heartbeat timeout
//! covers only the GET and PATCH of the Node. Here `Version` and `ListImages`
//! are CRI calls, so each gets a short deadline of its own
//! ([`RUNTIME_READ_TIMEOUT`]); when one fails or times out (containerd hung),
//! the last value read is reported instead, so the status (and the NotReady
//! condition that [`RuntimeState`] drives) is still posted every interval.
//! The image list is read at most every [`IMAGE_LIST_REFRESH`], the period
//! of upstream's image cache, not at every 10 s status check.

use std::time::Duration;

use cri::{ImageService, RuntimeService, pb};
use tokio::time::Instant;
use tracing::warn;

use super::setters;
use crate::RuntimeState;

/// Deadline for each of the runtime reads one status computation makes.
pub const RUNTIME_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a read image list is reported before it is read again
/// (upstream's image manager refreshes its `imageCache` every 30 s and the
/// `Images` setter reads that cache).
pub const IMAGE_LIST_REFRESH: Duration = Duration::from_secs(30);

/// Runtime facts for one status computation.
pub(super) struct RuntimeFacts {
    /// `nodeInfo.containerRuntimeVersion`; `None`: never read.
    pub version: Option<String>,
    /// Why the node is not ready (runtime, network and shutdown errors);
    /// empty: ready.
    pub not_ready: Vec<String>,
    /// The runtime's images; `None`: never read (the server's are kept).
    pub images: Option<Vec<pb::Image>>,
}

/// The last runtime version and image list read, reported while the runtime
/// does not answer.
#[derive(Default)]
pub(super) struct LastKnown {
    version: Option<String>,
    images: Option<Vec<pb::Image>>,
    /// When `images` was last read successfully.
    images_read: Option<Instant>,
}

impl LastKnown {
    /// Reads the runtime's version and images (each within
    /// [`RUNTIME_READ_TIMEOUT`], concurrently) and its health as the agent
    /// last saw it; a read that fails keeps the last known value.
    pub async fn read(
        &mut self,
        runtime: &dyn RuntimeService,
        images: &dyn ImageService,
        state: &dyn RuntimeState,
    ) -> RuntimeFacts {
        // The runtime's state as the health check last saw it (upstream
        // `runtimeState`): no second status call to the runtime.
        // Upstream's order: runtime, network, (storage), shutdown.
        let mut not_ready = state.runtime_errors();
        not_ready.extend(state.network_errors());
        not_ready.extend(state.shutdown_errors());
        let fresh = self
            .images_read
            .is_some_and(|at| at.elapsed() < IMAGE_LIST_REFRESH);
        let (version, list) = tokio::join!(
            tokio::time::timeout(RUNTIME_READ_TIMEOUT, runtime.version()),
            async {
                match fresh {
                    true => None,
                    false => {
                        Some(tokio::time::timeout(RUNTIME_READ_TIMEOUT, images.list_images()).await)
                    }
                }
            },
        );
        match version {
            Ok(Ok(v)) => {
                self.version = Some(setters::container_runtime_version(
                    &v.runtime_name,
                    &v.runtime_version,
                ));
            }
            Ok(Err(e)) => {
                warn!(error = %e, "Runtime version unavailable; reporting the last known")
            }
            Err(_) => warn!(
                timeout = ?RUNTIME_READ_TIMEOUT,
                "Runtime version timed out; reporting the last known"
            ),
        }
        match list {
            None => {}
            Some(Ok(Ok(list))) => {
                self.images = Some(list);
                self.images_read = Some(Instant::now());
            }
            Some(Ok(Err(e))) => {
                warn!(error = %e, "Image list unavailable; reporting the last known")
            }
            Some(Err(_)) => warn!(
                timeout = ?RUNTIME_READ_TIMEOUT,
                "Image list timed out; reporting the last known"
            ),
        }
        RuntimeFacts {
            version: self.version.clone(),
            not_ready,
            images: self.images.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cri::fake::FakeRuntime;

    use super::*;

    /// The runtime's image service, counting `ListImages`.
    struct Counting {
        fake: FakeRuntime,
        lists: Arc<AtomicUsize>,
    }

    #[async_trait::async_trait]
    impl ImageService for Counting {
        async fn image_status(&self, image: &str) -> cri::Result<Option<pb::Image>> {
            self.fake.image_status(image).await
        }
        async fn pull_image(
            &self,
            image: &str,
            auth: Option<pb::AuthConfig>,
            sandbox_config: Option<pb::PodSandboxConfig>,
        ) -> cri::Result<String> {
            self.fake.pull_image(image, auth, sandbox_config).await
        }
        async fn list_images(&self) -> cri::Result<Vec<pb::Image>> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            self.fake.list_images().await
        }
        async fn remove_image(&self, image: &str) -> cri::Result<()> {
            self.fake.remove_image(image).await
        }
    }

    struct Up;

    impl RuntimeState for Up {
        fn runtime_errors(&self) -> Vec<String> {
            vec![]
        }
        fn network_errors(&self) -> Vec<String> {
            vec![]
        }
    }

    fn names(f: &RuntimeFacts) -> Vec<String> {
        f.images
            .iter()
            .flatten()
            .flat_map(|i| i.repo_tags.clone())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_image_list_is_read_at_the_image_cache_period_not_every_status_check() {
        let fake = FakeRuntime::new();
        fake.add_image("localhost:5000/busybox:1.35");
        let lists = Arc::new(AtomicUsize::new(0));
        let images = Counting {
            fake: fake.clone(),
            lists: lists.clone(),
        };
        let mut known = LastKnown::default();
        let first = known.read(&fake, &images, &Up).await;
        assert_eq!(lists.load(Ordering::SeqCst), 1);
        assert_eq!(names(&first), vec!["localhost:5000/busybox:1.35"]);
        // Two more 10 s status checks: the list read 20 s ago is reported.
        fake.add_image("localhost:5000/pause:3.10");
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let f = known.read(&fake, &images, &Up).await;
            assert_eq!(names(&f), vec!["localhost:5000/busybox:1.35"]);
        }
        assert_eq!(
            lists.load(Ordering::SeqCst),
            1,
            "a quiet check lists no images"
        );
        // 30 s after the read: read again, the new image reported.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let f = known.read(&fake, &images, &Up).await;
        assert_eq!(lists.load(Ordering::SeqCst), 2);
        assert_eq!(names(&f).len(), 2, "{:?}", names(&f));
        // The version is still read at every check.
        assert_eq!(f.version.as_deref(), Some("fake://1.0.0"));
    }
}
