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

use crate::config::KubeletConfig;
use crate::healthz::{self, Health};
use crate::pod_sync::RuntimePodSyncer;
use crate::pod_workers::{PodWorkers, WorkQueue};
use crate::podconfig::file::{FileSource, ManifestErrors};
use crate::podconfig::http::HttpSource;
use crate::podconfig::spawn_merger;
use crate::status::StatusManager;
use crate::sync_loop::{DesiredPods, Heartbeat, SyncLoop};

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
}

/// A configured, not yet running kubelet.
pub struct App {
    cfg: KubeletConfig,
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
}

/// A running kubelet.
pub struct Running {
    stop: CancellationToken,
    tasks: TaskTracker,
    sync_loop: JoinHandle<()>,
    /// Read access.
    pub handle: AppHandle,
}

fn machine_memory() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
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
            machine_memory_bytes: machine_memory(),
            runtime_handler: String::new(),
        };
        let manager = Arc::new(KubeRuntimeManager::new(
            Arc::new(remote.clone()),
            Arc::new(remote.clone()),
            rcfg,
        ));
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
        let syncer = Arc::new(RuntimePodSyncer::new(
            self.manager.clone(),
            status.clone(),
            self.runtime_name,
            host_ips,
        ));
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
            sources_ready,
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
            },
        }
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
