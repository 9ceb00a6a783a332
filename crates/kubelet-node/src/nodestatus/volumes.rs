//! `status.volumesInUse` (upstream `nodestatus.VolumesInUse` over
//! `volumeManager.GetVolumesInUse`): the attachable volumes this node has
//! mounted or staged, by unique name (`kubernetes.io/csi/<driver>^<handle>`).
//! The attach/detach controller detaches none of them, so a volume a pod
//! still uses is never pulled from under it. Until the volume manager has
//! read back what earlier runs mounted (upstream
//! `ReconcilerStatesHasBeenSynced`) the list the apiserver holds stays.

/// What node status reads of the volume manager.
pub trait VolumesInUse: Send + Sync + 'static {
    /// The volumes in use, sorted; `None` while not yet known (the server's
    /// list stays).
    fn volumes_in_use(&self) -> Option<Vec<String>>;
}

/// A node whose volumes are never attachable: the server's list stays.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoVolumesInUse;

impl VolumesInUse for NoVolumesInUse {
    fn volumes_in_use(&self) -> Option<Vec<String>> {
        None
    }
}
