//! Pod status: generating the API status from runtime state (upstream
//! `kubelet_pods.go` `generateAPIPodStatus`, `getPhase`) and keeping the
//! latest per pod (the cache of upstream `pkg/kubelet/status/status_manager.go`),
//! and in cluster mode patching it to the apiserver ([`sync`]).

mod compared;
pub mod conditions;
#[cfg(test)]
mod ephemeral_tests;
mod generate;
mod manager;
#[cfg(test)]
mod sidecar_tests;
pub mod sync;

pub use generate::{Waiting, generate_api_pod_status};
pub use manager::{StatusManager, check_container_state_transition};
