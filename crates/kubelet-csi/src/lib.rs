//! CSI volumes for kubelet-rs (upstream pkg/volume/csi): CSI spec 1.x client, driver registration, stage/publish, inline and generic ephemeral volumes.
