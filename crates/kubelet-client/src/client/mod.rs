//! The apiserver client (upstream `buildKubeletClientConfig` /
//! `kubeClientConfigOverrides`): a kube-rs [`Client`] from a kubeconfig, over
//! rustls, with the client certificate behind a [`DynamicCert`] so rotation
//! needs no restart, client-side rate limiting (`kubeAPIQPS`/`kubeAPIBurst`)
//! and a deadline on every request ([`deadline`]). Every connection can be
//! closed at once after heartbeat failures ([`connrotation`]).
//!
//! The tower stack, outermost first: base URI, auth, request metrics (when
//! given), rate limit, deadline, the connection pool of the current
//! certificate and connection generation.

pub mod connrotation;
pub mod deadline;
pub mod dynamic_cert;
pub mod metrics;
mod options;
pub mod rate_limit;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use secrecy::ExposeSecret;
use tower::ServiceBuilder;

use crate::Error;
use crate::error::blocking;

pub use connrotation::Connections;
pub use deadline::{DEFAULT_REQUEST_TIMEOUT, RequestTimeout, is_timeout};
pub use dynamic_cert::{DynamicCert, certified_key};
pub use options::ClientOptions;
pub use rate_limit::TokenBucket;

/// Upstream's dialer keepalive (`net.Dialer{KeepAlive: 30s}`): how a watch on a
/// connection whose peer vanished finds out.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// The cluster and credentials of a kubeconfig, read once.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The kube-rs config (server, CA, token).
    pub config: Config,
    /// Client certificate and key PEM, if the user has one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// PEM given inline (base64 `data`) or as a `file` relative to `base`.
fn read_pem(
    data: Option<&str>,
    file: Option<&str>,
    field: &'static str,
    base: &Path,
) -> Result<Option<Vec<u8>>, Error> {
    if let Some(d) = data {
        return base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map(Some)
            .map_err(|source| Error::Base64 { field, source });
    }
    match file {
        Some(f) => {
            let p = base.join(f);
            std::fs::read(&p).map(Some).map_err(Error::io(p))
        }
        None => Ok(None),
    }
}

/// Reads a kubeconfig: cluster, CA and the user's credentials.
///
/// All of it is file IO (kube-rs reads the kubeconfig and the CA file
/// synchronously), so it runs as one group on the blocking pool.
pub async fn load(path: &Path) -> Result<Loaded, Error> {
    let path = path.to_path_buf();
    blocking(move || load_blocking(&path)).await
}

fn load_blocking(path: &Path) -> Result<Loaded, Error> {
    let kubeconfig = |source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let credentials = |source| Error::Credentials {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let kc = Kubeconfig::read_from(path).map_err(kubeconfig)?;
    // Only reads files (the CA) and never awaits anything else, so driving it
    // here, on a blocking-pool thread, is cheap and keeps it off the runtime.
    let config = tokio::runtime::Handle::current()
        .block_on(Config::from_custom_kubeconfig(
            kc,
            &KubeConfigOptions::default(),
        ))
        .map_err(kubeconfig)?;
    let base = path.parent().unwrap_or(Path::new("/"));
    let a = &config.auth_info;
    let cert = read_pem(
        a.client_certificate_data.as_deref(),
        a.client_certificate.as_deref(),
        "client-certificate-data",
        base,
    )
    .map_err(credentials)?;
    let key_data = a
        .client_key_data
        .as_ref()
        .map(|s| s.expose_secret().to_string());
    let key = read_pem(
        key_data.as_deref(),
        a.client_key.as_deref(),
        "client-key-data",
        base,
    )
    .map_err(credentials)?;
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(credentials(Error::IncompleteIdentity)),
    };
    Ok(Loaded { config, identity })
}

/// Builds a client for `loaded`, presenting whatever `cert` holds, with the
/// default request deadline.
pub fn build(
    loaded: &Loaded,
    cert: Arc<DynamicCert>,
    limiter: Arc<TokenBucket>,
) -> Result<Client, Error> {
    build_with(loaded, cert, limiter, DEFAULT_REQUEST_TIMEOUT)
}

/// Builds a client for `loaded`, presenting whatever `cert` holds; each
/// request gets `request_timeout`.
///
/// Blocking: kube-rs reads a `tokenFile` here, and without a CA in the
/// kubeconfig the platform verifier loads the system's roots.
/// [`from_kubeconfig_with`] calls it on the blocking pool.
pub fn build_with(
    loaded: &Loaded,
    cert: Arc<DynamicCert>,
    limiter: Arc<TokenBucket>,
    request_timeout: Duration,
) -> Result<Client, Error> {
    build_instrumented(loaded, cert, limiter, request_timeout, None, None)
}

/// [`build_with`], recording every request in `metrics` when given.
pub fn build_instrumented(
    loaded: &Loaded,
    cert: Arc<DynamicCert>,
    limiter: Arc<TokenBucket>,
    request_timeout: Duration,
    metrics: Option<Arc<kubelet_metrics::KubeletMetrics>>,
    connections: Option<Arc<Connections>>,
) -> Result<Client, Error> {
    let connections = connections.unwrap_or_default();
    let mut config = loaded.config.clone();
    // The identity comes from the resolver, not from the static config.
    config.auth_info.client_certificate = None;
    config.auth_info.client_certificate_data = None;
    config.auth_info.client_key = None;
    config.auth_info.client_key_data = None;
    config.connect_timeout = Some(Duration::from_secs(10));
    let mut tls = config.rustls_client_config().map_err(Error::Setup)?;
    tls.client_auth_cert_resolver = cert.clone();
    let connect_timeout = config.connect_timeout;
    let tracked = connections.clone();
    let make = move || {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(connect_timeout);
        http.set_keepalive(Some(TCP_KEEPALIVE));
        http.set_keepalive_interval(Some(TCP_KEEPALIVE));
        // Fresh session cache too: a resumed TLS session would carry the old identity.
        let mut tls = tls.clone();
        tls.resumption = rustls::client::Resumption::in_memory_sessions(64);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build::<_, kube::client::Body>(connrotation::connector(https, tracked.clone()))
    };
    // A new certificate gets a new connection pool: later requests handshake
    // with it, while requests in flight (the pod watch) keep their connection.
    // Closing all connections gets a new pool too, so no request picks a
    // closed idle connection before the pool noticed.
    let generation = move || (cert.generation(), connections.generation());
    let pool = Arc::new(parking_lot::Mutex::new((generation(), make())));
    let connections = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let hyper = {
            let mut p = pool.lock();
            let now = generation();
            if p.0 != now {
                *p = (now, make());
            }
            p.1.clone()
        };
        async move { hyper.request(req).await.map_err(tower::BoxError::from) }
    });
    let auth = config.auth_layer().map_err(Error::Setup)?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .option_layer(metrics.map(metrics::RestClientMetricsLayer::new))
        .layer(rate_limit::RateLimitLayer::new(limiter))
        .layer(deadline::DeadlineLayer::new(request_timeout))
        .service(connections);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// Loads a kubeconfig and builds a client with its own identity and the
/// default request deadline.
pub async fn from_kubeconfig(
    path: &Path,
    qps: f64,
    burst: u32,
) -> Result<(Client, Arc<DynamicCert>), Error> {
    from_kubeconfig_with(path, ClientOptions::new(qps, burst)).await
}

/// Loads a kubeconfig and builds a client with its own identity.
pub async fn from_kubeconfig_with(
    path: &Path,
    options: ClientOptions,
) -> Result<(Client, Arc<DynamicCert>), Error> {
    let loaded = load(path).await?;
    let cert = Arc::new(DynamicCert::default());
    if let Some((c, k)) = &loaded.identity {
        cert.set(certified_key(c, k).map_err(|e| Error::Credentials {
            path: path.to_path_buf(),
            source: Box::new(e),
        })?);
    }
    let limiter = Arc::new(TokenBucket::new(options.qps, options.burst));
    let identity = cert.clone();
    let client = blocking(move || {
        build_instrumented(
            &loaded,
            identity,
            limiter,
            options.request_timeout,
            options.metrics,
            options.connections,
        )
    })
    .await?;
    Ok((client, cert))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apiserver_double::{BOOTSTRAP_TOKEN, Fault, Options};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::Api;
    use kubelet_test_util::Cluster;

    fn code(r: Result<impl std::fmt::Debug, kube::Error>) -> u16 {
        match r {
            Err(kube::Error::Api(s)) => s.code,
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    /// The kubelet's own client (this module's stack) for node `n1`.
    async fn kubelet_client(c: &Cluster, options: ClientOptions) -> Client {
        let path = c.dir.path().join("n1-kubelet.conf");
        c.api
            .write_cert_kubeconfig(&path, "system:node:n1", &["system:nodes"])
            .expect("kubeconfig");
        from_kubeconfig_with(&path, options)
            .await
            .expect("client")
            .0
    }

    #[tokio::test(start_paused = true)]
    async fn unauthenticated_forbidden_and_injected_faults_are_errors_not_panics() {
        let c = Cluster::start(Options::default()).await;
        let dir = c.dir.path();
        c.api
            .write_token_kubeconfig(&dir.join("bad.conf"), "nope.nope")
            .expect("kubeconfig");
        let (bad, _) = from_kubeconfig(&dir.join("bad.conf"), 5.0, 10)
            .await
            .expect("client");
        assert_eq!(
            code(Api::<Node>::all(bad).list(&Default::default()).await),
            401
        );
        c.api
            .write_token_kubeconfig(&dir.join("boot.conf"), BOOTSTRAP_TOKEN)
            .expect("kubeconfig");
        let (boot, _) = from_kubeconfig(&dir.join("boot.conf"), 5.0, 10)
            .await
            .expect("client");
        assert_eq!(
            code(Api::<Pod>::all(boot).list(&Default::default()).await),
            403
        );

        let node = kubelet_client(&c, ClientOptions::new(5.0, 10)).await;
        let nodes: Api<Node> = Api::all(node);
        c.api.set_fault(Fault::ServerError);
        assert_eq!(code(nodes.get_opt("n1").await), 500);
        c.api.set_fault(Fault::Hang);
        let started = tokio::time::Instant::now();
        let hung = tokio::time::timeout(DEFAULT_REQUEST_TIMEOUT * 2, nodes.get_opt("n1"))
            .await
            .expect("the client bounds the request, not this guard");
        let took = started.elapsed();
        assert!(
            matches!(&hung, Err(e @ kube::Error::Service(_)) if is_timeout(e)),
            "a hanging apiserver gives the bounded error: {hung:?}"
        );
        assert!(
            took >= DEFAULT_REQUEST_TIMEOUT
                && took < DEFAULT_REQUEST_TIMEOUT + Duration::from_secs(1),
            "at the default deadline, took {took:?}"
        );
        c.api.set_fault(Fault::None);
        assert!(nodes.get_opt("n1").await.expect("healthy again").is_none());
        c.api.set_up(false);
        assert!(
            nodes.get_opt("n1").await.is_err(),
            "connection refused is an error"
        );
        c.api.set_up(true);
        assert!(nodes.get_opt("n1").await.is_ok(), "and back");
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_configurable_and_starts_after_the_rate_limiter() {
        let c = Cluster::start(Options::default()).await;
        let timeout = Duration::from_secs(5);
        // One token, then one every 20s: longer than the deadline.
        let options = ClientOptions::new(0.05, 1).with_request_timeout(timeout);
        let nodes: Api<Node> = Api::all(kubelet_client(&c, options).await);
        c.api.set_fault(Fault::Hang);
        let started = tokio::time::Instant::now();
        let hung = tokio::time::timeout(timeout * 2, nodes.get_opt("n1"))
            .await
            .expect("the client bounds the request, not this guard");
        let took = started.elapsed();
        assert!(matches!(&hung, Err(e) if is_timeout(e)), "{hung:?}");
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(1),
            "bounded by the configured deadline, took {took:?}"
        );
        c.api.set_fault(Fault::None);
        // The next token comes 20s after the first: a throttled request waits
        // for it and still succeeds (client-go throttles before the deadline).
        let started = tokio::time::Instant::now();
        let throttled = nodes.get_opt("n1").await;
        assert!(throttled.is_ok(), "{throttled:?}");
        assert!(
            started.elapsed() >= Duration::from_secs(14),
            "waited for its token, took {:?}",
            started.elapsed()
        );
    }

    /// Real time: under paused time the double's watch events reach the
    /// client only once the runtime has no timer left to jump to (even with a
    /// plain kube client), so a paused test would measure the harness. The
    /// body deadline itself is tested on paused time in [`deadline`].
    #[tokio::test]
    async fn a_watch_is_not_cut_by_the_request_deadline() {
        use futures::StreamExt;
        use kube::api::{PostParams, WatchEvent, WatchParams};
        let c = Cluster::start(Options::default()).await;
        let timeout = Duration::from_millis(500);
        let options = ClientOptions::new(50.0, 100).with_request_timeout(timeout);
        let pods: Api<Pod> = Api::all(kubelet_client(&c, options).await);
        let admin: Api<Pod> = Api::namespaced(c.admin().await, "default");
        let started = tokio::time::Instant::now();
        let stream = pods
            // A node may watch only its own pods (1.32+ Node authorizer).
            .watch(
                &WatchParams::default().timeout(3).fields("spec.nodeName=n1"),
                "0",
            )
            .await
            .expect("watch");
        let reader = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut seen = vec![];
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WatchEvent::Added(p)) => {
                        seen.push((p.metadata.name.unwrap_or_default(), started.elapsed()));
                    }
                    other => panic!(
                        "the watch runs until its timeoutSeconds: {other:?} at {:?}, saw {seen:?}",
                        started.elapsed()
                    ),
                }
            }
            (seen, started.elapsed())
        });
        for (i, at) in [1000u64, 2000].into_iter().enumerate() {
            tokio::time::sleep_until(started + Duration::from_millis(at)).await;
            let p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p{i}")},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}))
            .expect("pod");
            admin.create(&PostParams::default(), &p).await.expect("pod");
        }
        let (seen, ended) = reader.await.expect("reader");
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["p0", "p1"], "{seen:?}");
        assert!(
            seen[1].1 >= Duration::from_secs(2) && seen[1].1 < Duration::from_secs(3),
            "delivered live, long after the request deadline: {seen:?}"
        );
        assert!(
            ended >= Duration::from_secs(3) && ended < Duration::from_millis(3500),
            "ended by the server at timeoutSeconds, not by the deadline: {ended:?}"
        );
    }

    #[tokio::test]
    async fn watches_get_bookmarks_and_410_as_an_error_event() {
        use futures::StreamExt;
        use kube::api::{PostParams, WatchEvent, WatchParams};
        let c = Cluster::start(Options {
            bookmark_interval: Duration::from_millis(100),
            ..Options::default()
        })
        .await;
        let admin: Api<Pod> = Api::namespaced(c.admin().await, "default");
        let p: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "a"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        .expect("pod");
        let created = admin.create(&PostParams::default(), &p).await.expect("pod");
        let rv = created
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let stream = admin
            .watch(&WatchParams::default().timeout(5), &rv)
            .await
            .expect("watch");
        let mut stream = std::pin::pin!(stream);
        let first = tokio::time::timeout(Duration::from_secs(3), stream.next())
            .await
            .expect("in time");
        match first {
            Some(Ok(WatchEvent::Bookmark(b))) => {
                assert_eq!(b.metadata.resource_version, rv, "nothing newer seen")
            }
            other => panic!("expected a bookmark, got {other:?}"),
        }
        // Compacted past the requested revision: the watch answers with an Expired (410) error event.
        admin
            .create(
                &PostParams::default(),
                &Pod {
                    metadata: kube::api::ObjectMeta {
                        name: Some("b".into()),
                        ..Default::default()
                    },
                    ..p.clone()
                },
            )
            .await
            .expect("pod b");
        c.api.compact();
        let stream = admin
            .watch(&WatchParams::default().timeout(5), &rv)
            .await
            .expect("watch");
        let mut stream = std::pin::pin!(stream);
        match tokio::time::timeout(Duration::from_secs(3), stream.next())
            .await
            .expect("in time")
        {
            Some(Ok(WatchEvent::Error(e))) => {
                assert_eq!((e.code, e.reason.as_str()), (410, "Expired"))
            }
            other => panic!("expected 410 Gone, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn bootstrap_waits_for_a_manual_approval() {
        use k8s_openapi::api::certificates::v1::{
            CertificateSigningRequest, CertificateSigningRequestCondition,
        };
        let c = Cluster::start(Options {
            auto_approve: false,
            ..Options::default()
        })
        .await;
        let dir = c.dir.path().to_path_buf();
        let boot = dir.join("boot.conf");
        c.api
            .write_token_kubeconfig(&boot, BOOTSTRAP_TOKEN)
            .expect("kubeconfig");
        let (k, b, p) = (dir.join("kubelet.conf"), boot.clone(), dir.join("pki"));
        let task = tokio::spawn(async move {
            crate::certificate::bootstrap::load_client_cert(&k, Some(&b), &p, "n1").await
        });
        let csrs: Api<CertificateSigningRequest> = Api::all(c.admin().await);
        let name = loop {
            if let Some(n) = csrs
                .list(&Default::default())
                .await
                .expect("list")
                .items
                .first()
            {
                break n.metadata.name.clone().unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!task.is_finished(), "pending until approved");
        let approval = serde_json::json!({"status": {"conditions": [CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("KubectlApprove".into()),
            ..Default::default()
        }]}});
        csrs.patch_approval(
            &name,
            &Default::default(),
            &kube::api::Patch::Merge(approval),
        )
        .await
        .expect("approve");
        let done = tokio::time::timeout(Duration::from_secs(10), task).await;
        assert!(
            matches!(done, Ok(Ok(Ok(())))),
            "bootstrap completes after approval: {done:?}"
        );
        assert!(dir.join("kubelet.conf").exists());
    }
}
