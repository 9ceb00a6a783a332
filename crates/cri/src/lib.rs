//! CRI (Container Runtime Interface) `runtime.v1` client for kubelet-rs.
//!
//! Upstream counterpart: `k8s.io/cri-api` plus the kubelet's remote runtime
//! (`pkg/kubelet/cri/remote`). The generated bindings live in [`pb`]; the
//! kubelet talks to the runtime only through the [`RuntimeService`] and
//! [`ImageService`] traits, implemented by [`RemoteRuntime`] (gRPC over a unix
//! socket, a deadline on every call) and, for tests, by `fake::FakeRuntime`.

mod error;
mod remote;
mod service;

#[cfg(feature = "fake")]
pub mod fake;

pub use error::{CriError, Result};
pub use remote::{RemoteRuntime, endpoint_path};
pub use service::{ImageService, RuntimeService};
/// The gRPC status code carried by [`CriError::Rpc`].
pub use tonic::Code;

/// Generated protobuf messages and gRPC stubs for `runtime.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("runtime.v1");
}
