//! Graceful node shutdown (upstream `test/e2e_node/node_shutdown_linux_test.go`) against a test logind on D-Bus.
