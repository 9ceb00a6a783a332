//! Errors of the pod-resources server.

use std::path::PathBuf;

/// Why the pod-resources socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket directory could not be created.
    #[error("failed to create the pod-resources directory {}: {error}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A stale socket could not be removed, or the socket not bound.
    #[error("failed to create listener for podResources endpoint {}: {error}", path.display())]
    Listen {
        /// The socket.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A client could not connect to the socket.
    #[error("failed to dial the pod-resources socket {}: {reason}", path.display())]
    Dial {
        /// The socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The gRPC server stopped with an error.
    #[error("pod-resources server failed: {0}")]
    Serve(tonic::transport::Error),
}
