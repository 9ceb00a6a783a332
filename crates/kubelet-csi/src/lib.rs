//! CSI volumes for kubelet-rs (upstream `pkg/volume/csi`): the CSI spec 1.x
//! client, driver registration, stage/publish, inline ephemeral volumes.

/// Generated CSI v1 messages, clients and servers (`proto/csi/v1/csi.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("csi.v1");
}
