//! The crate's one error type (upstream returns wrapped `error`s from
//! `LoadClientCert`, `buildKubeletClientConfig` and the certificate manager).
//!
//! [`RequestTimeout`](crate::client::RequestTimeout) is not a variant: it is
//! the leaf error the deadline layer returns through tower, boxed into
//! `kube::Error::Service`, and it has to stay a small standalone
//! `std::error::Error` so callers find it by downcasting
//! ([`is_timeout`](crate::is_timeout)).

use std::path::PathBuf;
use std::time::Duration;

/// Why the apiserver client, TLS bootstrap or certificate rotation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kubeconfig cannot be read, parsed or resolved to a cluster.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A kubeconfig's credentials are unusable.
    #[error("kubeconfig {}: {source}", path.display())]
    Credentials {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// Inline kubeconfig data (`client-certificate-data`, …) is not base64.
    #[error("{field}: bad base64: {source}")]
    Base64 {
        /// The kubeconfig field.
        field: &'static str,
        /// Why.
        #[source]
        source: base64::DecodeError,
    },
    /// A kubeconfig user has a client certificate without a key, or a key
    /// without a certificate.
    #[error("client certificate and key must be given together")]
    IncompleteIdentity,
    /// A kubeconfig was missing or unusable, and there is nothing to
    /// bootstrap it from.
    #[error(
        "kubeconfig {} is missing or invalid and no --bootstrap-kubeconfig was given",
        kubeconfig.display()
    )]
    NoBootstrap {
        /// The `--kubeconfig` path.
        kubeconfig: PathBuf,
    },
    /// The bootstrap kubeconfig names no cluster to write into the kubeconfig.
    #[error("bootstrap kubeconfig {} has no cluster", path.display())]
    NoCluster {
        /// The `--bootstrap-kubeconfig` path.
        path: PathBuf,
    },
    /// A certificate or key file does not hold a usable certificate or key.
    #[error("{}: {source}", path.display())]
    CertificateFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// A certificate and a private key do not belong together.
    #[error("certificate {} does not match private key {}", cert.display(), key.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A blocking file task did not finish (the runtime is shutting down).
    #[error("blocking file task: {0}")]
    Blocking(#[from] tokio::task::JoinError),
    /// PEM that should hold a certificate or key does not parse.
    #[error("bad {what} PEM: {source}")]
    Pem {
        /// `"certificate"` or `"private key"`.
        what: &'static str,
        /// Why.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// PEM that should hold a certificate holds none.
    #[error("no certificate in PEM")]
    NoCertificate,
    /// A certificate does not parse as X.509.
    #[error("certificate: {0}")]
    X509(#[source] x509_parser::error::X509Error),
    /// rustls cannot sign with the private key.
    #[error("unsupported private key: {0}")]
    UnsupportedKey(#[source] rustls::Error),
    /// TLS or client setup failed.
    #[error("TLS or client setup: {0}")]
    Setup(#[source] kube::Error),
    /// Key or certificate request generation failed.
    #[error("key or certificate request: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// The apiserver refused or failed.
    #[error("apiserver: {0}")]
    Api(#[from] kube::Error),
    /// A CSR of the bootstrap's name exists for another key.
    #[error("CertificateSigningRequest {name} exists with a different request")]
    CsrConflict {
        /// The CSR.
        name: String,
    },
    /// The CSR was denied or failed (its `Denied` or `Failed` condition).
    #[error("certificate signing request was {}: {reason} {message}", condition.to_lowercase())]
    CsrRefused {
        /// `Denied` or `Failed`.
        condition: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The CSR was deleted before a certificate was issued.
    #[error("CertificateSigningRequest {name} was deleted")]
    CsrDeleted {
        /// The CSR.
        name: String,
    },
    /// The apiserver's version or discovery documents could not be read.
    #[error("discovery: {what} took longer than {after:?}")]
    DiscoveryTimeout {
        /// `/version` or a discovery document.
        what: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// `/version` answered a version that is not `<major>.<minor>`.
    #[error("discovery: unparsable server version {0:?}")]
    ServerVersion(String),
    /// No certificate was issued in time.
    #[error("timed out waiting for CertificateSigningRequest {name} after {after:?}")]
    CsrTimeout {
        /// The CSR.
        name: String,
        /// How long the kubelet waited.
        after: Duration,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// Runs a group of related blocking file operations on tokio's blocking
/// pool, off the async runtime.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, Error> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await?
}
