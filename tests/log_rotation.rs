//! Container log rotation (upstream `test/e2e_node/container_log_rotation_test.go`) on real containerd.
