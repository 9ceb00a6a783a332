//! Image garbage collection (upstream `test/e2e_node/image_gc_test.go`) on real containerd.
