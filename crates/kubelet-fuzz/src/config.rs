//! The node's own configuration: the `KubeletConfiguration` file
//! (upstream `pkg/kubelet/apis/config`, loaded by `cmd/kubelet/app`), the
//! command line (`cmd/kubelet/app/options`, pflag) and the image credential
//! provider config and plugin responses (`pkg/credentialprovider/plugin`).

use kubelet_config::{Flags, KubeletConfig, KubeletConfiguration, deprecated_in_use};
use kubelet_credentialprovider::api::decode_response;
use kubelet_credentialprovider::config::decode;

/// The hostname `resolve` defaults the node name to.
const HOSTNAME: &str = "fuzz-node";

/// A `--config` file (YAML or JSON), then resolved as the kubelet resolves
/// it at start, over the defaults of an empty command line.
pub fn kubelet_config(data: &[u8]) {
    let Ok((file, _ignored)) = KubeletConfiguration::parse(&super::text(data)) else {
        return;
    };
    if let Ok(flags) = Flags::parse_args(["kubelet-rs"]) {
        let _ = KubeletConfig::resolve(&flags, Some(&file), HOSTNAME);
    }
}

/// A command line: the bytes split into arguments at NUL and newline (the
/// program name is added), parsed as the kubelet's flags, then resolved.
pub fn flags(data: &[u8]) {
    let args = std::iter::once("kubelet-rs".to_string()).chain(
        data.split(|&b| b == 0 || b == b'\n')
            .map(|a| String::from_utf8_lossy(a).into_owned()),
    );
    let Ok(flags) = Flags::parse_args(args) else {
        return;
    };
    let _ = deprecated_in_use(&flags);
    let _ = KubeletConfig::resolve(&flags, None, HOSTNAME);
}

/// An `--image-credential-provider-config` document, and the same bytes as a
/// plugin's `CredentialProviderResponse` on its stdout.
pub fn credential_provider(data: &[u8]) {
    let _ = decode(data);
    let _ = decode_response(data);
}
