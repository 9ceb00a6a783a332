//! Wiring (the kubelet's `RunKubelet`/`startKubelet`): [`App::build`] checks the
//! configuration, opens the CRI client and binds sockets without starting
//! anything; [`App::spawn`] starts each subsystem under one task tracker and
//! one cancellation tree. Stopping the app stops the kubelet, never the pods:
//! containers keep running and are adopted by the next start.

mod admission;
mod allocator;
mod cgroup_driver;
mod cluster;
mod cm;
mod container_gc;
mod container_logs;
mod eviction;
mod housekeeping;
mod image_gc;
mod nodeshutdown;
mod oom_watcher;
mod plugins;
mod podresources;
mod pods;
mod probes;
mod server;
mod spawn;
mod volumes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cri::RemoteRuntime;
use kubelet_config::KubeletConfig;
use kubelet_node::nodestatus::machine::MachineInfo;
use kubelet_runtime::{KubeRuntimeManager, RuntimeConfig};
use kubelet_server::healthz::Checks;
use kubelet_types::events::Recorder;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn};

use crate::error::Error as AppError;
use crate::pod_manager::PodManager;
use crate::runtime_state::RuntimeState;
use crate::status::StatusManager;
use cluster::Cluster;
use kubelet_podconfig::file::ManifestErrors;
use kubelet_podconfig::http::HttpSource;
use spawn::{notify_ready, spawn_in};

/// A configured, not yet running kubelet.
pub struct App {
    cfg: KubeletConfig,
    /// The root of the cancellation tree; pulls in flight watch it too.
    stop: CancellationToken,
    cluster: Option<Cluster>,
    remote: RemoteRuntime,
    manager: Arc<KubeRuntimeManager>,
    runtime_state: Arc<RuntimeState>,
    /// The node's addresses (`--node-ip`, or the default route's interface).
    host_ips: Vec<std::net::IpAddr>,
    healthz: Option<TcpListener>,
    node_api: server::NodeApi,
    http: Option<HttpSource>,
    metrics: Arc<kubelet_metrics::KubeletMetrics>,
    /// Node allocatable, for Memory emptyDirs and the downward API.
    allocatable:
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// Liveness, readiness and startup results, shared by the prober, the
    /// runtime manager, status generation and the sync loop.
    probe_results: kubelet_runtime::ProbeResults,
    /// The instrumented CRI runtime service (the prober's exec probes).
    cri: Arc<dyn cri::RuntimeService>,
    /// The sysctl allowlist and whether the host has AppArmor, for admission.
    admission: (crate::lifecycle::sysctl::Allowlist, bool),
    /// QoS, pod and node allocatable cgroups (`app::cm`).
    container_manager: Arc<kubelet_cm::ContainerManager>,
    /// The eviction manager's thresholds, parsed before anything starts.
    eviction_thresholds: Vec<kubelet_eviction::Threshold>,
    /// The device manager (started) and the pod-resources socket (bound).
    devices: podresources::Devices,
    /// Service accounts and tokens for credential providers in token mode;
    /// the pod pipeline hands it the token manager.
    credential_tokens: Arc<crate::credential_tokens::KubeletTokens>,
}

/// Read access to a running kubelet, for tests and the (later) kubelet API.
#[derive(Clone)]
pub struct AppHandle {
    /// Generated pod statuses.
    pub status: Arc<StatusManager>,
    /// Static manifest files that were refused, with reasons.
    pub manifest_errors: Option<ManifestErrors>,
    /// Desired pods, and mirror pods in cluster mode.
    pub desired: PodManager,
    /// The node's view of the runtime.
    pub runtime_state: Arc<RuntimeState>,
    /// Where `/healthz` listens.
    pub healthz_addr: Option<SocketAddr>,
    /// Where the node API (10250) listens.
    pub server_addr: Option<SocketAddr>,
    /// Where the read-only port listens.
    pub read_only_addr: Option<SocketAddr>,
    /// The kubelet as its server reads it (`HostInterface`), for the node API.
    pub host: Arc<crate::host::KubeletHost>,
    /// The Node's UID once registered (cluster mode).
    pub registered: watch::Receiver<Option<String>>,
    /// The client certificate in use (cluster mode).
    pub client_cert: Option<Arc<kubelet_client::DynamicCert>>,
}

/// A running kubelet.
pub struct Running {
    stop: CancellationToken,
    tasks: TaskTracker,
    /// `None` once [`Running::sync_loop_exited`] saw it end.
    sync_loop: Option<JoinHandle<()>>,
    /// Read access.
    pub handle: AppHandle,
}

impl App {
    /// Opens the CRI client and binds the healthz port. An unreachable
    /// runtime is not fatal: the kubelet starts and waits for it.
    pub async fn build(mut cfg: KubeletConfig) -> Result<Self, AppError> {
        let eviction_thresholds = eviction::thresholds(&cfg).map_err(AppError::Eviction)?;
        let remote = RemoteRuntime::new(
            &cfg.container_runtime_endpoint,
            cfg.image_service_endpoint.as_deref(),
            cfg.runtime_request_timeout,
        )?;
        let gate = cfg
            .feature_gates
            .get(cgroup_driver::GATE)
            .copied()
            .unwrap_or(true);
        (cfg.cgroup_driver, _) = cgroup_driver::resolve(&remote, cfg.cgroup_driver, gate).await;
        // Read off the runtime: /proc, /sys and statvfs.
        let machine = MachineInfo::read(&cfg.root_dir).await;
        let allocatable = kubelet_node::nodestatus::setters::allocatable(
            &kubelet_node::nodestatus::setters::capacity(&machine, cfg.max_pods),
            &cfg.cluster,
        );
        let mut rcfg = RuntimeConfig {
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            root_dir: cfg.root_dir.clone(),
            cluster_dns: cfg.cluster_dns.clone(),
            cluster_domain: cfg.cluster_domain.clone(),
            resolv_conf: cfg.resolv_conf.clone(),
            cgroup_driver: cfg.cgroup_driver,
            cgroup_root: cfg.cgroup_root.clone(),
            machine_memory_bytes: i64::try_from(machine.memory_bytes).unwrap_or(i64::MAX),
            runtime_handler: String::new(),
            seccomp_default: matches!(
                cfg.settings.get("seccompDefault"),
                Some(kubelet_config::SettingValue::Bool(true))
            ),
            max_dead_per_container: usize::try_from(
                cfg.housekeeping.container_gc.max_per_pod_container,
            )
            .unwrap_or(0),
            ..RuntimeConfig::default()
        };
        // Providers in service-account token mode get the apiserver client
        // once connected (below) and the token manager once the pod
        // pipeline is built.
        let credential_tokens = Arc::new(crate::credential_tokens::KubeletTokens::default());
        let mut credential_options = kubelet_credentialprovider::RegisterOptions {
            tokens: Some(credential_tokens.clone()),
            ..Default::default()
        };
        if let Some(on) = cfg
            .feature_gates
            .get("KubeletServiceAccountTokenForCredentialProviders")
        {
            credential_options.service_account_tokens_gate = *on;
        }
        rcfg.image_credential_providers = kubelet_credentialprovider::register_from_flags(
            cfg.image_credential_provider_config.as_deref(),
            cfg.image_credential_provider_bin_dir.as_deref(),
            credential_options,
        )
        .await
        .map_err(AppError::CredentialProviders)?
        .map(|p| p as Arc<dyn kubelet_runtime::credentialprovider::ExternalCredentialProviders>);
        let container_manager = cm::start(&cfg, &machine, &mut rcfg)
            .await
            .map_err(AppError::ContainerManager)?;
        // Learn the runtime's name and version before any pod syncs; a runtime
        // that is down is retried by the runtime state's own loop.
        let runtime_state = Arc::new(RuntimeState::new(vec![]));
        runtime_state.update_runtime_up(&remote).await;
        let metrics = Arc::new(kubelet_metrics::KubeletMetrics::new());
        metrics.set_node_name(&cfg.node_name);
        let cluster = cluster::connect(&cfg, machine, metrics.clone()).await?;
        if let Some(c) = &cluster {
            credential_tokens.connect(c.client.clone());
        }
        let stop = CancellationToken::new();
        let instrumented = Arc::new(kubelet_runtime::instrumented::Instrumented::new(
            Arc::new(remote.clone()),
            metrics.clone(),
        ));
        let admission = (
            admission::allowlist(&cfg)?,
            crate::lifecycle::apparmor_enabled().await,
        );
        let probe_results = kubelet_runtime::ProbeResults::default();
        let cri: Arc<dyn cri::RuntimeService> = instrumented.clone();
        let mut manager = KubeRuntimeManager::new(instrumented.clone(), instrumented, rcfg)
            .with_probe_results(probe_results.clone())
            .with_shutdown(stop.child_token())
            .with_metrics(metrics.clone());
        if let Some(c) = &cluster {
            manager = manager.with_recorder(c.recorder.clone());
        }
        let healthz = if cfg.healthz_port == 0 {
            None
        } else {
            let addr = SocketAddr::new(cfg.healthz_bind_address, cfg.healthz_port);
            Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| AppError::Healthz { addr, source })?,
            )
        };
        let http = match &cfg.static_pod_url {
            Some(url) => Some(HttpSource::new(
                url.clone(),
                cfg.static_pod_url_header.clone(),
                cfg.node_name.clone(),
                cfg.http_check_frequency,
            )?),
            None => None,
        };
        let configured = cfg.node_ips.clone();
        // Reads /proc/net/route: off the async runtime.
        let host_ips =
            tokio::task::spawn_blocking(move || kubelet_node::node_ip::node_ips(&configured))
                .await
                .unwrap_or_default();
        let node_api =
            server::NodeApi::build(&cfg, cluster.as_ref().map(|c| c.client.clone()), &host_ips)
                .await?;
        // Last: it serves the device plugin registration socket at once.
        let devices = podresources::build(&cfg, &remote).await?;
        Ok(Self {
            cfg,
            stop,
            host_ips,
            cluster,
            remote,
            manager: Arc::new(manager),
            runtime_state,
            healthz,
            node_api,
            http,
            metrics,
            allocatable,
            probe_results,
            cri,
            admission,
            container_manager,
            eviction_thresholds,
            devices,
            credential_tokens,
        })
    }

    /// Starts every subsystem.
    pub fn spawn(self) -> Running {
        let stop = self.stop.clone();
        let tasks = TaskTracker::new();
        let cfg = &self.cfg;
        let host_ips = self.host_ips.clone();
        info!(?host_ips, "Node addresses");

        // The eviction manager's node conditions, read by admission and node
        // status; the manager starts with the housekeeping subsystems.
        let (pressure_tx, pressure) = kubelet_eviction::Pressure::channel();
        let sources = pods::Sources::new(cfg, self.http, self.cluster.as_ref());
        let pods = sources.spawn(&tasks, &stop);
        // The Node the apiserver last returned, for admission (cluster mode).
        let (latest_node_tx, latest_node_rx) = watch::channel(None);
        let latest_node_rx = self.cluster.is_some().then_some(latest_node_rx);
        // The apiserver's version and groups, read once at start (logged);
        // requests older apiservers refuse choose their form from it.
        let discovery = self.cluster.as_ref().map(|c| {
            let d = kubelet_client::discovery::Discovery::new(c.client.clone());
            let first = d.clone();
            spawn_in(&tasks, info_span!("discovery"), {
                let stop = stop.clone();
                async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = first.keep_current() => {}
                    }
                }
            });
            d
        });
        let cluster_discovery = discovery.clone();
        let pipeline = pods::Pipeline {
            cfg,
            manager: self.manager.clone(),
            runtime_state: self.runtime_state.clone(),
            host_ips: host_ips.clone(),
            recorder: self.cluster.as_ref().map(|c| c.recorder.clone()),
            metrics: self.metrics.clone(),
            client: self.cluster.as_ref().map(|c| c.client.clone()),
            discovery,
            allocatable: self.allocatable.clone(),
            probe_results: self.probe_results.clone(),
            cri: self.cri.clone(),
            admission: self.admission.clone(),
            latest_node: latest_node_rx,
            pressure: pressure.clone(),
            devices: self.devices.manager.clone(),
            credential_tokens: self.credential_tokens.clone(),
            orphan_cgroups: cm::orphans(&self.container_manager, &cfg.root_dir, &tasks),
        };
        let running = pipeline.spawn(pods, &tasks, &stop);
        let device_manager = self.devices.manager.clone();
        self.devices.spawn(
            podresources::Wiring {
                pods: running.pods.clone(),
                status: running.status.clone(),
                sources_ready: running.sources_ready.clone(),
                metrics: self.metrics.clone(),
            },
            &tasks,
            &stop,
        );
        let mut plugin_handlers = running.plugin_handlers.clone();
        plugin_handlers.push((
            kubelet_pluginmanager::DEVICE_PLUGIN,
            Arc::new(device_manager.clone()),
        ));
        let recorder = self
            .cluster
            .as_ref()
            .map(|c| c.recorder.clone() as Arc<dyn Recorder>);
        cm::spawn(
            &self.container_manager,
            running.pods.clone(),
            recorder,
            &tasks,
            &stop,
        );

        spawn_in(
            &tasks,
            info_span!("allocator"),
            allocator::trim_after_pods_leave(
                running.pods.clone(),
                allocator::malloc_trim,
                stop.child_token(),
            ),
        );

        let runtime = Arc::new(self.remote.clone());
        spawn_in(
            &tasks,
            info_span!("runtime_state"),
            running
                .runtime_state
                .clone()
                .run(runtime, stop.child_token()),
        );
        // The healthz port serves `ping` alone, as upstream's does; the
        // `log` and `syncloop` checks belong to the node API on 10250.
        let healthz_addr = self.healthz.and_then(|l| {
            let addr = l.local_addr().ok();
            let checks = Arc::new(Checks::ping_only());
            spawn_in(
                &tasks,
                info_span!("healthz"),
                kubelet_server::healthz::serve(l, checks, stop.child_token()),
            );
            addr
        });

        let host = Arc::new(crate::host::KubeletHost {
            heartbeat: running.heartbeat,
            resync: cfg.sync_frequency,
            node_name: cfg.node_name.clone(),
            pods: running.pods.clone(),
            status: running.status.clone(),
            manager: self.manager.clone(),
            remote: self.remote.clone(),
            pod_cache: running.pod_cache,
            root_dir: cfg.root_dir.clone(),
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            cpu_usage: Default::default(),
            summary_cache: Default::default(),
            metrics: self.metrics.clone(),
            pod_cgroups: self.container_manager.clone(),
            csi: running.csi.clone(),
        });
        let hk = housekeeping::Housekeeping {
            cfg,
            manager: self.manager.clone(),
            remote: self.remote.clone(),
            cri: self.cri.clone(),
            recorder: self.cluster.as_ref().map_or_else(
                || Arc::new(kubelet_types::events::NoopRecorder) as Arc<dyn Recorder>,
                |c| c.recorder.clone() as Arc<dyn Recorder>,
            ),
            metrics: self.metrics.clone(),
            pods: running.pods.clone(),
            status: running.status.clone(),
            killer: running.killer.clone(),
            host: host.clone(),
            runtime_state: running.runtime_state.clone(),
            sources_ready: running.sources_ready.clone(),
        };
        let reclaim = eviction::Reclaimers {
            containers: container_gc::spawn(&hk, &tasks, &stop),
            images: image_gc::spawn(&hk, &tasks, &stop),
        };
        container_logs::spawn(&hk, &tasks, &stop);
        eviction::spawn(
            &hk,
            self.eviction_thresholds.clone(),
            reclaim,
            pressure_tx,
            &tasks,
            &stop,
        );
        nodeshutdown::spawn(&hk, &tasks, &stop);
        plugins::spawn(cfg, plugin_handlers, &tasks, &stop);
        oom_watcher::spawn(&hk, &tasks, &stop);
        drop(hk);
        let (server_addr, read_only_addr) = self.node_api.addrs();
        self.node_api.spawn(
            server::Wiring {
                cfg,
                host: host.clone(),
                metrics: self.metrics.clone(),
            },
            &tasks,
            &stop,
        );
        let (registered_tx, registered) = watch::channel(None);
        let client_cert = self.cluster.as_ref().map(|c| c.cert.clone());
        match self.cluster {
            Some(c) => c.spawn(
                cluster::Wiring {
                    cfg,
                    remote: &self.remote,
                    host_ips,
                    runtime_state: running.runtime_state.clone(),
                    status: running.status.clone(),
                    pods: running.pods.clone(),
                    sources_ready: running.sources_ready.clone(),
                    registered_tx,
                    latest_node: latest_node_tx,
                    registered: registered.clone(),
                    pressure: Arc::new(eviction::NodePressure(pressure)),
                    extended: Arc::new(crate::devices::NodeDevices(device_manager)),
                    volumes_in_use: running.volumes_in_use.clone(),
                    discovery: cluster_discovery,
                },
                &tasks,
                &stop,
            ),
            None => {
                drop(registered_tx);
                notify_ready();
            }
        }
        tasks.close();
        info!(node = %cfg.node_name, "Started kubelet");
        Running {
            stop,
            tasks,
            sync_loop: Some(running.sync_loop),
            handle: AppHandle {
                status: running.status,
                manifest_errors: running.manifest_errors,
                desired: running.pods,
                runtime_state: running.runtime_state,
                healthz_addr,
                server_addr,
                read_only_addr,
                host,
                registered,
                client_cert,
            },
        }
    }
}

impl Running {
    /// Resolves if the sync loop ends on its own (a critical failure); never
    /// resolves again after that.
    pub async fn sync_loop_exited(&mut self) {
        match self.sync_loop.as_mut() {
            Some(h) => {
                let _ = h.await;
                self.sync_loop = None;
            }
            None => std::future::pending().await,
        }
    }

    /// How many of the kubelet's tracked tasks are alive (per-pod workers,
    /// probe workers, object watches, loops): churn tests check that it
    /// comes back down once the pods are gone.
    pub fn tracked_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Stops every task, waiting at most `grace`. Containers keep running.
    pub async fn shutdown(self, grace: Duration) {
        self.stop.cancel();
        let wait = async {
            if let Some(h) = self.sync_loop {
                let _ = h.await;
            }
            self.tasks.wait().await;
        };
        if tokio::time::timeout(grace, wait).await.is_err() {
            warn!(?grace, "Some tasks did not stop in time");
        }
        info!("Kubelet stopped; containers keep running");
    }
}
