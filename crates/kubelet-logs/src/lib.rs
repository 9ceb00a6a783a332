//! Container log rotation (upstream `pkg/kubelet/logs/container_log_manager.go`).
