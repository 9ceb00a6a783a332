//! What the eviction manager reclaims node-level resources with before it
//! evicts a pod for disk (upstream eviction `ImageGC` and `ContainerGC`
//! interfaces, `reclaimNodeLevelResources`).

/// Why a reclaim failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReclaimError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// Image garbage collection as eviction calls it.
#[async_trait::async_trait]
pub trait ImageGc: Send + Sync + 'static {
    /// Deletes every unused image (upstream `DeleteUnusedImages`); returns
    /// the bytes freed.
    async fn delete_unused_images(&self) -> Result<u64, ReclaimError>;
}

/// Container garbage collection as eviction calls it.
#[async_trait::async_trait]
pub trait ContainerGc: Send + Sync + 'static {
    /// Deletes every dead container and sandbox no pod needs (upstream
    /// `DeleteAllUnusedContainers`).
    async fn delete_all_unused_containers(&self) -> Result<(), ReclaimError>;
}
