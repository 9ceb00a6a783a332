//! The node API (10250) and the read-only port of a kubelet under test, on
//! real containerd, called over the network as the apiserver, kubectl and
//! metrics-server call them.

use std::time::Duration;

use http::{Method, StatusCode};
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);

/// A plain-HTTP GET on the read-only port.
async fn plain_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(StatusCode, String)> {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = tokio::time::timeout(T, send.send_request(req)).await??;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_only_port_serves_only_what_needs_no_authorization() -> anyhow::Result<()> {
    let node = Node::start(|f| f.read_only_port = Some(free_port())).await;
    node.write_manifest("ro.yaml", &pod_yaml("ro", "Always", BUSYBOX, "sleep 3600"));
    node.wait_status("ro", T, "running", |s| is_running(s, "c"))
        .await?;
    let addr = node.handle().read_only_addr.ctx("read-only port")?;

    let (s, body) = plain_get(addr, "/pods").await?;
    assert_eq!(s, StatusCode::OK, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(list["kind"], "PodList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .ctx("items")?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&node.pod_name("ro").as_str()), "{names:?}");

    let (s, body) = plain_get(addr, "/healthz").await?;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "ok"));
    for path in ["/stats/summary", "/metrics", "/metrics/resource"] {
        let (s, body) = plain_get(addr, path).await?;
        assert_eq!(s, StatusCode::OK, "{path}: {body}");
    }

    // The debugging handlers are not there: upstream's 405 on each.
    let uid = node.uid_of("ro").ctx("uid")?;
    for path in [
        format!("/containerLogs/default/{}/c", node.pod_name("ro")),
        format!(
            "/exec/default/{}/c?command=ls&output=1",
            node.pod_name("ro")
        ),
        format!("/attach/default/{}/{uid}/c?output=1", node.pod_name("ro")),
        format!("/portForward/default/{}", node.pod_name("ro")),
        format!("/run/default/{}/c", node.pod_name("ro")),
        "/runningpods/".to_string(),
    ] {
        let (s, body) = plain_get(addr, &path).await?;
        assert_eq!(
            (s, body.as_str()),
            (
                StatusCode::METHOD_NOT_ALLOWED,
                "Debug endpoints are disabled.\n"
            ),
            "{path}"
        );
    }
    // Nor is what upstream installs only with the debugging handlers.
    for path in ["/configz", "/debug/flags/v"] {
        let (s, _) = plain_get(addr, path).await?;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    node.cleanup().await;
    Ok(())
}

fn client(node: &Node, creds: Credentials) -> anyhow::Result<NodeApiClient> {
    let addr = node.handle().server_addr.ctx("server port")?;
    NodeApiClient::new(addr, &node.serving_ca(), &node.name, creds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secure_port_serves_pods_running_pods_configz_and_healthz_over_tls()
-> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "api.yaml",
        &pod_yaml("api", "Always", BUSYBOX, "sleep 3600"),
    );
    node.wait_status("api", T, "running", |s| is_running(s, "c"))
        .await?;
    // Flags alone: upstream's legacy defaults allow anonymous requests.
    let c = client(&node, Credentials::None)?;

    let a = c.get("/healthz").await?;
    assert_eq!((a.status, a.text().as_str()), (StatusCode::OK, "ok"));
    let a = c.get("/healthz?verbose").await?;
    for check in ["[+]ping ok", "[+]log ok", "[+]syncloop ok"] {
        assert!(a.text().contains(check), "{}", a.text());
    }

    let pods = c.get("/pods").await?.json()?;
    let pod = pods["items"]
        .as_array()
        .ctx("items")?
        .iter()
        .find(|p| p["metadata"]["name"] == node.pod_name("api").as_str())
        .ctx("our pod in /pods")?
        .clone();
    assert_eq!(
        pod["status"]["phase"], "Running",
        "/pods carries the status"
    );

    let running = c.get("/runningpods/").await?.json()?;
    let uid = node.uid_of("api").ctx("uid")?;
    let rp = running["items"]
        .as_array()
        .ctx("items")?
        .iter()
        .find(|p| p["metadata"]["uid"] == uid.as_str())
        .ctx("our pod in /runningpods/")?
        .clone();
    assert_eq!(rp["spec"]["containers"][0]["name"], "c");
    // The image as the runtime reports it (upstream `toKubeContainer`:
    // `Image.Image`, which containerd answers with the resolved image ID).
    let image = rp["spec"]["containers"][0]["image"].as_str().ctx("image")?;
    assert!(image == BUSYBOX || image.starts_with("sha256:"), "{image}");

    let cz = c.get("/configz").await?.json()?;
    assert_eq!(cz["kubeletconfig"]["kind"], "KubeletConfiguration");
    assert_eq!(cz["kubeletconfig"]["authorization"]["mode"], "AlwaysAllow");

    // h2 is negotiated and serves the same.
    let a = c.http2()?.get("/healthz").await?;
    assert_eq!(a.status, StatusCode::OK);

    // /debug/flags/v: PUT only.
    let a = c
        .call(Method::GET, "/debug/flags/v", bytes::Bytes::new())
        .await?;
    assert_eq!(a.status, StatusCode::NOT_ACCEPTABLE);
    node.cleanup().await;
    Ok(())
}

/// A kubeadm-style node: a config file (v1beta1 defaults: webhook
/// authentication and authorization, anonymous off) with `clientCAFile`
/// naming the cluster CA, joined to the double. The apiserver's own client
/// certificate, a scraper's token and an unauthorized token each get what
/// upstream gives them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_node_authenticates_and_authorizes_through_the_apiserver() -> anyhow::Result<()> {
    use apiserver_double::Options;
    use apiserver_double::auth::Identity;
    use apiserver_double::review::{AccessRule, Subject};
    let mut options = Options::default();
    options.tokens.insert(
        "scraper-token".into(),
        Identity::new("scraper", &["monitoring"]),
    );
    options
        .tokens
        .insert("nobody-token".into(), Identity::new("nobody", &[]));
    options.access_rules.push(AccessRule::new(
        Subject::Group("monitoring".into()),
        &["get"],
        &["nodes/proxy", "nodes/stats", "nodes/metrics"],
    ));
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    let ca = dir.path().join("ca.crt");
    let joined = cluster::Joined::start_with(options, |f, api| {
        std::fs::write(&ca, api.ca_pem()).expect("ca");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                 authentication:\n  x509:\n    clientCAFile: {}\n",
                ca.display()
            ),
        )
        .expect("config");
        f.config = Some(config.clone());
    })
    .await;
    let node = &joined.node;
    let client = |creds| client(node, creds);

    // No credentials: 401, /healthz included (every path is filtered).
    let a = client(Credentials::None)?.get("/healthz").await?;
    assert_eq!(
        (a.status, a.text().as_str()),
        (StatusCode::UNAUTHORIZED, "Unauthorized")
    );

    // The apiserver's kubelet client certificate (system:masters here).
    let issued = joined
        .api
        .client_cert("kube-apiserver-kubelet-client", &["system:masters"])?;
    let apiserver = client(Credentials::Cert {
        cert_pem: issued.cert_pem.into_bytes(),
        key_pem: issued.key_pem.into_bytes(),
    })?;
    let a = apiserver.get("/pods").await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());

    // A token: TokenReview, then SubjectAccessReview on nodes/proxy.
    let reviews = |kind: &str| {
        joined
            .api
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with(kind))
            .count()
    };
    let scraper = client(Credentials::Token("scraper-token".into()))?;
    for _ in 0..3 {
        let a = scraper.get("/pods").await?;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    }
    assert_eq!(reviews("tokenreviews"), 1, "the token review is cached");

    // Denied: upstream's 403 text, with both fine-grained subresources.
    let nobody = client(Credentials::Token("nobody-token".into()))?;
    let a = nobody.get("/pods").await?;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(
        a.text(),
        "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    joined.cleanup().await;
    Ok(())
}

/// `serverTLSBootstrap`: the kubelet asks for a `kubernetes.io/kubelet-serving`
/// certificate naming its addresses, serves nothing until it is approved,
/// and serves the issued certificate (trusted through the cluster CA) the
/// moment it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tls_bootstrap_serves_the_approved_certificate() -> anyhow::Result<()> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use kube::Api;
    use kube::api::{ListParams, Patch, PatchParams};
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("cluster-ca.crt");
    let joined = cluster::Joined::start_with(apiserver_double::Options::default(), |f, api| {
        std::fs::write(&ca, api.ca_pem()).expect("ca");
        f.rotate_server_certificates = Some(true);
    })
    .await;
    let node = &joined.node;
    let csrs: Api<CertificateSigningRequest> = Api::all(joined.admin.clone());
    let deadline = tokio::time::Instant::now() + T;
    let csr = loop {
        let list = csrs.list(&ListParams::default()).await?;
        if let Some(c) = list.items.into_iter().find(|c| {
            c.spec.signer_name == "kubernetes.io/kubelet-serving"
                && c.spec.username.as_deref() == Some(&format!("system:node:{}", node.name))
        }) {
            break c;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no serving CSR");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut usages = csr.spec.usages.clone().unwrap_or_default();
    usages.sort();
    assert_eq!(
        usages,
        vec!["digital signature", "key encipherment", "server auth"]
    );
    let addr = node.handle().server_addr.ctx("server port")?;
    let c = NodeApiClient::new(addr, &ca, &node.name, Credentials::None)?;
    assert!(
        c.get("/healthz").await.is_err(),
        "no certificate before approval"
    );

    let name = csr.metadata.name.clone().ctx("csr name")?;
    let mut approved = csr.clone();
    approved.status = Some(serde_json::from_value(serde_json::json!({
        "conditions": [{"type": "Approved", "status": "True", "reason": "Test", "message": "approved by the test"}]
    }))?);
    csrs.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&approved))
        .await?;
    let deadline = tokio::time::Instant::now() + T;
    let a = loop {
        // Flags alone: anonymous is allowed, so /healthz answers once TLS works.
        match c.get("/healthz").await {
            Ok(a) => break a,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.context("the issued certificate is never served")),
        }
    };
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        node.serving_ca()
            .with_file_name("kubelet-server-current.pem")
            .exists(),
        "stored as upstream's file store does"
    );
    joined.cleanup().await;
    Ok(())
}

/// `/metrics` on a joined node, read with an independent text parser: every
/// family the issue names, with upstream's labels, and the start breakdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_upstreams_families_and_the_start_breakdown() -> anyhow::Result<()> {
    use kubelet_rs_integration::prom_text;
    let joined = cluster::Joined::start(apiserver_double::Options::default()).await;
    joined
        .create_pod("mx", cluster::sleeper("sleep 3600"))
        .await;
    joined
        .create_pod(
            "bad",
            serde_json::json!({"containers": [{"name": "c", "image": "localhost:5000/does-not-exist:1"}]}),
        )
        .await;
    joined
        .wait_api("mx", T, "Running", |p| cluster::phase(p) == Some("Running"))
        .await;
    let node = &joined.node;
    let c = client(node, Credentials::None)?;
    let deadline = tokio::time::Instant::now() + T;
    let families = loop {
        let a = c.get("/metrics").await?;
        assert_eq!(a.status, StatusCode::OK);
        assert!(
            a.headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
            "{:?}",
            a.headers
        );
        let f = prom_text::parse(&a.text())?;
        let errors = f
            .get("kubelet_runtime_operations_errors_total")
            .is_some_and(|f| !f.samples.is_empty());
        let ready = f
            .get("kubelet_pod_start_phase_duration_seconds")
            .is_some_and(|f| {
                f.samples
                    .iter()
                    .any(|s| s.labels.get("phase").map(String::as_str) == Some("first_ready"))
            });
        if (errors && ready) || tokio::time::Instant::now() > deadline {
            break f;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let has = |name: &str, label: Option<&str>| {
        families.get(name).is_some_and(|f| {
            !f.samples.is_empty()
                && label.is_none_or(|l| {
                    f.samples.iter().all(|s| {
                        s.labels.contains_key(l)
                            || s.name.ends_with("_sum")
                            || s.name.ends_with("_count")
                            || s.labels.contains_key("le")
                    })
                })
        })
    };
    for (name, label) in [
        ("kubelet_running_pods", None),
        ("kubelet_running_containers", Some("container_state")),
        ("kubelet_pod_start_duration_seconds", None),
        ("kubelet_pod_worker_duration_seconds", Some("operation")),
        ("kubelet_pleg_relist_duration_seconds", None),
        ("kubelet_pleg_relist_interval_seconds", None),
        ("kubelet_runtime_operations_total", Some("operation_type")),
        (
            "kubelet_runtime_operations_errors_total",
            Some("operation_type"),
        ),
        (
            "kubelet_runtime_operations_duration_seconds",
            Some("operation_type"),
        ),
        ("kubelet_node_name", Some("node")),
        ("kubelet_http_requests_total", Some("path")),
        ("kubelet_started_pods_total", None),
        ("kubelet_started_containers_total", Some("container_type")),
        ("rest_client_requests_total", Some("code")),
        ("kubelet_pod_start_phase_duration_seconds", Some("phase")),
    ] {
        assert!(
            has(name, label),
            "{name} missing or without {label:?}: {:?}",
            families.get(name)
        );
    }
    assert_eq!(families["kubelet_running_pods"].kind, "gauge");
    assert_eq!(families["kubelet_runtime_operations_total"].kind, "counter");
    assert_eq!(
        families["kubelet_pod_start_duration_seconds"].kind,
        "histogram"
    );
    let node_name = &families["kubelet_node_name"].samples[0];
    assert_eq!(node_name.labels.get("node"), Some(&node.name));
    let phases: std::collections::BTreeSet<&str> =
        families["kubelet_pod_start_phase_duration_seconds"]
            .samples
            .iter()
            .filter_map(|s| s.labels.get("phase").map(String::as_str))
            .collect();
    for p in [
        "sandbox",
        "image_pull",
        "container_create",
        "container_start",
        "first_ready",
    ] {
        assert!(phases.contains(p), "phase {p}: {phases:?}");
    }
    joined.cleanup().await;
    Ok(())
}
