//! Image credential provider plugins for kubelet-rs (upstream pkg/credentialprovider/plugin, KEP-2133).
