//! The eviction manager (upstream `test/e2e_node/eviction_test.go`) on real containerd.
