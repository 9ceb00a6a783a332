//! Pod updates between the config sources, the merger and the sync loop
//! (upstream `pkg/kubelet/types/pod_update.go`).

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// Where a pod came from. Upstream names: `file`, `http`, `api`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// Static pods from `staticPodPath` (`--pod-manifest-path`).
    File,
    /// Static pods from `staticPodURL` (`--manifest-url`).
    Http,
    /// Pods bound to this node in the apiserver.
    Api,
}

impl Source {
    /// The upstream name, as written to `kubernetes.io/config.source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Http => "http",
            Self::Api => "api",
        }
    }

    /// True for sources whose pods are static (need mirror pods, never deleted via the API).
    pub fn is_static(self) -> bool {
        !matches!(self, Self::Api)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to the pods of an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOperation {
    /// A source's complete current set of pods (what sources send).
    Set,
    /// Pods new to the kubelet.
    Add,
    /// Pods whose spec, labels or annotations changed.
    Update,
    /// Pods gone from their source: stop them.
    Remove,
    /// Pods marked for graceful deletion (a deletionTimestamp appeared).
    Delete,
    /// Pods whose status alone changed.
    Reconcile,
}

/// A batch of pods with one operation from one source.
#[derive(Clone, Debug)]
pub struct PodUpdate {
    /// The operation.
    pub op: PodOperation,
    /// The source the pods belong to.
    pub source: Source,
    /// The pods, defaulted.
    pub pods: Vec<Arc<Pod>>,
}
