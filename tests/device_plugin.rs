//! Device plugins (upstream `test/e2e_node/device_plugin_test.go`) on real containerd.
