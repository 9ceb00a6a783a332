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

use super::{CertError, csr, store};
use crate::kubeclient;

/// How long a bootstrap waits for its certificate (upstream: one hour).
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(3600);

/// Whether `kubeconfig` can be used as it is: it loads, and a client
/// certificate in it (if any) has not expired.
pub async fn is_client_config_valid(kubeconfig: &Path) -> bool {
    let Ok(loaded) = kubeclient::load(kubeconfig).await else {
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
) -> Result<(), CertError> {
    if is_client_config_valid(kubeconfig).await {
        return Ok(());
    }
    let Some(bootstrap) = bootstrap else {
        return Err(CertError::Invalid(format!(
            "kubeconfig {} is missing or invalid and no --bootstrap-kubeconfig was given",
            kubeconfig.display()
        )));
    };
    // A certificate from an earlier bootstrap whose kubeconfig was lost is still good.
    let current = store::current_path(cert_dir);
    if let Ok(pem) = std::fs::read(&current)
        && let Ok((_, not_after)) = store::validity(&store::split_pem(&pem).0)
        && not_after > SystemTime::now()
    {
        info!(cert = %current.display(), "Using existing client certificate; writing kubeconfig");
        return write_kubeconfig(kubeconfig, bootstrap, &current);
    }
    info!(bootstrap = %bootstrap.display(), "Requesting a client certificate with the bootstrap kubeconfig");
    let (client, _) = kubeclient::from_kubeconfig(bootstrap, 5.0, 10)
        .await
        .map_err(|e| CertError::Invalid(e.to_string()))?;
    std::fs::create_dir_all(cert_dir)
        .map_err(|e| CertError::Io(format!("{}: {e}", cert_dir.display())))?;
    // The key survives restarts while the request is pending, so the same CSR is reused.
    let key_path = store::pending_key_path(cert_dir);
    let key = match std::fs::read_to_string(&key_path)
        .ok()
        .and_then(|k| KeyPair::from_pem(&k).ok())
    {
        Some(k) => k,
        None => {
            let k = KeyPair::generate()?;
            store::write_private(&key_path, k.serialize_pem().as_bytes())?;
            k
        }
    };
    let request = csr::request_pem(node, &key)?;
    let name = csr::digested_name(&key.subject_public_key_info(), node);
    let cert = csr::request_certificate(&client, &request, Some(&name), BOOTSTRAP_TIMEOUT).await?;
    let current = store::store_pair(cert_dir, &cert, key.serialize_pem().as_bytes())?;
    if let Err(e) = std::fs::remove_file(&key_path) {
        warn!(error = %e, "Cannot remove the pending bootstrap key");
    }
    info!(cert = %current.display(), "Client certificate issued");
    write_kubeconfig(kubeconfig, bootstrap, &current)
}

/// Writes the kubelet's kubeconfig: the bootstrap kubeconfig's cluster, and the
/// certificate file as user (upstream `writeKubeconfigFromBootstrapping`).
fn write_kubeconfig(kubeconfig: &Path, bootstrap: &Path, cert: &Path) -> Result<(), CertError> {
    let kc = Kubeconfig::read_from(bootstrap).map_err(|e| CertError::Invalid(e.to_string()))?;
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
        .ok_or_else(|| {
            CertError::Invalid(format!(
                "bootstrap kubeconfig {} has no cluster",
                bootstrap.display()
            ))
        })?;
    let server = cluster.server.clone().unwrap_or_default();
    let base = bootstrap.parent().unwrap_or(Path::new("/"));
    let ca_line = if let Some(data) = &cluster.certificate_authority_data {
        format!("    certificate-authority-data: {data}\n")
    } else if let Some(file) = &cluster.certificate_authority {
        let pem =
            std::fs::read(base.join(file)).map_err(|e| CertError::Io(format!("{file}: {e}")))?;
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
        std::fs::create_dir_all(dir)
            .map_err(|e| CertError::Io(format!("{}: {e}", dir.display())))?;
    }
    store::write_private(kubeconfig, text.as_bytes())?;
    info!(kubeconfig = %kubeconfig.display(), "Wrote kubeconfig");
    Ok(())
}
