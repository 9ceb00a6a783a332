//! What upstream's `kubelet_pods.go` makes for each container: its mounts
//! ([`mounts`]).

pub mod helper;
pub mod mounts;
pub mod hosts;
