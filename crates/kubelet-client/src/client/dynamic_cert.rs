//! The client certificate the apiserver client presents, swappable at run time
//! (upstream `certificate.Manager.Current()` behind the transport's
//! `GetClientCertificate` callback): after rotation new connections use the
//! new certificate; open connections, such as the pod watch, keep running.

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate/key pair that can be replaced.
#[derive(Debug, Default)]
pub struct DynamicCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    serial: RwLock<u64>,
}

/// Why PEM could not be used as a client identity.
#[derive(Debug, thiserror::Error)]
#[error("client certificate: {0}")]
pub struct IdentityError(pub String);

/// Parses a PEM certificate chain and a PEM private key into a signing identity.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, IdentityError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| IdentityError(format!("bad certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(IdentityError("no certificate in PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| IdentityError(format!("bad private key PEM: {e}")))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| IdentityError(format!("unsupported private key: {e}")))?;
    Ok(CertifiedKey::new(certs, signer))
}

impl DynamicCert {
    /// Installs a new identity.
    pub fn set(&self, key: CertifiedKey) {
        *self.current.write() = Some(Arc::new(key));
        *self.serial.write() += 1;
    }

    /// How many identities were installed (for tests and logs).
    pub fn generation(&self) -> u64 {
        *self.serial.read()
    }

    /// Whether an identity is installed.
    pub fn is_set(&self) -> bool {
        self.current.read().is_some()
    }
}

impl ResolvesClientCert for DynamicCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current.read().clone()
    }

    fn has_certs(&self) -> bool {
        self.is_set()
    }
}
