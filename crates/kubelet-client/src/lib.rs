//! The kubelet's side of the apiserver (upstream `pkg/kubelet/certificate`,
//! `kubeClientConfigOverrides` and `client-go/tools/record`):
//! - [`client`]: a kube-rs client from a kubeconfig, with a rotating client
//!   certificate, client-side rate limiting and a deadline on every request;
//! - [`certificate`]: TLS bootstrap, the CSR exchange and rotation;
//! - [`events`]: the event recorder and its rate-limited sink;
//! - [`clock`]: the wall clock as a seam for paused-time tests.

pub mod certificate;
pub mod client;
pub mod clock;
pub mod events;

pub use certificate::CertError;
pub use client::{
    ClientError, ClientOptions, DynamicCert, from_kubeconfig, from_kubeconfig_with, is_timeout,
};
