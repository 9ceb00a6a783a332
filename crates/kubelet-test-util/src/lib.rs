//! Test utilities shared by every kubelet-rs crate's tests, compiled once:
//! the in-process apiserver double with admin and node clients ([`Cluster`]),
//! a recorder that keeps events ([`RecordingRecorder`]), pod builders
//! ([`pods`]), the fake CRI runtime (re-exported from `cri`) and a
//! host-path CSI driver with its registrar ([`csi_driver`]).
//!
//! Clients here are built with kube-rs alone, not with the kubelet's client
//! code, so tests of that code are not checked by the code itself.
//!
//! The double behaves as one apiserver release ([`Profile`]): 1.35 unless
//! `KUBELET_RS_APISERVER_PROFILE` (`1.19` or `1.35`) names another, so a
//! whole suite can run against each release; [`Cluster::start_profile`]
//! pins one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod blocking;
pub mod cri_proxy;
pub mod csi_driver;
pub mod pods;

use apiserver_double::{ApiServer, Options};

pub use apiserver_double::profile::{ENV_VAR as PROFILE_ENV_VAR, Profile};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use cri::fake::FakeRuntime;

/// A double and clients for it.
pub struct Cluster {
    /// The double.
    pub api: ApiServer,
    /// Scratch space for kubeconfigs and certificates.
    pub dir: tempfile::TempDir,
}

/// A kube-rs client for the kubeconfig at `path`.
pub async fn client_for(path: &std::path::Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

impl Cluster {
    /// Starts a double with `options` (their `profile` defaults to
    /// [`PROFILE_ENV_VAR`], else 1.35).
    pub async fn start(options: Options) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = ApiServer::start(options).await.expect("double starts");
        Self {
            api,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// Starts a double behaving as `profile`, whatever the environment says.
    pub async fn start_profile(profile: Profile, options: Options) -> Self {
        Self::start(Options { profile, ..options }).await
    }

    /// The release the double behaves as.
    pub fn profile(&self) -> Profile {
        self.api.profile()
    }

    /// A client for `kubernetes-admin` (system:masters).
    pub async fn admin(&self) -> Client {
        let path = self.dir.path().join("admin.conf");
        self.api
            .write_admin_kubeconfig(&path)
            .expect("admin kubeconfig");
        client_for(&path).await
    }

    /// A client for the kubelet of `node` (system:node:<node> in system:nodes).
    pub async fn node_client(&self, node: &str) -> Client {
        let path = self.dir.path().join(format!("{node}.conf"));
        self.api
            .write_cert_kubeconfig(&path, &format!("system:node:{node}"), &["system:nodes"])
            .expect("node kubeconfig");
        client_for(&path).await
    }
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
