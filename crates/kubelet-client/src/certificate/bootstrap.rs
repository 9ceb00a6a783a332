//! TLS bootstrap (upstream `pkg/kubelet/certificate/bootstrap` `LoadClientCert`):
//! when `--kubeconfig` is missing or its client certificate is unusable and a
//! `--bootstrap-kubeconfig` is given, request a client certificate with the
//! bootstrap credentials, store it under `--cert-dir`, and write a kubeconfig
//! that points at `kubelet-client-current.pem`.

use std::path::Path;
use std::time::{Duration, SystemTime};

use base64::Engine;
use kube::config::Kubeconfig;
use rcgen::{KeyPair, PublicKeyData};
use tracing::{info, warn};

use super::{csr, store};
use crate::Error;
use crate::client;
use crate::error::blocking;

/// How long a bootstrap waits for its certificate (upstream: one hour).
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(3600);

/// Whether `kubeconfig` can be used as it is: it loads, and a client
/// certificate in it (if any) has not expired.
pub async fn is_client_config_valid(kubeconfig: &Path) -> bool {
    let Ok(loaded) = client::load(kubeconfig).await else {
        return false;
    };
    match &loaded.identity {
        None => true,
        Some((cert, _)) => match store::validity(cert) {
            Ok((_, not_after)) => not_after > SystemTime::now(),
            Err(_) => false,
        },
    }
}

/// Makes sure `kubeconfig` holds usable credentials, bootstrapping if needed.
pub async fn load_client_cert(
    kubeconfig: &Path,
    bootstrap: Option<&Path>,
    cert_dir: &Path,
    node: &str,
) -> Result<(), Error> {
    if is_client_config_valid(kubeconfig).await {
        return Ok(());
    }
    let Some(bootstrap) = bootstrap else {
        return Err(Error::NoBootstrap {
            kubeconfig: kubeconfig.to_path_buf(),
        });
    };
    // A certificate from an earlier bootstrap whose kubeconfig was lost is still good.
    let current = store::current_path(cert_dir);
    if let Ok(pem) = tokio::fs::read(&current).await
        && let Ok((_, not_after)) = store::validity(&store::split_pem(&pem).0)
        && not_after > SystemTime::now()
    {
        info!(cert = %current.display(), "Using existing client certificate; writing kubeconfig");
        return write_kubeconfig(kubeconfig, bootstrap, &current).await;
    }
    info!(bootstrap = %bootstrap.display(), "Requesting a client certificate with the bootstrap kubeconfig");
    let (client, _) = client::from_kubeconfig(bootstrap, 5.0, 10).await?;
    let dir = cert_dir.to_path_buf();
    let key = blocking(move || pending_key(&dir)).await?;
    let request = csr::request_pem(node, &key)?;
    let name = csr::digested_name(&key.subject_public_key_info(), node);
    let cert = csr::request_certificate(&client, &request, Some(&name), BOOTSTRAP_TIMEOUT).await?;
    let current = store::store_pair(cert_dir, &cert, key.serialize_pem().as_bytes()).await?;
    if let Err(e) = tokio::fs::remove_file(store::pending_key_path(cert_dir)).await {
        warn!(error = %e, "Cannot remove the pending bootstrap key");
    }
    info!(cert = %current.display(), "Client certificate issued");
    write_kubeconfig(kubeconfig, bootstrap, &current).await
}

/// The key of the pending bootstrap request: the one kept by an earlier
/// start, so the same CSR is reused, or a new one, kept for the next start.
/// Blocking.
fn pending_key(cert_dir: &Path) -> Result<KeyPair, Error> {
    std::fs::create_dir_all(cert_dir).map_err(Error::io(cert_dir))?;
    let key_path = store::pending_key_path(cert_dir);
    if let Some(k) = std::fs::read_to_string(&key_path)
        .ok()
        .and_then(|k| KeyPair::from_pem(&k).ok())
    {
        return Ok(k);
    }
    let k = KeyPair::generate()?;
    store::write_private(&key_path, k.serialize_pem().as_bytes())?;
    Ok(k)
}

/// Writes the kubelet's kubeconfig: the bootstrap kubeconfig's cluster, and the
/// certificate file as user (upstream `writeKubeconfigFromBootstrapping`).
async fn write_kubeconfig(kubeconfig: &Path, bootstrap: &Path, cert: &Path) -> Result<(), Error> {
    let (kubeconfig, bootstrap, cert) = (
        kubeconfig.to_path_buf(),
        bootstrap.to_path_buf(),
        cert.to_path_buf(),
    );
    blocking(move || write_kubeconfig_blocking(&kubeconfig, &bootstrap, &cert)).await
}

fn write_kubeconfig_blocking(
    kubeconfig: &Path,
    bootstrap: &Path,
    cert: &Path,
) -> Result<(), Error> {
    let kc = Kubeconfig::read_from(bootstrap).map_err(|source| Error::Kubeconfig {
        path: bootstrap.to_path_buf(),
        source,
    })?;
    let context = kc.current_context.clone().unwrap_or_default();
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .or_else(|| kc.clusters.first().map(|c| c.name.clone()))
        .unwrap_or_default();
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| Error::NoCluster {
            path: bootstrap.to_path_buf(),
        })?;
    let server = cluster.server.clone().unwrap_or_default();
    let base = bootstrap.parent().unwrap_or(Path::new("/"));
    let ca_line = if let Some(data) = &cluster.certificate_authority_data {
        format!("    certificate-authority-data: {data}\n")
    } else if let Some(file) = &cluster.certificate_authority {
        let path = base.join(file);
        let pem = std::fs::read(&path).map_err(Error::io(path))?;
        format!(
            "    certificate-authority-data: {}\n",
            base64::engine::general_purpose::STANDARD.encode(pem)
        )
    } else {
        String::new()
    };
    let cert = cert.display();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n{ca_line}    server: {server}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\npreferences: {{}}\nusers:\n- name: default-auth\n  user:\n    client-certificate: {cert}\n    client-key: {cert}\n"
    );
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    }
    store::write_private(kubeconfig, text.as_bytes())?;
    info!(kubeconfig = %kubeconfig.display(), "Wrote kubeconfig");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use apiserver_double::{BOOTSTRAP_TOKEN, Options};
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, PostParams};
    use kubelet_test_util::Cluster;

    /// Bootstraps `node` with the double's bootstrap token: (bootstrap kubeconfig, kubeconfig, cert dir).
    async fn bootstrapped(
        c: &Cluster,
        node: &str,
    ) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
        let dir = c.dir.path();
        let bootstrap = dir.join("bootstrap-kubelet.conf");
        c.api
            .write_token_kubeconfig(&bootstrap, BOOTSTRAP_TOKEN)
            .expect("bootstrap kubeconfig");
        let (kubeconfig, pki) = (dir.join("kubelet.conf"), dir.join("pki"));
        load_client_cert(&kubeconfig, Some(&bootstrap), &pki, node)
            .await
            .expect("bootstrap");
        (bootstrap, kubeconfig, pki)
    }

    #[tokio::test]
    async fn bootstrap_gets_an_approved_kubelet_certificate_and_writes_the_kubeconfig() {
        let c = Cluster::start(Options::default()).await;
        let (bootstrap, kubeconfig, pki) = bootstrapped(&c, "node-a").await;

        let csrs = c.api.list("certificatesigningrequests");
        assert_eq!(csrs.len(), 1);
        let csr = &csrs[0];
        assert!(
            csr["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("node-csr-"))
        );
        assert_eq!(
            csr["spec"]["signerName"],
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        assert_eq!(
            csr["spec"]["usages"],
            serde_json::json!(["digital signature", "key encipherment", "client auth"])
        );
        assert_eq!(csr["spec"]["username"], "system:bootstrap:07401b");
        assert!(
            apiserver_double::csr::kubelet_client_problem(csr).is_none(),
            "auto-approvable as is"
        );
        assert!(store::current_path(&pki).exists());
        assert!(
            !store::pending_key_path(&pki).exists(),
            "pending key cleaned up"
        );
        let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
        assert!(text.contains("kubelet-client-current.pem"), "{text}");

        // The new identity is the node's: it may register its own Node.
        let (client, _) = crate::client::from_kubeconfig(&kubeconfig, 5.0, 10)
            .await
            .expect("client");
        let mut node = Node::default();
        node.metadata.name = Some("node-a".into());
        Api::<Node>::all(client)
            .create(&PostParams::default(), &node)
            .await
            .expect("node registers");
        assert!(
            c.api
                .requests()
                .iter()
                .any(|r| r.path == "/api/v1/nodes"
                    && r.user.as_deref() == Some("system:node:node-a")),
            "authenticated by the issued certificate"
        );

        // A second start finds a valid kubeconfig and asks for nothing.
        load_client_cert(&kubeconfig, Some(&bootstrap), &pki, "node-a")
            .await
            .expect("again");
        assert_eq!(c.api.list("certificatesigningrequests").len(), 1);
    }

    #[tokio::test]
    async fn a_wrong_token_or_no_bootstrap_is_a_clear_error() {
        let c = Cluster::start(Options::default()).await;
        let dir = c.dir.path();
        let bootstrap = dir.join("bad.conf");
        c.api
            .write_token_kubeconfig(&bootstrap, "abcdef.0000000000000000")
            .expect("kubeconfig");
        let e = load_client_cert(&dir.join("k.conf"), Some(&bootstrap), &dir.join("pki"), "n")
            .await
            .expect_err("401");
        assert!(
            e.to_string().contains("401") || e.to_string().contains("Unauthorized"),
            "{e}"
        );
        let e = load_client_cert(&dir.join("k.conf"), None, &dir.join("pki"), "n")
            .await
            .expect_err("no bootstrap");
        assert!(e.to_string().contains("--bootstrap-kubeconfig"), "{e}");
    }

    /// Issue 7 fix 4.8: a kubeconfig whose read blocks (a FIFO with no
    /// writer) does not stall the runtime the kubelet starts on.
    #[test]
    fn a_blocking_kubeconfig_read_does_not_stall_the_runtime() {
        kubelet_test_util::blocking::assert_runtime_not_stalled_by(
            "kubelet.conf",
            |dir| async move {
                let _ =
                    load_client_cert(&dir.join("kubelet.conf"), None, &dir.join("pki"), "n").await;
            },
        );
    }

    /// Issue 7 fix 4.8: neither does a blocking read of the certificate an
    /// earlier bootstrap left behind.
    #[test]
    fn a_blocking_read_of_the_current_certificate_does_not_stall_the_runtime() {
        kubelet_test_util::blocking::assert_runtime_not_stalled_by(
            "pki/kubelet-client-current.pem",
            |dir| async move {
                let bootstrap = dir.join("bootstrap-kubelet.conf");
                let _ = load_client_cert(
                    &dir.join("kubelet.conf"),
                    Some(&bootstrap),
                    &dir.join("pki"),
                    "n",
                )
                .await;
            },
        );
    }
}
