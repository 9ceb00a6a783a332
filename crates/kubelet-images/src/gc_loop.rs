//! The periodic collection (the image half of upstream
//! `Kubelet.StartGarbageCollection`): at start and every [`GC_PERIOD`]; a
//! failure is logged, and a second failure in a row is also a Warning
//! `ImageGCFailed` event on the Node.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_types::events::{EventType, Recorder};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use crate::{ImageGcManager, reason};

/// Collects with `manager` now and every `period` until `stop`
/// (`period` is [`GC_PERIOD`](crate::GC_PERIOD) outside tests).
pub async fn run(
    manager: Arc<ImageGcManager>,
    period: Duration,
    recorder: Arc<dyn Recorder>,
    node: ObjectReference,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut previous_failed = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = tokio::select! {
            () = stop.cancelled() => return,
            r = manager.garbage_collect() => r,
        };
        match result {
            Err(err) if previous_failed => {
                error!(error = %err, "Image garbage collection failed multiple times in a row");
                recorder.event(
                    &node,
                    EventType::Warning,
                    reason::IMAGE_GC_FAILED,
                    err.to_string(),
                );
            }
            Err(err) => {
                error!(error = %err, "Image garbage collection failed once. Stats initialization may not have completed yet");
                previous_failed = true;
            }
            Ok(outcome) => {
                if previous_failed {
                    info!(
                        usage_percent = outcome.usage_percent,
                        freed = outcome.freed,
                        images_removed = outcome.removed.len(),
                        "Image garbage collection succeeded"
                    );
                } else {
                    debug!(
                        usage_percent = outcome.usage_percent,
                        freed = outcome.freed,
                        images_removed = outcome.removed.len(),
                        "Image garbage collection succeeded"
                    );
                }
                previous_failed = false;
            }
        }
    }
}
