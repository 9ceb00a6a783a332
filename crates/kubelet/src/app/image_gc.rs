//! Image garbage collection (`kubelet-images`), upstream `ImageGCManager.Start`
//! and the image half of `StartGarbageCollection`: the manager over CRI, its
//! 5-minute loop (off when `imageGCHighThresholdPercent` is 100, as
//! upstream), and the manager as eviction's `ImageGC`.

use std::sync::Arc;

use kubelet_config::housekeeping::image_gc::ImageGcConfig;
use kubelet_eviction::{ImageGc, ReclaimError};
use kubelet_images::{CriImageRuntime, GC_PERIOD, ImageGcManager, ImageGcPolicy};
use kubelet_types::events::node_ref;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span};

use super::housekeeping::Housekeeping;
use super::spawn::spawn_in;

/// The manager as eviction reclaims disk with it (upstream
/// `DeleteUnusedImages`).
struct Reclaim(Arc<ImageGcManager>);

#[async_trait::async_trait]
impl ImageGc for Reclaim {
    async fn delete_unused_images(&self) -> Result<u64, ReclaimError> {
        self.0
            .delete_unused_images()
            .await
            .map_err(|e| ReclaimError(Box::new(e)))
    }
}

/// The configured policy; thresholds are validated to 0..=100 by
/// `kubelet-config`.
fn policy(c: &ImageGcConfig) -> ImageGcPolicy {
    let percent = |p: i32| u8::try_from(p.clamp(0, 100)).unwrap_or(100);
    ImageGcPolicy {
        high_threshold_percent: percent(c.high_threshold_percent),
        low_threshold_percent: percent(c.low_threshold_percent),
        min_age: c.minimum_gc_age,
        max_age: c.maximum_gc_age,
    }
}

/// Starts it on `tasks` under `stop`; returns what eviction reclaims
/// disk with.
pub(super) fn spawn(
    h: &Housekeeping<'_>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) -> Option<Arc<dyn kubelet_eviction::ImageGc>> {
    let policy = policy(&h.cfg.housekeeping.image_gc);
    let node = node_ref(&h.cfg.node_name);
    let manager = Arc::new(
        ImageGcManager::new(
            Arc::new(CriImageRuntime::new(h.remote.clone())),
            policy.clone(),
            h.recorder.clone(),
            node.clone(),
            h.cfg.pod_infra_container_image.clone(),
        )
        .with_removed_hook({
            let metrics = h.metrics.clone();
            Arc::new(move |reason| metrics.add_images_garbage_collected(reason, 1))
        }),
    );
    if policy.periodic_gc_enabled() {
        info!(
            period = ?GC_PERIOD,
            high_threshold = policy.high_threshold_percent,
            low_threshold = policy.low_threshold_percent,
            min_age = ?policy.min_age,
            max_age = ?policy.max_age,
            "Starting image garbage collection"
        );
        spawn_in(
            tasks,
            info_span!("image_gc"),
            kubelet_images::run(
                manager.clone(),
                GC_PERIOD,
                h.recorder.clone(),
                node,
                stop.child_token(),
            ),
        );
    } else {
        info!("ImageGCHighThresholdPercent is set 100, Disable image GC");
    }
    Some(Arc::new(Reclaim(manager)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_policy_is_the_configuration() {
        let p = policy(&ImageGcConfig {
            high_threshold_percent: 90,
            low_threshold_percent: 70,
            minimum_gc_age: Duration::from_secs(30),
            maximum_gc_age: Duration::from_secs(3600),
        });
        assert_eq!(p.high_threshold_percent, 90);
        assert_eq!(p.low_threshold_percent, 70);
        assert_eq!(p.min_age, Duration::from_secs(30));
        assert_eq!(p.max_age, Duration::from_secs(3600));
        assert!(p.periodic_gc_enabled());
        let off = policy(&ImageGcConfig {
            high_threshold_percent: 100,
            low_threshold_percent: 99,
            ..ImageGcConfig::default()
        });
        assert!(!off.periodic_gc_enabled());
    }
}
