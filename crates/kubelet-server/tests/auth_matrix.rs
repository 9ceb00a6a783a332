//! The node API's authn/authz matrix over real TLS on 127.0.0.1, reviewing
//! through the apiserver double (no container runtime needed): 401 without
//! credentials, client certificates from the CA, tokens through TokenReview,
//! SubjectAccessReview denials with upstream's 403 body, caching visible in
//! the double's request counts, HTTP/1.1 and h2.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;

use apiserver_double::review::{AccessRule, Subject};
use apiserver_double::{Identity, Options};
use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Method, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubelet_server::auth::{
    self, AnonymousSettings, AuthenticationSettings, AuthorizationSettings, KubeletAuth,
    X509Settings,
};
use kubelet_server::serve::serve_tls;
use kubelet_server::tls::{self, SwappableCert, TlsError, TlsSettings};
use kubelet_test_util::Cluster;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const NODE: &str = "n1";
const TOKEN: &str = "alice-token";

struct Served {
    cluster: Cluster,
    addr: std::net::SocketAddr,
    server_ca: CertificateDer<'static>,
    stop: CancellationToken,
    tracker: TaskTracker,
}

fn serving_cert() -> (Arc<SwappableCert>, CertificateDer<'static>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    let ck =
        tls::certified_key_from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes()).unwrap();
    (
        Arc::new(SwappableCert::new(Arc::new(ck))),
        cert.der().clone(),
    )
}

async fn start(anonymous: bool) -> Served {
    let cluster = Cluster::start(Options {
        tokens: HashMap::from([(TOKEN.to_string(), Identity::new("alice", &["devs"]))]),
        access_rules: vec![AccessRule::new(
            Subject::User("alice".into()),
            &["get"],
            &["nodes/stats"],
        )],
        ..Options::default()
    })
    .await;
    let ca_file = cluster.dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, cluster.api.ca_pem()).unwrap();
    let client = cluster.node_client(NODE).await;
    let authn = AuthenticationSettings {
        x509: X509Settings {
            client_ca_file: Some(ca_file),
        },
        anonymous: AnonymousSettings { enabled: anonymous },
        ..AuthenticationSettings::default()
    };
    let kubelet_auth = KubeletAuth::build(
        NODE,
        Some(client),
        &authn,
        &AuthorizationSettings::default(),
        false,
    )
    .await
    .expect("auth builds");
    let router = Router::new()
        .route("/stats/summary", get(|| async { "summary" }))
        .route("/pods", get(|| async { "pods" }))
        .route("/exec/{ns}/{pod}/{c}", post(|| async { "exec" }));
    let router = auth::layer(router, Arc::new(kubelet_auth));
    let (cert, server_ca) = serving_cert();
    let settings = TlsSettings {
        request_client_certs: true,
        ..TlsSettings::default()
    };
    let config = tls::server_config(&settings, cert).expect("tls config");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    tracker.spawn(serve_tls(
        listener,
        Arc::new(config),
        router,
        stop.clone(),
        tracker.clone(),
    ));
    Served {
        cluster,
        addr,
        server_ca,
        stop,
        tracker,
    }
}

struct Call<'a> {
    alpn: &'a [u8],
    cert: Option<(String, String)>,
    token: Option<&'a str>,
    method: Method,
    path: &'a str,
}

impl<'a> Call<'a> {
    fn get(path: &'a str) -> Self {
        Self {
            alpn: b"http/1.1",
            cert: None,
            token: None,
            method: Method::GET,
            path,
        }
    }
}

impl Served {
    async fn call(&self, c: Call<'_>) -> (StatusCode, Version, String) {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.server_ca.clone()).unwrap();
        let b = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut cfg = match c.cert {
            Some((cert, key)) => {
                let chain: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<Result<_, _>>()
                        .unwrap();
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
                b.with_client_auth_cert(chain, key).unwrap()
            }
            None => b.with_no_client_auth(),
        };
        cfg.alpn_protocols = vec![c.alpn.to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let stream = connector.connect(name, tcp).await.expect("handshake");
        let io = TokioIo::new(stream);
        let mut req = http::Request::builder().method(c.method).uri(format!(
            "https://localhost:{}{}",
            self.addr.port(),
            c.path
        ));
        if let Some(t) = c.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Empty::<Bytes>::new()).unwrap();
        let resp = if c.alpn == b"h2" {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            send.send_request(req).await.unwrap()
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            send.send_request(req).await.unwrap()
        };
        let status = resp.status();
        let version = resp.version();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, version, String::from_utf8_lossy(&body).into_owned())
    }

    fn reviews(&self, resource: &str) -> usize {
        self.cluster
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with(resource))
            .count()
    }

    async fn stop(self) {
        self.stop.cancel();
        self.tracker.close();
        tokio::time::timeout(std::time::Duration::from_secs(30), self.tracker.wait())
            .await
            .expect("server stops");
    }
}

#[tokio::test]
async fn no_credentials_is_401_and_a_bad_token_too() {
    let s = start(false).await;
    let (code, _, body) = s.call(Call::get("/pods")).await;
    assert_eq!(
        (code, body.as_str()),
        (StatusCode::UNAUTHORIZED, "Unauthorized")
    );
    // Unknown paths are behind authentication as well.
    let (code, _, _) = s.call(Call::get("/nope")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, _, body) = s
        .call(Call {
            token: Some("wrong"),
            ..Call::get("/pods")
        })
        .await;
    assert_eq!(
        (code, body.as_str()),
        (StatusCode::UNAUTHORIZED, "Unauthorized")
    );
    assert_eq!(s.reviews("/tokenreviews"), 1);
    assert_eq!(s.reviews("/subjectaccessreviews"), 0);
    s.stop().await;
}

#[tokio::test]
async fn client_certificates_from_the_ca_are_authenticated() {
    let s = start(false).await;
    let admin = s
        .cluster
        .api
        .client_cert("kube-apiserver-kubelet-client", &["system:masters"])
        .unwrap();
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (code, version, body) = s
            .call(Call {
                alpn,
                cert: Some((admin.cert_pem.clone(), admin.key_pem.clone())),
                ..Call::get("/pods")
            })
            .await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "pods"));
        let want = if alpn == b"h2" {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        assert_eq!(version, want);
    }
    // Cached: one review for both requests.
    assert_eq!(s.reviews("/subjectaccessreviews"), 1);
    assert_eq!(s.reviews("/tokenreviews"), 0);
    // A certificate of a user without a grant reaches authorization.
    let carol = s.cluster.api.client_cert("carol", &["ops"]).unwrap();
    let (code, _, body) = s
        .call(Call {
            cert: Some((carol.cert_pem, carol.key_pem)),
            ..Call::get("/pods")
        })
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert_eq!(
        body,
        "Forbidden (user=carol, verb=get, resource=nodes, subresource(s)=[proxy])\n"
    );
    // A certificate from another CA does not fail the handshake; it
    // authenticates nobody.
    let other = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "mallory");
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let forged = p.self_signed(&other).unwrap();
    let (code, _, _) = s
        .call(Call {
            cert: Some((forged.pem(), other.serialize_pem())),
            ..Call::get("/pods")
        })
        .await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    s.stop().await;
}

#[tokio::test]
async fn tokens_go_through_token_review_and_denials_are_403() {
    let s = start(false).await;
    for alpn in [&b"http/1.1"[..], b"h2", b"http/1.1"] {
        let (code, _, body) = s
            .call(Call {
                alpn,
                token: Some(TOKEN),
                ..Call::get("/stats/summary")
            })
            .await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "summary"));
    }
    assert_eq!(s.reviews("/tokenreviews"), 1, "cached for cacheTTL");
    assert_eq!(
        s.reviews("/subjectaccessreviews"),
        1,
        "cached for cacheAuthorizedTTL"
    );
    for _ in 0..2 {
        let (code, _, body) = s
            .call(Call {
                token: Some(TOKEN),
                method: Method::POST,
                ..Call::get("/exec/default/p/c")
            })
            .await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        assert_eq!(
            body,
            "Forbidden (user=alice, verb=create, resource=nodes, subresource(s)=[proxy])\n"
        );
    }
    assert_eq!(s.reviews("/tokenreviews"), 1);
    assert_eq!(
        s.reviews("/subjectaccessreviews"),
        2,
        "the denial is cached for cacheUnauthorizedTTL"
    );
    s.stop().await;
}

#[tokio::test]
async fn anonymous_when_enabled_is_authorized_as_system_anonymous() {
    let s = start(true).await;
    let (code, _, body) = s.call(Call::get("/stats/summary")).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert_eq!(
        body,
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[stats])\n"
    );
    s.stop().await;
}

#[test]
fn a_bad_cipher_suite_name_stops_startup_with_a_clear_error() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (cert, _) = serving_cert();
    let err = tls::server_config(
        &TlsSettings {
            cipher_suites: vec![
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
                "TLS_NOPE".into(),
            ],
            ..TlsSettings::default()
        },
        cert,
    )
    .expect_err("refused");
    assert!(matches!(err, TlsError::UnknownCipherSuite(ref n) if n == "TLS_NOPE"));
    assert_eq!(
        err.to_string(),
        "tlsCipherSuites: unknown cipher suite \"TLS_NOPE\""
    );
}

#[tokio::test]
async fn failing_reviews_are_retried_then_answer_401_or_500() {
    let s = start(false).await;
    s.cluster
        .api
        .set_fault(apiserver_double::Fault::ServerError);
    let (code, _, body) = s
        .call(Call {
            token: Some(TOKEN),
            ..Call::get("/pods")
        })
        .await;
    assert_eq!(
        (code, body.as_str()),
        (StatusCode::UNAUTHORIZED, "Unauthorized")
    );
    assert_eq!(s.reviews("/tokenreviews"), 5, "upstream's five attempts");
    let admin = s
        .cluster
        .api
        .client_cert("admin", &["system:masters"])
        .unwrap();
    let cert = Some((admin.cert_pem, admin.key_pem));
    let (code, _, body) = s
        .call(Call {
            cert: cert.clone(),
            ..Call::get("/pods")
        })
        .await;
    assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body,
        "Authorization error (user=admin, verb=get, resource=nodes, subresource=proxy)"
    );
    assert_eq!(s.reviews("/subjectaccessreviews"), 5);
    // Failures were not cached: with the apiserver back, both work.
    s.cluster.api.set_fault(apiserver_double::Fault::None);
    let (code, _, _) = s
        .call(Call {
            cert,
            ..Call::get("/pods")
        })
        .await;
    assert_eq!(code, StatusCode::OK);
    let (code, _, _) = s
        .call(Call {
            token: Some(TOKEN),
            ..Call::get("/stats/summary")
        })
        .await;
    assert_eq!(code, StatusCode::OK);
    s.stop().await;
}
