//! The node API's wiring (upstream `ListenAndServeKubeletServer` and
//! `ListenAndServeKubeletReadOnlyServer`): binds 10250 and the read-only
//! port in [`NodeApi::bind`], and in [`NodeApi::spawn`] assembles the
//! handler sets of `kubelet_server::server` over the agent's host and serves
//! them on the shared task tracker.

use std::net::SocketAddr;
use std::sync::Arc;

use kubelet_config::KubeletConfig;
use kubelet_config::server::ServerConfig;
use kubelet_server::ServerError;
use kubelet_server::auth::{
    AnonymousSettings, AuthenticationSettings, AuthorizationSettings, KubeletAuth,
    WebhookAuthnSettings, WebhookAuthzSettings, X509Settings,
};
use kubelet_server::healthz::{Checks, LogCheck};
use kubelet_server::serve;
use kubelet_server::server::{Debugging, VerbositySetter};
use kubelet_server::tls::TlsSettings;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span};

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
        cert: Arc<dyn rustls::server::ResolvesServerCert>,
    ) -> Result<Self, AppError> {
        let s = &cfg.server;
        let mut api = Self::bind(s).await?;
        if api.secure.is_none() {
            return Ok(api);
        }
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
            });
        }
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

/// What the node API is assembled from.
pub(super) struct Wiring<'a> {
    pub(super) cfg: &'a KubeletConfig,
    pub(super) host: Arc<KubeletHost>,
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
                .merge(kubelet_server::server::debugging_disabled());
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
        let s = &w.cfg.server;
        let mut router = kubelet_server::server::auth_not_required(host.clone(), checks);
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
                .merge(kubelet_server::streaming::routes(w.host.clone()));
        } else {
            router = router.merge(kubelet_server::server::debugging_disabled());
        }
        let router = kubelet_server::auth::layer(router, auth.clone());
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

/// The serving certificate: `tlsCertFile`/`tlsPrivateKeyFile` when given,
/// else a self-signed one for the node's name and addresses.
pub(super) async fn serving_cert(
    cfg: &KubeletConfig,
    ips: &[std::net::IpAddr],
) -> Result<Arc<dyn rustls::server::ResolvesServerCert>, AppError> {
    let s = &cfg.server;
    let (cert, key) = match (&s.tls_cert_file, &s.tls_private_key_file) {
        (Some(c), Some(k)) => (
            tokio::fs::read(c).await.map_err(|e| tls_file(c, e))?,
            tokio::fs::read(k).await.map_err(|e| tls_file(k, e))?,
        ),
        _ => {
            let mut params = rcgen::CertificateParams::new(vec![cfg.node_name.clone()])
                .map_err(|e| kubelet_server::tls::TlsError::Certificate(e.to_string()))?;
            params
                .subject_alt_names
                .extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
            let key = rcgen::KeyPair::generate()
                .map_err(|e| kubelet_server::tls::TlsError::Certificate(e.to_string()))?;
            let cert = params
                .self_signed(&key)
                .map_err(|e| kubelet_server::tls::TlsError::Certificate(e.to_string()))?;
            let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
            let dir = cfg.cert_dir.clone();
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| tls_file(&dir, e))?;
            let crt = dir.join("kubelet.crt");
            tokio::fs::write(&crt, &cert_pem)
                .await
                .map_err(|e| tls_file(&crt, e))?;
            (cert_pem.into_bytes(), key_pem.into_bytes())
        }
    };
    let key = kubelet_server::tls::certified_key_from_pem(&cert, &key)?;
    Ok(Arc::new(kubelet_server::tls::SwappableCert::new(Arc::new(
        key,
    ))))
}

fn tls_file(path: &std::path::Path, e: std::io::Error) -> AppError {
    AppError::Tls(kubelet_server::tls::TlsError::Certificate(format!(
        "{}: {e}",
        path.display()
    )))
}
