//! The node API's wiring (upstream `ListenAndServeKubeletServer` and
//! `ListenAndServeKubeletReadOnlyServer`): binds 10250 and the read-only
//! port in [`NodeApi::bind`], and in [`NodeApi::spawn`] assembles the
//! handler sets of `kubelet_server::server` over the agent's host and serves
//! them on the shared task tracker.

use std::net::SocketAddr;
use std::sync::Arc;

use kubelet_config::KubeletConfig;
use kubelet_config::server::{Exposure, ServerConfig};
use kubelet_server::ServerError;
use kubelet_server::auth::{
    AnonymousSettings, AuthenticationSettings, AuthorizationSettings, KubeletAuth,
    WebhookAuthnSettings, WebhookAuthzSettings, X509Settings,
};
use kubelet_server::healthz::{Checks, LogCheck};
use kubelet_server::metrics::{ServerType, instrument};
use kubelet_server::serve;
use kubelet_server::server::{Debugging, VerbositySetter};
use kubelet_server::tls::TlsSettings;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn};

use kubelet_client::certificate::self_signed;
use kubelet_client::{ServingCert, ServingCertManager};

use super::spawn::spawn_in;
use crate::host::KubeletHost;

use crate::error::Error as AppError;

/// The node API's sockets, bound before anything starts, and what the
/// secure port checks each request with.
pub(super) struct NodeApi {
    pub(super) secure: Option<TcpListener>,
    pub(super) read_only: Option<TcpListener>,
    /// Authentication and authorization; `None` when the server is off.
    auth: Option<Arc<KubeletAuth>>,
    /// The TLS configuration of the secure port.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Keeps the serving certificate current.
    cert_task: Option<CertTask>,
}

async fn listen(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Listen { what, addr, source })
}

impl NodeApi {
    /// Binds `address:port` (unless `enableServer` is off) and
    /// `address:readOnlyPort` (when set), failing as upstream does when a
    /// port is taken.
    /// Builds upstream's `BuildAuth` from the settings (webhook modes need
    /// `client`, as upstream: standalone kubelets use the legacy defaults)
    /// and the TLS configuration serving `cert`.
    pub(super) async fn build(
        cfg: &KubeletConfig,
        client: Option<kube::Client>,
        host_ips: &[std::net::IpAddr],
    ) -> Result<Self, AppError> {
        let s = &cfg.server;
        let mut api = Self::bind(s).await?;
        if api.secure.is_none() {
            return Ok(api);
        }
        let (cert, cert_task) = serving_cert(cfg, client.clone(), host_ips).await?;
        api.cert_task = Some(cert_task);
        let authn = AuthenticationSettings {
            x509: X509Settings {
                client_ca_file: s.authentication.client_ca_file.clone(),
            },
            webhook: WebhookAuthnSettings {
                enabled: s.authentication.webhook_enabled,
                cache_ttl: s.authentication.webhook_cache_ttl,
            },
            anonymous: AnonymousSettings {
                enabled: s.authentication.anonymous_enabled,
            },
        };
        let authz = AuthorizationSettings {
            mode: s.authorization.mode.as_str().to_string(),
            webhook: WebhookAuthzSettings {
                cache_authorized_ttl: s.authorization.cache_authorized_ttl,
                cache_unauthorized_ttl: s.authorization.cache_unauthorized_ttl,
            },
        };
        // KubeletFineGrainedAuthz: beta and on by default since 1.33.
        let fine_grained = cfg
            .feature_gates
            .get("KubeletFineGrainedAuthz")
            .copied()
            .unwrap_or(true);
        let auth = KubeletAuth::build(&cfg.node_name, client, &authn, &authz, fine_grained).await?;
        let tls = TlsSettings {
            cipher_suites: s.tls_cipher_suites.clone(),
            min_version: s.tls_min_version.clone().unwrap_or_default(),
            request_client_certs: s.authentication.client_ca_file.is_some(),
        };
        api.tls = Some(Arc::new(kubelet_server::tls::server_config(&tls, cert)?));
        api.auth = Some(Arc::new(auth));
        Ok(api)
    }

    async fn bind(cfg: &ServerConfig) -> Result<Self, AppError> {
        if !cfg.enable_server {
            return Ok(Self {
                secure: None,
                read_only: None,
                auth: None,
                tls: None,
                cert_task: None,
            });
        }
        log_exposure(cfg);
        let secure = listen("server", SocketAddr::new(cfg.address, cfg.port)).await?;
        let read_only = match cfg.read_only_port {
            0 => None,
            p => Some(listen("read-only server", SocketAddr::new(cfg.address, p)).await?),
        };
        Ok(Self {
            secure: Some(secure),
            read_only,
            auth: None,
            tls: None,
            cert_task: None,
        })
    }

    /// Where each server listens.
    pub(super) fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        (
            self.secure.as_ref().and_then(|l| l.local_addr().ok()),
            self.read_only.as_ref().and_then(|l| l.local_addr().ok()),
        )
    }
}

/// Says once at start who may use the node API: kubelet-rs narrowed it to
/// loopback, or which flags and config fields opened it to anonymous clients
/// with `AlwaysAllow`.
fn log_exposure(cfg: &ServerConfig) {
    match &cfg.exposure {
        Exposure::Guarded => {}
        Exposure::LoopbackOnly => warn!(
            address = %cfg.address,
            "Serving the node API on loopback only: anonymous requests with AlwaysAllow come from \
             upstream's legacy flag defaults alone. Give --anonymous-auth=false and \
             --authorization-mode=Webhook (or a --config file) to serve it securely on every \
             address; --address, --anonymous-auth=true or --authorization-mode=AlwaysAllow keeps \
             upstream's open behaviour"
        ),
        Exposure::Open { by } => warn!(
            address = %cfg.address,
            opened_by = %by.join(", "),
            "The node API allows anonymous requests everything (AlwaysAllow), including exec in \
             every container"
        ),
    }
}

/// What the node API is assembled from.
pub(super) struct Wiring<'a> {
    pub(super) cfg: &'a KubeletConfig,
    pub(super) host: Arc<KubeletHost>,
    pub(super) metrics: Arc<kubelet_metrics::KubeletMetrics>,
}

impl NodeApi {
    /// Serves the read-only port (plain HTTP, no authentication: the
    /// handlers that need none, and 405 on the debugging paths, as
    /// upstream's read-only server) and 10250.
    pub(super) fn spawn(self, w: Wiring<'_>, tasks: &TaskTracker, stop: &CancellationToken) {
        let log = Arc::new(LogCheck::default());
        spawn_in(
            tasks,
            info_span!("log_check"),
            log.clone().run(stop.child_token()),
        );
        let host: Arc<dyn kubelet_server::HostInterface> = w.host.clone();
        let checks = Arc::new(Checks::new(host.clone(), log));
        if let Some(l) = self.read_only {
            let router = kubelet_server::server::auth_not_required(host.clone(), checks.clone())
                .merge(kubelet_server::metrics::routes(w.metrics.clone()))
                .merge(kubelet_server::stats::routes(w.host.clone()))
                .merge(kubelet_server::server::debugging_disabled());
            let router = instrument(router, w.metrics.clone(), ServerType::ReadOnly);
            let stop = stop.child_token();
            info!(addr = ?l.local_addr().ok(), "Starting the read-only server");
            spawn_in(
                tasks,
                info_span!("read_only_server"),
                serve::serve_plain(l, router, stop, tasks.clone()),
            );
        }
        let (Some(l), Some(tls), Some(auth)) = (self.secure, self.tls, self.auth) else {
            return;
        };
        if let Some(task) = self.cert_task {
            spawn_in(tasks, info_span!("serving_cert"), task(stop.child_token()));
        }
        let s = &w.cfg.server;
        let mut router = kubelet_server::server::auth_not_required(host.clone(), checks)
            .merge(kubelet_server::metrics::routes(w.metrics.clone()))
            .merge(kubelet_server::stats::routes(w.host.clone()));
        if s.enable_debugging_handlers {
            let verbosity: Option<Arc<dyn VerbositySetter>> = if s.enable_debug_flags_handler {
                Some(Arc::new(LogVerbosity))
            } else {
                None
            };
            router = router
                .merge(kubelet_server::server::debugging(Debugging {
                    host: host.clone(),
                    configz: kubelet_config::configz::configz(w.cfg),
                    verbosity,
                }))
                .merge(kubelet_server::streaming::routes(w.host.clone()))
                .merge(kubelet_server::logs::routes(w.host.clone()));
        } else {
            router = router.merge(kubelet_server::server::debugging_disabled());
        }
        // Counted outside the auth filter, so 401s and 403s are counted too.
        let router = instrument(
            kubelet_server::auth::layer(router, auth.clone()),
            w.metrics.clone(),
            ServerType::ReadWrite,
        );
        let ca_stop = stop.child_token();
        spawn_in(tasks, info_span!("client_ca_reload"), async move {
            auth.run_ca_reload(ca_stop).await;
        });
        info!(addr = ?l.local_addr().ok(), "Starting the kubelet server");
        spawn_in(
            tasks,
            info_span!("server"),
            serve::serve_tls(l, tls, router, stop.child_token(), tasks.clone()),
        );
    }
}

/// The agent's `/debug/flags/v` setter: klog's `-v` over the tracing filter.
pub(super) struct LogVerbosity;

impl kubelet_server::server::VerbositySetter for LogVerbosity {
    fn set_verbosity(&self, level: u8) -> Result<(), ServerError> {
        kubelet_config::logs::set_verbosity(level).map_err(|e| ServerError::Verbosity(Box::new(e)))
    }
}

/// A task that keeps the serving certificate current (file reloads or CSR
/// rotation), started with the rest of the kubelet.
pub(super) type CertTask =
    Box<dyn FnOnce(CancellationToken) -> futures::future::BoxFuture<'static, ()> + Send>;

/// The serving certificate, as upstream `InitializeTLS` and `NewMainKubelet`
/// choose it: with `serverTLSBootstrap` (and an apiserver), a
/// `kubernetes.io/kubelet-serving` certificate from a CSR, rotated, with
/// `tlsCertFile` as the fallback until one is issued; else
/// `tlsCertFile`/`tlsPrivateKeyFile`; else a self-signed pair in the cert
/// directory. Files are re-read when they change.
pub(super) async fn serving_cert(
    cfg: &KubeletConfig,
    client: Option<kube::Client>,
    host_ips: &[std::net::IpAddr],
) -> Result<(Arc<ServingCert>, CertTask), AppError> {
    let s = &cfg.server;
    let files = match (&s.tls_cert_file, &s.tls_private_key_file) {
        (Some(c), Some(k)) => Some((c.clone(), k.clone())),
        _ => None,
    };
    if s.server_tls_bootstrap
        && let Some(client) = client
    {
        let addresses = kubelet_node::nodestatus::setters::addresses(host_ips, &cfg.node_name);
        let (_tx, rx) = tokio::sync::watch::channel(addresses);
        let mut m =
            ServingCertManager::new(client, cfg.cert_dir.clone(), cfg.node_name.clone(), rx);
        if let Some((c, k)) = files {
            m = m.with_fallback_files(c, k);
        }
        m.load_stored().await;
        let cert = m.cert();
        let task: CertTask = Box::new(move |stop| {
            Box::pin(async move {
                // The addresses are fixed for the kubelet's life today; the
                // sender lives as long as the manager.
                let _tx = _tx;
                m.run(stop).await;
            })
        });
        return Ok((cert, task));
    }
    let (cert, (cert_file, key_file)) = match files {
        Some((c, k)) => (ServingCert::from_files(&c, &k).await?, (c, k)),
        None => {
            // Upstream names the hostname alone in the self-signed pair.
            let dir = &cfg.cert_dir;
            let cert = self_signed::load_or_generate(dir, &cfg.node_name, &[], &[]).await?;
            (
                cert,
                (self_signed::cert_path(dir), self_signed::key_path(dir)),
            )
        }
    };
    let reload = cert.clone();
    let task: CertTask = Box::new(move |stop| {
        Box::pin(async move { reload.reload_files(cert_file, key_file, stop).await })
    });
    Ok((cert, task))
}
