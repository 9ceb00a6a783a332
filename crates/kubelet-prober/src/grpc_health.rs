//! The standard gRPC health checking protocol (`grpc.health.v1`), the API
//! gRPC probes call (upstream uses `google.golang.org/grpc/health/grpc_health_v1`).

/// Generated messages, the `health_client` used by probes and the
/// `health_server` tests serve.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("grpc.health.v1");
}
