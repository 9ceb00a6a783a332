//! The pod-resources API (upstream `test/e2e_node/podresources_test.go`) on real containerd.
