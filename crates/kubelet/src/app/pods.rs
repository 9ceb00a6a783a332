//! The pod pipeline's subsystems: the pod sources and their merger
//! (upstream `makePodSourceConfig`), then the PLEG, status manager, pod
//! workers and sync loop (upstream `startKubelet`/`Run`), each spawned on the
//! shared task tracker in its own span.

use std::net::IpAddr;
use std::sync::Arc;

use kubelet_client::events::EventRecorder;
use kubelet_config::KubeletConfig;
use kubelet_runtime::KubeRuntimeManager;
use kubelet_runtime::pleg::GenericPleg;
use kubelet_types::{PodUpdate, Source};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span};

use super::cluster::Cluster;
use super::spawn::spawn_in;
use crate::pod_manager::PodManager;
use crate::pod_sync::RuntimePodSyncer;
use crate::pod_workers::{AsyncPodWorkers, WorkQueue};
use crate::runtime_state::{HealthCheck, RuntimeState};
use crate::status::StatusManager;
use crate::sync_loop::{Heartbeat, SyncLoop};
use kubelet_podconfig::api::ApiSource;
use kubelet_podconfig::file::{FileSource, ManifestErrors};
use kubelet_podconfig::http::HttpSource;
use kubelet_podconfig::{SourcesReady, spawn_merger};

/// The configured pod sources.
pub(super) struct Sources {
    file: Option<FileSource>,
    http: Option<HttpSource>,
    api: Option<ApiSource>,
    pods: PodManager,
}

/// The merged output of the sources.
pub(super) struct SourcesOut {
    config: mpsc::Receiver<PodUpdate>,
    ready: Arc<SourcesReady>,
    manifest_errors: Option<ManifestErrors>,
    pods: PodManager,
}

impl Sources {
    pub(super) fn new(
        cfg: &KubeletConfig,
        http: Option<HttpSource>,
        cluster: Option<&Cluster>,
    ) -> Self {
        let pods = PodManager::default();
        let file = cfg.static_pod_path.as_ref().map(|path| {
            info!(path = %path.display(), "Watching static pod path");
            FileSource::new(
                path.clone(),
                cfg.node_name.clone(),
                cfg.file_check_frequency,
            )
        });
        let api = cluster.map(|c| ApiSource {
            client: c.client.clone(),
            node_name: cfg.node_name.clone(),
            mirror: Arc::new(pods.clone()),
        });
        Self {
            file,
            http,
            api,
            pods,
        }
    }

    /// Starts the merger and every source.
    pub(super) fn spawn(self, tasks: &TaskTracker, stop: &CancellationToken) -> SourcesOut {
        let mut expected = vec![];
        if self.file.is_some() {
            expected.push(Source::File);
        }
        if self.http.is_some() {
            expected.push(Source::Http);
        }
        if self.api.is_some() {
            expected.push(Source::Api);
        }
        let (tx, config, ready) = spawn_merger(tasks, &expected, stop.child_token());
        let manifest_errors = self.file.as_ref().map(FileSource::errors);
        if let Some(src) = self.file {
            let run = src.run(tx.clone(), stop.child_token());
            spawn_in(tasks, info_span!("file_source"), run);
        }
        if let Some(src) = self.http {
            let run = src.run(tx.clone(), stop.child_token());
            spawn_in(tasks, info_span!("http_source"), run);
        }
        if let Some(src) = self.api {
            let run = src.run(tx, stop.child_token());
            spawn_in(tasks, info_span!("api_source"), run);
        }
        SourcesOut {
            config,
            ready,
            manifest_errors,
            pods: self.pods,
        }
    }
}

/// What the pod pipeline is built from.
pub(super) struct Pipeline<'a> {
    pub cfg: &'a KubeletConfig,
    pub manager: Arc<KubeRuntimeManager>,
    pub runtime_state: Arc<RuntimeState>,
    pub host_ips: Vec<IpAddr>,
    pub recorder: Option<Arc<EventRecorder>>,
    pub metrics: Arc<kubelet_metrics::KubeletMetrics>,
    /// The apiserver client (cluster mode).
    pub client: Option<kube::Client>,
    /// The apiserver's version and groups (cluster mode).
    pub discovery: Option<kubelet_client::discovery::Discovery>,
    /// Node allocatable.
    pub allocatable:
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// Probe results (see [`super::probes`]).
    pub probe_results: kubelet_runtime::ProbeResults,
    /// The CRI runtime service, for exec probes.
    pub cri: Arc<dyn cri::RuntimeService>,
    /// The sysctl allowlist and whether the host has AppArmor.
    pub admission: (crate::lifecycle::sysctl::Allowlist, bool),
    /// The Node the apiserver last returned (cluster mode).
    pub latest_node: Option<tokio::sync::watch::Receiver<Option<k8s_openapi::api::core::v1::Node>>>,
    /// The eviction manager's node conditions (its admit handler).
    pub pressure: kubelet_eviction::Pressure,
    /// Device plugins (admission and container options).
    pub devices: kubelet_devicemanager::DeviceManager,
    /// Tokens for credential providers in token mode: given the token
    /// manager here.
    pub credential_tokens: Arc<crate::credential_tokens::KubeletTokens>,
    /// Orphaned pod cgroups (see [`super::cm::Orphans`]).
    pub orphan_cgroups: Option<Arc<dyn crate::sync_loop::OrphanPodCgroups>>,
}

/// Handles to the running pipeline.
pub(super) struct RunningPipeline {
    pub sync_loop: JoinHandle<()>,
    pub status: Arc<StatusManager>,
    pub pods: PodManager,
    pub sources_ready: Arc<SourcesReady>,
    pub manifest_errors: Option<ManifestErrors>,
    pub runtime_state: Arc<RuntimeState>,
    pub heartbeat: Arc<Heartbeat>,
    pub pod_cache: Arc<kubelet_runtime::pleg::PodCache>,
    /// Ends pods for eviction and node shutdown.
    pub killer: Arc<dyn crate::pod_killer::PodKiller>,
    /// The CSI volume plugin (cluster mode), for volume stats.
    pub csi: Option<Arc<kubelet_csi::CsiPlugin>>,
    /// Registration handlers the volume subsystem offers the plugin manager
    /// (the device manager's is added beside them).
    pub plugin_handlers: Vec<(&'static str, Arc<dyn kubelet_pluginmanager::PluginHandler>)>,
    /// The attachable volumes in use, for node status.
    pub volumes_in_use: Arc<dyn kubelet_node::VolumesInUse>,
}

impl Pipeline<'_> {
    pub(super) fn spawn(
        self,
        sources: SourcesOut,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> RunningPipeline {
        let cfg = self.cfg;
        let (pleg, pleg_rx) = GenericPleg::new(
            self.manager.clone(),
            8,
            cfg.runtime_request_timeout,
            tasks.clone(),
        );
        pleg.set_metrics(self.metrics.clone());
        spawn_in(
            tasks,
            info_span!("pleg"),
            pleg.clone().run(stop.child_token()),
        );
        let p = pleg.clone();
        let check: HealthCheck = Arc::new(move || p.healthy());
        self.runtime_state.add_health_check("PLEG", check);

        let status = Arc::new(StatusManager::default());
        let event_recorder: Arc<dyn kubelet_types::events::Recorder> = match &self.recorder {
            Some(r) => r.clone(),
            None => Arc::new(kubelet_types::events::NoopRecorder),
        };
        let volumes = super::volumes::VolumeWiring {
            cfg,
            client: self.client.clone(),
            discovery: self.discovery.clone(),
            metrics: self.metrics.clone(),
            allocatable: self.allocatable.clone(),
            pods: sources.pods.clone(),
            sources_ready: sources.ready.clone(),
            pod_cache: pleg.cache().clone(),
            recorder: event_recorder.clone(),
            latest_node: self.latest_node.clone(),
        }
        .spawn(tasks, stop);
        // Credential providers in token mode share the pods' token cache
        // (upstream hands them the token manager's GetServiceAccountToken).
        self.credential_tokens
            .set_token_manager(volumes.host.tokens.clone());
        self.manager.set_runtime_helper(Arc::new(
            crate::kubelet_pods::helper::KubeletRuntimeHelper {
                volumes: volumes.manager.clone(),
                host: volumes.host.clone(),
                recorder: event_recorder.clone(),
                services: volumes.services.clone(),
                host_ips: self.host_ips.iter().map(ToString::to_string).collect(),
                cluster_domain: cfg.cluster_domain.clone(),
                node_hosts: "/etc/hosts".into(),
                runtime_classes: self.client.clone().map(|c| {
                    let m = crate::runtimeclass::RuntimeClassManager::new(c);
                    match &self.discovery {
                        Some(d) => m.with_discovery(d.clone(), self.metrics.clone()),
                        None => m,
                    }
                }),
                devices: Some(self.devices.clone()),
                features: self.runtime_state.features(),
            },
        ));
        let probes = super::probes::probe_manager(
            &self.probe_results,
            self.cri.clone(),
            status.clone(),
            event_recorder.clone(),
            self.metrics.clone(),
            stop,
        );
        let mut syncer = RuntimePodSyncer::new(
            self.manager.clone(),
            status.clone(),
            self.runtime_state.clone(),
            self.host_ips,
        )
        .with_pod_manager(sources.pods.clone())
        .with_pod_cache(pleg.cache().clone())
        .with_metrics(self.metrics.clone())
        .with_volume_manager(volumes.manager.clone(), volumes.host.clone())
        .with_probes(probes.clone());
        let terminations = crate::pod_killer::Terminations::default();
        syncer = syncer.with_terminations(terminations.clone());
        if let Some(r) = self.recorder {
            syncer = syncer.with_recorder(r);
        }
        let queue = Arc::new(WorkQueue::default());
        let workers = Arc::new(
            AsyncPodWorkers::new(
                Arc::new(syncer),
                queue.clone(),
                cfg.sync_frequency,
                stop.child_token(),
                tasks.clone(),
            )
            .with_metrics(self.metrics.clone()),
        );
        let killer = Arc::new(crate::pod_killer::WorkerKiller {
            terminations,
            workers: workers.clone(),
            status: status.clone(),
            slack: std::time::Duration::from_secs(10),
        });
        let heartbeat = Arc::new(Heartbeat::default());
        let pod_cache = pleg.cache().clone();
        let sync_loop = SyncLoop {
            config: sources.config,
            pleg_events: pleg_rx,
            pleg,
            workers,
            queue,
            sources_ready: sources.ready.clone(),
            desired: Arc::new(sources.pods.clone()),
            heartbeat: heartbeat.clone(),
            status: status.clone(),
            admitter: Arc::new(
                super::admission::admitter(
                    cfg,
                    &self.allocatable,
                    self.latest_node,
                    self.admission,
                    event_recorder.clone(),
                )
                .with_pressure(self.pressure)
                .with_allocator(Arc::new(crate::devices::DeviceAllocator(self.devices)))
                .with_runtime_features(self.runtime_state.features())
                .with_shutdown(self.runtime_state.clone()),
            ),
            rejected: Default::default(),
            probes,
            probe_updates: crate::sync_loop::ProbeUpdates::subscribe(&self.probe_results),
            orphan_cgroups: self.orphan_cgroups,
        };
        let sync_loop = spawn_in(
            tasks,
            info_span!("sync_loop"),
            sync_loop.run(stop.child_token()),
        );
        RunningPipeline {
            sync_loop,
            status,
            pods: sources.pods,
            sources_ready: sources.ready,
            manifest_errors: sources.manifest_errors,
            runtime_state: self.runtime_state,
            heartbeat,
            pod_cache,
            killer,
            csi: volumes.csi,
            plugin_handlers: volumes.plugin_handlers,
            volumes_in_use: volumes.in_use,
        }
    }
}
