//! Image pulls by policy with per-image backoff (upstream
//! `pkg/kubelet/images/image_manager.go` `EnsureImageExists`). Pulls are
//! serialized, as upstream's default `serializeImagePulls: true`.

use std::sync::Arc;

use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use std::time::SystemTime;

use cri::ImageService;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::pod;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::backoff::Backoff;
use crate::{Error, Result};

/// Ensures images are present before containers are created.
pub struct ImageManager {
    images: Arc<dyn ImageService>,
    pub(crate) recorder: Arc<dyn Recorder>,
    backoff: Backoff,
    serialize: tokio::sync::Mutex<()>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) metrics: Option<Arc<kubelet_metrics::KubeletMetrics>>,
}

fn err(reason: &'static str, message: String) -> Error {
    Error::Container {
        reason,
        message,
        source: None,
    }
}

fn cri_err(reason: &'static str, message: String, source: cri::CriError) -> Error {
    Error::Container {
        reason,
        message,
        source: Some(source),
    }
}

impl ImageManager {
    /// A manager pulling through `images`.
    pub fn new(images: Arc<dyn ImageService>) -> Self {
        Self {
            images,
            recorder: Arc::new(kubelet_types::events::NoopRecorder),
            backoff: Backoff::default(),
            serialize: tokio::sync::Mutex::new(()),
            shutdown: CancellationToken::new(),
            metrics: None,
        }
    }

    /// The image ID to run `c` with, pulling it first when the policy says so.
    /// Errors carry `InvalidImageName`, `ErrImageNeverPull`, `ImagePullBackOff` or `ErrImagePull`.
    pub async fn ensure_image_exists(
        &self,
        p: &Pod,
        c: &Container,
        now: SystemTime,
    ) -> Result<String> {
        let image = c.image.as_deref().unwrap_or("").trim();
        if image.is_empty() || image.contains(char::is_whitespace) {
            return Err(err(
                "InvalidImageName",
                format!("Failed to apply default image tag {image:?}"),
            ));
        }
        let policy = pod::image_pull_policy(c);
        let obj = pod_ref(p, Some(&c.name));
        let event =
            |kind, reason: &str, message: String| self.recorder.event(&obj, kind, reason, message);
        let present = self.images.image_status(image).await.map_err(|e| {
            cri_err(
                "ImageInspectError",
                format!("Failed to inspect image {image:?}: {e}"),
                e,
            )
        })?;
        match (policy, present) {
            ("Never", None) => {
                event(
                    EventType::Warning,
                    "ErrImageNeverPull",
                    format!("Container image {image:?} is not present with pull policy of Never"),
                );
                return Err(err(
                    "ErrImageNeverPull",
                    format!("Container image {image:?} is not present with pull policy of Never"),
                ));
            }
            ("Never" | "IfNotPresent", Some(img)) => {
                debug!(image, "Container image already present on machine");
                event(
                    EventType::Normal,
                    reason::PULLED,
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(img.id);
            }
            _ => {}
        }
        let key = format!("{}_{}", pod::uid(p), image);
        if let Some(left) = self.backoff.remaining_since_update(&key, now) {
            debug!(image, ?left, "Image pull backing off");
            event(
                EventType::Normal,
                reason::BACK_OFF,
                format!("Back-off pulling image {image:?}"),
            );
            return Err(err(
                "ImagePullBackOff",
                format!("Back-off pulling image {image:?}"),
            ));
        }
        // A pull has no deadline of ours (upstream sets none); shutdown cancels
        // it, and dropping the pull cancels the call on the runtime.
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => {
                info!(image, "Image pull cancelled: shutting down");
                Err(Error::Shutdown { op: "PullImage" })
            }
            r = self.pull(p, c, image, policy, &key, now) => r,
        }
    }

    async fn pull(
        &self,
        p: &Pod,
        c: &Container,
        image: &str,
        policy: &str,
        key: &str,
        now: SystemTime,
    ) -> Result<String> {
        let obj = pod_ref(p, Some(&c.name));
        let event =
            |kind, reason: &str, message: String| self.recorder.event(&obj, kind, reason, message);
        // Upstream's pull duration counts the wait in the puller's queue.
        let queued = tokio::time::Instant::now();
        let _turn = self.serialize.lock().await;
        // Another pod may have pulled it while this one waited its turn.
        if policy != "Always"
            && let Ok(Some(img)) = self.images.image_status(image).await
        {
            return Ok(img.id);
        }
        info!(image, "Pulling image");
        event(
            EventType::Normal,
            reason::PULLING,
            format!("Pulling image {image:?}"),
        );
        let started = tokio::time::Instant::now();
        match self.images.pull_image(image, None, None).await {
            Ok(image_ref) => {
                self.backoff.reset(key);
                info!(image, %image_ref, "Successfully pulled image");
                event(
                    EventType::Normal,
                    reason::PULLED,
                    format!(
                        "Successfully pulled image {image:?} in {:?}",
                        started.elapsed()
                    ),
                );
                if let Some(m) = &self.metrics {
                    // Upstream reads the size back from the runtime too (`GetImageSize`).
                    let size = match self.images.image_status(image).await {
                        Ok(Some(img)) => img.size,
                        _ => 0,
                    };
                    m.observe_image_pull(size, queued.elapsed());
                }
                Ok(image_ref)
            }
            Err(e) => {
                self.backoff.next(key, now, now);
                event(
                    EventType::Warning,
                    reason::FAILED,
                    format!("Failed to pull image {image:?}: {}", e.message()),
                );
                let message = format!("failed to pull image {image:?}: {}", e.message());
                Err(cri_err("ErrImagePull", message, e))
            }
        }
    }

    /// Drops backoff entries that have been quiet for long.
    pub fn gc(&self, now: SystemTime) {
        self.backoff.gc(now);
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test(start_paused = true)]
    async fn shutdown_cancels_a_pull_in_flight() {
        let fake = FakeRuntime::new();
        fake.hang_pull("reg/huge:1");
        let mut m = ImageManager::new(Arc::new(fake.clone()));
        let stop = CancellationToken::new();
        m.shutdown = stop.clone();
        let m = Arc::new(m);
        let p = pod_with("reg/huge:1", None);
        let pull = tokio::spawn({
            let m = m.clone();
            async move {
                let c = &pod::containers(&p)[0];
                m.ensure_image_exists(&p, c, UNIX_EPOCH).await
            }
        });
        // No deadline of ours: an hour later the pull is still going.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!pull.is_finished());
        assert_eq!(fake.call_count("PullImage"), 1);
        stop.cancel();
        let r = tokio::time::timeout(Duration::from_secs(1), pull)
            .await
            .expect("the pull returns at once")
            .expect("task");
        assert!(
            matches!(r, Err(Error::Shutdown { op: "PullImage" })),
            "{r:?}"
        );
        // A cancelled pull is no failure: the image does not back off.
        let p2 = pod_with("reg/huge:1", None);
        let c = &pod::containers(&p2)[0];
        let e = m.ensure_image_exists(&p2, c, UNIX_EPOCH).await;
        assert!(matches!(e, Err(Error::Shutdown { .. })), "{e:?}");
    }

    use super::*;
    use cri::fake::FakeRuntime;
    use std::time::{Duration, UNIX_EPOCH};

    fn pod_with(image: &str, policy: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": image, "imagePullPolicy": policy}]}
        }))
        .expect("pod")
    }

    #[tokio::test]
    async fn pull_policies_and_backoff() {
        let fake = FakeRuntime::new();
        let m = ImageManager::new(Arc::new(fake.clone()));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);

        // IfNotPresent pulls once, then uses what is there.
        let p = pod_with("reg/a:1", None);
        let c = &pod::containers(&p)[0];
        assert!(m.ensure_image_exists(&p, c, t0).await.is_ok());
        assert!(m.ensure_image_exists(&p, c, t0).await.is_ok());
        assert_eq!(fake.call_count("PullImage"), 1);

        // Always pulls every time.
        let p = pod_with("reg/a:1", Some("Always"));
        let c = &pod::containers(&p)[0];
        assert!(m.ensure_image_exists(&p, c, t0).await.is_ok());
        assert_eq!(fake.call_count("PullImage"), 2);

        // Never with a missing image.
        let p = pod_with("reg/b:1", Some("Never"));
        let c = &pod::containers(&p)[0];
        let e = m.ensure_image_exists(&p, c, t0).await.expect_err("never");
        assert_eq!(e.reason(), "ErrImageNeverPull");

        // A failing pull: ErrImagePull, then ImagePullBackOff inside the window, then a retry.
        fake.set_image_missing("reg/missing:1");
        let p = pod_with("reg/missing:1", None);
        let c = &pod::containers(&p)[0];
        let e = m.ensure_image_exists(&p, c, t0).await.expect_err("missing");
        assert_eq!(e.reason(), "ErrImagePull");
        let e = m
            .ensure_image_exists(&p, c, t0 + Duration::from_secs(5))
            .await
            .expect_err("backoff");
        assert_eq!(e.reason(), "ImagePullBackOff");
        let pulls = fake.call_count("PullImage");
        let e = m
            .ensure_image_exists(&p, c, t0 + Duration::from_secs(11))
            .await
            .expect_err("retry");
        assert_eq!(e.reason(), "ErrImagePull");
        assert_eq!(fake.call_count("PullImage"), pulls + 1);
        // The window doubled: 20s from the second failure.
        let e = m
            .ensure_image_exists(&p, c, t0 + Duration::from_secs(25))
            .await
            .expect_err("backoff 2");
        assert_eq!(e.reason(), "ImagePullBackOff");
    }
}
