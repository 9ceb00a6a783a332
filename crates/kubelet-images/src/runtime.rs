//! What image garbage collection reads from the container runtime (the
//! parts of upstream `container.Runtime` and the stats provider it uses).

use std::collections::HashSet;

use crate::ImageGcError;

/// One image as the runtime lists it (CRI `Image`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageInfo {
    /// The image ID (`sha256:...`).
    pub id: String,
    /// Its tags (`registry/name:tag`).
    pub repo_tags: Vec<String>,
    /// Its digests (`registry/name@sha256:...`).
    pub repo_digests: Vec<String>,
    /// Bytes on disk.
    pub size: u64,
    /// The runtime asks never to remove it (CRI `pinned`).
    pub pinned: bool,
}

impl ImageInfo {
    /// Whether `reference` names this image: its ID, a tag or a digest.
    pub fn is_named(&self, reference: &str) -> bool {
        self.id == reference
            || self.repo_tags.iter().any(|t| t == reference)
            || self.repo_digests.iter().any(|d| d == reference)
    }
}

/// The image filesystem's size (upstream `ImageFsStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    /// Where the runtime keeps its images.
    pub mountpoint: String,
    /// Total bytes.
    pub capacity: u64,
    /// Bytes an unprivileged writer can still use.
    pub available: u64,
    /// Bytes the runtime says its images use.
    pub images_used: u64,
}

/// The runtime as image garbage collection reads it. Every call has a
/// deadline in the implementation.
#[async_trait::async_trait]
pub trait ImageGcRuntime: Send + Sync + 'static {
    /// Every image (`ListImages`).
    async fn list_images(&self) -> Result<Vec<ImageInfo>, ImageGcError>;
    /// The image references of every container, running or exited
    /// (`ListContainers`: `image_ref` and the image spec).
    async fn container_images(&self) -> Result<HashSet<String>, ImageGcError>;
    /// The ID of the image `reference` names, if present (`ImageStatus`).
    async fn image_id(&self, reference: &str) -> Result<Option<String>, ImageGcError>;
    /// The pod sandbox image the runtime is configured with, when it says
    /// (containerd's verbose `Status`: `config.sandboxImage`).
    async fn runtime_sandbox_image(&self) -> Result<Option<String>, ImageGcError>;
    /// Removes an image by ID (`RemoveImage`).
    async fn remove_image(&self, id: &str) -> Result<(), ImageGcError>;
    /// The image filesystem's capacity and availability.
    async fn image_fs_stats(&self) -> Result<FsStats, ImageGcError>;
}
