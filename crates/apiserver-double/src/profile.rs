//! Version profiles: which kube-apiserver release the double behaves as.
//!
//! A kubelet-rs must work against control planes 1.19 to 1.35, and those
//! apiservers refuse different requests. A [`Profile`] picks one release and
//! the double then answers as that release does: the API groups and
//! subresources it serves ([`discovery`], upstream `pkg/master/master.go` in
//! 1.19 and `pkg/controlplane/instance.go` later), the field selectors each
//! kind accepts ([`fields`], upstream `pkg/apis/core/v1/conversion.go`), the
//! Node authorizer and NodeRestriction rules that changed ([`node`]), the
//! service account token volume admission injects ([`service_account`]) and
//! the pod fields its codec does not know ([`decode`]).
//!
//! The research behind every rule, with the upstream files and the versions
//! read, is `docs/apiserver-versions.md`; each rule below names its file.

pub mod decode;
pub mod discovery;
pub mod fields;
pub mod node;
pub mod service_account;

use std::fmt;
use std::str::FromStr;

use http::StatusCode;

use crate::DoubleError;
use crate::rest::Body;

/// The environment variable that picks the profile of
/// [`crate::Options::default`] (`1.19` or `1.35`).
pub const ENV_VAR: &str = "KUBELET_RS_APISERVER_PROFILE";

/// An apiserver release the double can behave as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Profile {
    /// Kubernetes 1.19 (rules read from the v1.19.10 tree).
    V1_19,
    /// Kubernetes 1.35 (rules read from the newest upstream files, checked
    /// against the 1.35 values of the versioned feature gates).
    #[default]
    V1_35,
}

impl Profile {
    /// Every profile, oldest first.
    pub const ALL: [Profile; 2] = [Profile::V1_19, Profile::V1_35];

    /// The minor version (`19`, `35`).
    pub fn minor(self) -> u32 {
        match self {
            Self::V1_19 => 19,
            Self::V1_35 => 35,
        }
    }

    /// Whether this release is `1.<minor>` or newer.
    pub fn at_least(self, minor: u32) -> bool {
        self.minor() >= minor
    }

    /// `gitVersion` of `/version`: the last patch release of 1.19, the
    /// first of 1.35.
    pub fn git_version(self) -> &'static str {
        match self {
            Self::V1_19 => "v1.19.16",
            Self::V1_35 => "v1.35.0",
        }
    }

    /// The profile [`ENV_VAR`] names, `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, DoubleError> {
        match std::env::var(ENV_VAR) {
            Ok(v) if !v.trim().is_empty() => v.parse().map(Some),
            _ => Ok(None),
        }
    }

    /// The profile [`ENV_VAR`] names, or the default (1.35) when it is
    /// unset or not a profile ([`crate::ApiServer::start`] refuses to start
    /// on a bad value, so a typo cannot silently test 1.35).
    pub fn from_env_or_default() -> Self {
        Self::from_env().ok().flatten().unwrap_or_default()
    }

    /// The 404 for a path no handler serves.
    ///
    /// - 1.19: the delegation chain ends in apiextensions' `delegateHandler`,
    ///   `http.NotFoundHandler()` (`staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/apiserver.go`,
    ///   v1.19.10): plain text `404 page not found`.
    /// - 1.35: `staging/src/k8s.io/apiserver/pkg/util/notfoundhandler/not_found_handler.go`
    ///   answers a JSON `Status`, reason `NotFound`.
    pub fn path_not_found(self) -> http::Response<Body> {
        match self {
            Self::V1_19 => {
                use http_body_util::BodyExt;
                let body =
                    http_body_util::Full::new(bytes::Bytes::from_static(b"404 page not found\n"))
                        .boxed();
                let mut r = http::Response::new(body);
                *r.status_mut() = StatusCode::NOT_FOUND;
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                r.headers_mut().insert(
                    "x-content-type-options",
                    http::HeaderValue::from_static("nosniff"),
                );
                r
            }
            Self::V1_35 => crate::rest::status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            ),
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

impl FromStr for Profile {
    type Err = DoubleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().trim_start_matches('v') {
            "1.19" => Ok(Self::V1_19),
            "1.35" => Ok(Self::V1_35),
            other => Err(DoubleError::Profile(other.to_string())),
        }
    }
}

/// Whether the double, set up with `options`, serves `resource[/sub]` in
/// `api_version` ([`discovery`] lists what each release serves).
/// `Options::runtime_class_v1beta1_only` keeps its old meaning on any
/// profile: RuntimeClasses in `node.k8s.io/v1beta1` only.
pub fn served(options: &crate::Options, api_version: &str, resource: &str, sub: &str) -> bool {
    if resource == "runtimeclasses" && options.runtime_class_v1beta1_only {
        return api_version == "node.k8s.io/v1beta1";
    }
    discovery::serves(options.profile, api_version, resource, sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_from_their_version() {
        assert_eq!("1.19".parse::<Profile>().ok(), Some(Profile::V1_19));
        assert_eq!("v1.35".parse::<Profile>().ok(), Some(Profile::V1_35));
        assert!("1.20".parse::<Profile>().is_err());
        assert_eq!(Profile::default(), Profile::V1_35);
        assert_eq!(Profile::V1_19.to_string(), "1.19");
        assert!(Profile::V1_35.at_least(31) && !Profile::V1_19.at_least(20));
    }
}
