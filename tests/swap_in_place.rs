//! Swapping kubelets in place (issue 21): containers written by an upstream
//! kubelet are adopted or restarted as an upstream upgrade would.
