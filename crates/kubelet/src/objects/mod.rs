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
use std::time::Duration;

pub use kubelet_volume::host::ObjectError;

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

/// A kube error as an [`ObjectError`]: 404 is `NotFound` (upstream's
/// `IsNotFound`), anything else keeps the client's message.
pub(crate) fn object_error(resource: &'static str, name: &str, e: kube::Error) -> ObjectError {
    match e {
        kube::Error::Api(s) if s.is_not_found() => ObjectError::NotFound {
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
