//! Image credential provider plugins (upstream `pkg/credentialprovider/plugin`)
//! on real containerd.
