//! What the container runtime says it can do (upstream `runtimeState`'s
//! `runtimeHandlers()` and `runtimeFeatures()`, set by `updateRuntimeUp`
//! from each ready `Status` answer), and the questions upstream asks of it:
//! `HandlerSupportsUserNamespaces`, `runtimeClassSupportsRecursiveReadOnlyMounts`
//! and what upstream publishes as the Node's `features.supplementalGroupsPolicy`.
//! (kubelet-rs does not publish the Node's `runtimeHandlers` and `features`
//! yet: they come with containerd 2.x, issue 30; admission reads them here.)
//!
//! A runtime older than CRI 1.30 (containerd 1.6 and 1.7) reports no
//! handlers and no features: then no handler supports user namespaces or
//! recursive read-only mounts, and `SupplementalGroupsPolicy: Strict` is not
//! supported. Pods asking for them fail as upstream fails them; kubelet-rs
//! never runs them without what they asked for.

use cri::pb;
use parking_lot::RwLock;
use tokio::sync::watch;

/// The handlers and features of the runtime's last ready `Status`.
#[derive(Debug, Default)]
pub struct RuntimeFeatures {
    /// `None` until the runtime has answered ready once.
    reported: RwLock<Option<Reported>>,
    /// Turns true at the first record.
    known: watch::Sender<bool>,
}

#[derive(Debug, Clone, Default)]
struct Reported {
    handlers: Vec<pb::RuntimeHandler>,
    features: Option<pb::RuntimeFeatures>,
}

/// Why a handler's support cannot be told (upstream's errors of
/// `HandlerSupportsUserNamespaces`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerLookupError {
    /// The runtime has not answered ready yet.
    #[error("runtime handlers are not set")]
    NotSet,
    /// The runtime did not list this handler (every handler, on a runtime
    /// that lists none).
    #[error("the handler {0:?} is not known")]
    Unknown(String),
}

impl RuntimeFeatures {
    /// Records a ready `Status` answer (upstream `setRuntimeHandlers`,
    /// `setRuntimeFeatures`).
    pub fn record(&self, status: &pb::StatusResponse) {
        *self.reported.write() = Some(Reported {
            handlers: status.runtime_handlers.clone(),
            features: status.features,
        });
        self.known.send_if_modified(|k| !std::mem::replace(k, true));
    }

    /// Resolves once the runtime has answered ready (at once after that).
    pub async fn known(&self) {
        let mut rx = self.known.subscribe();
        let _ = rx.wait_for(|k| *k).await;
    }

    fn handler(&self, name: &str) -> Result<pb::RuntimeHandlerFeatures, HandlerLookupError> {
        let reported = self.reported.read();
        let reported = reported.as_ref().ok_or(HandlerLookupError::NotSet)?;
        reported
            .handlers
            .iter()
            .find(|h| h.name == name)
            .map(|h| h.features.unwrap_or_default())
            .ok_or_else(|| HandlerLookupError::Unknown(name.to_string()))
    }

    /// Upstream `HandlerSupportsUserNamespaces`.
    pub fn handler_supports_user_namespaces(
        &self,
        handler: &str,
    ) -> Result<bool, HandlerLookupError> {
        self.handler(handler).map(|f| f.user_namespaces)
    }

    /// Upstream `runtimeClassSupportsRecursiveReadOnlyMounts`: false for a
    /// handler the runtime did not list.
    pub fn handler_supports_recursive_read_only(&self, handler: &str) -> bool {
        self.handler(handler)
            .is_ok_and(|f| f.recursive_read_only_mounts)
    }

    /// The node's `status.features.supplementalGroupsPolicy`: whether the
    /// runtime honours `SupplementalGroupsPolicy: Strict`.
    pub fn supplemental_groups_policy(&self) -> bool {
        self.reported
            .read()
            .as_ref()
            .and_then(|r| r.features)
            .is_some_and(|f| f.supplemental_groups_policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(handlers: Vec<pb::RuntimeHandler>, sgp: Option<bool>) -> pb::StatusResponse {
        pb::StatusResponse {
            runtime_handlers: handlers,
            features: sgp.map(|s| pb::RuntimeFeatures {
                supplemental_groups_policy: s,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn handler(name: &str, userns: bool, rro: bool) -> pb::RuntimeHandler {
        pb::RuntimeHandler {
            name: name.into(),
            features: Some(pb::RuntimeHandlerFeatures {
                recursive_read_only_mounts: rro,
                user_namespaces: userns,
            }),
        }
    }

    #[test]
    fn before_the_first_status_nothing_is_supported() {
        let f = RuntimeFeatures::default();
        assert_eq!(
            f.handler_supports_user_namespaces(""),
            Err(HandlerLookupError::NotSet)
        );
        assert!(!f.handler_supports_recursive_read_only(""));
        assert!(!f.supplemental_groups_policy());
    }

    #[test]
    fn a_runtime_reporting_no_handlers_knows_none_containerd_1_6() {
        let f = RuntimeFeatures::default();
        f.record(&status(vec![], None));
        let e = f.handler_supports_user_namespaces("").expect_err("unknown");
        assert_eq!(e.to_string(), r#"the handler "" is not known"#);
        assert!(!f.handler_supports_recursive_read_only(""));
        assert!(!f.supplemental_groups_policy());
    }

    #[test]
    fn handlers_and_features_as_reported() {
        let f = RuntimeFeatures::default();
        f.record(&status(
            vec![handler("", true, true), handler("crun", false, true)],
            Some(true),
        ));
        assert_eq!(f.handler_supports_user_namespaces(""), Ok(true));
        assert_eq!(f.handler_supports_user_namespaces("crun"), Ok(false));
        assert!(f.handler_supports_recursive_read_only("crun"));
        assert!(!f.handler_supports_recursive_read_only("kata"));
        assert!(f.supplemental_groups_policy());
    }
}
