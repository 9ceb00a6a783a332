//! Why a collection failed.

use std::time::Duration;

/// Errors of image garbage collection.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    /// A CRI call failed.
    #[error(transparent)]
    Runtime(#[from] cri::CriError),
    /// The runtime reported no image filesystem (`ImageFsInfo`).
    #[error("the container runtime reported no image filesystem")]
    NoImageFilesystem,
    /// `statvfs` of the image filesystem failed.
    #[error("statvfs {mountpoint}: {source}")]
    Statvfs {
        /// The image filesystem's mountpoint.
        mountpoint: String,
        /// The system error.
        #[source]
        source: nix::Error,
    },
    /// `statvfs` did not return in time (a hung mount).
    #[error("statvfs {mountpoint}: no answer within {timeout:?}")]
    StatvfsTimeout {
        /// The image filesystem's mountpoint.
        mountpoint: String,
        /// The deadline.
        timeout: Duration,
    },
    /// The blocking `statvfs` task died.
    #[error("statvfs {mountpoint}: the blocking task failed")]
    StatvfsTask {
        /// The image filesystem's mountpoint.
        mountpoint: String,
    },
    /// The image filesystem reported a capacity of 0.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Not enough unused images to get down to the low threshold.
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, \
         but only found {freed} bytes eligible to free."
    )]
    NotEnoughFreed {
        /// Bytes the collection had to free.
        wanted: u64,
        /// Bytes it freed.
        freed: u64,
    },
    /// Some removals failed while freeing space.
    #[error(
        "wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {}",
        join(.errors)
    )]
    Deletion {
        /// Bytes wanted (`u64::MAX` for "every unused image").
        wanted: u64,
        /// Bytes freed.
        freed: u64,
        /// Each failed removal.
        errors: Vec<ImageGcError>,
    },
    /// Some removals of images past `imageMaximumGCAge` failed.
    #[error(
        "wanted to free images older than {max_age:?}, encountered errors in image deletion: {}",
        join(.errors)
    )]
    MaxAgeDeletion {
        /// `imageMaximumGCAge`.
        max_age: Duration,
        /// Each failed removal.
        errors: Vec<ImageGcError>,
    },
}

fn join(errors: &[ImageGcError]) -> String {
    let parts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    if parts.len() == 1 {
        parts.concat()
    } else {
        format!("[{}]", parts.join(", "))
    }
}
