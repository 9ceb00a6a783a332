//! The kubelet-rs node agent (upstream `pkg/kubelet`).
//!
//! Pod sources ([`podconfig`]) feed one merged channel of pod updates into the
//! [`sync_loop`], which dispatches each pod to its worker ([`pod_workers`]);
//! workers sync pods through the runtime manager of `kubelet-runtime`. The
//! PLEG wakes pods whose containers changed; [`status`] turns runtime state
//! into API pod status; [`healthz`] serves the local health endpoint. [`App`]
//! wires it all under one cancellation tree.

pub mod active_deadline;
mod admission;
mod app;
pub mod certificate;
pub mod clock;
pub mod config;
pub mod events;
pub mod healthz;
pub mod kubeclient;
pub mod logging;
pub mod mirror;
pub mod node_ip;
pub mod nodelease;
pub mod nodestatus;
pub mod pod_sync;
pub mod pod_workers;
pub mod podconfig;
pub mod status;
pub mod sync_loop;
#[cfg(test)]
mod test_support;

pub use app::{App, AppError, AppHandle, Running};
pub use config::{ConfigError, KubeletConfig};
