//! A host-path CSI driver for tests, written from the CSI spec (v1.x,
//! `container-storage-interface/spec` `spec.md`), together with the
//! node-driver-registrar's side of the kubelet plugin registration API
//! (`pluginregistration.v1`), as `csi-driver-host-path` and its registrar
//! sidecar are deployed beside a real kubelet.
//!
//! [`CsiDriver::start`] serves Identity, Node and Controller on the CSI
//! socket the test names and, when asked, `Registration` on
//! `<registry dir>/<driver>-reg.sock` so the kubelet's plugin watcher finds
//! it. Volumes live under a data directory: staging bind-mounts a volume's
//! directory on the staging path, publishing bind-mounts the staged
//! directory (or the volume's directory) on the target path, read-only
//! when asked. A block volume is a regular file backing a loop device, as
//! in csi-driver-host-path: publishing binds the volume's loop device
//! (attached at its first publish, detached when its last publish or the
//! volume goes) onto the target file, so the target is a block device node
//! a container runtime can hand to a container ([`CsiDriver::block_file`],
//! [`CsiDriver::loop_device`]).
//! Every call is recorded ([`Call`], [`CsiDriver::wait_for_call`]); any
//! method, the registrar's `GetInfo` included, can be made to fail with a
//! gRPC code or to hang ([`Fault`]). [`api`] has what the control plane
//! does for a driver: its CSIDriver object, PVs and the VolumeAttachment;
//! [`attacher`] runs the attach/detach controller and external-attacher.
//!
//! Mounting needs root, as a real driver does.

pub mod api;
pub mod attacher;
mod block;
#[cfg(test)]
mod block_tests;
mod controller;
mod identity;
mod loopdev;
mod mount;
mod node;
mod registrar;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use kubelet_csi::pb;
use parking_lot::Mutex;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

pub use registrar::RegistrationStatus;

/// The plugin API versions the registrar offers (node-driver-registrar
/// answers `1.0.0`).
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The volume context key the kubelet sets for CSI ephemeral inline volumes.
pub const EPHEMERAL_CONTEXT_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// Size of the file backing a block volume created by a stage or publish
/// (a CreateVolume asking for a capacity gets that size).
pub const BLOCK_SIZE: u64 = 1 << 20;

/// How the driver behaves.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The driver name (`GetPluginInfo`, the registration's name).
    pub name: String,
    /// `vendor_version` of `GetPluginInfo`.
    pub vendor_version: String,
    /// `NodeGetInfo.node_id`.
    pub node_id: String,
    /// `NodeGetInfo.accessible_topology` segments; empty: none.
    pub topology: BTreeMap<String, String>,
    /// `NodeGetInfo.max_volumes_per_node` (0: no limit).
    pub max_volumes: i64,
    /// The node capability `STAGE_UNSTAGE_VOLUME`.
    pub stage_unstage: bool,
    /// The node capability `GET_VOLUME_STATS`.
    pub get_volume_stats: bool,
    /// The node capability `EXPAND_VOLUME` (and online expansion).
    pub expand: bool,
    /// The node capability `VOLUME_MOUNT_GROUP`.
    pub volume_mount_group: bool,
    /// The controller capability `PUBLISH_UNPUBLISH_VOLUME` (attach).
    pub controller_publish: bool,
    /// Where volumes live (`<data_dir>/<volume id>`).
    pub data_dir: PathBuf,
    /// The versions the registrar's `GetInfo` offers
    /// ([`SUPPORTED_VERSIONS`] unless a test wants a mismatch).
    pub registration_versions: Vec<String>,
}

impl DriverConfig {
    /// A driver named `name` for node `node_id`, keeping volumes in
    /// `data_dir`, with staging and stats on and the rest off.
    pub fn new(name: &str, node_id: &str, data_dir: &Path) -> Self {
        Self {
            name: name.to_string(),
            vendor_version: "v0.0.1-kubelet-rs-test".into(),
            node_id: node_id.to_string(),
            topology: BTreeMap::from([(
                "topology.hostpath.csi/node".to_string(),
                node_id.to_string(),
            )]),
            max_volumes: 0,
            stage_unstage: true,
            get_volume_stats: true,
            expand: false,
            volume_mount_group: false,
            controller_publish: false,
            data_dir: data_dir.to_path_buf(),
            registration_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }
    }
}

/// One call the driver received, with its request.
#[derive(Debug, Clone)]
pub enum Request {
    /// Identity `GetPluginInfo`.
    GetPluginInfo,
    /// Identity `GetPluginCapabilities`.
    GetPluginCapabilities,
    /// Identity `Probe`.
    Probe,
    /// Node `NodeGetInfo`.
    NodeGetInfo,
    /// Node `NodeGetCapabilities`.
    NodeGetCapabilities,
    /// Node `NodeStageVolume`.
    NodeStageVolume(pb::NodeStageVolumeRequest),
    /// Node `NodeUnstageVolume`.
    NodeUnstageVolume(pb::NodeUnstageVolumeRequest),
    /// Node `NodePublishVolume`.
    NodePublishVolume(pb::NodePublishVolumeRequest),
    /// Node `NodeUnpublishVolume`.
    NodeUnpublishVolume(pb::NodeUnpublishVolumeRequest),
    /// Node `NodeGetVolumeStats`.
    NodeGetVolumeStats(pb::NodeGetVolumeStatsRequest),
    /// Node `NodeExpandVolume`.
    NodeExpandVolume(pb::NodeExpandVolumeRequest),
    /// Controller `ControllerGetCapabilities`.
    ControllerGetCapabilities,
    /// Controller `CreateVolume`.
    CreateVolume(pb::CreateVolumeRequest),
    /// Controller `DeleteVolume`.
    DeleteVolume(pb::DeleteVolumeRequest),
    /// Controller `ControllerPublishVolume`.
    ControllerPublishVolume(pb::ControllerPublishVolumeRequest),
    /// Controller `ControllerUnpublishVolume`.
    ControllerUnpublishVolume(pb::ControllerUnpublishVolumeRequest),
    /// Controller `ControllerExpandVolume`.
    ControllerExpandVolume(pb::ControllerExpandVolumeRequest),
}

/// A recorded call: the method (`NodeStageVolume`), the request, and the
/// code it was answered with (`Ok` for success).
#[derive(Debug, Clone)]
pub struct Call {
    /// The method's name, as in the proto.
    pub method: &'static str,
    /// The request.
    pub request: Request,
    /// The answer's code.
    pub code: Code,
}

/// What a method does instead of its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Fail every call with this code and message until cleared.
    Fail(Code, String),
    /// Fail the next call only.
    FailOnce(Code, String),
    /// Never answer until the fault is cleared (then do the work).
    Hang,
    /// Fail the next `n` calls, then work again (the fault goes by
    /// itself), as upstream csi_mock's hooks failing the first calls do.
    FailTimes(u32, Code, String),
    /// Do the work, then answer with this code and message until cleared:
    /// a driver whose operation went through but reported an error (an
    /// unstage that unmounted, then timed out answering), which leaves no
    /// mount behind as upstream's mock driver, which mounts nothing, does.
    FailAfterWork(Code, String),
}

/// What a method's fault lets it do.
pub(crate) enum Gate {
    /// Work and answer.
    Work,
    /// Work, then answer with this error.
    WorkThenFail(Status),
}

/// A published target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The volume.
    pub volume_id: String,
    /// Mounted read-only.
    pub readonly: bool,
    /// A block volume (its loop device bind-mounted on a file).
    pub block: bool,
    /// An ephemeral inline volume (its data goes with its unpublish).
    pub ephemeral: bool,
}

/// What the driver remembers across restarts (a real host-path driver
/// keeps it in a state file).
#[derive(Debug, Default)]
pub(crate) struct VolumeState {
    /// volume id → staging path.
    pub staged: HashMap<String, PathBuf>,
    /// target path → what is published there.
    pub published: HashMap<PathBuf, Published>,
    /// volume id → size the last NodeExpandVolume asked for.
    pub expanded: HashMap<String, i64>,
    /// volume id → group the last stage or publish applied.
    pub mount_groups: HashMap<String, String>,
    /// Ephemeral volumes whose data was removed by their unpublish.
    pub ended: std::collections::HashSet<String>,
    /// Backing files of block volumes this driver bound a loop device to
    /// (detached at the last unpublish, DeleteVolume or the driver's drop).
    pub attached: std::collections::HashSet<PathBuf>,
}

pub(crate) struct Shared {
    pub config: Mutex<DriverConfig>,
    pub calls: Mutex<Vec<Call>>,
    pub faults: Mutex<HashMap<String, Fault>>,
    pub fault_changed: watch::Sender<u64>,
    pub volumes: Mutex<VolumeState>,
    pub registrations: Mutex<Vec<RegistrationStatus>>,
    pub registered: watch::Sender<usize>,
    /// How many calls were recorded.
    pub recorded: watch::Sender<usize>,
    /// Serializes the loop device work of block volumes (attach with
    /// mount, unmount with detach), so two publishes of one volume share
    /// its device and an unpublish never detaches one being published.
    pub block_lock: tokio::sync::Mutex<()>,
}

/// A cheap handle the gRPC services share.
#[derive(Clone)]
pub(crate) struct Driver(pub Arc<Shared>);

impl Driver {
    pub fn config(&self) -> DriverConfig {
        self.0.config.lock().clone()
    }

    /// Waits out or applies the fault set for `method`, if any.
    pub async fn gate(&self, method: &str) -> Result<Gate, Status> {
        let mut changed = self.0.fault_changed.subscribe();
        loop {
            let fault = {
                let mut faults = self.0.faults.lock();
                let key = if faults.contains_key(method) {
                    method
                } else {
                    "*"
                };
                let f = faults.get(key).cloned();
                match &f {
                    Some(Fault::FailOnce(..)) | Some(Fault::FailTimes(0 | 1, ..)) => {
                        faults.remove(key);
                    }
                    Some(Fault::FailTimes(n, code, msg)) => {
                        let next = Fault::FailTimes(n - 1, *code, msg.clone());
                        faults.insert(key.to_string(), next);
                    }
                    _ => {}
                }
                f
            };
            match fault {
                None | Some(Fault::FailTimes(0, ..)) => return Ok(Gate::Work),
                Some(
                    Fault::Fail(code, msg)
                    | Fault::FailOnce(code, msg)
                    | Fault::FailTimes(_, code, msg),
                ) => {
                    return Err(Status::new(code, msg));
                }
                Some(Fault::FailAfterWork(code, msg)) => {
                    return Ok(Gate::WorkThenFail(Status::new(code, msg)));
                }
                Some(Fault::Hang) => {
                    if changed.changed().await.is_err() {
                        return Err(Status::unavailable("driver stopped"));
                    }
                }
            }
        }
    }

    /// Records `request` and runs `work` behind the method's fault.
    pub async fn call<T, F>(
        &self,
        method: &'static str,
        request: Request,
        work: F,
    ) -> Result<tonic::Response<T>, Status>
    where
        F: std::future::Future<Output = Result<T, Status>>,
    {
        let result = match self.gate(method).await {
            Ok(Gate::Work) => work.await,
            Ok(Gate::WorkThenFail(status)) => work.await.and(Err(status)),
            Err(s) => Err(s),
        };
        let code = result.as_ref().err().map_or(Code::Ok, Status::code);
        tracing::debug!(method, ?code, "test CSI driver call");
        let n = {
            let mut calls = self.0.calls.lock();
            calls.push(Call {
                method,
                request,
                code,
            });
            calls.len()
        };
        self.0.recorded.send_replace(n);
        result.map(tonic::Response::new)
    }
}

/// A running driver.
pub struct CsiDriver {
    driver: Driver,
    socket: PathBuf,
    registration: Option<PathBuf>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
}

impl CsiDriver {
    /// Serves Identity, Node and Controller on `socket`, and, when
    /// `registry_dir` is given, the registration service on
    /// `<registry_dir>/<name>-reg.sock` naming `socket` as the endpoint.
    pub async fn start(
        config: DriverConfig,
        socket: &Path,
        registry_dir: Option<&Path>,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&config.data_dir)?;
        let registration = registry_dir.map(|d| d.join(format!("{}-reg.sock", config.name)));
        let shared = Shared {
            config: Mutex::new(config),
            calls: Mutex::default(),
            faults: Mutex::default(),
            fault_changed: watch::channel(0).0,
            volumes: Mutex::default(),
            registrations: Mutex::default(),
            registered: watch::channel(0).0,
            recorded: watch::channel(0).0,
            block_lock: tokio::sync::Mutex::new(()),
        };
        let mut d = Self {
            driver: Driver(Arc::new(shared)),
            socket: socket.to_path_buf(),
            registration,
            stop: watch::channel(false).0,
            tasks: Vec::new(),
        };
        d.serve()?;
        Ok(d)
    }

    /// Serves as a driver deployed beside a kubelet with `root_dir`
    /// (`--root-dir`) is: the CSI socket at
    /// `<root>/plugins/<driver>/csi.sock`, the registration socket in
    /// `<root>/plugins_registry` (csi-driver-host-path's DaemonSet layout).
    pub async fn start_in_root(config: DriverConfig, root_dir: &Path) -> std::io::Result<Self> {
        let socket = root_dir.join("plugins").join(&config.name).join("csi.sock");
        Self::start(config, &socket, Some(&root_dir.join("plugins_registry"))).await
    }

    fn serve(&mut self) -> std::io::Result<()> {
        use kubelet_csi::pb::controller_server::ControllerServer;
        use kubelet_csi::pb::identity_server::IdentityServer;
        use kubelet_csi::pb::node_server::NodeServer;
        use kubelet_pluginmanager::pb::registration_server::RegistrationServer;

        self.stop.send_replace(false);
        let csi = bind(&self.socket)?;
        let mut stop = self.stop.subscribe();
        let driver = self.driver.clone();
        let server = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(driver.clone()))
            .add_service(NodeServer::new(driver.clone()))
            .add_service(ControllerServer::new(driver))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(csi),
                async move {
                    let _ = stop.wait_for(|s| *s).await;
                },
            );
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::warn!(error = %e, "test CSI driver server ended");
            }
        }));
        if let Some(path) = &self.registration {
            let reg = bind(path)?;
            let mut stop = self.stop.subscribe();
            let svc = registrar::Registrar {
                driver: self.driver.clone(),
                endpoint: self.socket.clone(),
            };
            let server = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(svc))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(reg),
                    async move {
                        let _ = stop.wait_for(|s| *s).await;
                    },
                );
            self.tasks.push(tokio::spawn(async move {
                if let Err(e) = server.await {
                    tracing::warn!(error = %e, "test registrar server ended");
                }
            }));
        }
        Ok(())
    }

    /// Stops serving and removes both sockets (a driver pod going away).
    /// Volumes stay mounted and the driver's state is kept.
    pub async fn stop(&mut self) {
        self.stop.send_replace(true);
        // Hanging calls end too.
        self.driver.0.fault_changed.send_modify(|g| *g += 1);
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let _ = std::fs::remove_file(&self.socket);
        if let Some(p) = &self.registration {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Stops and serves again on the same sockets, keeping its state (a
    /// driver pod restarted).
    pub async fn restart(&mut self) -> std::io::Result<()> {
        self.stop().await;
        self.serve()
    }

    /// The CSI socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The registration socket, if the driver registers.
    pub fn registration_socket(&self) -> Option<&Path> {
        self.registration.as_deref()
    }

    /// Changes the configuration (capabilities answer from the next call).
    pub fn configure(&self, f: impl FnOnce(&mut DriverConfig)) {
        f(&mut self.driver.0.config.lock());
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.driver.0.calls.lock().clone()
    }

    /// The calls of `method`, in order.
    pub fn calls_of(&self, method: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect()
    }

    /// Waits up to `limit` for a call of `method` that got `code`; the
    /// first such call, if one came.
    pub async fn wait_for_call(&self, method: &str, code: Code, limit: Duration) -> Option<Call> {
        let find = || self.calls_of(method).into_iter().find(|c| c.code == code);
        let mut rx = self.driver.0.recorded.subscribe();
        let wait = async {
            loop {
                if let Some(c) = find() {
                    return Some(c);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(limit, wait).await.ok().flatten()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.driver.0.calls.lock().clear();
    }

    /// Sets a fault on `method` (`NodePublishVolume`, or `*` for all).
    pub fn set_fault(&self, method: &str, fault: Fault) {
        self.driver
            .0
            .faults
            .lock()
            .insert(method.to_string(), fault);
        self.driver.0.fault_changed.send_modify(|g| *g += 1);
    }

    /// Clears the fault on `method`; hanging calls go on.
    pub fn clear_fault(&self, method: &str) {
        self.driver.0.faults.lock().remove(method);
        self.driver.0.fault_changed.send_modify(|g| *g += 1);
    }

    /// What is published on each target path.
    pub fn published(&self) -> HashMap<PathBuf, Published> {
        self.driver.0.volumes.lock().published.clone()
    }

    /// The staging path of each staged volume.
    pub fn staged(&self) -> HashMap<String, PathBuf> {
        self.driver.0.volumes.lock().staged.clone()
    }

    /// The size the last NodeExpandVolume of `volume_id` asked for.
    pub fn expanded_size(&self, volume_id: &str) -> Option<i64> {
        self.driver
            .0
            .volumes
            .lock()
            .expanded
            .get(volume_id)
            .copied()
    }

    /// The directory holding mount volume `volume_id` (a block volume's
    /// file is [`CsiDriver::block_file`]).
    pub fn volume_path(&self, volume_id: &str) -> PathBuf {
        node::volume_dir(&self.driver.config(), volume_id)
    }

    /// The registration statuses the kubelet reported, in order.
    pub fn registration_statuses(&self) -> Vec<RegistrationStatus> {
        self.driver.0.registrations.lock().clone()
    }

    /// Waits up to `limit` for the kubelet to report a registration;
    /// the last status, if any came.
    pub async fn wait_registration(&self, limit: Duration) -> Option<RegistrationStatus> {
        let mut rx = self.driver.0.registered.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|n| *n > 0)).await;
        self.registration_statuses().last().cloned()
    }
}

impl Drop for CsiDriver {
    /// Stops serving, removes the sockets and detaches the loop devices
    /// of the driver's block volumes (a shared host resource no test may
    /// leak), waiting for `losetup` a bounded time.
    fn drop(&mut self) {
        self.driver.detach_all_now();
        self.stop.send_replace(true);
        self.driver.0.fault_changed.send_modify(|g| *g += 1);
        let _ = std::fs::remove_file(&self.socket);
        if let Some(p) = &self.registration {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A gRPC channel to the unix socket at `path` (for CSI or registration
/// clients), failing after `limit`.
pub async fn connect(path: &Path, limit: Duration) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_timeout(limit)
        .timeout(limit)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}
