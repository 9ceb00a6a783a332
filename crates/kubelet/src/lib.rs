//! The kubelet-rs node agent (upstream `pkg/kubelet`).
//!
//! Pod sources (`kubelet-podconfig`) feed one merged channel of pod updates into the
//! [`sync_loop`], which records desired pods in the [`pod_manager`] and
//! dispatches each pod to its worker ([`pod_workers`]); workers sync pods
//! through the runtime manager of `kubelet-runtime` ([`pod_sync`]). The PLEG
//! wakes pods whose containers changed; [`status`] turns runtime state into API
//! pod status; [`runtime_state`] is the node's view of the runtime;
//! [`lifecycle`] admits pods. [`App`] wires it all under one cancellation tree.
//!
//! Configuration, pod sources, the apiserver client, the Node and the HTTP
//! endpoints live in their own crates: `kubelet-config`, `kubelet-podconfig`,
//! `kubelet-client`, `kubelet-node` and `kubelet-server`.

pub mod active_deadline;
mod app;
pub mod credential_tokens;
pub mod csi_host;
pub mod devices;
pub mod envvars;
pub mod error;
pub mod host;
pub mod kubelet_pods;
pub mod kubelet_volumes;
mod lifecycle;
pub mod mirror;
pub mod objects;
pub mod oom_watcher;
pub mod pod_killer;
pub mod pod_manager;
mod pod_start;
pub mod pod_sync;
pub mod pod_workers;
pub mod prober;
pub mod runtime_features;
pub mod runtime_state;
pub mod runtimeclass;
pub mod status;
pub mod sync_loop;
pub mod volume_host;
pub mod volumemanager;

pub use app::{App, AppHandle, Running};
pub use error::Error as AppError;
pub use kubelet_config::{ConfigError, KubeletConfig};
