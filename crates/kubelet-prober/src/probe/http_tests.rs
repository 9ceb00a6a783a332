//! Tests of HTTP probes against a local server (upstream `http_test.go`).

use std::convert::Infallible;

use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::HTTPHeader;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;

async fn handle(port: u16, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let redirect = |to: String| {
        Response::builder()
            .status(302)
            .header("Location", to)
            .body(Full::new(Bytes::from_static(b"moved")))
            .unwrap()
    };
    let h = |n: &str| {
        req.headers()
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let resp = match req.uri().path() {
        "/ok" => Response::new(Full::new(Bytes::from_static(b"ok body"))),
        "/fail" => Response::builder()
            .status(500)
            .body(Full::new(Bytes::from_static(b"secret")))
            .unwrap(),
        "/redirect" => redirect("/ok".into()),
        "/loop" => redirect("/loop".into()),
        "/chain9" | "/chain8" | "/chain7" | "/chain6" | "/chain5" | "/chain4" | "/chain3"
        | "/chain2" | "/chain1" => {
            let n: u32 = req.uri().path()[6..].parse().unwrap();
            if n == 1 {
                redirect("/ok".into())
            } else {
                redirect(format!("/chain{}", n - 1))
            }
        }
        "/offhost" => redirect(format!("http://localhost:{port}/ok")),
        "/relative-headers" => redirect("headers".into()),
        "/absolute-headers" => redirect(format!("http://127.0.0.1:{port}/headers")),
        "/headers" => Response::new(Full::new(Bytes::from(format!(
            "ua={} accept={} host={} x={} referer={} path={}",
            h("user-agent"),
            h("accept"),
            h("host"),
            h("x-custom"),
            h("referer"),
            req.uri()
        )))),
        "/big" => Response::new(Full::new(Bytes::from(vec![b'a'; 20 * 1024]))),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Response::new(Full::new(Bytes::new()))
        }
        _ => Response::builder()
            .status(404)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    };
    Ok(resp)
}

async fn server() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), service_fn(move |r| handle(port, r))),
            );
        }
    });
    port
}

fn action(port: u16, path: &str, headers: &[(&str, &str)]) -> HTTPGetAction {
    HTTPGetAction {
        host: None,
        path: Some(path.into()),
        port: IntOrString::Int(i32::from(port)),
        scheme: None,
        http_headers: Some(
            headers
                .iter()
                .map(|(n, v)| HTTPHeader {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
        ),
    }
}

async fn run(port: u16, path: &str, headers: &[(&str, &str)]) -> Output {
    let req = request_for(
        &action(port, path, headers),
        &Container::default(),
        "127.0.0.1",
    )
    .unwrap();
    HttpProber::new()
        .probe(&req, Duration::from_secs(5))
        .await
        .unwrap()
}

#[tokio::test]
async fn status_codes_decide() {
    let port = server().await;
    assert_eq!(
        run(port, "/ok", &[]).await,
        (ProbeOutcome::Success, "ok body".to_string())
    );
    assert_eq!(
        run(port, "/fail", &[]).await,
        (
            ProbeOutcome::Failure,
            "HTTP probe failed with statuscode: 500".to_string()
        )
    );
    let (outcome, body) = run(port, "/big", &[]).await;
    assert_eq!(outcome, ProbeOutcome::Success);
    assert_eq!(body.len(), MAX_OUTPUT, "body is read up to 10 KiB");
}

#[tokio::test]
async fn default_and_overridden_headers() {
    let port = server().await;
    let (_, body) = run(port, "/headers", &[]).await;
    assert_eq!(
        body,
        format!("ua=kube-probe/1.33 accept=*/* host=127.0.0.1:{port} x= referer= path=/headers")
    );
    let (_, body) = run(
        port,
        "/headers",
        &[
            ("User-Agent", "mine"),
            ("Accept", "text/plain"),
            ("Host", "example.com"),
            ("X-Custom", "a"),
            ("X-Custom", "b"),
        ],
    )
    .await;
    assert_eq!(
        body,
        "ua=mine accept=text/plain host=example.com x=a,b referer= path=/headers"
    );
    // An empty Accept removes the header.
    let (_, body) = run(port, "/headers", &[("Accept", "")]).await;
    assert!(body.contains("accept= "), "{body}");
}

#[tokio::test]
async fn redirect_rules() {
    let port = server().await;
    // Same host: followed.
    assert_eq!(
        run(port, "/redirect", &[]).await,
        (ProbeOutcome::Success, "ok body".to_string())
    );
    // Nine redirects then 200: ten requests, allowed.
    assert_eq!(run(port, "/chain9", &[]).await.0, ProbeOutcome::Success);
    // A loop stops after ten requests.
    assert_eq!(
        run(port, "/loop", &[]).await,
        (
            ProbeOutcome::Failure,
            format!("Get \"http://127.0.0.1:{port}/loop\": stopped after 10 redirects")
        )
    );
    // Another host: not followed, a warning with the redirect's body.
    assert_eq!(
        run(port, "/offhost", &[]).await,
        (
            ProbeOutcome::Warning,
            "Probe terminated redirects, Response body: moved".to_string()
        )
    );
    // A Host override survives a relative redirect, not an absolute one.
    let (_, body) = run(port, "/relative-headers", &[("Host", "example.com")]).await;
    assert!(body.contains("host=example.com "), "{body}");
    assert!(
        body.contains(&format!("referer=http://127.0.0.1:{port}/relative-headers")),
        "{body}"
    );
    let (_, body) = run(port, "/absolute-headers", &[("Host", "example.com")]).await;
    assert!(body.contains(&format!("host=127.0.0.1:{port} ")), "{body}");
}

#[tokio::test]
async fn transport_errors_and_timeouts_fail() {
    let port = server().await;
    let req = request_for(
        &action(port, "/slow", &[]),
        &Container::default(),
        "127.0.0.1",
    )
    .unwrap();
    let (outcome, msg) = HttpProber::new()
        .probe(&req, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(outcome, ProbeOutcome::Failure);
    assert_eq!(
        msg,
        format!(
            "Get \"http://127.0.0.1:{port}/slow\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )
    );

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cport = closed.local_addr().unwrap().port();
    drop(closed);
    assert_eq!(
        run(cport, "/", &[]).await,
        (
            ProbeOutcome::Failure,
            format!(
                "Get \"http://127.0.0.1:{cport}/\": dial tcp 127.0.0.1:{cport}: connect: connection refused"
            )
        )
    );
}

#[test]
fn request_defaults() {
    let container = Container {
        ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            name: Some("web".into()),
            container_port: 8080,
            ..Default::default()
        }]),
        ..Default::default()
    };
    let a = HTTPGetAction {
        port: IntOrString::String("web".into()),
        path: Some("healthz?x=1".into()),
        scheme: Some("HTTPS".into()),
        ..Default::default()
    };
    let r = request_for(&a, &container, "10.0.0.5").unwrap();
    assert_eq!(r.url.to_string(), "https://10.0.0.5:8080/healthz?x=1");
    let a = HTTPGetAction {
        port: IntOrString::Int(80),
        host: Some("fd00::1".into()),
        ..Default::default()
    };
    let r = request_for(&a, &container, "10.0.0.5").unwrap();
    assert_eq!(r.url.to_string(), "http://[fd00::1]:80/");
    assert_eq!(r.headers.get("user-agent").unwrap(), "kube-probe/1.33");
    assert_eq!(r.headers.get("accept").unwrap(), "*/*");
}

#[test]
fn locations_resolve() {
    let base: Uri = "http://h:1/a/b?q".parse().unwrap();
    let r = |l: &str| resolve_location(&base, l).unwrap().to_string();
    assert_eq!(r("/x"), "http://h:1/x");
    assert_eq!(r("c"), "http://h:1/a/c");
    assert_eq!(r("?z"), "http://h:1/a/b?z");
    assert_eq!(r("//o:2/p"), "http://o:2/p");
    assert_eq!(r("https://o/p#frag"), "https://o/p");
}

/// https probes skip certificate verification (upstream InsecureSkipVerify):
/// a self-signed certificate for another name is accepted.
#[tokio::test]
async fn https_skips_certificate_verification() {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["not-this-host".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service_fn(move |r| handle(port, r)))
                    .await;
            });
        }
    });
    let mut a = action(port, "/ok", &[]);
    a.scheme = Some("HTTPS".into());
    let req = request_for(&a, &Container::default(), "127.0.0.1").unwrap();
    assert_eq!(
        HttpProber::new()
            .probe(&req, Duration::from_secs(5))
            .await
            .unwrap(),
        (ProbeOutcome::Success, "ok body".to_string())
    );
}
