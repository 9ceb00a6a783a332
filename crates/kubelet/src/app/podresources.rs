//! The device manager and the pod-resources API in the kubelet (upstream
//! `containerManager.Start` starting the device manager, and
//! `Kubelet.ListenAndServePodResources` on
//! `<root-dir>/pod-resources/kubelet.sock`). Both sockets are bound in
//! `App::build`, so a kubelet that cannot serve them does not start, as
//! upstream; the server runs on the task tracker until the kubelet stops,
//! and the device manager stops with it. Devices of pods gone are freed
//! before each allocation and each pod-resources `List`, as upstream (no
//! timer).

use std::sync::Arc;

use kubelet_config::KubeletConfig;
use kubelet_devicemanager::{DeviceManager, DeviceManagerConfig};
use kubelet_podresources::{PodResourcesProviders, PodResourcesServer, RateLimit};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info_span};

use super::spawn::spawn_in;
use crate::devices::{
    KubeletActivePods, ResourceDevices, ResourceMetrics, ResourcePods, running_containers,
};
use crate::error::Error as AppError;
use crate::pod_manager::PodManager;
use crate::status::StatusManager;

/// The device manager, started, and the pod-resources socket, bound.
pub(super) struct Devices {
    pub manager: DeviceManager,
    pub active: Arc<KubeletActivePods>,
    listener: UnixListener,
    /// The `KubeletPodResourcesGet` feature gate (on unless set off).
    get_enabled: bool,
}

/// Starts the device manager (its checkpoint read and registration socket
/// served before any pod is admitted) and binds the pod-resources socket.
pub(super) async fn build(
    cfg: &KubeletConfig,
    runtime: &dyn cri::RuntimeService,
) -> Result<Devices, AppError> {
    let active = Arc::new(KubeletActivePods::default());
    let manager = DeviceManager::new(DeviceManagerConfig::new(&cfg.root_dir));
    let running = running_containers(runtime).await;
    manager
        .start(active.clone(), running)
        .await
        .map_err(AppError::DeviceManager)?;
    let socket = kubelet_podresources::socket_path(&cfg.root_dir);
    let listener = match kubelet_podresources::bind(&socket).await {
        Ok(l) => l,
        Err(e) => {
            manager.stop();
            return Err(AppError::PodResources(e));
        }
    };
    let get_enabled = cfg
        .feature_gates
        .get(kubelet_podresources::GET_FEATURE_GATE)
        .copied()
        .unwrap_or(true);
    Ok(Devices {
        manager,
        active,
        listener,
        get_enabled,
    })
}

/// What the pod-resources API and the device manager read of the running kubelet.
pub(super) struct Wiring {
    pub pods: PodManager,
    pub status: Arc<StatusManager>,
    pub sources_ready: Arc<kubelet_podconfig::SourcesReady>,
    pub metrics: Arc<kubelet_metrics::KubeletMetrics>,
}

impl Devices {
    /// Binds the pod pipeline and serves the pod-resources API; the device
    /// manager stops with the kubelet.
    pub(super) fn spawn(self, w: Wiring, tasks: &TaskTracker, stop: &CancellationToken) {
        self.active
            .bind(w.pods.clone(), w.status.clone(), w.sources_ready);
        let providers = PodResourcesProviders {
            pods: Arc::new(ResourcePods {
                pods: w.pods,
                status: w.status,
            }),
            devices: Arc::new(ResourceDevices(self.manager.clone())),
            cpus: Arc::new(kubelet_podresources::NoCpus),
            memory: Arc::new(kubelet_podresources::NoMemory),
        };
        let server = PodResourcesServer::new(providers, RateLimit::default())
            .with_metrics(Arc::new(ResourceMetrics(w.metrics)))
            .with_get_enabled(self.get_enabled);
        let cancel = stop.child_token();
        spawn_in(tasks, info_span!("pod_resources"), async move {
            if let Err(e) = kubelet_podresources::serve(self.listener, server, cancel).await {
                error!(error = %e, "The pod-resources API server stopped");
            }
        });
        let manager = self.manager;
        let stop = stop.child_token();
        spawn_in(tasks, info_span!("device_manager"), async move {
            stop.cancelled().await;
            manager.stop();
        });
    }
}
