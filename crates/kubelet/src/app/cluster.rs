//! The cluster-mode subsystems (upstream `kubelet.go` `NewMainKubelet` client
//! side): TLS bootstrap and the client, events, node status, the lease, pod
//! status sync, mirror pods and certificate rotation.

use std::net::IpAddr;
use std::sync::Arc;

use cri::RemoteRuntime;
use kubelet_client::certificate::manager::CertManager;
use kubelet_client::clock::{Clock, SystemClock};
use kubelet_client::events::{EventRecorder, EventSink};
use kubelet_client::{Connections, DynamicCert};
use kubelet_config::KubeletConfig;
use kubelet_node::nodelease::LeaseController;
use kubelet_node::nodestatus::NodeStatusManager;
use kubelet_node::nodestatus::machine::MachineInfo;
use kubelet_types::events::{EventType, Recorder, node_ref, reason};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span};

use super::spawn::{notify_ready, spawn_in};
use crate::error::Error as AppError;
use crate::mirror::MirrorManager;
use crate::pod_manager::PodManager;
use crate::runtime_state::RuntimeState;
use crate::status::StatusManager;
use crate::status::sync::StatusSync;
use kubelet_podconfig::SourcesReady;

/// The apiserver side of a kubelet in cluster mode.
pub(super) struct Cluster {
    pub client: kube::Client,
    pub cert: Arc<DynamicCert>,
    /// The client's connections, closed on repeated heartbeat failures.
    connections: Arc<Connections>,
    rotate: bool,
    pub recorder: Arc<EventRecorder>,
    sink: EventSink,
    machine: MachineInfo,
}

/// Bootstraps the client certificate when needed and builds the client;
/// `None` in standalone mode. `machine` is what node status reports.
pub(super) async fn connect(
    cfg: &KubeletConfig,
    machine: MachineInfo,
    metrics: Arc<kubelet_metrics::KubeletMetrics>,
) -> Result<Option<Cluster>, AppError> {
    let Some(kubeconfig) = &cfg.kubeconfig else {
        if cfg.bootstrap_kubeconfig.is_some() {
            return Err(AppError::Cluster(
                "--bootstrap-kubeconfig needs --kubeconfig: the path where the bootstrapped kubeconfig is written",
            ));
        }
        return Ok(None);
    };
    kubelet_client::certificate::bootstrap::load_client_cert(
        kubeconfig,
        cfg.bootstrap_kubeconfig.as_deref(),
        &cfg.cert_dir,
        &cfg.node_name,
    )
    .await?;
    let c = &cfg.cluster;
    // Upstream `closeAllConns`: the heartbeats close every connection of the
    // client when they fail repeatedly.
    let connections = Arc::new(Connections::new());
    let (client, cert) = kubelet_client::from_kubeconfig_with(
        kubeconfig,
        kubelet_client::ClientOptions::new(c.kube_api_qps, c.kube_api_burst)
            .with_metrics(metrics)
            .with_connections(connections.clone()),
    )
    .await?;
    let current = kubelet_client::certificate::store::current_path(&cfg.cert_dir);
    let rotate = c.rotate_certificates
        && cert.is_set()
        && tokio::fs::try_exists(&current).await.unwrap_or(false);
    let (recorder, sink) = kubelet_client::events::channel(
        client.clone(),
        &cfg.node_name,
        c.event_record_qps,
        c.event_burst,
        Arc::new(SystemClock),
    );
    info!(kubeconfig = %kubeconfig.display(), "Cluster mode: using the apiserver");
    Ok(Some(Cluster {
        client,
        cert,
        connections,
        rotate,
        recorder: Arc::new(recorder),
        sink,
        machine,
    }))
}

/// What the cluster subsystems share with the rest of the kubelet.
pub(super) struct Wiring<'a> {
    pub cfg: &'a KubeletConfig,
    pub remote: &'a RemoteRuntime,
    pub host_ips: Vec<IpAddr>,
    pub runtime_state: Arc<RuntimeState>,
    pub status: Arc<StatusManager>,
    pub pods: PodManager,
    pub sources_ready: Arc<SourcesReady>,
    pub registered_tx: watch::Sender<Option<String>>,
    pub registered: watch::Receiver<Option<String>>,
    pub latest_node: watch::Sender<Option<k8s_openapi::api::core::v1::Node>>,
    /// The eviction manager's node conditions.
    pub pressure: Arc<dyn kubelet_node::NodePressure>,
    /// Device plugins' extended resources.
    pub extended: Arc<dyn kubelet_node::ExtendedResources>,
    /// The attachable volumes in use.
    pub volumes_in_use: Arc<dyn kubelet_node::VolumesInUse>,
    /// The apiserver's version and groups.
    pub discovery: Option<kubelet_client::discovery::Discovery>,
}

impl Cluster {
    /// Starts the cluster subsystems; systemd hears "ready" once the Node is registered.
    pub(super) fn spawn(self, w: Wiring<'_>, tasks: &TaskTracker, stop: &CancellationToken) {
        let cfg = w.cfg;
        let status_changed = kubelet_node::RuntimeState::status_changed(w.runtime_state.as_ref());
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        self.recorder.event(
            &node_ref(&cfg.node_name),
            EventType::Normal,
            reason::STARTING,
            "Starting kubelet.".into(),
        );
        spawn_in(
            tasks,
            info_span!("events"),
            self.sink.run(stop.child_token()),
        );
        let node_status = NodeStatusManager {
            client: self.client.clone(),
            node_name: cfg.node_name.clone(),
            cfg: cfg.cluster.clone(),
            max_pods: cfg.max_pods,
            node_labels: cfg.node_labels.clone(),
            taints: cfg.register_with_taints.clone(),
            provider_id: cfg.provider_id.clone(),
            node_ips: w.host_ips,
            provided_node_ips: cfg.node_ips.clone(),
            machine: self.machine,
            runtime: Arc::new(w.remote.clone()),
            images: Arc::new(w.remote.clone()),
            runtime_state: w.runtime_state,
            pressure: w.pressure,
            extended: w.extended,
            volumes: w.volumes_in_use,
            clock: clock.clone(),
            recorder: self.recorder.clone(),
            registered: w.registered_tx,
            latest: w.latest_node,
            connections: Some(self.connections.clone()),
            discovery: w.discovery,
            reported: Default::default(),
        };
        spawn_in(
            tasks,
            info_span!("node_status"),
            node_status.run(stop.child_token()),
        );
        let lease = LeaseController {
            client: self.client.clone(),
            node_name: cfg.node_name.clone(),
            duration_seconds: cfg.cluster.node_lease_duration_seconds,
            clock,
            node_uid: w.registered.clone(),
            connections: Some(self.connections.clone()),
            recovered: Some(status_changed),
        };
        spawn_in(
            tasks,
            info_span!("node_lease"),
            lease.run(stop.child_token()),
        );
        let sync = StatusSync {
            client: self.client.clone(),
            status: w.status,
            desired: w.pods.clone(),
            mirror: w.pods.clone(),
        };
        spawn_in(
            tasks,
            info_span!("status_manager"),
            sync.run(stop.child_token()),
        );
        let mirrors = MirrorManager {
            client: self.client.clone(),
            node_name: cfg.node_name.clone(),
            desired: w.pods.clone(),
            mirror: w.pods,
            sources_ready: w.sources_ready,
            node_uid: w.registered.clone(),
        };
        spawn_in(
            tasks,
            info_span!("mirror_pods"),
            mirrors.run(stop.child_token()),
        );
        if self.rotate {
            let certs = CertManager {
                client: self.client.clone(),
                cert_dir: cfg.cert_dir.clone(),
                cert: self.cert.clone(),
                node: cfg.node_name.clone(),
            };
            spawn_in(
                tasks,
                info_span!("certificate_manager"),
                certs.run(stop.child_token()),
            );
        }
        let mut ready = w.registered;
        spawn_in(tasks, info_span!("sd_notify"), async move {
            if ready.wait_for(Option::is_some).await.is_ok() {
                notify_ready();
            }
        });
    }
}
