//! The serving certificate manager against the apiserver double: the
//! request upstream sends, approval by an admin, the certificate served the
//! moment it is issued, and a restart that reuses the stored certificate.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::NodeAddress;
use kube::api::{Api, Patch, PatchParams};
use kubelet_test_util::Cluster;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::serving::{CertInfo, ServingCert};
use super::serving_manager::{ServingCertManager, Template};
use super::store;

fn addresses() -> Vec<NodeAddress> {
    [
        ("InternalIP", "10.1.2.3"),
        ("Hostname", "node-a"),
        ("InternalDNS", "node-a.internal"),
    ]
    .into_iter()
    .map(|(t, a)| NodeAddress {
        type_: t.into(),
        address: a.into(),
    })
    .collect()
}

/// A TLS handshake with a server that resolves through `serving`, by a
/// client that trusts `ca_pem` and connects to `name`.
fn handshake(serving: Arc<ServingCert>, ca_pem: &str, name: &str) -> Result<(), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("ca pem")).expect("root");
    }
    let client_config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(serving);
    let server_name = ServerName::try_from(name.to_string()).expect("name");
    let mut client =
        rustls::ClientConnection::new(Arc::new(client_config), server_name).expect("client");
    let mut server = rustls::ServerConnection::new(Arc::new(server_config)).expect("server");
    let mut buf = Vec::new();
    for _ in 0..10 {
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
        buf.clear();
        client.write_tls(&mut buf).expect("write");
        server.read_tls(&mut buf.as_slice()).expect("read");
        server.process_new_packets()?;
        buf.clear();
        server.write_tls(&mut buf).expect("write");
        client.read_tls(&mut buf.as_slice()).expect("read");
        client.process_new_packets()?;
    }
    Err(rustls::Error::General("handshake did not finish".into()))
}

async fn csrs_eventually(c: &Cluster, n: usize) -> Vec<serde_json::Value> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let csrs = c.api.list("certificatesigningrequests");
            if csrs.len() >= n {
                return csrs;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("CSR submitted")
}

#[tokio::test]
async fn a_serving_csr_is_submitted_approved_by_an_admin_and_served_then_reused() {
    let c = Cluster::start(Options::default()).await;
    let kubeconfig = c.dir.path().join("node-a.conf");
    c.api
        .write_cert_kubeconfig(&kubeconfig, "system:node:node-a", &["system:nodes"])
        .expect("node kubeconfig");
    let (client, _) = crate::client::from_kubeconfig(&kubeconfig, 5.0, 10)
        .await
        .expect("client");
    let pki = c.dir.path().join("pki");
    let (tx, rx) = watch::channel(addresses());
    let manager = ServingCertManager::new(client.clone(), pki.clone(), "node-a".into(), rx);
    let serving = manager.cert();
    let mut issued = serving.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(manager.run(stop.clone()));

    let csr = csrs_eventually(&c, 1).await.remove(0);
    assert_eq!(csr["spec"]["signerName"], "kubernetes.io/kubelet-serving");
    assert_eq!(
        csr["spec"]["usages"],
        serde_json::json!(["digital signature", "key encipherment", "server auth"])
    );
    assert_eq!(csr["spec"]["username"], "system:node:node-a");
    // Signable by every release's signer, 1.19's included.
    for p in apiserver_double::profile::Profile::ALL {
        assert_eq!(
            apiserver_double::csr::kubelet_serving_problem(&csr, p),
            None
        );
    }
    // Without key encipherment (what upstream kubelets send for ECDSA keys
    // since 1.27), a signer before 1.25 would not sign it.
    let mut short = csr.clone();
    short["spec"]["usages"] = serde_json::json!(["digital signature", "server auth"]);
    assert!(
        apiserver_double::csr::kubelet_serving_problem(
            &short,
            apiserver_double::profile::Profile::V1_19
        )
        .is_some_and(|p| p.contains("usages did not match"))
    );
    assert_eq!(
        apiserver_double::csr::kubelet_serving_problem(
            &short,
            apiserver_double::profile::Profile::V1_35
        ),
        None
    );
    assert_eq!(
        apiserver_double::csr::kubelet_serving_requester_problem(&csr),
        None
    );
    assert!(
        csr.pointer("/status/conditions").is_none(),
        "serving CSRs are not auto-approved: {csr}"
    );
    assert!(serving.current().is_none());
    assert!(
        handshake(serving.clone(), c.api.ca_pem(), "node-a").is_err(),
        "no certificate before approval"
    );

    let name = csr["metadata"]["name"].as_str().expect("name").to_string();
    let admin: Api<CertificateSigningRequest> = Api::all(c.admin().await);
    admin
        .patch_approval(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [{
                "type": "Approved", "status": "True", "reason": "AdminApproved",
                "message": "approved by the test"}]}})),
        )
        .await
        .expect("approve");
    tokio::time::timeout(Duration::from_secs(10), issued.changed())
        .await
        .expect("issued in time")
        .expect("open");

    let key = serving.current().expect("serving");
    let info = CertInfo::from_der(key.cert[0].as_ref()).expect("leaf");
    assert_eq!(
        info.dns_names.iter().cloned().collect::<Vec<_>>(),
        ["node-a", "node-a.internal"]
    );
    assert_eq!(
        info.ips.iter().copied().collect::<Vec<_>>(),
        ["10.1.2.3".parse::<IpAddr>().expect("ip")]
    );
    assert_eq!(info.common_name, "system:node:node-a");
    handshake(serving.clone(), c.api.ca_pem(), "node-a").expect("node name verifies");
    handshake(serving.clone(), c.api.ca_pem(), "10.1.2.3").expect("node IP verifies");
    assert!(
        handshake(serving.clone(), c.api.ca_pem(), "other-node").is_err(),
        "other names do not"
    );
    let stored = store::current_path_for(&pki, store::SERVER_PREFIX);
    assert!(
        std::fs::read_link(&stored)
            .expect("symlink")
            .to_string_lossy()
            .contains("kubelet-server-"),
        "stored as kubelet-server-<time>.pem"
    );
    stop.cancel();
    task.await.expect("stops");
    drop(tx);

    // A restart serves the stored certificate without a new request.
    let (_tx, rx) = watch::channel(addresses());
    let again = ServingCertManager::new(client, pki, "node-a".into(), rx);
    assert!(again.load_stored().await);
    let reloaded = again.cert();
    assert_eq!(reloaded.info(), Some(info.clone()));
    let template = Template::from_addresses("node-a", &addresses()).expect("template");
    assert!(template.satisfied_by(&info), "nothing to rotate for");
    let stop = CancellationToken::new();
    let task = tokio::spawn(again.run(stop.clone()));
    handshake(reloaded, c.api.ca_pem(), "node-a").expect("served after restart");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.api.list("certificatesigningrequests").len(), 1);
    stop.cancel();
    task.await.expect("stops");
}

#[tokio::test]
async fn the_double_fails_a_serving_csr_without_sans() {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
    let c = Cluster::start(Options::default()).await;
    let node = c.node_client("node-b").await;
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(DnType::CommonName, "system:node:node-b");
    let pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let submit = tokio::spawn(async move {
        super::csr::request_certificate_for(
            &node,
            &pem,
            Some("no-sans"),
            "kubernetes.io/kubelet-serving",
            &["digital signature", "server auth"],
            Duration::from_secs(10),
        )
        .await
    });
    csrs_eventually(&c, 1).await;
    let admin: Api<CertificateSigningRequest> = Api::all(c.admin().await);
    admin
        .patch_approval(
            "no-sans",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [{
                "type": "Approved", "status": "True", "reason": "AdminApproved"}]}})),
        )
        .await
        .expect("approve");
    let e = submit
        .await
        .expect("join")
        .expect_err("failed by the signer");
    assert!(
        e.to_string()
            .contains("DNS or IP subjectAltName is required"),
        "{e}"
    );
}

#[tokio::test]
async fn new_addresses_while_waiting_for_approval_make_a_new_request() {
    let c = Cluster::start(Options::default()).await;
    let kubeconfig = c.dir.path().join("node-c.conf");
    c.api
        .write_cert_kubeconfig(&kubeconfig, "system:node:node-c", &["system:nodes"])
        .expect("node kubeconfig");
    let (client, _) = crate::client::from_kubeconfig(&kubeconfig, 5.0, 10)
        .await
        .expect("client");
    let ip = |a: &str| {
        vec![NodeAddress {
            type_: "InternalIP".into(),
            address: a.into(),
        }]
    };
    let (tx, rx) = watch::channel(ip("10.9.0.1"));
    let manager = ServingCertManager::new(client, c.dir.path().join("pki"), "node-c".into(), rx);
    let serving = manager.cert();
    let mut issued = serving.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(manager.run(stop.clone()));
    csrs_eventually(&c, 1).await;
    tx.send_replace(ip("10.9.0.2"));
    let csrs = csrs_eventually(&c, 2).await;
    let newest = csrs
        .iter()
        .find(|c| {
            let info = rcgen::CertificateSigningRequestParams::from_pem(
                std::str::from_utf8(&base64_decode(&c["spec"]["request"])).expect("utf8"),
            )
            .expect("csr");
            info.params.subject_alt_names
                == [rcgen::SanType::IpAddress("10.9.0.2".parse().expect("ip"))]
        })
        .expect("a request for the new address");
    let admin: Api<CertificateSigningRequest> = Api::all(c.admin().await);
    admin
        .patch_approval(
            newest["metadata"]["name"].as_str().expect("name"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [{
                "type": "Approved", "status": "True", "reason": "AdminApproved"}]}})),
        )
        .await
        .expect("approve");
    tokio::time::timeout(Duration::from_secs(10), issued.changed())
        .await
        .expect("issued in time")
        .expect("open");
    assert_eq!(
        serving
            .info()
            .expect("info")
            .ips
            .into_iter()
            .collect::<Vec<_>>(),
        ["10.9.0.2".parse::<IpAddr>().expect("ip")]
    );
    stop.cancel();
    task.await.expect("stops");
}

fn base64_decode(v: &serde_json::Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("base64 string"))
        .expect("base64")
}
