//! The eviction manager (upstream `pkg/kubelet/eviction`).
