//! Client certificates (upstream `pkg/kubelet/certificate`): TLS bootstrap
//! ([`bootstrap`]), the CSR exchange ([`csr`]), the certificate directory
//! ([`store`]) and rotation ([`manager`]).

pub mod bootstrap;
pub mod csr;
pub mod manager;
pub mod store;

/// Certificate errors.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Key or request generation failed.
    #[error("key or certificate request: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// The apiserver refused or failed.
    #[error("apiserver: {0}")]
    Api(#[from] kube::Error),
    /// The request was denied, failed or timed out.
    #[error("{0}")]
    Csr(String),
    /// A file could not be read or written.
    #[error("{0}")]
    Io(String),
    /// A certificate or kubeconfig is unusable.
    #[error("{0}")]
    Invalid(String),
}
