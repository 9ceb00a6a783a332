//! Graceful node shutdown (upstream `pkg/kubelet/nodeshutdown`).
