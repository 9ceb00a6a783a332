//! Wiring (the kubelet's `RunKubelet`/`startKubelet`): [`App::build`] checks the
//! configuration, opens the CRI client and binds sockets without starting
//! anything; [`App::spawn`] starts every task under one cancellation tree.
//! Stopping the app stops the kubelet, never the pods: containers keep running
//! and are adopted by the next start.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cri::{RemoteRuntime, RuntimeService};
use kubelet_runtime::pleg::GenericPleg;
use kubelet_runtime::{KubeRuntimeManager, RuntimeConfig};
use kubelet_types::Source;
use parking_lot::RwLock;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use crate::certificate::manager::CertManager;
use crate::clock::{Clock, SystemClock};
use crate::config::KubeletConfig;
use crate::events::{EventRecorder, EventSink};
use crate::healthz::{self, Health};
use crate::kubeclient::DynamicCert;
use crate::mirror::MirrorManager;
use crate::nodelease::LeaseController;
use crate::nodestatus::NodeStatusManager;
use crate::nodestatus::machine::MachineInfo;
use crate::pod_sync::RuntimePodSyncer;
use crate::pod_workers::{PodWorkers, WorkQueue};
use crate::podconfig::api::{ApiSource, MirrorPods};
use crate::podconfig::file::{FileSource, ManifestErrors};
use crate::podconfig::http::HttpSource;
use crate::podconfig::spawn_merger;
use crate::status::StatusManager;
use crate::status::sync::StatusSync;
use crate::sync_loop::{DesiredPods, Heartbeat, SyncLoop};
use kubelet_types::events::{EventType, Recorder, node_ref, reason};
use tokio::sync::watch;

/// Errors that stop the kubelet from starting.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The CRI endpoint is unusable.
    #[error("container runtime client: {0}")]
    Runtime(#[from] cri::CriError),
    /// The healthz address cannot be bound.
    #[error("cannot listen on healthz address {addr}: {source}")]
    Healthz {
        /// Address.
        addr: SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest URL source cannot be set up.
    #[error("manifest URL: {0}")]
    ManifestUrl(String),
    /// TLS bootstrap or the client certificate failed.
    #[error("client certificate: {0}")]
    Certificate(#[from] crate::certificate::CertError),
    /// The apiserver client cannot be built.
    #[error(transparent)]
    Client(#[from] crate::kubeclient::ClientError),
    /// Cluster mode is configured inconsistently.
    #[error("{0}")]
    Cluster(String),
}

/// The apiserver side of a kubelet in cluster mode.
struct Cluster {
    client: kube::Client,
    cert: Arc<DynamicCert>,
    rotate: bool,
    recorder: Arc<EventRecorder>,
    sink: EventSink,
}

async fn connect_cluster(cfg: &KubeletConfig) -> Result<Option<Cluster>, AppError> {
    let Some(kubeconfig) = &cfg.kubeconfig else {
        if cfg.bootstrap_kubeconfig.is_some() {
            return Err(AppError::Cluster(
                "--bootstrap-kubeconfig needs --kubeconfig: the path where the bootstrapped kubeconfig is written".into(),
            ));
        }
        return Ok(None);
    };
    crate::certificate::bootstrap::load_client_cert(
        kubeconfig,
        cfg.bootstrap_kubeconfig.as_deref(),
        &cfg.cert_dir,
        &cfg.node_name,
    )
    .await?;
    let c = &cfg.cluster;
    let (client, cert) =
        crate::kubeclient::from_kubeconfig(kubeconfig, c.kube_api_qps, c.kube_api_burst).await?;
    let current = crate::certificate::store::current_path(&cfg.cert_dir);
    let rotate = c.rotate_certificates && cert.is_set() && current.exists();
    let (recorder, sink) = crate::events::channel(
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
        rotate,
        recorder: Arc::new(recorder),
        sink,
    }))
}

/// A configured, not yet running kubelet.
pub struct App {
    cfg: KubeletConfig,
    cluster: Option<Cluster>,
    remote: RemoteRuntime,
    manager: Arc<KubeRuntimeManager>,
    runtime_name: String,
    healthz: Option<TcpListener>,
    http: Option<HttpSource>,
}

/// Read access to a running kubelet, for tests and the (later) kubelet API.
#[derive(Clone)]
pub struct AppHandle {
    /// Generated pod statuses.
    pub status: Arc<StatusManager>,
    /// Static manifest files that were refused, with reasons.
    pub manifest_errors: Option<ManifestErrors>,
    /// Pods the sources want.
    pub desired: DesiredPods,
    /// Health checks.
    pub health: Arc<Health>,
    /// Where `/healthz` listens.
    pub healthz_addr: Option<SocketAddr>,
    /// Mirror pods seen in the apiserver (cluster mode).
    pub mirror: Option<MirrorPods>,
    /// The Node's UID once registered (cluster mode).
    pub registered: watch::Receiver<Option<String>>,
    /// The client certificate in use (cluster mode).
    pub client_cert: Option<Arc<DynamicCert>>,
}

/// A running kubelet.
pub struct Running {
    stop: CancellationToken,
    tasks: TaskTracker,
    sync_loop: JoinHandle<()>,
    /// Read access.
    pub handle: AppHandle,
}

impl App {
    /// Opens the CRI client, learns the runtime's name and binds the healthz port.
    /// An unreachable runtime is not fatal: the kubelet starts and waits for it.
    pub async fn build(cfg: KubeletConfig) -> Result<Self, AppError> {
        let remote = RemoteRuntime::new(
            &cfg.container_runtime_endpoint,
            cfg.image_service_endpoint.as_deref(),
            cfg.runtime_request_timeout,
        )?;
        let runtime_name = match tokio::time::timeout(Duration::from_secs(5), remote.version())
            .await
        {
            Ok(Ok(v)) => {
                info!(runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version,
                    "Connected to container runtime");
                v.runtime_name
            }
            Ok(Err(e)) => {
                warn!(endpoint = %cfg.container_runtime_endpoint, error = %e,
                    "Container runtime not reachable yet; starting anyway and retrying");
                "containerd".to_string()
            }
            Err(_) => {
                warn!(endpoint = %cfg.container_runtime_endpoint, "Container runtime did not answer in 5s; starting anyway");
                "containerd".to_string()
            }
        };
        let rcfg = RuntimeConfig {
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            root_dir: cfg.root_dir.clone(),
            cluster_dns: cfg.cluster_dns.clone(),
            cluster_domain: cfg.cluster_domain.clone(),
            resolv_conf: cfg.resolv_conf.clone(),
            cgroup_driver: cfg.cgroup_driver.clone(),
            cgroup_root: cfg.cgroup_root.clone(),
            machine_memory_bytes: i64::try_from(crate::nodestatus::machine::meminfo_bytes())
                .unwrap_or(i64::MAX),
            runtime_handler: String::new(),
        };
        let cluster = connect_cluster(&cfg).await?;
        let mut manager =
            KubeRuntimeManager::new(Arc::new(remote.clone()), Arc::new(remote.clone()), rcfg);
        if let Some(c) = &cluster {
            manager = manager.with_recorder(c.recorder.clone());
        }
        let manager = Arc::new(manager);
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
            Some(url) => Some(
                HttpSource::new(
                    url.clone(),
                    cfg.static_pod_url_header.clone(),
                    cfg.node_name.clone(),
                    cfg.http_check_frequency,
                )
                .map_err(AppError::ManifestUrl)?,
            ),
            None => None,
        };
        Ok(Self {
            cfg,
            cluster,
            remote,
            manager,
            runtime_name,
            healthz,
            http,
        })
    }

    /// Starts every task.
    pub fn spawn(self) -> Running {
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let cfg = &self.cfg;

        let mut expected = vec![];
        if cfg.static_pod_path.is_some() {
            expected.push(Source::File);
        }
        if self.http.is_some() {
            expected.push(Source::Http);
        }
        if self.cluster.is_some() {
            expected.push(Source::Api);
        }
        let (src_tx, config_rx, sources_ready) = spawn_merger(&expected, stop.child_token());

        let mut manifest_errors = None;
        if let Some(path) = &cfg.static_pod_path {
            let src = FileSource::new(
                path.clone(),
                cfg.node_name.clone(),
                cfg.file_check_frequency,
            );
            manifest_errors = Some(src.errors());
            info!(path = %path.display(), "Watching static pod path");
            tasks.spawn(
                src.run(src_tx.clone(), stop.child_token())
                    .instrument(info_span!("file_source")),
            );
        }
        if let Some(src) = self.http {
            info!(url = ?cfg.static_pod_url, "Polling static pod URL");
            tasks.spawn(
                src.run(src_tx.clone(), stop.child_token())
                    .instrument(info_span!("http_source")),
            );
        }
        let mirror = self.cluster.as_ref().map(|c| {
            let mirror = MirrorPods::default();
            let src = ApiSource {
                client: c.client.clone(),
                node_name: cfg.node_name.clone(),
                mirror: mirror.clone(),
            };
            tasks.spawn(
                src.run(src_tx.clone(), stop.child_token())
                    .instrument(info_span!("api_source")),
            );
            mirror
        });
        drop(src_tx);

        let (pleg, pleg_rx) =
            GenericPleg::new(self.manager.clone(), 8, cfg.runtime_request_timeout);
        tasks.spawn(
            pleg.clone()
                .run(stop.child_token())
                .instrument(info_span!("pleg")),
        );

        let status = Arc::new(StatusManager::default());
        let host_ips = crate::node_ip::node_ips(&cfg.node_ips);
        info!(?host_ips, "Node addresses");
        let mut syncer = RuntimePodSyncer::new(
            self.manager.clone(),
            status.clone(),
            self.runtime_name,
            host_ips.clone(),
        );
        if let Some(c) = &self.cluster {
            syncer = syncer.with_recorder(c.recorder.clone());
        }
        let syncer = Arc::new(syncer);
        let queue = Arc::new(WorkQueue::default());
        let workers = Arc::new(PodWorkers::new(
            syncer,
            queue.clone(),
            cfg.sync_frequency,
            stop.child_token(),
        ));
        let heartbeat = Arc::new(Heartbeat::default());
        let desired = DesiredPods::default();
        let sync_loop = SyncLoop {
            config: config_rx,
            pleg_events: pleg_rx,
            pleg: pleg.clone(),
            workers,
            queue,
            sources_ready: sources_ready.clone(),
            desired: desired.clone(),
            heartbeat: heartbeat.clone(),
            runtime: self.manager.clone(),
            status: status.clone(),
            max_pods: cfg.max_pods,
            rejected: Default::default(),
        };
        let sync_loop = tokio::spawn(
            sync_loop
                .run(stop.child_token())
                .instrument(info_span!("sync_loop")),
        );

        let health = Arc::new(Health {
            heartbeat,
            // Upstream: twice the sync frequency, at least 5 minutes.
            max_loop_stall: (cfg.sync_frequency * 2).max(Duration::from_secs(300)),
            pleg,
            runtime_error: RwLock::new(None),
            network_error: RwLock::new(None),
        });
        let runtime: Arc<dyn RuntimeService> = Arc::new(self.remote.clone());
        tasks.spawn(healthz::watch_runtime(
            runtime,
            health.clone(),
            stop.child_token(),
        ));
        let mut healthz_addr = None;
        if let Some(l) = self.healthz {
            healthz_addr = l.local_addr().ok();
            tasks.spawn(healthz::serve(l, health.clone(), stop.child_token()));
        }
        let (registered_tx, registered) = watch::channel(None);
        let mut client_cert = None;
        if let (Some(c), Some(mirror)) = (self.cluster, mirror.clone()) {
            client_cert = Some(c.cert.clone());
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            c.recorder.event(
                &node_ref(&cfg.node_name),
                EventType::Normal,
                reason::STARTING,
                "Starting kubelet.".into(),
            );
            tasks.spawn(
                c.sink
                    .run(stop.child_token())
                    .instrument(info_span!("events")),
            );
            let node_status = NodeStatusManager {
                client: c.client.clone(),
                node_name: cfg.node_name.clone(),
                cfg: cfg.cluster.clone(),
                max_pods: cfg.max_pods,
                node_labels: cfg.node_labels.clone(),
                taints: cfg.register_with_taints.clone(),
                provider_id: cfg.provider_id.clone(),
                node_ips: host_ips.clone(),
                provided_node_ips: cfg.node_ips.clone(),
                machine: MachineInfo::read(&cfg.root_dir),
                runtime: Arc::new(self.remote.clone()),
                images: Arc::new(self.remote.clone()),
                health: health.clone(),
                clock: clock.clone(),
                recorder: c.recorder.clone(),
                registered: registered_tx,
            };
            tasks.spawn(
                node_status
                    .run(stop.child_token())
                    .instrument(info_span!("node_status")),
            );
            let lease = LeaseController {
                client: c.client.clone(),
                node_name: cfg.node_name.clone(),
                duration_seconds: cfg.cluster.node_lease_duration_seconds,
                clock,
                node_uid: registered.clone(),
            };
            tasks.spawn(
                lease
                    .run(stop.child_token())
                    .instrument(info_span!("node_lease")),
            );
            let sync = StatusSync {
                client: c.client.clone(),
                status: status.clone(),
                desired: desired.clone(),
                mirror: mirror.clone(),
            };
            tasks.spawn(
                sync.run(stop.child_token())
                    .instrument(info_span!("status_manager")),
            );
            let mirrors = MirrorManager {
                client: c.client.clone(),
                node_name: cfg.node_name.clone(),
                desired: desired.clone(),
                mirror,
                sources_ready,
                node_uid: registered.clone(),
            };
            tasks.spawn(
                mirrors
                    .run(stop.child_token())
                    .instrument(info_span!("mirror_pods")),
            );
            if c.rotate {
                let certs = CertManager {
                    client: c.client.clone(),
                    cert_dir: cfg.cert_dir.clone(),
                    cert: c.cert.clone(),
                    node: cfg.node_name.clone(),
                };
                tasks.spawn(
                    certs
                        .run(stop.child_token())
                        .instrument(info_span!("certificate_manager")),
                );
            }
            let mut ready = registered.clone();
            tasks.spawn(async move {
                if ready.wait_for(Option::is_some).await.is_ok() {
                    notify_ready();
                }
            });
        } else {
            drop(registered_tx);
            notify_ready();
        }
        tasks.close();
        info!(node = %cfg.node_name, "Started kubelet");
        Running {
            stop,
            tasks,
            sync_loop,
            handle: AppHandle {
                status,
                manifest_errors,
                desired,
                health,
                healthz_addr,
                mirror,
                registered,
                client_cert,
            },
        }
    }
}

/// Tells systemd (`Type=notify`) the kubelet is up; a no-op outside systemd.
fn notify_ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        warn!(error = %e, "Cannot notify systemd");
    }
}

impl Running {
    /// Resolves if the sync loop ends on its own (a critical failure).
    pub async fn sync_loop_exited(&mut self) {
        let _ = (&mut self.sync_loop).await;
    }

    /// Stops every task, waiting at most `grace`. Containers keep running.
    pub async fn shutdown(self, grace: Duration) {
        self.stop.cancel();
        let wait = async {
            let _ = self.sync_loop.await;
            self.tasks.wait().await;
        };
        if tokio::time::timeout(grace, wait).await.is_err() {
            warn!(?grace, "Some tasks did not stop in time");
        }
        info!("Kubelet stopped; containers keep running");
    }
}
