//! System OOM events (upstream `pkg/kubelet/oom`).
