//! The kubelet's side of CSI (upstream `KubeletVolumeHost` as a CSI volume host):
//! CSIDriver, VolumeAttachment, CSINode and the Node's metadata read and written
//! over the apiserver client for `kubelet-csi`.
//!
//! Objects are read one by one, by name, as the node authorizer allows
//! (upstream reads CSIDrivers and VolumeAttachments through informers; a
//! GET per operation is what a node may always do). Each request has its
//! own deadline ([`crate::objects::REQUEST_DEADLINE`]).

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubelet_csi::{CsiHost, Error as CsiError, Result as CsiResult};
use tokio::sync::watch;

use crate::objects::REQUEST_DEADLINE;
use crate::objects::token::TokenManager;

/// The apiserver as the CSI plugin sees it.
pub struct KubeletCsiHost {
    client: Client,
    node_name: String,
    tokens: TokenManager,
    /// The Node as registered (`None` inside until the kubelet registered it).
    registered: Option<watch::Receiver<Option<Node>>>,
}

/// How long a driver's registration waits for the kubelet to register its
/// Node before patching it (within the plugin's 2 min registration deadline).
const NODE_REGISTRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl KubeletCsiHost {
    /// A host for node `node_name` over `client`, with tokens from `tokens`;
    /// patches of the Node wait until `registered` carries it.
    pub fn new(
        client: Client,
        node_name: String,
        tokens: TokenManager,
        registered: Option<watch::Receiver<Option<Node>>>,
    ) -> Self {
        Self {
            client,
            node_name,
            tokens,
            registered,
        }
    }

    /// Waits, for a bounded time, until the kubelet has registered its Node:
    /// a CSI driver that registers while the kubelet starts would otherwise
    /// find no Node to label and be refused (upstream retries its Node
    /// update for about 1.5 s; the node-driver-registrar then restarts).
    async fn node_registered(&self) {
        let Some(rx) = &self.registered else { return };
        let mut rx = rx.clone();
        let _ = tokio::time::timeout(NODE_REGISTRATION_WAIT, rx.wait_for(Option::is_some)).await;
    }
}

/// A request failed or timed out.
#[derive(Debug, thiserror::Error)]
enum HostError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: no answer from the apiserver within {REQUEST_DEADLINE:?}")]
    Timeout { what: String },
    #[error("{0}")]
    Token(#[from] kubelet_volume::ObjectError),
}

/// Runs one request under the deadline; a 404 is `None`.
async fn get_opt<T>(
    what: String,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> CsiResult<Option<T>> {
    match tokio::time::timeout(REQUEST_DEADLINE, fut).await {
        Ok(Ok(v)) => Ok(Some(v)),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(None),
        Ok(Err(source)) => Err(CsiError::host(HostError::Api { what, source })),
        Err(_) => Err(CsiError::host(HostError::Timeout { what })),
    }
}

/// Runs one request under the deadline.
async fn call<T>(what: String, fut: impl Future<Output = Result<T, kube::Error>>) -> CsiResult<T> {
    match tokio::time::timeout(REQUEST_DEADLINE, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(CsiError::host(HostError::Api { what, source })),
        Err(_) => Err(CsiError::host(HostError::Timeout { what })),
    }
}

#[async_trait::async_trait]
impl CsiHost for KubeletCsiHost {
    fn node_name(&self) -> &str {
        &self.node_name
    }

    async fn csi_driver(&self, name: &str) -> CsiResult<Option<CSIDriver>> {
        let api: Api<CSIDriver> = Api::all(self.client.clone());
        get_opt(format!("get csidrivers {name}"), api.get(name)).await
    }

    async fn volume_attachment(&self, name: &str) -> CsiResult<Option<VolumeAttachment>> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        get_opt(format!("get volumeattachments {name}"), api.get(name)).await
    }

    async fn persistent_volume(&self, name: &str) -> CsiResult<Option<PersistentVolume>> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        get_opt(format!("get persistentvolumes {name}"), api.get(name)).await
    }

    async fn secret(&self, namespace: &str, name: &str) -> CsiResult<Secret> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        call(format!("get secrets {namespace}/{name}"), api.get(name)).await
    }

    async fn csi_node(&self, name: &str) -> CsiResult<Option<CSINode>> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        get_opt(format!("get csinodes {name}"), api.get(name)).await
    }

    async fn create_csi_node(&self, node: CSINode) -> CsiResult<CSINode> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        call(
            "create csinodes".to_string(),
            api.create(&PostParams::default(), &node),
        )
        .await
    }

    async fn update_csi_node(&self, node: CSINode) -> CsiResult<CSINode> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        let name = node.metadata.name.clone().unwrap_or_default();
        call(
            format!("update csinodes {name}"),
            api.replace(&name, &PostParams::default(), &node),
        )
        .await
    }

    async fn node(&self) -> CsiResult<Option<Node>> {
        let api: Api<Node> = Api::all(self.client.clone());
        get_opt(
            format!("get nodes {}", self.node_name),
            api.get(&self.node_name),
        )
        .await
    }

    async fn patch_node_metadata(
        &self,
        labels: BTreeMap<String, Option<String>>,
        annotations: BTreeMap<String, Option<String>>,
    ) -> CsiResult<()> {
        self.node_registered().await;
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = serde_json::json!({
            "metadata": {"labels": labels, "annotations": annotations}
        });
        call(
            format!("patch nodes {}", self.node_name),
            api.patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            ),
        )
        .await
        .map(|_| ())
    }

    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> CsiResult<()> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        call(
            format!("patch persistentvolumeclaims {namespace}/{name} status"),
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)),
        )
        .await
        .map(|_| ())
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> CsiResult<TokenRequestStatus> {
        let bound = request.spec.bound_object_ref.clone().unwrap_or_default();
        let expiration_seconds = request.spec.expiration_seconds.unwrap_or(3600);
        let req = kubelet_volume::host::TokenRequest {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            audience: request.spec.audiences.first().cloned().unwrap_or_default(),
            expiration_seconds,
            pod_name: bound.name.unwrap_or_default(),
            pod_uid: bound.uid.unwrap_or_default(),
        };
        let token = self
            .tokens
            .get_service_account_token(&req)
            .await
            .map_err(|e| CsiError::host(HostError::Token(e)))?;
        // The token manager keeps the token, not its expiry: the longest it
        // can be valid for is what was asked.
        let expires = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_secs(expiration_seconds))
            .unwrap_or(jiff::Timestamp::MAX);
        Ok(TokenRequestStatus {
            token,
            expiration_timestamp: Time(expires),
        })
    }
}
