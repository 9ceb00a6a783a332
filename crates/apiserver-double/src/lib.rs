//! An in-process kube-apiserver test double.
//!
//! It serves the REST semantics a kubelet relies on, over TLS with client
//! certificate and bearer-token authentication:
//! - list and watch with `resourceVersion`, bookmarks, `fieldSelector`
//!   (`spec.nodeName`, `metadata.name`, `metadata.namespace`, any field
//!   path), `labelSelector`, paging, and 410 Gone for a
//!   revision older than the kept history ([`store`]);
//! - create/get/update/patch/delete with `resourceVersion` and `uid`
//!   preconditions, JSON merge, strategic merge and JSON patch ([`patch`]),
//!   status subresources, graceful pod deletion;
//! - pods decoded, defaulted and validated by the double's own ports of the
//!   apiserver's code ([`defaults`], [`validation`], [`quantity`]), with the
//!   QoS class set on create ([`qos`]), never by the kubelet's;
//! - Node, Pod, Lease, Event, CSR (with the kubelet client auto-approver and
//!   signer, [`csr`]), TokenReview and SubjectAccessReview ([`review`]); 401 for unknown credentials, 403 from
//!   RBAC-like rules, the Node authorizer's graph ([`graph`]) and
//!   NodeRestriction ([`auth`]);
//! - ConfigMap, Secret, Namespace, Service (ClusterIPs from
//!   [`strategy::SERVICE_CIDR`]), ServiceAccount with the `token`
//!   subresource (ES256 JWTs, [`token`]), PersistentVolume and
//!   PersistentVolumeClaim ([`strategy`]);
//! - `storage.k8s.io`: CSIDriver, CSINode, VolumeAttachment (with its
//!   status subresource), StorageClass with each release's defaults and
//!   validation ([`storage`]), CSIStorageCapacity and
//!   VolumeAttributesClass stored as written;
//! - what controllers publish: the system namespaces, the `kubernetes`
//!   Service, each namespace's `default` ServiceAccount and
//!   `kube-root-ca.crt` ConfigMap ([`controllers`]); a namespace is created
//!   on first use;
//! - fault injection: refuse connections (stopped, then started again on the
//!   same address with its state kept), hang requests, answer 500s, or go
//!   half-open: accept connections and never answer on them, nor on the
//!   ones already open ([`ApiServer::set_half_open`]).
//!
//! Upstream behaviour it follows is named in each module; what it leaves out
//! (admission beyond NodeRestriction and the opt-in ServiceAccount plugin,
//! [`admission`]; server-side apply, protobuf, field managers) is not used
//! by kubelet-rs.

pub mod admission;
mod audience;
pub mod auth;
pub mod controllers;
pub mod csr;
pub mod defaults;
pub mod field;
pub mod graph;
pub mod patch;
pub mod pki;
pub mod pod;
pub mod profile;
pub mod qos;
pub mod quantity;
pub mod rest;
pub mod review;
pub mod storage;
pub mod store;
pub mod strategy;
pub mod token;
pub mod validation;

#[cfg(test)]
mod kube_tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use parking_lot::{Mutex, RwLock};
use rustls::server::WebPkiClientVerifier;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub use auth::{BOOTSTRAP_TOKEN, Identity};
use store::{Key, Store};

/// Errors starting the double.
#[derive(Debug, thiserror::Error)]
pub enum DoubleError {
    /// Certificates.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// The service account signing key.
    #[error("service account key: {0}")]
    Key(#[from] rcgen::Error),
    /// TLS setup.
    #[error("tls: {0}")]
    Tls(String),
    /// Socket.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A version profile that does not exist (`profile::ENV_VAR` or a parse).
    #[error("unknown apiserver profile {0:?}: expected \"1.19\" or \"1.35\"")]
    Profile(String),
}

/// An injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Normal service.
    None,
    /// Requests hang until the fault is cleared.
    Hang,
    /// Every request gets 500 InternalError.
    ServerError,
}

/// Settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Lifetime of certificates the signer issues.
    pub cert_lifetime: Duration,
    /// Whether kubelet client CSRs are auto-approved (kubeadm's default RBAC).
    pub auto_approve: bool,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Watch history kept (events).
    pub history_limit: usize,
    /// How far back issued certificates start (upstream's signer: 5 minutes).
    pub backdate: Duration,
    /// Bearer tokens known besides the bootstrap token (authenticate to the
    /// double and in TokenReviews).
    pub tokens: HashMap<String, Identity>,
    /// Grants SubjectAccessReviews are decided by (`system:masters` aside).
    pub access_rules: Vec<review::AccessRule>,
    /// `iss` of service account tokens (`--service-account-issuer`).
    pub service_account_issuer: String,
    /// The API audiences (`--api-audiences`): the default audience of
    /// TokenRequests, and what a service account token must be for to
    /// authenticate to the double.
    pub api_audiences: Vec<String>,
    /// Whether the ServiceAccount admission plugin runs on pod creation
    /// ([`admission`]: default service account, the `kube-api-access-*`
    /// volume and mounts, pull secrets from the service account). Upstream
    /// always runs it; off by default here so pods stay as tests wrote them.
    pub service_account_admission: bool,
    /// Serve RuntimeClasses in `node.k8s.io/v1beta1` only (`v1` answers
    /// 404), whatever the profile. Off: as the profile says (1.19:
    /// `v1beta1` only; 1.35: `v1` only).
    pub runtime_class_v1beta1_only: bool,
    /// The apiserver release the double behaves as ([`profile`]). The
    /// default is [`profile::ENV_VAR`] when set, else 1.35.
    pub profile: profile::Profile,
}

/// kubeadm's service account issuer (and API audience).
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

impl Default for Options {
    fn default() -> Self {
        Self {
            cert_lifetime: Duration::from_secs(365 * 86400),
            auto_approve: true,
            bookmark_interval: Duration::from_secs(60),
            history_limit: 10_000,
            backdate: Duration::from_secs(300),
            tokens: HashMap::new(),
            access_rules: Vec::new(),
            service_account_issuer: DEFAULT_ISSUER.to_string(),
            api_audiences: vec![DEFAULT_ISSUER.to_string()],
            service_account_admission: false,
            runtime_class_v1beta1_only: false,
            profile: profile::Profile::from_env_or_default(),
        }
    }
}

/// One request as the audit log would show it.
#[derive(Debug, Clone)]
pub struct Request {
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Query string.
    pub query: String,
    /// Authenticated user, if any.
    pub user: Option<String>,
    /// Serial of the client certificate used, if any.
    pub serial: Option<String>,
    /// Content type.
    pub content_type: String,
    /// When it arrived (tokio time: virtual under paused time).
    pub at: tokio::time::Instant,
}

impl Request {
    /// The query's keys, in order, each once (values left out).
    pub fn query_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for (k, _) in form_urlencoded::parse(self.query.as_bytes()) {
            if !keys.iter().any(|x| *x == k) {
                keys.push(k.into_owned());
            }
        }
        keys
    }
}

/// State shared by connections.
pub struct Shared {
    pub(crate) store: Mutex<Store>,
    pub(crate) options: Options,
    pub(crate) ca: pki::Ca,
    pub(crate) signer: token::Signer,
    pub(crate) tokens: RwLock<HashMap<String, Identity>>,
    pub(crate) cert_lifetime: RwLock<Duration>,
    fault: watch::Sender<Fault>,
    pub(crate) watch_generation: watch::Sender<u64>,
    up: watch::Sender<bool>,
    half_open: watch::Sender<bool>,
    held: std::sync::atomic::AtomicUsize,
    log: Mutex<Vec<Request>>,
}

impl Shared {
    pub(crate) fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    pub(crate) async fn wait_fault_cleared(&self) {
        let mut rx = self.fault.subscribe();
        let _ = rx.wait_for(|f| *f != Fault::Hang).await;
    }

    pub(crate) fn log_request<B>(&self, req: &http::Request<B>, who: Option<&Identity>) {
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.log.lock().push(Request {
            method: req.method().to_string(),
            path: req.uri().path().to_string(),
            query: req.uri().query().unwrap_or("").to_string(),
            user: who.map(|w| w.user.clone()),
            serial: who.and_then(|w| w.serial.clone()),
            content_type,
            at: tokio::time::Instant::now(),
        });
    }
}

/// A running double.
#[derive(Clone)]
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl ApiServer {
    /// Starts a double on 127.0.0.1 with a fresh CA.
    pub async fn start(options: Options) -> Result<Self, DoubleError> {
        // A misspelt profile must not silently test the default release.
        profile::Profile::from_env()?;
        let ca = pki::Ca::new()?;
        let (chain, key) = ca.serving()?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(ca.der())
            .map_err(|e| DoubleError::Tls(e.to_string()))?;
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
            .allow_unauthenticated()
            .build()
            .map_err(|e| DoubleError::Tls(e.to_string()))?;
        let mut tls = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| DoubleError::Tls(e.to_string()))?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mut tokens = auth::default_tokens();
        tokens.extend(options.tokens.clone());
        let mut store = Store::new(options.history_limit);
        controllers::bootstrap(&mut store, &ca.cert_pem, addr.port());
        // The bootstrap objects predate any watch.
        store.compact();
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            signer: token::Signer::new()?,
            cert_lifetime: RwLock::new(options.cert_lifetime),
            options,
            ca,
            tokens: RwLock::new(tokens),
            fault: watch::channel(Fault::None).0,
            watch_generation: watch::channel(0).0,
            up: watch::channel(true).0,
            half_open: watch::channel(false).0,
            held: std::sync::atomic::AtomicUsize::new(0),
            log: Mutex::new(vec![]),
        });
        tokio::spawn(serve(shared.clone(), acceptor, addr, Some(listener)));
        Ok(Self { shared, addr })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The port the double listens on (the `kubernetes` Service's targetPort).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The public key service account tokens are signed with (PEM, P-256, ES256).
    pub fn service_account_public_key_pem(&self) -> String {
        self.shared.signer.public_key_pem()
    }

    /// The `kid` header of service account tokens.
    pub fn service_account_key_id(&self) -> String {
        self.shared.signer.key_id().to_string()
    }

    /// What a service account token the double issued stands for, if it is
    /// still valid for one of `audiences` (empty: the API audiences).
    pub fn review_token(&self, token: &str, audiences: &[String]) -> Option<token::IssuedToken> {
        let auds = if audiences.is_empty() {
            &self.shared.options.api_audiences
        } else {
            audiences
        };
        let store = self.shared.store.lock();
        self.shared
            .signer
            .authenticate(token, auds, &store)
            .map(|(t, _)| t)
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.shared.ca.cert_pem
    }

    /// Issues a client certificate for `user` in `groups`.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<pki::Issued, DoubleError> {
        Ok(self
            .shared
            .ca
            .client(user, groups, Duration::from_secs(86400))?)
    }

    /// Writes a kubeconfig with a bearer token (a bootstrap kubeconfig).
    pub fn write_token_kubeconfig(&self, path: &Path, token: &str) -> std::io::Result<()> {
        let user = format!("    token: {token}\n");
        std::fs::write(
            path,
            self.kubeconfig_text("tls-bootstrap-token-user", &user),
        )
    }

    /// Writes a kubeconfig for a client certificate (embedded).
    pub fn write_cert_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        groups: &[&str],
    ) -> Result<(), DoubleError> {
        use base64::Engine;
        let c = self.client_cert(user, groups)?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        let entry = format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&c.cert_pem),
            b64(&c.key_pem)
        );
        std::fs::write(path, self.kubeconfig_text(user, &entry))?;
        Ok(())
    }

    /// Writes an admin kubeconfig (`kubernetes-admin` in `system:masters`).
    pub fn write_admin_kubeconfig(&self, path: &Path) -> Result<(), DoubleError> {
        self.write_cert_kubeconfig(path, "kubernetes-admin", &["system:masters"])
    }

    fn kubeconfig_text(&self, user: &str, entry: &str) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem().as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: default\n  context:\n    cluster: double\n    user: {user}\ncurrent-context: default\nusers:\n- name: {user}\n  user:\n{entry}",
            self.url()
        )
    }

    /// Sets the lifetime of certificates signed from now on.
    pub fn set_cert_lifetime(&self, d: Duration) {
        *self.shared.cert_lifetime.write() = d;
    }

    /// Injects a fault (or clears it with [`Fault::None`]).
    pub fn set_fault(&self, f: Fault) {
        self.shared.fault.send_replace(f);
    }

    /// Takes the server down (connections refused, open ones cut) or back up.
    pub fn set_up(&self, up: bool) {
        self.shared.up.send_replace(up);
        if !up {
            self.close_watches();
        }
    }

    /// Half-open (a peer that vanished without closing, or a network
    /// dropping packets one way): connections are accepted but never
    /// answered, not even the TLS handshake, and connections already open
    /// stop answering mid-request (watches included). Clearing it serves new
    /// connections again, while the held ones stay open and unanswered: on a
    /// real network nothing tells the client they are dead, so its deadlines
    /// and its closing of connections after heartbeat failures must. Held
    /// connections close when the double is stopped ([`ApiServer::set_up`]).
    pub fn set_half_open(&self, half_open: bool) {
        self.shared.half_open.send_replace(half_open);
    }

    /// Connections half-open mode has held unanswered so far (new and
    /// already open ones), counted once each.
    pub fn held_connections(&self) -> usize {
        self.shared.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Ends every open watch stream (clients re-watch from their last revision).
    pub fn close_watches(&self) {
        self.shared.watch_generation.send_modify(|g| *g += 1);
    }

    /// Drops the watch history: re-watching from any older revision gets 410 Gone.
    pub fn compact(&self) {
        self.shared.store.lock().compact();
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        self.shared.store.lock().revision()
    }

    /// One stored object (`resource` plural; `namespace` "" when cluster-scoped).
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store
            .lock()
            .get(&Key {
                resource: resource.into(),
                namespace: namespace.into(),
                name: name.into(),
            })
            .cloned()
    }

    /// All stored objects of a resource.
    pub fn list(&self, resource: &str) -> Vec<Value> {
        self.shared.store.lock().list(resource, None)
    }

    /// The release the double behaves as.
    pub fn profile(&self) -> profile::Profile {
        self.shared.options.profile
    }

    /// Requests seen so far, in arrival order (method, path, query, who).
    pub fn requests(&self) -> Vec<Request> {
        self.shared.log.lock().clone()
    }
}

async fn serve(
    shared: Arc<Shared>,
    acceptor: TlsAcceptor,
    addr: SocketAddr,
    mut listener: Option<TcpListener>,
) {
    let mut up = shared.up.subscribe();
    loop {
        if !*up.borrow_and_update() {
            // Down: no listener, so connections are refused.
            listener = None;
            if up.changed().await.is_err() {
                return;
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "apiserver double cannot rebind");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        loop {
            tokio::select! {
                _ = up.changed() => break,
                accepted = l.accept() => {
                    let Ok((tcp, _)) = accepted else { continue };
                    tokio::spawn(connection(shared.clone(), acceptor.clone(), tcp));
                }
            }
        }
        drop(l);
    }
}

/// Keeps `held` (a connection, or a handshake in progress) open and unpolled
/// until the double is stopped, then drops it: the peer sees the close.
async fn hold<T>(shared: &Shared, held: T) {
    shared
        .held
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut up = shared.up.subscribe();
    let _ = up.wait_for(|u| !*u).await.is_ok();
    drop(held);
}

async fn until_half_open(half_open: &mut watch::Receiver<bool>) {
    if half_open.wait_for(|h| *h).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn connection(shared: Arc<Shared>, acceptor: TlsAcceptor, tcp: tokio::net::TcpStream) {
    let mut half_open = shared.half_open.subscribe();
    if *half_open.borrow_and_update() {
        return hold(&shared, tcp).await;
    }
    let accept = acceptor.accept(tcp);
    let mut accept = std::pin::pin!(accept);
    let tls = tokio::select! {
        tls = &mut accept => match tls {
            Ok(tls) => tls,
            Err(_) => return,
        },
        () = until_half_open(&mut half_open) => return hold(&shared, accept).await,
    };
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| pki::identity_of(c.as_ref()))
        .map(|(user, groups, serial)| {
            let g: Vec<&str> = groups.iter().map(String::as_str).collect();
            Identity {
                serial: Some(serial),
                ..Identity::new(&user, &g)
            }
        });
    let s = shared.clone();
    let svc = hyper::service::service_fn(move |req| {
        let s = s.clone();
        let peer = peer.clone();
        async move { Ok::<_, std::convert::Infallible>(rest::handle(s, peer, req).await) }
    });
    let mut up = shared.up.subscribe();
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = &mut conn => {}
        _ = async { up.wait_for(|u| !*u).await.is_ok() } => {}
        () = until_half_open(&mut half_open) => hold(&shared, conn).await,
    }
}
