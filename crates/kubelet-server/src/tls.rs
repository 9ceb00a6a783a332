//! TLS settings of the node API (upstream `cmd/kubelet/app/server.go`
//! `InitializeTLS` and `component-base/cli/flag/ciphersuites_flag.go`):
//! `tlsCipherSuites` by their Go names, `tlsMinVersion`, the serving
//! certificate through a swappable resolver, ALPN `h2` and `http/1.1`.
//!
//! Client certificates are *requested*, not verified, in the handshake, as
//! upstream does (`tls.RequestClientCert`): a client proves it holds the key
//! (the handshake checks its signature), and the x509 authenticator
//! ([`crate::auth::authn`]) checks the chain against the current
//! `clientCAFile` per request. So a certificate from another CA does not
//! fail the handshake; it falls through to token or anonymous
//! authentication, and a reloaded CA takes effect without a new listener.
//!
//! Version choice: rustls speaks TLS 1.2 and 1.3 only. `VersionTLS10` and
//! `VersionTLS11` are accepted and raised to TLS 1.2 with a warning (every
//! client upstream's defaults admit still connects); other names are errors.

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::DistinguishedName;
use rustls::SignatureScheme;
use rustls::SupportedCipherSuite;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, ring};
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Errors building the TLS configuration; each stops the kubelet at startup.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A `tlsCipherSuites` name Go does not know.
    #[error("tlsCipherSuites: unknown cipher suite {0:?}")]
    UnknownCipherSuite(String),
    /// A Go cipher suite rustls does not implement (CBC, RSA key exchange,
    /// 3DES, RC4).
    #[error(
        "tlsCipherSuites: cipher suite {0:?} is not supported by this kubelet (only ECDHE with AES-GCM or ChaCha20-Poly1305)"
    )]
    UnsupportedCipherSuite(String),
    /// A `tlsMinVersion` value Go does not know.
    #[error(
        "tlsMinVersion: unknown version {0:?} (VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13)"
    )]
    UnknownVersion(String),
    /// rustls refused the configuration.
    #[error("tls configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The serving certificate or key cannot be used.
    #[error("serving certificate: {0}")]
    Certificate(String),
}

/// The node API's TLS settings (KubeletConfiguration `tlsCipherSuites`,
/// `tlsMinVersion`; `authentication.x509.clientCAFile` decides whether
/// client certificates are requested).
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// Go cipher suite names; empty means the defaults.
    pub cipher_suites: Vec<String>,
    /// `VersionTLS12` or `VersionTLS13`; empty means TLS 1.2.
    pub min_version: String,
    /// Request client certificates (set when `clientCAFile` is configured).
    pub request_client_certs: bool,
}

/// Go names of the TLS 1.3 suites: accepted in `tlsCipherSuites`, not
/// configurable (Go always enables them), so they are ignored.
const TLS13_NAMES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Go names rustls does not implement (`tls.CipherSuites()` and
/// `tls.InsecureCipherSuites()` minus the AEAD ECDHE suites).
const UNSUPPORTED_NAMES: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// One Go name to a rustls TLS 1.2 suite; `Ok(None)` for a TLS 1.3 name.
fn suite(name: &str) -> Result<Option<SupportedCipherSuite>, TlsError> {
    use ring::cipher_suite as cs;
    let s = match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        // Go accepts both spellings of the ChaCha20 suites.
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        n if TLS13_NAMES.contains(&n) => return Ok(None),
        n if UNSUPPORTED_NAMES.contains(&n) => {
            return Err(TlsError::UnsupportedCipherSuite(n.to_string()));
        }
        n => return Err(TlsError::UnknownCipherSuite(n.to_string())),
    };
    Ok(Some(s))
}

/// Whether the minimum version is TLS 1.3 (`false`: TLS 1.2).
fn min_is_tls13(v: &str) -> Result<bool, TlsError> {
    match v {
        "" | "VersionTLS12" => Ok(false),
        "VersionTLS13" => Ok(true),
        "VersionTLS10" | "VersionTLS11" => {
            tracing::warn!(
                tls_min_version = v,
                "TLS 1.0 and 1.1 are not available; serving TLS 1.2 and above"
            );
            Ok(false)
        }
        other => Err(TlsError::UnknownVersion(other.to_string())),
    }
}

/// The crypto provider for `settings`: ring with the configured TLS 1.2
/// suites (all when none are named) and every TLS 1.3 suite.
pub fn provider(settings: &TlsSettings) -> Result<CryptoProvider, TlsError> {
    let base = ring::default_provider();
    let tls13_only = min_is_tls13(&settings.min_version)?;
    let mut tls12 = Vec::new();
    for name in &settings.cipher_suites {
        if let Some(s) = suite(name.trim())? {
            tls12.push(s);
        }
    }
    let tls13 = base
        .cipher_suites
        .iter()
        .copied()
        .filter(|s| s.version() == &rustls::version::TLS13);
    let cipher_suites: Vec<SupportedCipherSuite> = if tls13_only {
        tls13.collect()
    } else if settings.cipher_suites.is_empty() {
        base.cipher_suites.clone()
    } else if tls12.is_empty() {
        // Go keeps TLS 1.2 enabled with no suite, so only TLS 1.3 clients
        // connect; rustls needs the version off for the same effect.
        tracing::warn!("tlsCipherSuites names no TLS 1.2 suite; serving TLS 1.3 only");
        tls13.collect()
    } else {
        tls12.into_iter().chain(tls13).collect()
    };
    Ok(CryptoProvider {
        cipher_suites,
        ..base
    })
}

/// The rustls server configuration of the node API.
pub fn server_config(
    settings: &TlsSettings,
    cert: Arc<dyn ResolvesServerCert>,
) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(provider(settings)?);
    let has_tls12 = provider
        .cipher_suites
        .iter()
        .any(|s| s.version() == &rustls::version::TLS12);
    let versions: &[&rustls::SupportedProtocolVersion] = if has_tls12 {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)?;
    let builder = if settings.request_client_certs {
        builder.with_client_cert_verifier(Arc::new(RequestClientCert {
            algorithms: provider.signature_verification_algorithms,
        }))
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Go's `tls.RequestClientCert`: ask for a certificate, accept none, check
/// only that the client holds the key of the one it sends. The chain is
/// checked by the x509 authenticator against the current CA.
#[derive(Debug)]
struct RequestClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: a client picks its certificate itself (the CA may be
        // reloaded under a running listener).
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A serving certificate that can be replaced while serving (a rotated or
/// regenerated certificate takes effect on the next handshake).
#[derive(Debug, Default)]
pub struct SwappableCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl SwappableCert {
    /// A resolver serving `key`.
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        Self {
            current: RwLock::new(Some(key)),
        }
    }

    /// Replaces the certificate.
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.current.write() = Some(key);
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().clone()
    }
}

/// A certified key from PEM texts (certificate chain, then private key).
pub fn certified_key_from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Certificate(format!("certificate PEM: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::Certificate("no certificate in PEM".into()));
    }
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::Certificate(format!("private key PEM: {e}")))?;
    let signer = ring::sign::any_supported_type(&key)?;
    Ok(CertifiedKey::new(chain, signer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(suites: &[&str], min: &str) -> TlsSettings {
        TlsSettings {
            cipher_suites: suites.iter().map(|s| s.to_string()).collect(),
            min_version: min.into(),
            request_client_certs: false,
        }
    }

    #[test]
    fn go_names_map_to_rustls_suites() {
        let p = provider(&settings(
            &[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                "TLS_AES_128_GCM_SHA256",
            ],
            "",
        ))
        .expect("valid suites");
        let tls12: Vec<_> = p
            .cipher_suites
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
            .map(|s| s.suite())
            .collect();
        assert_eq!(
            tls12,
            vec![
                rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            ]
        );
        // TLS 1.3 suites stay, as in Go.
        assert_eq!(
            p.cipher_suites
                .iter()
                .filter(|s| s.version() == &rustls::version::TLS13)
                .count(),
            3
        );
    }

    #[test]
    fn bad_names_and_versions_are_typed_errors() {
        assert!(matches!(
            provider(&settings(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA999"], "")),
            Err(TlsError::UnknownCipherSuite(n)) if n == "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA999"
        ));
        assert!(matches!(
            provider(&settings(&["TLS_RSA_WITH_AES_128_CBC_SHA"], "")),
            Err(TlsError::UnsupportedCipherSuite(_))
        ));
        assert!(matches!(
            provider(&settings(&[], "VersionTLS14")),
            Err(TlsError::UnknownVersion(_))
        ));
        let msg = provider(&settings(&["bogus"], ""))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(msg, "tlsCipherSuites: unknown cipher suite \"bogus\"");
    }

    #[test]
    fn tls13_minimum_drops_tls12_suites_and_old_versions_are_raised() {
        let p = provider(&settings(&[], "VersionTLS13")).expect("tls13");
        assert!(
            p.cipher_suites
                .iter()
                .all(|s| s.version() == &rustls::version::TLS13)
        );
        // TLS 1.3 names alone leave TLS 1.3 only, as in Go.
        let p = provider(&settings(&["TLS_AES_128_GCM_SHA256"], "VersionTLS12")).expect("1.3");
        assert!(
            p.cipher_suites
                .iter()
                .all(|s| s.version() == &rustls::version::TLS13)
        );
        let p = provider(&settings(&[], "VersionTLS10")).expect("raised to 1.2");
        assert!(
            p.cipher_suites
                .iter()
                .any(|s| s.version() == &rustls::version::TLS12)
        );
    }
}
