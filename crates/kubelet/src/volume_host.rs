//! The kubelet as a volume plugins' host (upstream `pkg/kubelet/volume_host.go`,
//! `kubeletVolumeHost`): ConfigMaps and Secrets from the watch-based
//! managers, tokens from the token manager, PVCs and PVs by name, the pod
//! as the pod manager holds it now, and the node's name, labels and
//! allocatable resources.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_volume::host::TokenRequest;
use kubelet_volume::{ObjectError, VolumeHost};

use crate::objects::pvc::PersistentVolumeGetter;
use crate::objects::token::TokenManager;
use crate::objects::watch::WatchBasedManager;
use crate::pod_manager::PodManager;

/// What volumes are made of, read the way the node authorizer allows.
#[derive(Clone)]
pub struct KubeletVolumeHost {
    /// ConfigMaps referenced by the node's pods.
    pub config_maps: WatchBasedManager<ConfigMap>,
    /// Secrets referenced by the node's pods.
    pub secrets: WatchBasedManager<Secret>,
    /// Service-account tokens.
    pub tokens: TokenManager,
    /// PVCs and PVs.
    pub volumes: PersistentVolumeGetter,
    /// Desired pods.
    pub pods: PodManager,
    /// This node.
    pub node_name: String,
    /// This node's labels as the kubelet registers them (upstream's
    /// defaults and `--node-labels`): used until the Node is read back.
    pub node_labels: BTreeMap<String, String>,
    /// The Node as the apiserver last returned it (cluster mode): its labels
    /// include those others set (CSI topology, zones), as upstream's
    /// `GetNodeLabels` reads them from the node lister.
    pub latest_node: Option<tokio::sync::watch::Receiver<Option<k8s_openapi::api::core::v1::Node>>>,
    /// This node's allocatable resources.
    pub allocatable: BTreeMap<String, Quantity>,
}

impl KubeletVolumeHost {
    /// Starts watching what `p` references (upstream registers pods with the
    /// secret and configmap managers as the pod manager learns of them).
    pub fn register_pod(&self, p: &Pod) {
        self.config_maps.register_pod(p);
        self.secrets.register_pod(p);
    }

    /// `p` is gone: stop watching what only it referenced, drop its tokens.
    pub fn unregister_pod(&self, p: &Pod) {
        self.config_maps.unregister_pod(p);
        self.secrets.unregister_pod(p);
        self.tokens
            .delete_service_account_token(kubelet_types::pod::uid(p));
    }
}

#[async_trait::async_trait]
impl VolumeHost for KubeletVolumeHost {
    async fn get_config_map(&self, namespace: &str, name: &str) -> Result<ConfigMap, ObjectError> {
        self.config_maps.get_object(namespace, name).await
    }

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Secret, ObjectError> {
        self.secrets.get_object(namespace, name).await
    }

    async fn get_service_account_token(&self, req: &TokenRequest) -> Result<String, ObjectError> {
        self.tokens.get_service_account_token(req).await
    }

    async fn get_persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError> {
        self.volumes
            .get_persistent_volume_claim(namespace, name)
            .await
    }

    async fn get_persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        self.volumes.get_persistent_volume(name).await
    }

    fn node_name(&self) -> String {
        self.node_name.clone()
    }

    fn node_labels(&self) -> BTreeMap<String, String> {
        let read = self.latest_node.as_ref().and_then(|rx| {
            rx.borrow()
                .as_ref()
                .map(|n| n.metadata.labels.clone().unwrap_or_default())
        });
        read.unwrap_or_else(|| self.node_labels.clone())
    }

    fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
        self.allocatable.clone()
    }

    fn pod(&self, uid: &str) -> Option<Pod> {
        self.pods.get_pod_by_uid(uid).map(|p| (*p).clone())
    }
}
