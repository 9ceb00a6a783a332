//! The volume subsystem's wiring (upstream `NewMainKubelet`'s secret,
//! configmap and token managers, service lister, and `volumeManager`): the
//! object managers, the kubelet's volume host, the volume manager and the
//! task that turns object changes into volume rewrites.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_client::clock::SystemClock;
use kubelet_pluginmanager::PluginHandler;
use kubelet_podconfig::SourcesReady;
use kubelet_runtime::pleg::PodCache;
use kubelet_types::events::Recorder;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, info_span, warn};

use super::spawn::spawn_in;
use crate::csi_host::KubeletCsiHost;
use crate::objects::ObjectKey;
use crate::objects::pvc::PersistentVolumeGetter;
use crate::objects::services::{Compat, ServiceLister};
use crate::objects::token::TokenManager;
use crate::objects::watch::WatchBasedManager;
use crate::pod_manager::PodManager;
use crate::volume_host::KubeletVolumeHost;
use crate::volumemanager::{CsiVolumes, KubeletVolumeOps, VolumeManager, VolumesInUseReporter};

/// The running volume subsystem.
pub(super) struct Volumes {
    pub manager: VolumeManager,
    pub host: Arc<KubeletVolumeHost>,
    pub services: ServiceLister,
    /// The CSI volume plugin (cluster mode), for volume stats.
    pub csi: Option<Arc<kubelet_csi::CsiPlugin>>,
    /// Registration handlers for the plugin manager, by plugin type.
    pub plugin_handlers: Vec<(&'static str, Arc<dyn PluginHandler>)>,
    /// The attachable volumes in use, for node status.
    pub in_use: Arc<dyn kubelet_node::VolumesInUse>,
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
    /// The Node the apiserver last returned (cluster mode), for its labels.
    pub latest_node: Option<tokio::sync::watch::Receiver<Option<k8s_openapi::api::core::v1::Node>>>,
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
        // Cluster mode: the CSI plugin, its drivers registered through the
        // plugin manager.
        let csi = client.clone().map(|c| {
            let csi_host: Arc<dyn kubelet_csi::CsiHost> = Arc::new(KubeletCsiHost::new(
                c,
                self.cfg.node_name.clone(),
                tokens.clone(),
                self.latest_node.clone(),
            ));
            Arc::new(kubelet_csi::CsiPlugin::new(
                csi_host,
                &self.cfg.root_dir,
                kubelet_csi::Timeouts::default(),
            ))
        });
        let host = Arc::new(KubeletVolumeHost {
            config_maps: config_maps.clone(),
            secrets: secrets.clone(),
            tokens,
            volumes: PersistentVolumeGetter::new(client),
            pods: self.pods.clone(),
            node_name: self.cfg.node_name.clone(),
            node_labels: node_labels(self.cfg),
            latest_node: self.latest_node,
            allocatable: self.allocatable,
        });
        let (pods, ready, cache) = (self.pods, self.sources_ready, self.pod_cache);
        // Directories found on disk go once every source has reported, the
        // pod is unknown, and the runtime, relisted at least once, runs
        // nothing of it any more (upstream `cleanupOrphanedPodDirs` skips
        // pods in the running set).
        let may_clean_orphan = Box::new(move |uid: &str| {
            ready.all_handled()
                && !pods.contains(uid)
                && cache.timestamp().is_some()
                && cache
                    .get(uid)
                    .is_none_or(|s| s.live_containers().next().is_none() && !s.has_ready_sandbox())
        });
        let mut ops = KubeletVolumeOps::new(host.clone());
        let mut plugin_handlers: Vec<(&'static str, Arc<dyn PluginHandler>)> = Vec::new();
        let mut csi_volumes = None;
        if let Some(plugin) = &csi {
            let volumes = Arc::new(CsiVolumes::new(plugin.clone()));
            csi_volumes = Some(volumes.clone());
            ops = ops.with_csi(volumes.clone());
            plugin_handlers.push((
                kubelet_pluginmanager::CSI_PLUGIN,
                Arc::new(plugin.registration_handler()),
            ));
            spawn_in(
                tasks,
                info_span!("csi_node_init"),
                initialize_csi_node(plugin.clone(), stop.child_token()),
            );
            spawn_in(
                tasks,
                info_span!("csi_unstage_retry"),
                retry_unstages(volumes, stop.child_token()),
            );
        }
        let manager = VolumeManager::new(
            Arc::new(ops),
            &self.cfg.root_dir,
            self.recorder,
            tasks.clone(),
            stop.child_token(),
            may_clean_orphan,
        );
        let in_use = Arc::new(VolumesInUseReporter::new(
            manager.reconstructed(),
            csi_volumes,
        ));
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
            csi,
            plugin_handlers,
            in_use,
        }
    }
}

/// First and longest wait between attempts to create the CSINode.
const CSI_NODE_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));
/// How often a failed unstage is tried again.
const UNSTAGE_RETRY_PERIOD: Duration = Duration::from_secs(5);

/// Creates this node's CSINode once the Node exists (upstream
/// `InitializeCSINodeWithAnnotation` with its retries), with backoff.
async fn initialize_csi_node(plugin: Arc<kubelet_csi::CsiPlugin>, stop: CancellationToken) {
    let host = plugin.host().clone();
    let mut delay = CSI_NODE_BACKOFF.0;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let result = match host.node().await {
            Ok(Some(_)) => kubelet_csi::nodeinfo::initialize_csi_node(host.as_ref())
                .await
                .map(|()| true),
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        match result {
            Ok(true) => {
                info!(attempts, "Initialized the CSINode of this node");
                return;
            }
            Ok(false) => debug!(
                ?delay,
                "Node not registered yet; CSINode initialization waits"
            ),
            Err(e) => warn!(error = %e, ?delay, "Failed to initialize the CSINode; retrying"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(CSI_NODE_BACKOFF.1);
    }
}

/// Retries the unstage of devices whose last pod went while it failed.
async fn retry_unstages(volumes: Arc<CsiVolumes>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(UNSTAGE_RETRY_PERIOD) => {}
        }
        volumes.retry_unstages().await;
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
