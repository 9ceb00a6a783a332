//! Pure types shared by the kubelet-rs crates; no IO, no async.
//!
//! Upstream counterparts: `pkg/kubelet/types` (pod updates, sources,
//! annotations), `pkg/kubelet/config/common.go` (static pod defaulting) and
//! `pkg/kubelet/container/helpers.go` (container hashing, restart rules),
//! `resource.Quantity` and `GetPodQOS` (exact quantities, QoS classes).

pub mod defaults;
mod enums;
mod error;
pub mod events;
pub mod fieldpath;
pub mod hash;
pub mod labels;
pub mod path;
pub mod pod;
pub mod pod_update;
pub mod qos;
pub mod quantity;
pub mod version;

pub use enums::{CgroupDriver, PodPhase, ProbeResult};
pub use error::{Error, Result};
pub use pod_update::{PodOperation, PodUpdate, Source};

pub use version::KUBERNETES_VERSION;
