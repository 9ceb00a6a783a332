//! What the log manager reads from the runtime (upstream's
//! `internalapi.RuntimeService` as the manager uses it: `ListContainers`,
//! `ContainerStatus`, `ReopenContainerLog`), and the CRI implementation.

use std::sync::Arc;

use async_trait::async_trait;
use cri::pb::{ContainerFilter, ContainerState, ContainerStateValue};
use cri::{CriError, RemoteRuntime, RuntimeService};

/// The runtime as the log manager sees it.
#[async_trait]
pub trait LogRuntime: Send + Sync {
    /// The IDs of the running containers: only they write logs.
    async fn running_containers(&self) -> Result<Vec<String>, CriError>;
    /// The container's log path (CRI `ContainerStatus.log_path`).
    async fn log_path(&self, id: &str) -> Result<String, CriError>;
    /// Asks the runtime to reopen the container's log at its path.
    async fn reopen_container_log(&self, id: &str) -> Result<(), CriError>;
}

/// [`LogRuntime`] over CRI: listing and status through the (instrumented)
/// runtime service, the reopen through the remote client.
pub struct CriLogRuntime {
    service: Arc<dyn RuntimeService>,
    remote: RemoteRuntime,
}

impl CriLogRuntime {
    /// Over `service` (list, status) and `remote` (reopen).
    pub fn new(service: Arc<dyn RuntimeService>, remote: RemoteRuntime) -> Self {
        Self { service, remote }
    }
}

#[async_trait]
impl LogRuntime for CriLogRuntime {
    async fn running_containers(&self) -> Result<Vec<String>, CriError> {
        let running = ContainerState::ContainerRunning as i32;
        let filter = ContainerFilter {
            state: Some(ContainerStateValue { state: running }),
            ..Default::default()
        };
        Ok(self
            .service
            .list_containers(Some(filter))
            .await?
            .into_iter()
            .filter(|c| c.state == running)
            .map(|c| c.id)
            .collect())
    }

    async fn log_path(&self, id: &str) -> Result<String, CriError> {
        Ok(self.service.container_status(id).await?.log_path)
    }

    async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        self.remote.reopen_container_log(id).await
    }
}
