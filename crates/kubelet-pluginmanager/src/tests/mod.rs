//! The plugin manager against real `Registration` servers on unix sockets
//! (as upstream's `plugin_watcher_test.go` and `reconciler_test.go`), with a
//! handler that records its calls. Real time: sockets and paused time do
//! not mix; every wait has a generous deadline.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::pb::registration_server::{Registration, RegistrationServer};
use crate::pb::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use crate::{
    CSI_PLUGIN, CallTimeouts, DEVICE_PLUGIN, HandlerError, PluginHandler, PluginManager,
    PluginManagerConfig, PluginRegistration,
};

mod monitor;
mod quiet;

const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Validate(String),
    Register(String, PathBuf, Vec<String>),
    Deregister(String, PathBuf),
}

#[derive(Default)]
struct FakeHandler {
    calls: Mutex<Vec<Call>>,
    fail_register: bool,
}

impl FakeHandler {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }
}

#[async_trait::async_trait]
impl PluginHandler for FakeHandler {
    async fn validate_plugin(&self, plugin: &PluginRegistration<'_>) -> Result<(), HandlerError> {
        self.calls
            .lock()
            .push(Call::Validate(plugin.name.to_string()));
        if plugin.name.starts_with("bad") {
            return Err(HandlerError::new(format!(
                "plugin name {} is refused",
                plugin.name
            )));
        }
        Ok(())
    }

    async fn register_plugin(
        &self,
        plugin: &PluginRegistration<'_>,
        _timeout: Duration,
    ) -> Result<(), HandlerError> {
        self.calls.lock().push(Call::Register(
            plugin.name.to_string(),
            plugin.endpoint.to_path_buf(),
            plugin.versions.to_vec(),
        ));
        if self.fail_register {
            return Err(HandlerError::new("node info unavailable"));
        }
        Ok(())
    }

    async fn deregister_plugin(&self, name: &str, endpoint: &Path) {
        self.calls
            .lock()
            .push(Call::Deregister(name.to_string(), endpoint.to_path_buf()));
    }
}

/// A plugin's registration service.
struct TestPlugin {
    info: PluginInfo,
    /// `GetInfo` never answers.
    silent: bool,
    /// `GetInfo` fails this many times first.
    failures: AtomicUsize,
    /// `GetInfo` fails while set.
    unhealthy: Arc<AtomicBool>,
    statuses: mpsc::UnboundedSender<RegistrationStatus>,
}

#[tonic::async_trait]
impl Registration for TestPlugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        if self.silent {
            std::future::pending::<()>().await;
        }
        if self.unhealthy.load(Ordering::SeqCst) {
            return Err(Status::unavailable("hung"));
        }
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err(Status::unavailable("starting up"));
        }
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let _ = self.statuses.send(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

struct Served {
    stop: CancellationToken,
    unhealthy: Arc<AtomicBool>,
    statuses: mpsc::UnboundedReceiver<RegistrationStatus>,
}

impl Served {
    async fn next_status(&mut self) -> RegistrationStatus {
        tokio::time::timeout(DEADLINE, self.statuses.recv())
            .await
            .expect("a registration status in time")
            .expect("status channel open")
    }
}

fn info(kind: &str, name: &str, endpoint: &str, versions: &[&str]) -> PluginInfo {
    PluginInfo {
        r#type: kind.to_string(),
        name: name.to_string(),
        endpoint: endpoint.to_string(),
        supported_versions: versions.iter().map(|v| v.to_string()).collect(),
    }
}

fn serve_plugin(socket: &Path, info: PluginInfo, silent: bool, failures: usize) -> Served {
    let (tx, statuses) = mpsc::unbounded_channel();
    let unhealthy = Arc::new(AtomicBool::new(false));
    let plugin = TestPlugin {
        info,
        silent,
        failures: AtomicUsize::new(failures),
        unhealthy: unhealthy.clone(),
        statuses: tx,
    };
    let listener = tokio::net::UnixListener::bind(socket).expect("bind plugin socket");
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let stop = CancellationToken::new();
    let shutdown = stop.clone().cancelled_owned();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(plugin))
            .serve_with_incoming_shutdown(incoming, shutdown),
    );
    Served {
        stop,
        unhealthy,
        statuses,
    }
}

struct Running {
    dir: PathBuf,
    actual: crate::ActualStateOfWorld,
    desired: crate::DesiredStateOfWorld,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), crate::Error>>,
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("manager stops in time")
            .expect("manager task")
            .expect("manager result");
    }
}

fn start(dir: &Path, handler: Arc<FakeHandler>, timeouts: CallTimeouts) -> Running {
    let config = PluginManagerConfig {
        rescan_interval: Duration::from_millis(300),
        timeouts,
        ..PluginManagerConfig::default()
    };
    start_with(dir, handler, config)
}

fn start_with(dir: &Path, handler: Arc<FakeHandler>, config: PluginManagerConfig) -> Running {
    let mut handlers: HashMap<&'static str, Arc<dyn PluginHandler>> = HashMap::new();
    handlers.insert(CSI_PLUGIN, handler.clone());
    handlers.insert(DEVICE_PLUGIN, handler);
    let manager = PluginManager::new(dir, handlers, config);
    let actual = manager.actual_state();
    let desired = manager.desired_state();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.run(cancel.clone()));
    Running {
        dir: dir.to_path_buf(),
        actual,
        desired,
        cancel,
        task,
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn registry(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("plugins_registry")
}

#[tokio::test]
async fn registers_sockets_present_at_start_and_created_later() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(dir.join("csi")).expect("mkdir");
    let early_sock = dir.join("csi/early.sock");
    let mut early = serve_plugin(
        &early_sock,
        info(
            CSI_PLUGIN,
            "early.csi.example.com",
            "/var/lib/kubelet/plugins/early/csi.sock",
            &["1.0.0"],
        ),
        false,
        0,
    );
    let handler = Arc::new(FakeHandler::default());
    let running = start(&dir, handler.clone(), CallTimeouts::default());

    let status = early.next_status().await;
    assert!(status.plugin_registered, "{status:?}");
    assert_eq!(status.error, "");
    assert!(handler.calls().contains(&Call::Register(
        "early.csi.example.com".into(),
        PathBuf::from("/var/lib/kubelet/plugins/early/csi.sock"),
        vec!["1.0.0".into()],
    )));

    // A plugin without an endpoint of its own is served on its socket.
    let late_sock = dir.join("late.sock");
    let mut late = serve_plugin(
        &late_sock,
        info(DEVICE_PLUGIN, "example.com/gpu", "", &["v1beta1"]),
        false,
        0,
    );
    assert!(late.next_status().await.plugin_registered);
    assert!(handler.calls().contains(&Call::Register(
        "example.com/gpu".into(),
        late_sock.clone(),
        vec!["v1beta1".into()],
    )));
    let names: Vec<_> = running
        .actual
        .registered_plugins()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, vec!["early.csi.example.com", "example.com/gpu"]);
    let registered = running.actual.plugin_at(&late_sock).expect("late plugin");
    assert_eq!(registered.plugin_type, DEVICE_PLUGIN);
    assert_eq!(registered.endpoint, late_sock);
    assert_eq!(
        running.desired.sockets(),
        vec![early_sock.clone(), late_sock.clone()]
    );
    running.stop().await;
    early.stop.cancel();
    late.stop.cancel();
}

#[tokio::test]
async fn creates_the_registry_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("root/plugins_registry");
    let running = start(
        &dir,
        Arc::new(FakeHandler::default()),
        CallTimeouts::default(),
    );
    wait_for("the registry directory", || dir.is_dir()).await;
    assert_eq!(running.dir, dir);
    running.stop().await;
}

#[tokio::test]
async fn validation_failure_is_reported_and_the_plugin_is_not_registered() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start(&dir, handler.clone(), CallTimeouts::default());
    let mut bad = serve_plugin(
        &dir.join("bad.sock"),
        info(CSI_PLUGIN, "bad.example.com", "", &["1.0.0"]),
        false,
        0,
    );

    let status = bad.next_status().await;
    assert!(!status.plugin_registered);
    assert_eq!(
        status.error,
        "RegisterPlugin error -- plugin validation failed with err: plugin name bad.example.com is refused"
    );
    assert!(running.actual.registered_plugins().is_empty());
    assert!(
        !handler
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Register(..)))
    );
    running.stop().await;
    bad.stop.cancel();
}

#[tokio::test]
async fn unknown_plugin_type_is_rejected_with_upstreams_message() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start(&dir, handler.clone(), CallTimeouts::default());
    let sock = dir.join("dra.sock");
    let mut plugin = serve_plugin(
        &sock,
        info("DRAPlugin", "dra.example.com", "", &["v1"]),
        false,
        0,
    );

    let status = plugin.next_status().await;
    assert!(!status.plugin_registered);
    assert_eq!(
        status.error,
        format!(
            "RegisterPlugin error -- no handler registered for plugin type: DRAPlugin at socket {}",
            sock.display()
        )
    );
    assert!(handler.calls().is_empty());
    running.stop().await;
    plugin.stop.cancel();
}

#[tokio::test]
async fn a_removed_socket_is_deregistered() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start(&dir, handler.clone(), CallTimeouts::default());
    let sock = dir.join("p.sock");
    let mut plugin = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "p.example.com", "/plugins/p.sock", &["1.0.0"]),
        false,
        0,
    );
    assert!(plugin.next_status().await.plugin_registered);

    plugin.stop.cancel();
    std::fs::remove_file(&sock).expect("rm socket");
    let gone = Call::Deregister("p.example.com".into(), PathBuf::from("/plugins/p.sock"));
    wait_for("the deregistration", || handler.calls().contains(&gone)).await;
    assert!(running.actual.registered_plugins().is_empty());
    assert!(running.desired.sockets().is_empty());
    running.stop().await;
}

#[tokio::test]
async fn a_restarted_plugin_registers_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start(&dir, handler.clone(), CallTimeouts::default());
    let sock = dir.join("r.sock");
    let mut first = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "r.example.com", "", &["1.0.0"]),
        false,
        0,
    );
    assert!(first.next_status().await.plugin_registered);

    // The plugin restarts: the old socket goes and a new one is bound at
    // the same path, speaking a newer version.
    first.stop.cancel();
    std::fs::remove_file(&sock).expect("rm socket");
    let mut second = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "r.example.com", "", &["1.1.0"]),
        false,
        0,
    );
    assert!(second.next_status().await.plugin_registered);

    let lifecycle: Vec<_> = handler
        .calls()
        .into_iter()
        .filter(|c| !matches!(c, Call::Validate(_)))
        .collect();
    assert_eq!(
        lifecycle,
        vec![
            Call::Register("r.example.com".into(), sock.clone(), vec!["1.0.0".into()]),
            Call::Deregister("r.example.com".into(), sock.clone()),
            Call::Register("r.example.com".into(), sock.clone(), vec!["1.1.0".into()]),
        ]
    );
    let registered = running.actual.plugin_at(&sock).expect("registered");
    assert_eq!(registered.versions, vec!["1.1.0"]);
    running.stop().await;
    second.stop.cancel();
}

#[tokio::test]
async fn a_silent_plugin_does_not_block_another() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let silent = serve_plugin(
        &dir.join("a-silent.sock"),
        info(CSI_PLUGIN, "silent.example.com", "", &["1.0.0"]),
        true,
        0,
    );
    // A GetInfo deadline longer than the test's: were sockets handled one
    // after another, the second plugin would wait past the deadline.
    let timeouts = CallTimeouts {
        get_info: Duration::from_secs(60),
        ..CallTimeouts::default()
    };
    let handler = Arc::new(FakeHandler::default());
    let running = start(&dir, handler.clone(), timeouts);
    let mut other = serve_plugin(
        &dir.join("b-other.sock"),
        info(CSI_PLUGIN, "other.example.com", "", &["1.0.0"]),
        false,
        0,
    );
    assert!(other.next_status().await.plugin_registered);
    let names: Vec<_> = running
        .actual
        .registered_plugins()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, vec!["other.example.com"]);
    // Stopping does not wait for the silent plugin's call.
    running.stop().await;
    silent.stop.cancel();
    other.stop.cancel();
}

#[tokio::test]
async fn a_failed_get_info_is_retried() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start(&dir, handler.clone(), CallTimeouts::default());
    let mut plugin = serve_plugin(
        &dir.join("slow.sock"),
        info(CSI_PLUGIN, "slow.example.com", "", &["1.0.0"]),
        false,
        2,
    );
    // The first two GetInfo calls fail; the backoff (0.5 s, 1 s) brings a
    // third, which registers.
    assert!(plugin.next_status().await.plugin_registered);
    assert_eq!(running.actual.registered_plugins().len(), 1);
    running.stop().await;
    plugin.stop.cancel();
}

#[tokio::test]
async fn a_failed_registration_is_reported_not_retried_and_still_deregistered() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler {
        fail_register: true,
        ..FakeHandler::default()
    });
    let running = start(&dir, handler.clone(), CallTimeouts::default());
    let sock = dir.join("f.sock");
    let mut plugin = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "f.example.com", "", &["1.0.0"]),
        false,
        0,
    );
    let status = plugin.next_status().await;
    assert!(!status.plugin_registered);
    assert_eq!(
        status.error,
        "RegisterPlugin error -- plugin registration failed with err: node info unavailable"
    );
    assert!(running.actual.registered_plugins().is_empty());
    // Several rescans later the handler was still asked only once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let registers = handler
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Register(..)))
        .count();
    assert_eq!(registers, 1);

    plugin.stop.cancel();
    std::fs::remove_file(&sock).expect("rm socket");
    let gone = Call::Deregister("f.example.com".into(), sock.clone());
    wait_for("the deregistration", || handler.calls().contains(&gone)).await;
    running.stop().await;
}

#[tokio::test]
async fn a_refused_dial_names_the_socket_and_the_cause() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sock = tmp.path().join("dead.sock");
    // A socket file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&sock).expect("bind"));
    let Err(e) = crate::client::PluginClient::dial(&sock, CallTimeouts::default()).await else {
        panic!("dialing a dead socket succeeded");
    };
    let text = e.to_string();
    let prefix = format!(
        "RegisterPlugin error -- dial failed at socket {0}, err: failed to dial socket {0}, err: transport error: ",
        sock.display()
    );
    assert!(text.starts_with(&prefix), "{text}");
    assert!(text.contains("onnection refused"), "{text}");
}
