//! Registry credentials for image pulls (upstream `pkg/credentialprovider`):
//! docker config files as found in image pull secrets ([`config`]), the
//! keyring matching them against an image's registry host, port and path
//! ([`keyring`]), image pull secrets turned into a keyring ([`secrets`]) and
//! the normalized repository name a lookup is made with ([`reference`]), and
//! the seam to image credential provider plugins ([`external`]).

pub mod config;
pub mod external;
pub mod keyring;
pub mod reference;
pub mod secrets;

pub use config::{DockerConfig, DockerConfigEntry};
pub use external::{ExternalCredentialProviders, LateKeyring, PullPod};
pub use keyring::{
    AuthConfig, BasicDockerKeyring, DockerKeyring, UnionDockerKeyring, schemeless_url_error,
    urls_match_str,
};
pub use reference::repo_to_pull;
pub use secrets::make_docker_keyring;

/// A docker config that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The document is not the JSON upstream expects.
    #[error("error occurred while trying to unmarshal json: {0}")]
    Json(#[source] serde_json::Error),
    /// The document is JSON of the wrong shape (an array for a map, a number
    /// for a string).
    #[error("{0}")]
    Unmarshal(String),
    /// An entry's `auth` field is not base64.
    #[error("illegal base64 data at input byte {0}")]
    Base64(usize),
    /// An entry's `auth` field decodes to no `username:password` pair.
    #[error("unable to parse auth field, must be formatted as base64(username:password)")]
    AuthField,
}
