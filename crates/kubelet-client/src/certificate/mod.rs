//! Client certificates (upstream `pkg/kubelet/certificate`): TLS bootstrap
//! ([`bootstrap`]), the CSR exchange ([`csr`]), the certificate directory
//! ([`store`]) and rotation ([`manager`]).

pub mod bootstrap;
pub mod csr;
pub mod manager;
pub mod store;
