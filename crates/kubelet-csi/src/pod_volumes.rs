//! Which pod volume each published CSI volume is (upstream: the volume
//! manager's actual state, which the summary provider reads for
//! `VolumeStats`): the pod's name for the volume and the claim it comes
//! from, by pod UID and spec name.

use std::collections::BTreeMap;

use crate::plugin::CsiPlugin;

/// A published CSI volume as its pod names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVolumeRef {
    /// The spec name (PV name, or the pod's volume name for inline volumes).
    pub spec_name: String,
    /// The pod's name for the volume.
    pub name: String,
    /// The claim (`namespace`, `name`) of a PVC or generic ephemeral volume.
    pub claim: Option<(String, String)>,
    /// The unique volume name of a persistent volume
    /// (`kubernetes.io/csi/<driver>^<volume handle>`), as the node's
    /// `status.volumesInUse` lists it; `None` for inline volumes.
    pub unique_name: Option<String>,
}

/// Upstream's unique name of a CSI volume (`GetUniqueVolumeName`).
pub fn unique_volume_name(driver: &str, volume_handle: &str) -> String {
    format!("{}/{driver}^{volume_handle}", crate::paths::CSI_PLUGIN_NAME)
}

impl CsiPlugin {
    /// Records that pod `uid`'s volume `r` is published.
    pub fn record_pod_volume(&self, uid: &str, r: PodVolumeRef) {
        self.pod_volumes
            .lock()
            .entry(uid.to_string())
            .or_default()
            .insert(r.spec_name.clone(), r);
    }

    /// Forgets pod `uid`'s volume `spec_name` (torn down).
    pub fn forget_pod_volume(&self, uid: &str, spec_name: &str) {
        let mut all = self.pod_volumes.lock();
        if let Some(v) = all.get_mut(uid) {
            v.remove(spec_name);
            if v.is_empty() {
                all.remove(uid);
            }
        }
    }

    /// The published CSI volumes of pod `uid`, by spec name.
    pub fn pod_volumes(&self, uid: &str) -> Vec<PodVolumeRef> {
        self.pod_volumes
            .lock()
            .get(uid)
            .map(|v| v.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Pod UID to spec name to reference.
pub(crate) type PodVolumes = parking_lot::Mutex<BTreeMap<String, BTreeMap<String, PodVolumeRef>>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_volumes_are_listed_until_forgotten() {
        let host = std::sync::Arc::new(crate::testing::FakeHost::default());
        let plugin = CsiPlugin::new(host, "/nonexistent", crate::Timeouts::default());
        let r = PodVolumeRef {
            spec_name: "pv-1".into(),
            name: "data".into(),
            claim: Some(("ns".into(), "claim".into())),
            unique_name: Some(unique_volume_name("d", "h")),
        };
        plugin.record_pod_volume("u1", r.clone());
        plugin.record_pod_volume("u2", r.clone());
        plugin.record_pod_volume(
            "u2",
            PodVolumeRef {
                spec_name: "inline".into(),
                name: "inline".into(),
                claim: None,
                unique_name: None,
            },
        );
        assert_eq!(plugin.pod_volumes("u1"), vec![r]);
        assert!(plugin.pod_volumes("u3").is_empty());
        plugin.forget_pod_volume("u1", "pv-1");
        assert!(plugin.pod_volumes("u1").is_empty());
        plugin.forget_pod_volume("u2", "pv-1");
        assert_eq!(plugin.pod_volumes("u2").len(), 1, "the inline volume stays");
    }
}
