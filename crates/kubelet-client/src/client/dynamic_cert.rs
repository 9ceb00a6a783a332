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

use crate::Error;

/// A certificate/key pair that can be replaced.
#[derive(Debug, Default)]
pub struct DynamicCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    serial: RwLock<u64>,
}

/// Parses a PEM certificate chain and a PEM private key into a signing identity.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|source| Error::Pem {
            what: "certificate",
            source,
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| Error::Pem {
        what: "private key",
        source,
    })?;
    let signer =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(Error::UnsupportedKey)?;
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
