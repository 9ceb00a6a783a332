//! What upstream's `kubelet_pods.go` makes for each container: its mounts
//! ([`mounts`]).

pub mod env;
pub mod helper;
pub mod hosts;
pub mod mounts;
