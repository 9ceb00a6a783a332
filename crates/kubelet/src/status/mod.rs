//! Pod status: generating the API status from runtime state (upstream
//! `kubelet_pods.go` `generateAPIPodStatus`, `getPhase`) and keeping the
//! latest per pod (the cache of upstream `pkg/kubelet/status/status_manager.go`; sending it
//! to the apiserver comes with cluster mode).

mod generate;
mod manager;

pub use generate::{Waiting, generate_api_pod_status};
pub use manager::StatusManager;
