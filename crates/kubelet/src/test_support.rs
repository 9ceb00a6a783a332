//! Shared fixtures for tests against the apiserver double.

use apiserver_double::{ApiServer, Options};
use kube::Client;

/// A double and clients for it.
pub struct Cluster {
    /// The double.
    pub api: ApiServer,
    /// Scratch space for kubeconfigs and certificates.
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts a double with `options`.
    pub async fn start(options: Options) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = ApiServer::start(options).await.expect("double starts");
        Self {
            api,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// A client for `kubernetes-admin` (system:masters).
    pub async fn admin(&self) -> Client {
        let path = self.dir.path().join("admin.conf");
        self.api
            .write_admin_kubeconfig(&path)
            .expect("admin kubeconfig");
        crate::kubeclient::from_kubeconfig(&path, 1000.0, 1000)
            .await
            .expect("admin client")
            .0
    }

    /// A client for the kubelet of `node` (system:node:<node> in system:nodes).
    pub async fn node_client(&self, node: &str) -> Client {
        let path = self.dir.path().join(format!("{node}.conf"));
        self.api
            .write_cert_kubeconfig(&path, &format!("system:node:{node}"), &["system:nodes"])
            .expect("node kubeconfig");
        crate::kubeclient::from_kubeconfig(&path, 50.0, 100)
            .await
            .expect("node client")
            .0
    }
}

/// Health over a fake runtime, with its PLEG relisting until `stop`.
pub fn health(
    fake: &cri::fake::FakeRuntime,
    stop: &tokio_util::sync::CancellationToken,
) -> std::sync::Arc<crate::healthz::Health> {
    use std::sync::Arc;
    use std::time::Duration;
    let m = Arc::new(kubelet_runtime::KubeRuntimeManager::new(
        Arc::new(fake.clone()),
        Arc::new(fake.clone()),
        kubelet_runtime::RuntimeConfig::default(),
    ));
    let (pleg, _rx) = kubelet_runtime::pleg::GenericPleg::new(m, 1, Duration::from_secs(1));
    tokio::spawn(pleg.clone().run(stop.child_token()));
    Arc::new(crate::healthz::Health {
        heartbeat: Arc::new(crate::sync_loop::Heartbeat::default()),
        max_loop_stall: Duration::from_secs(300),
        pleg,
        runtime_error: parking_lot::RwLock::new(None),
        network_error: parking_lot::RwLock::new(None),
    })
}

/// Keeps every event for assertions.
#[derive(Default)]
pub struct RecordingRecorder {
    /// (reason, message) in order.
    pub events: parking_lot::Mutex<Vec<(String, String)>>,
}

impl kubelet_types::events::Recorder for RecordingRecorder {
    fn event(
        &self,
        _: &k8s_openapi::api::core::v1::ObjectReference,
        _: kubelet_types::events::EventType,
        reason: &str,
        message: String,
    ) {
        self.events.lock().push((reason.to_string(), message));
    }
}

impl RecordingRecorder {
    /// Reasons recorded so far.
    pub fn reasons(&self) -> Vec<String> {
        self.events.lock().iter().map(|(r, _)| r.clone()).collect()
    }
}
