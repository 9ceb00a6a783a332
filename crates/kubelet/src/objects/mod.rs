//! The kubelet's views of apiserver objects other than its pods and Node
//! (upstream `pkg/kubelet/configmap`, `pkg/kubelet/secret`,
//! `pkg/kubelet/util/manager`, `pkg/kubelet/token` and the service lister):
//!
//! - [`watch`]: ConfigMaps and Secrets the node's pods reference, one watch
//!   per object (`configMapAndSecretChangeDetectionStrategy: Watch`), with a
//!   change notification so mounted volumes are rewritten at once;
//! - [`token`]: service-account tokens from the TokenRequest API, cached and
//!   refreshed before they expire;
//! - [`services`]: every Service of the cluster, for service env vars;
//! - [`pvc`]: PersistentVolumeClaims and PersistentVolumes, read by name.
//!
//! Everything reads the way the node authorizer allows: objects one by one,
//! by name (services are the exception, as upstream). Without an apiserver
//! (standalone mode) reads fail with [`ObjectError::NoClient`].

pub mod pvc;
pub mod refs;
pub mod services;
pub mod token;
pub mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kubelet_client::clock::Clock;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use kubelet_volume::host::ObjectError;

use pvc::PersistentVolumeGetter;
use services::ServiceLister;
use token::TokenManager;
use watch::{ConfigMapManager, SecretManager};

/// Deadline of one apiserver request made here (a GET, a TokenRequest), and
/// how long a read waits for a new watch to list its object.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// A namespaced object's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// All of the object caches, sharing one client (`None`: standalone). Cheap
/// to clone.
#[derive(Clone)]
pub struct Objects {
    /// ConfigMaps of registered pods.
    pub config_maps: ConfigMapManager,
    /// Secrets of registered pods.
    pub secrets: SecretManager,
    /// Service-account tokens.
    pub tokens: TokenManager,
    /// Every Service (started here, as upstream starts its informer with the
    /// kubelet).
    pub services: ServiceLister,
    /// Claims and volumes.
    pub volumes: PersistentVolumeGetter,
}

impl Objects {
    /// The caches, their tasks on `tasks` until `stop`.
    pub fn new(
        client: Option<Client>,
        clock: Arc<dyn Clock>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> Self {
        Self {
            config_maps: ConfigMapManager::new(client.clone(), tasks, stop),
            secrets: SecretManager::new(client.clone(), tasks, stop),
            tokens: TokenManager::new(client.clone(), clock, tasks, stop),
            services: ServiceLister::new(
                client.clone().map(|c| {
                    let compat = services::Compat {
                        discovery: kubelet_client::discovery::Discovery::new(c.clone()),
                        metrics: None,
                        events: None,
                    };
                    (c, compat)
                }),
                tasks,
                stop,
            ),
            volumes: PersistentVolumeGetter::new(client),
        }
    }

    /// A pod was added or updated (upstream: the pod manager registers it
    /// with the secret and configmap managers).
    pub fn register_pod(&self, pod: &Pod) {
        self.config_maps.register_pod(pod);
        self.secrets.register_pod(pod);
    }

    /// A pod was removed: its references and its tokens go.
    pub fn unregister_pod(&self, pod: &Pod) {
        self.config_maps.unregister_pod(pod);
        self.secrets.unregister_pod(pod);
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.tokens.delete_service_account_token(uid);
        }
    }
}

/// A kube error as an [`ObjectError`]: 404 is `NotFound` (upstream's
/// `IsNotFound`: the reason, or the code when the body is no Status, as a
/// 1.19 apiserver's plain-text `404 page not found` for a path it does not
/// serve), anything else keeps the client's message.
pub(crate) fn object_error(resource: &'static str, name: &str, e: kube::Error) -> ObjectError {
    match e {
        kube::Error::Api(s) if s.is_not_found() || s.code == 404 => ObjectError::NotFound {
            resource,
            name: name.to_string(),
        },
        kube::Error::Api(s) => ObjectError::Other(s.message.clone()),
        e => ObjectError::Other(e.to_string()),
    }
}

/// Runs one apiserver request under [`REQUEST_DEADLINE`].
pub(crate) async fn with_deadline<T>(
    what: impl std::fmt::Display,
    fut: impl Future<Output = Result<T, ObjectError>>,
) -> Result<T, ObjectError> {
    match tokio::time::timeout(REQUEST_DEADLINE, fut).await {
        Ok(r) => r,
        Err(_) => Err(ObjectError::Other(format!(
            "{what}: no answer from the apiserver within {REQUEST_DEADLINE:?}"
        ))),
    }
}

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn a_plain_text_404_is_not_found() {
        // kube-rs's Status for a body that is no Status (1.19's
        // `404 page not found` for a path it does not serve).
        let s = kube::core::Status::failure("404 page not found", "Failed to parse error data")
            .with_code(404);
        assert!(matches!(
            object_error(
                "serviceaccounts/token",
                "default",
                kube::Error::Api(Box::new(s))
            ),
            ObjectError::NotFound { .. }
        ));
    }
}
#[cfg(test)]
mod services_tests;
