//! The image garbage collection manager (upstream `realImageGCManager`):
//! image records, detection, eviction order, `GarbageCollect`,
//! `DeleteUnusedImages`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_types::events::{EventType, Recorder};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::{ImageGcError, ImageGcPolicy, ImageGcRuntime, reason};

/// What the manager knows of one image (upstream `imageRecord`).
#[derive(Clone, Debug)]
struct Record {
    /// When this manager first listed it.
    first_detected: Instant,
    /// When a container was last seen using it; `None`: never seen in use.
    last_used: Option<Instant>,
    /// Bytes on disk.
    size: u64,
    /// The runtime pins it.
    pinned: bool,
}

impl Record {
    /// Since when the image has been unused as far as this manager knows:
    /// its last use, or its first detection when it was never seen in use.
    fn unused_since(&self) -> Instant {
        self.last_used.unwrap_or(self.first_detected)
    }
}

/// An unused image, candidate for removal (upstream `evictionInfo`).
#[derive(Clone, Debug)]
struct Candidate {
    id: String,
    record: Record,
}

/// What one collection did, for logs and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcOutcome {
    /// Image filesystem usage in percent, as upstream computes it
    /// (`100 - available * 100 / capacity`).
    pub usage_percent: u64,
    /// Bytes the collection had to free to reach the low threshold (0 below
    /// the high threshold).
    pub bytes_to_free: u64,
    /// Bytes freed by removed images (by age and by usage).
    pub freed: u64,
    /// IDs of the images removed, in order.
    pub removed: Vec<String>,
}

/// Image garbage collection for one node.
pub struct ImageGcManager {
    runtime: Arc<dyn ImageGcRuntime>,
    policy: ImageGcPolicy,
    recorder: Arc<dyn Recorder>,
    node: ObjectReference,
    sandbox_image: Option<String>,
    /// When collection began (upstream `beganGC`): `imageMaximumGCAge`
    /// removes nothing before the kubelet has run that long.
    began: Instant,
    /// The records, held across a whole collection so that the periodic
    /// collection and eviction's reclaim never remove images at once.
    records: Mutex<HashMap<String, Record>>,
    /// Told of each removed image and why (`age`, `space`): upstream's
    /// `kubelet_image_garbage_collected_total{reason}`.
    on_removed: Option<RemovedHook>,
}

/// What [`ImageGcManager::with_removed_hook`] calls for each removed image,
/// with the reason (`age` or `space`).
pub type RemovedHook = Arc<dyn Fn(&'static str) + Send + Sync>;

impl ImageGcManager {
    /// A manager that reads `runtime`, never removes `sandbox_image` (the
    /// runtime's pod sandbox image, by tag, digest or ID), and records
    /// events about `node`.
    pub fn new(
        runtime: Arc<dyn ImageGcRuntime>,
        policy: ImageGcPolicy,
        recorder: Arc<dyn Recorder>,
        node: ObjectReference,
        sandbox_image: Option<String>,
    ) -> Self {
        Self {
            runtime,
            policy,
            recorder,
            node,
            sandbox_image: sandbox_image.filter(|s| !s.is_empty()),
            began: Instant::now(),
            records: Mutex::new(HashMap::new()),
            on_removed: None,
        }
    }

    /// Calls `hook` with the reason (`age`, `space`) of each image removed.
    #[must_use]
    pub fn with_removed_hook(mut self, hook: RemovedHook) -> Self {
        self.on_removed = Some(hook);
        self
    }

    fn removed(&self, reason: &'static str) {
        if let Some(hook) = &self.on_removed {
            hook(reason);
        }
    }

    /// The policy in use.
    pub fn policy(&self) -> &ImageGcPolicy {
        &self.policy
    }

    /// Applies the policy once (upstream `GarbageCollect`): images unused
    /// for longer than `imageMaximumGCAge`, then, at or above the high
    /// threshold, unused images least recently used first down to the low
    /// threshold. Not freeing enough is an error and a `FreeDiskSpaceFailed`
    /// event.
    pub async fn garbage_collect(&self) -> Result<GcOutcome, ImageGcError> {
        let mut records = self.records.lock().await;
        let free_time = Instant::now();
        let mut candidates = self.eviction_order(&mut records, free_time).await?;
        let mut outcome = GcOutcome::default();
        if !self.policy.max_age.is_zero() {
            candidates = self
                .free_old_images(&mut records, candidates, free_time, &mut outcome)
                .await?;
        }

        let fs = self.runtime.image_fs_stats().await?;
        let capacity = fs.capacity;
        let mut available = fs.available;
        if available > capacity {
            warn!(
                available,
                capacity, "Image filesystem availability is larger than its capacity"
            );
            available = capacity;
        }
        if capacity == 0 {
            let err = ImageGcError::InvalidCapacity;
            self.recorder.event(
                &self.node,
                EventType::Warning,
                reason::INVALID_DISK_CAPACITY,
                err.to_string(),
            );
            return Err(err);
        }
        let usage_percent = 100 - available.saturating_mul(100) / capacity;
        outcome.usage_percent = usage_percent;
        let high = u64::from(self.policy.high_threshold_percent);
        let low = u64::from(self.policy.low_threshold_percent);
        if usage_percent < high {
            debug!(
                mountpoint = %fs.mountpoint,
                usage_percent,
                high_threshold = high,
                removed_by_age = outcome.removed.len(),
                "Image filesystem usage is below the high threshold"
            );
            return Ok(outcome);
        }
        let bytes_to_free = (capacity.saturating_mul(100 - low) / 100).saturating_sub(available);
        outcome.bytes_to_free = bytes_to_free;
        let before = outcome.removed.len();
        let freed_by_age = outcome.freed;
        let result = self
            .free_space(
                &mut records,
                bytes_to_free,
                free_time,
                candidates,
                &mut outcome,
            )
            .await;
        let freed = outcome.freed - freed_by_age;
        info!(
            mountpoint = %fs.mountpoint,
            usage_percent,
            high_threshold = high,
            low_threshold = low,
            capacity,
            available,
            images_used = fs.images_used,
            bytes_to_free,
            freed,
            images_removed = outcome.removed.len() - before,
            "Image filesystem usage is over the high threshold: collected unused images down to the low threshold"
        );
        result?;
        if freed < bytes_to_free {
            let err = ImageGcError::NotEnoughFreed {
                wanted: bytes_to_free,
                freed,
            };
            self.recorder.event(
                &self.node,
                EventType::Warning,
                reason::FREE_DISK_SPACE_FAILED,
                err.to_string(),
            );
            return Err(err);
        }
        Ok(outcome)
    }

    /// Removes every unused image old enough (upstream `DeleteUnusedImages`,
    /// which eviction calls before it evicts for disk); returns the bytes
    /// freed. The minimum age still protects images just pulled.
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        let mut records = self.records.lock().await;
        let free_time = Instant::now();
        let candidates = self.eviction_order(&mut records, free_time).await?;
        let mut outcome = GcOutcome::default();
        let result = self
            .free_space(&mut records, u64::MAX, free_time, candidates, &mut outcome)
            .await;
        info!(
            freed = outcome.freed,
            images_removed = outcome.removed.len(),
            "Deleted unused images to reclaim disk"
        );
        result.map(|()| outcome.freed)
    }

    /// Refreshes the records from the runtime (upstream `detectImages`);
    /// returns the IDs of the images in use (by a container, or the sandbox
    /// image).
    async fn detect(
        &self,
        records: &mut HashMap<String, Record>,
        detect_time: Instant,
    ) -> Result<HashSet<String>, ImageGcError> {
        let images = self.runtime.list_images().await?;
        let refs = self.runtime.container_images().await?;
        let sandbox = self.sandbox_images().await;
        let mut in_use = HashSet::new();
        let mut current = HashSet::with_capacity(images.len());
        for image in images {
            let used = refs.iter().any(|r| image.is_named(r))
                || sandbox.iter().any(|s| s == &image.id || image.is_named(s));
            let r = records.entry(image.id.clone()).or_insert_with(|| {
                debug!(image = %image.id, "New image");
                Record {
                    first_detected: detect_time,
                    last_used: None,
                    size: 0,
                    pinned: false,
                }
            });
            if used {
                r.last_used = Some(detect_time);
                in_use.insert(image.id.clone());
            }
            r.size = image.size;
            r.pinned = image.pinned;
            current.insert(image.id);
        }
        records.retain(|id, _| current.contains(id));
        Ok(in_use)
    }

    /// The sandbox images never to remove: the configured one
    /// (`--pod-infra-container-image`) and the one the runtime reports, with
    /// the IDs they resolve to (so `pause:3.9` matches
    /// `docker.io/library/pause:3.9`). A failed lookup only logs: the names
    /// still match by tag and digest.
    async fn sandbox_images(&self) -> Vec<String> {
        let mut names: Vec<String> = self.sandbox_image.iter().cloned().collect();
        match self.runtime.runtime_sandbox_image().await {
            Ok(Some(s)) if !names.contains(&s) => names.push(s),
            Ok(_) => {}
            Err(error) => debug!(%error, "The runtime did not report its sandbox image"),
        }
        let mut out = names.clone();
        for name in &names {
            match self.runtime.image_id(name).await {
                Ok(Some(id)) => out.push(id),
                Ok(None) => {}
                Err(error) => {
                    debug!(%error, sandbox_image = %name, "Could not resolve the sandbox image")
                }
            }
        }
        out
    }

    /// Unused, unpinned images, least recently used first, ties broken by
    /// first detection (upstream `imagesInEvictionOrder`).
    async fn eviction_order(
        &self,
        records: &mut HashMap<String, Record>,
        free_time: Instant,
    ) -> Result<Vec<Candidate>, ImageGcError> {
        let in_use = self.detect(records, free_time).await?;
        let mut out: Vec<Candidate> = records
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .map(|(id, r)| Candidate {
                id: id.clone(),
                record: r.clone(),
            })
            .collect();
        out.sort_by(|a, b| {
            (a.record.last_used, a.record.first_detected, &a.id).cmp(&(
                b.record.last_used,
                b.record.first_detected,
                &b.id,
            ))
        });
        Ok(out)
    }

    /// Removes the candidates unused for longer than `imageMaximumGCAge`,
    /// once the kubelet has run that long (upstream `freeOldImages`);
    /// returns the others.
    async fn free_old_images(
        &self,
        records: &mut HashMap<String, Record>,
        candidates: Vec<Candidate>,
        free_time: Instant,
        outcome: &mut GcOutcome,
    ) -> Result<Vec<Candidate>, ImageGcError> {
        let max_age = self.policy.max_age;
        if free_time.saturating_duration_since(self.began) <= max_age {
            return Ok(candidates);
        }
        let mut errors = Vec::new();
        let mut remaining = Vec::with_capacity(candidates.len());
        for c in candidates {
            let unused_for = free_time.saturating_duration_since(c.record.unused_since());
            if unused_for <= max_age {
                remaining.push(c);
                continue;
            }
            info!(image = %c.id, size = c.record.size, unused_for = ?unused_for, max_age = ?max_age,
                "Removing image unused for longer than imageMaximumGCAge");
            match self.runtime.remove_image(&c.id).await {
                Ok(()) => {
                    records.remove(&c.id);
                    self.removed("age");
                    outcome.freed += c.record.size;
                    outcome.removed.push(c.id);
                }
                Err(e) => {
                    errors.push(e);
                    remaining.push(c);
                }
            }
        }
        if !errors.is_empty() {
            return Err(ImageGcError::MaxAgeDeletion { max_age, errors });
        }
        Ok(remaining)
    }

    /// Removes candidates in order until `bytes_to_free` are freed, skipping
    /// those younger than `imageMinimumGCAge` and going on past failed
    /// removals (upstream `freeSpace`).
    async fn free_space(
        &self,
        records: &mut HashMap<String, Record>,
        bytes_to_free: u64,
        free_time: Instant,
        candidates: Vec<Candidate>,
        outcome: &mut GcOutcome,
    ) -> Result<(), ImageGcError> {
        let mut errors = Vec::new();
        let mut freed: u64 = 0;
        for c in candidates {
            let age = free_time.saturating_duration_since(c.record.first_detected);
            if age < self.policy.min_age {
                debug!(image = %c.id, age = ?age, min_age = ?self.policy.min_age,
                    "Image is younger than imageMinimumGCAge; kept");
                continue;
            }
            info!(image = %c.id, size = c.record.size, "Removing image to free disk space");
            if let Err(e) = self.runtime.remove_image(&c.id).await {
                errors.push(e);
                continue;
            }
            records.remove(&c.id);
            self.removed("space");
            freed = freed.saturating_add(c.record.size);
            outcome.freed = outcome.freed.saturating_add(c.record.size);
            outcome.removed.push(c.id);
            if freed >= bytes_to_free {
                break;
            }
        }
        if !errors.is_empty() {
            return Err(ImageGcError::Deletion {
                wanted: bytes_to_free,
                freed,
                errors,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
