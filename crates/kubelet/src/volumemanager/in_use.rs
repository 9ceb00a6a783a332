//! The volumes in use as node status reports them (upstream
//! `volumeManager.GetVolumesInUse` behind `ReconcilerStatesHasBeenSynced`):
//! nothing until the volume manager has read back what earlier runs left
//! mounted, then every attachable (persistent CSI) device a pod uses.

use std::sync::Arc;

use tokio::sync::watch;

use super::csi::CsiVolumes;

/// [`kubelet_node::VolumesInUse`] over the volume manager.
pub struct VolumesInUseReporter {
    reconstructed: watch::Receiver<bool>,
    csi: Option<Arc<CsiVolumes>>,
}

impl VolumesInUseReporter {
    /// Reports `csi`'s devices once `reconstructed` turns true.
    pub fn new(reconstructed: watch::Receiver<bool>, csi: Option<Arc<CsiVolumes>>) -> Self {
        Self { reconstructed, csi }
    }
}

impl kubelet_node::VolumesInUse for VolumesInUseReporter {
    fn volumes_in_use(&self) -> Option<Vec<String>> {
        if !*self.reconstructed.borrow() {
            return None;
        }
        Some(
            self.csi
                .as_ref()
                .map(|c| c.volumes_in_use())
                .unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use kubelet_node::VolumesInUse;

    use super::*;

    #[test]
    fn nothing_is_reported_before_reconstruction_then_the_devices_in_use() {
        let (tx, rx) = watch::channel(false);
        let r = VolumesInUseReporter::new(rx, None);
        assert_eq!(r.volumes_in_use(), None, "unknown before reconstruction");
        tx.send_replace(true);
        assert_eq!(r.volumes_in_use(), Some(vec![]), "no CSI: nothing in use");
    }
}
