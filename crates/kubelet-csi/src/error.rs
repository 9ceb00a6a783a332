//! Errors of the CSI volume plugin (upstream `pkg/volume/csi` error texts).
//! Where the pod sees an error (the `FailedMount` / `FailedAttachVolume`
//! event after the operation's own prefix), `Display` is upstream's text.

use std::path::PathBuf;

/// The `log()` prefix upstream puts on the plugin's own messages.
pub const LOG_PREFIX: &str = "kubernetes.io/csi";

/// Everything that can go wrong in the CSI plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The driver answered with a gRPC error, or the call hit its deadline
    /// (then the status is `DeadlineExceeded`, "context deadline exceeded").
    /// Shown as Go's gRPC status text.
    #[error("rpc error: code = {:?} desc = {}", .0.code(), .0.message())]
    Grpc(tonic::Status),

    /// The driver's socket could not be dialled (shown as gRPC-Go shows a
    /// failed dial: `Unavailable`).
    #[error(
        "rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial unix {}: connect: {}\"",
        .endpoint.display(),
        innermost(.source)
    )]
    Dial {
        /// The driver's socket.
        endpoint: PathBuf,
        /// What the transport said.
        #[source]
        source: tonic::transport::Error,
    },

    /// The driver has not registered through the plugin watcher.
    #[error("driver name {0} not found in the list of registered CSI drivers")]
    DriverNotRegistered(String),

    /// A step of an operation failed; `context` names the step as upstream
    /// logs it ("mounter.SetUpAt failed to get CSI client").
    #[error("{LOG_PREFIX}: {context}: {source}")]
    Step {
        /// The failing step.
        context: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    /// The apiserver (through the [`crate::CsiHost`]) failed.
    #[error("{0}")]
    Host(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// The external attacher reported `status.attachError`.
    #[error("{0}")]
    AttachError(String),

    /// The VolumeAttachment is being deleted while the kubelet waits.
    #[error("volume attachment is being deleted")]
    AttachmentDeleted,

    /// The VolumeAttachment did not become attached in time.
    #[error(
        "timed out waiting for external-attacher of {driver} CSI driver to attach volume {volume_handle}"
    )]
    AttachTimeout {
        /// The CSI driver.
        driver: String,
        /// The volume handle.
        volume_handle: String,
    },

    /// The CSIDriver does not allow the volume's lifecycle mode.
    #[error("volume mode {mode:?} not supported by driver {driver} ({})", supported_text(.supported))]
    LifecycleModeUnsupported {
        /// `Persistent` or `Ephemeral`.
        mode: String,
        /// The CSI driver.
        driver: String,
        /// The CSIDriver's `volumeLifecycleModes`, or `None` without a CSIDriver object.
        supported: Option<Vec<String>>,
    },

    /// A file or directory operation failed.
    #[error("{context} [{}]: {source}", .path.display())]
    Io {
        /// What was being done.
        context: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// `vol_data.json` could not be read or written.
    #[error("failed to parse volume data file [{}]: {source}", .path.display())]
    VolData {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },

    /// The volume spec is not a usable CSI volume.
    #[error("{0}")]
    InvalidSpec(String),

    /// fsGroup ownership could not be applied after publish.
    #[error("applyFSGroup failed for vol {volume_handle}: {source}")]
    FsGroup {
        /// The volume handle.
        volume_handle: String,
        /// Why.
        #[source]
        source: kubelet_volume::Error,
    },

    /// A mount-table or mount operation failed.
    #[error(transparent)]
    Mount(#[from] kubelet_volume::Error),

    /// An operation phase failed for a volume: upstream's event text
    /// (`MountVolume.SetUp failed for volume "pv-1" : ...`), what the
    /// kubelet puts into the `FailedMount` event.
    #[error("{phase} failed for volume {volume:?} : {source}")]
    Phase {
        /// `MountVolume.WaitForAttach`, `MountVolume.MountDevice`,
        /// `MountVolume.SetUp`, `UnmountVolume.TearDown` or `UnmountDevice`.
        phase: &'static str,
        /// The spec name (PV name or pod volume name).
        volume: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    /// The driver's registration was refused (versions, names).
    #[error("{LOG_PREFIX}: {0}")]
    Registration(String),

    /// The Node or CSINode object could not be updated for a driver.
    #[error("error updating {object} object with CSI driver node info: {source}")]
    NodeInfo {
        /// `Node` or `CSINode`.
        object: &'static str,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    /// The driver's topology collides with a label another driver set.
    #[error(
        "detected topology value collision: driver reported {key:?}:{new:?} but existing label is {key:?}:{existing:?}"
    )]
    TopologyCollision {
        /// The label key.
        key: String,
        /// The value this driver reported.
        new: String,
        /// The value already on the node.
        existing: String,
    },
}

/// The deepest cause of an error (the OS error under a transport error).
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Go's `%q` of a `[]VolumeLifecycleMode`, or upstream's note when there is
/// no CSIDriver.
fn supported_text(supported: &Option<Vec<String>>) -> String {
    match supported {
        None => "no CSIDriver object".to_string(),
        Some(modes) => {
            let quoted: Vec<String> = modes.iter().map(|m| format!("{m:?}")).collect();
            format!("only supports [{}]", quoted.join(" "))
        }
    }
}

impl Error {
    /// Wraps `self` with the step that failed.
    pub fn step(self, context: impl Into<String>) -> Self {
        Error::Step {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// Wraps `self` as the failure of `phase` for `volume`.
    pub fn phase(self, phase: &'static str, volume: &str) -> Self {
        Error::Phase {
            phase,
            volume: volume.to_string(),
            source: Box::new(self),
        }
    }

    /// An apiserver error from the host.
    pub fn host(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Host(e.into())
    }

    /// An IO error at `path`.
    pub fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Error::Io {
            context,
            path,
            source,
        }
    }

    /// Whether the driver call ended for sure (upstream `IsOperationFinishedError`):
    /// anything but a deadline, an unavailable driver or a cancelled call.
    /// After an unfinished error the mount may exist, so its directory stays.
    pub fn is_final(&self) -> bool {
        match self {
            Error::Grpc(s) => !matches!(
                s.code(),
                tonic::Code::DeadlineExceeded
                    | tonic::Code::Unavailable
                    | tonic::Code::Cancelled
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Aborted
            ),
            Error::Step { source, .. } | Error::Phase { source, .. } => source.is_final(),
            Error::Dial { .. } => false,
            _ => true,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_upstream() {
        let e = Error::LifecycleModeUnsupported {
            mode: "Ephemeral".into(),
            driver: "d.example.com".into(),
            supported: Some(vec!["Persistent".into()]),
        };
        assert_eq!(
            e.to_string(),
            "volume mode \"Ephemeral\" not supported by driver d.example.com (only supports [\"Persistent\"])"
        );
        let e = Error::Grpc(tonic::Status::internal("boom"));
        assert_eq!(e.to_string(), "rpc error: code = Internal desc = boom");
        let e =
            Error::DriverNotRegistered("x".into()).step("mounter.SetUpAt failed to get CSI client");
        assert_eq!(
            e.to_string(),
            "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name x not found in the list of registered CSI drivers"
        );
        assert!(!Error::Grpc(tonic::Status::deadline_exceeded("x")).is_final());
        assert!(Error::Grpc(tonic::Status::internal("x")).is_final());
    }
}
