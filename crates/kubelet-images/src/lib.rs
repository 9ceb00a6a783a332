//! Image garbage collection (upstream `pkg/kubelet/images/image_gc_manager.go`
//! and the image half of `Kubelet.StartGarbageCollection`).
//!
//! The [`ImageGcManager`] remembers, per image ID, when it first saw the image
//! and when it last saw a container (running or exited) use it. Every
//! [`GC_PERIOD`] the [`run`] loop asks it to collect: images unused for longer
//! than `imageMaximumGCAge` go whatever the usage, and when the image
//! filesystem is at or above `imageGCHighThresholdPercent`, unused images
//! older than `imageMinimumGCAge` go, least recently used first, until the
//! usage is back at `imageGCLowThresholdPercent`. An image a container uses,
//! a pinned image and the runtime's sandbox image are never removed. The
//! eviction manager reclaims disk through
//! [`ImageGcManager::delete_unused_images`].
//!
//! The runtime is read through the [`ImageGcRuntime`] seam; [`CriImageRuntime`]
//! implements it over CRI (`ListImages`, `ListContainers`, `ImageStatus`,
//! `RemoveImage`, `ImageFsInfo`, and a `statvfs` of the image filesystem).

mod cri_runtime;
mod error;
mod gc_loop;
mod manager;
mod policy;
mod runtime;

pub use cri_runtime::CriImageRuntime;
pub use error::ImageGcError;
pub use gc_loop::run;
pub use manager::{GcOutcome, ImageGcManager, RemovedHook};
pub use policy::{GC_PERIOD, ImageGcPolicy};
pub use runtime::{FsStats, ImageGcRuntime, ImageInfo};

/// Upstream event reasons this crate records on the Node
/// (`pkg/kubelet/events`).
pub mod reason {
    /// A garbage collection failed twice in a row (upstream `ImageGCFailed`).
    pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
    /// Not enough unused images to get below the low threshold (upstream
    /// `FreeDiskSpaceFailed`).
    pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
    /// The image filesystem reported no capacity (upstream
    /// `InvalidDiskCapacity`).
    pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";
}
