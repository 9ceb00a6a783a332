//! Image garbage collection (upstream `pkg/kubelet/images/image_gc_manager.go`).
