//! CSI volumes (upstream `pkg/volume/csi`, `test/e2e/storage/csi_mock`) on real containerd.
