//! Container garbage collection (upstream `test/e2e_node/garbage_collector_test.go`) on real containerd.
