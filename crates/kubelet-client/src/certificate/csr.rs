//! Requesting a kubelet client certificate through the certificates API
//! (upstream `k8s.io/client-go/util/certificate/csr`): a CSR with signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `O=system:nodes, CN=system:node:<node>`, usages exactly digital signature,
//! key encipherment and client auth, no SANs; then wait until it is approved
//! and issued, or denied.

use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::Client;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use sha2::{Digest, Sha512};
use tracing::info;

use crate::Error;

/// The signer of kubelet client certificates.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The usages the approver requires, in upstream order.
pub const USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

/// The PEM certificate request for `node`, signed with `key`.
pub fn request_pem(node: &str, key: &KeyPair) -> Result<String, Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    Ok(params.serialize_request(key)?.pem()?)
}

/// The bootstrap CSR name: a digest of key, subject and usages, so a restarted
/// kubelet finds its own pending request (upstream `digestedName`).
pub fn digested_name(public_key_der: &[u8], node: &str) -> String {
    let mut h = Sha512::new();
    h.update(public_key_der);
    h.update(b"|O=system:nodes|CN=system:node:");
    h.update(node.as_bytes());
    for u in USAGES {
        h.update(b"|");
        h.update(u.as_bytes());
    }
    let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.finalize());
    format!("node-csr-{digest}")
}

/// Creates the kubelet client CSR (named, or with `generateName: csr-`) and
/// waits for its certificate.
pub async fn request_certificate(
    client: &Client,
    csr_pem: &str,
    name: Option<&str>,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    request_certificate_for(client, csr_pem, name, SIGNER, &USAGES, timeout).await
}

/// Creates a CSR for `signer` with `usages` (named, or with
/// `generateName: csr-`) and waits up to `timeout` for its certificate
/// (upstream `csr.RequestCertificate` and `csr.WaitForCertificate`).
pub async fn request_certificate_for(
    client: &Client,
    csr_pem: &str,
    name: Option<&str>,
    signer: &str,
    usages: &[&str],
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut obj = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: signer.to_string(),
            usages: Some(usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    match name {
        Some(n) => obj.metadata.name = Some(n.to_string()),
        None => obj.metadata.generate_name = Some("csr-".to_string()),
    }
    let created = match api.create(&PostParams::default(), &obj).await {
        Ok(c) => c,
        Err(kube::Error::Api(s)) if s.code == 409 && name.is_some() => {
            let existing = api.get(name.unwrap_or_default()).await?;
            if existing.spec.request.0 != csr_pem.as_bytes() {
                return Err(Error::CsrConflict {
                    name: name.unwrap_or_default().to_string(),
                });
            }
            existing
        }
        Err(e) => return Err(e.into()),
    };
    let csr_name = created.metadata.name.clone().unwrap_or_default();
    info!(csr = %csr_name, signer, "Waiting for certificate");
    tokio::time::timeout(timeout, wait_issued(&api, &csr_name, created))
        .await
        .map_err(|_| Error::CsrTimeout {
            name: csr_name.clone(),
            after: timeout,
        })?
}

/// The certificate once issued, or why it never will be.
fn issued(csr: &CertificateSigningRequest) -> Option<Result<Vec<u8>, Error>> {
    let status = csr.status.as_ref()?;
    for c in status.conditions.iter().flatten() {
        if c.status == "True" && (c.type_ == "Denied" || c.type_ == "Failed") {
            return Some(Err(Error::CsrRefused {
                condition: c.type_.clone(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
            }));
        }
    }
    let approved = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Approved" && c.status == "True");
    match &status.certificate {
        Some(cert) if approved && !cert.0.is_empty() => Some(Ok(cert.0.clone())),
        _ => None,
    }
}

async fn wait_issued(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    mut latest: CertificateSigningRequest,
) -> Result<Vec<u8>, Error> {
    loop {
        if let Some(r) = issued(&latest) {
            return r;
        }
        let rv = latest.metadata.resource_version.clone().unwrap_or_default();
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let stream = match api.watch(&wp, &rv).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "CSR watch failed; polling");
                tokio::time::sleep(Duration::from_secs(2)).await;
                latest = api.get(name).await?;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(WatchEvent::Added(c) | WatchEvent::Modified(c)) => {
                    if let Some(r) = issued(&c) {
                        return r;
                    }
                }
                Ok(WatchEvent::Deleted(_)) => {
                    return Err(Error::CsrDeleted {
                        name: name.to_string(),
                    });
                }
                Ok(WatchEvent::Bookmark(_)) => {}
                Ok(WatchEvent::Error(_)) | Err(_) => break,
            }
        }
        latest = api.get(name).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::PublicKeyData;

    #[test]
    fn the_request_has_exactly_the_kubelet_subject_and_no_sans() {
        let key = KeyPair::generate().expect("key");
        let pem = request_pem("node-1", &key).expect("csr");
        let params = rcgen::CertificateSigningRequestParams::from_pem(&pem).expect("parse");
        assert!(params.params.subject_alt_names.is_empty());
        let dn: Vec<_> = params
            .params
            .distinguished_name
            .iter()
            .map(|(t, _)| t.clone())
            .collect();
        assert!(dn.contains(&DnType::CommonName) && dn.contains(&DnType::OrganizationName));
        assert_eq!(dn.len(), 2);
        let a = digested_name(&key.subject_public_key_info(), "node-1");
        assert_eq!(
            a,
            digested_name(&key.subject_public_key_info(), "node-1"),
            "stable across restarts"
        );
        assert_ne!(a, digested_name(&key.subject_public_key_info(), "node-2"));
        assert!(a.starts_with("node-csr-"));
    }
}
