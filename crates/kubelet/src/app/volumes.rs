//! The volume subsystem's wiring (upstream `NewMainKubelet`'s secret,
//! configmap and token managers, service lister, and `volumeManager`): the
//! object managers, the kubelet's volume host, the volume manager and the
//! task that turns object changes into volume rewrites.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_client::clock::SystemClock;
use kubelet_podconfig::SourcesReady;
use kubelet_runtime::pleg::PodCache;
use kubelet_types::events::Recorder;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info_span;

use super::spawn::spawn_in;
use crate::objects::ObjectKey;
use crate::objects::pvc::PersistentVolumeGetter;
use crate::objects::services::{Compat, ServiceLister};
use crate::objects::token::TokenManager;
use crate::objects::watch::WatchBasedManager;
use crate::pod_manager::PodManager;
use crate::volume_host::KubeletVolumeHost;
use crate::volumemanager::{KubeletVolumeOps, VolumeManager};

/// The running volume subsystem.
pub(super) struct Volumes {
    pub manager: VolumeManager,
    pub host: Arc<KubeletVolumeHost>,
    pub services: ServiceLister,
    /// The CSI volume plugin (cluster mode), for volume stats.
    pub csi: Option<Arc<kubelet_csi::CsiPlugin>>,
    /// Registration handlers for the plugin manager, by plugin type.
    pub plugin_handlers: Vec<(&'static str, Arc<dyn kubelet_pluginmanager::PluginHandler>)>,
}

/// What it is built from.
pub(super) struct VolumeWiring<'a> {
    pub cfg: &'a kubelet_config::KubeletConfig,
    pub client: Option<kube::Client>,
    pub discovery: Option<kubelet_client::discovery::Discovery>,
    pub metrics: Arc<kubelet_metrics::KubeletMetrics>,
    pub allocatable: BTreeMap<String, Quantity>,
    pub pods: PodManager,
    pub sources_ready: Arc<SourcesReady>,
    pub pod_cache: Arc<PodCache>,
    pub recorder: Arc<dyn Recorder>,
}

/// The labels the Node carries (upstream's defaults plus `--node-labels`),
/// for PV node affinity.
fn node_labels(cfg: &kubelet_config::KubeletConfig) -> BTreeMap<String, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", cfg.node_name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", arch),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", arch),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    labels.extend(cfg.node_labels.clone());
    labels
}

impl VolumeWiring<'_> {
    pub(super) fn spawn(self, tasks: &TaskTracker, stop: &CancellationToken) -> Volumes {
        let client = self.client;
        let config_maps = WatchBasedManager::<ConfigMap>::new(client.clone(), tasks, stop);
        let secrets = WatchBasedManager::<Secret>::new(client.clone(), tasks, stop);
        let tokens = TokenManager::new(client.clone(), Arc::new(SystemClock), tasks, stop);
        let services = ServiceLister::new(
            client.clone().zip(self.discovery).map(|(c, discovery)| {
                let compat = Compat {
                    discovery,
                    metrics: Some(self.metrics.clone()),
                    events: Some((self.recorder.clone(), self.cfg.node_name.clone())),
                };
                (c, compat)
            }),
            tasks,
            stop,
        );
        let host = Arc::new(KubeletVolumeHost {
            config_maps: config_maps.clone(),
            secrets: secrets.clone(),
            tokens,
            volumes: PersistentVolumeGetter::new(client),
            pods: self.pods.clone(),
            node_name: self.cfg.node_name.clone(),
            node_labels: node_labels(self.cfg),
            allocatable: self.allocatable,
        });
        let (pods, ready, cache) = (self.pods, self.sources_ready, self.pod_cache);
        // Directories found on disk go once every source has reported, the
        // pod is unknown, and the runtime, relisted at least once, runs
        // nothing of it any more (upstream `cleanupOrphanedPodDirs` skips
        // pods in the running set).
        let may_clean_orphan = Box::new(move |uid: &str| {
            ready.all_ready()
                && !pods.contains(uid)
                && cache.timestamp().is_some()
                && cache
                    .get(uid)
                    .is_none_or(|s| s.live_containers().next().is_none() && !s.has_ready_sandbox())
        });
        let manager = VolumeManager::new(
            Arc::new(KubeletVolumeOps::new(host.clone())),
            &self.cfg.root_dir,
            self.recorder,
            tasks.clone(),
            stop.child_token(),
            may_clean_orphan,
        );
        spawn_in(tasks, info_span!("volume_manager"), manager.clone().run());
        for rx in [config_maps.subscribe(), secrets.subscribe()] {
            spawn_in(
                tasks,
                info_span!("volume_refresh"),
                forward_changes(rx, manager.clone(), stop.child_token()),
            );
        }
        Volumes {
            manager,
            host,
            services,
            csi: None,
            plugin_handlers: Vec::new(),
        }
    }
}

/// Turns object change notifications into volume rewrites.
async fn forward_changes(
    mut rx: broadcast::Receiver<ObjectKey>,
    manager: VolumeManager,
    stop: CancellationToken,
) {
    loop {
        let key = tokio::select! {
            () = stop.cancelled() => return,
            r = rx.recv() => r,
        };
        match key {
            Ok(k) => manager.objects_changed(&k.namespace),
            Err(broadcast::error::RecvError::Lagged(_)) => manager.objects_changed_everywhere(),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
