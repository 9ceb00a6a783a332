//! The kubelet's certificates (upstream `pkg/kubelet/certificate` and
//! `InitializeTLS`). Client: TLS bootstrap ([`bootstrap`]), the CSR exchange
//! ([`csr`]), the certificate directory ([`store`]) and rotation
//! ([`manager`]). Serving (port 10250): the swappable identity and
//! `tlsCertFile`/`tlsPrivateKeyFile` ([`serving`]), the self-signed pair
//! ([`self_signed`]) and the `kubernetes.io/kubelet-serving` manager
//! ([`serving_manager`]).

pub mod bootstrap;
pub mod csr;
pub mod manager;
pub mod self_signed;
pub mod serving;
pub mod serving_manager;
pub mod store;

#[cfg(test)]
mod serving_double_tests;
