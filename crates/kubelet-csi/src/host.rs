//! What the CSI plugin needs from the apiserver (upstream: the plugin's
//! `kubernetes.Interface`, the CSIDriver and VolumeAttachment listers, the
//! service-account token manager). The kubelet adapts its client to this
//! seam; unit tests use a fake.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};

use crate::Result;

/// The apiserver, as the CSI plugin uses it. Every method must finish
/// within its own deadline; errors are [`crate::Error::Host`].
#[async_trait::async_trait]
pub trait CsiHost: Send + Sync + 'static {
    /// This node's name.
    fn node_name(&self) -> &str;

    /// The cluster-scoped CSIDriver `name`; `None` when it does not exist.
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>>;

    /// The VolumeAttachment `name`; `None` when it does not exist.
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>>;

    /// The PersistentVolume `name`; `None` when it does not exist.
    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>>;

    /// The Secret `namespace/name` (an error when it does not exist).
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret>;

    /// The CSINode `name` (this node's name); `None` when it does not exist.
    async fn csi_node(&self, name: &str) -> Result<Option<CSINode>>;

    /// Creates a CSINode.
    async fn create_csi_node(&self, node: CSINode) -> Result<CSINode>;

    /// Replaces a CSINode (with its resourceVersion: a conflict is an error).
    async fn update_csi_node(&self, node: CSINode) -> Result<CSINode>;

    /// This node's Node object; `None` when it does not exist yet.
    async fn node(&self) -> Result<Option<Node>>;

    /// Merge-patches this node's labels and annotations: `Some` sets a key,
    /// `None` removes it.
    async fn patch_node_metadata(
        &self,
        labels: BTreeMap<String, Option<String>>,
        annotations: BTreeMap<String, Option<String>>,
    ) -> Result<()>;

    /// Strategic-merge-patches the status of claim `namespace/name` (upstream
    /// `PatchPVCStatus` after an expansion). `patch` is the `{"status": ...}`
    /// document.
    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<()>;

    /// A token of `namespace/service_account` (upstream
    /// `serviceAccountTokenGetter`, usually the kubelet's token manager).
    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> Result<TokenRequestStatus>;
}
