//! The kubelet's side of the apiserver (upstream `pkg/kubelet/certificate`,
//! `kubeClientConfigOverrides` and `client-go/tools/record`):
//! - [`client`]: a kube-rs client from a kubeconfig, with a rotating client
//!   certificate, client-side rate limiting and a deadline on every request;
//! - [`certificate`]: TLS bootstrap, the CSR exchange and rotation;
//! - [`events`]: the event recorder and its rate-limited sink;
//! - [`clock`]: the wall clock as a seam for paused-time tests;
//! - [`discovery`]: the apiserver's version and served group versions;
//! - [`refusal`]: when a list or watch the apiserver refuses is reported.
//!
//! Every failure is an [`Error`]. File IO (kubeconfigs, certificates, keys)
//! never runs on the async runtime: it goes through `tokio::fs` or, for a
//! group of related sync operations, one `spawn_blocking`.

pub mod certificate;
pub mod client;
pub mod clock;
pub mod discovery;
mod error;
pub mod events;
pub mod refusal;

pub use certificate::serving::{CertInfo, ServingCert};
pub use certificate::serving_manager::ServingCertManager;
pub use client::{
    ClientOptions, Connections, DynamicCert, RequestTimeout, from_kubeconfig, from_kubeconfig_with,
    is_timeout,
};
pub use error::Error;
