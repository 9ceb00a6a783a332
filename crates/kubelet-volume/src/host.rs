//! What a volume plugin may ask of the kubelet (upstream `volume.VolumeHost`
//! and `KubeletVolumeHost`): the apiserver objects a volume is made of, read
//! the way the node authorizer allows (one object at a time, by name), a
//! service-account token bound to the pod, and facts about the node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// An object could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ObjectError {
    /// The object does not exist (upstream's `IsNotFound`, which `optional`
    /// volumes and items tolerate). `resource` is the plural
    /// (`configmaps`), as in upstream's `configmaps "x" not found`.
    #[error("{resource} {name:?} not found")]
    NotFound {
        /// Plural resource name.
        resource: &'static str,
        /// Object name.
        name: String,
    },
    /// There is no apiserver (standalone mode).
    #[error("cannot get {resource} {namespace}/{name}: no apiserver client (standalone mode)")]
    NoClient {
        /// Plural resource name.
        resource: &'static str,
        /// Namespace.
        namespace: String,
        /// Object name.
        name: String,
    },
    /// Any other failure (timeout, 403, 500); the message is the client's.
    #[error("{0}")]
    Other(String),
}

impl ObjectError {
    /// Whether this is a not-found (which `optional` tolerates).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}

/// A service-account token request (upstream `TokenRequestSpec` for a
/// projected `serviceAccountToken` source).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenRequest {
    /// Namespace of the pod and service account.
    pub namespace: String,
    /// The service account (`spec.serviceAccountName`, default `default`).
    pub service_account: String,
    /// Audience; empty means the apiserver's default audiences.
    pub audience: String,
    /// `expirationSeconds` (default 3600, at least 600).
    pub expiration_seconds: i64,
    /// The pod the token is bound to (name, uid).
    pub pod_name: String,
    /// The pod's UID.
    pub pod_uid: String,
}

/// What the kubelet offers volume plugins. Every call has a deadline inside
/// the implementation.
#[async_trait::async_trait]
pub trait VolumeHost: Send + Sync + 'static {
    /// The ConfigMap `namespace/name`, for the pod `pod_uid` (the kubelet
    /// registers the reference so updates are watched).
    async fn get_config_map(&self, namespace: &str, name: &str) -> Result<ConfigMap, ObjectError>;
    /// The Secret `namespace/name`.
    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Secret, ObjectError>;
    /// A token for the request, from the TokenRequest API (cached and
    /// refreshed by the kubelet's token manager).
    async fn get_service_account_token(&self, req: &TokenRequest) -> Result<String, ObjectError>;
    /// The PersistentVolumeClaim `namespace/name`.
    async fn get_persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError>;
    /// The PersistentVolume `name`.
    async fn get_persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError>;
    /// This node's name.
    fn node_name(&self) -> String;
    /// This node's labels (for PV node affinity).
    fn node_labels(&self) -> BTreeMap<String, String>;
    /// Node allocatable resources: the size of a Memory emptyDir without a
    /// `sizeLimit`, and the downward API's fallback for unset limits.
    fn node_allocatable(&self) -> BTreeMap<String, Quantity>;
    /// The pod as the kubelet knows it now (downward API volumes are
    /// rewritten when its labels or annotations change).
    fn pod(&self, uid: &str) -> Option<Pod> {
        let _ = uid;
        None
    }
}
