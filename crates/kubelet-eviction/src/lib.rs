//! The eviction manager (upstream `pkg/kubelet/eviction`).

pub mod reclaim;

pub use reclaim::{ContainerGc, ImageGc, ReclaimError};
