//! Volume stats of pods (upstream `pkg/kubelet/stats` `volumeStatCalculator`
//! through `csi_metrics.go`): each published CSI volume of a pod, as the
//! driver reports it with `NodeGetVolumeStats`, named as the pod names it,
//! with the claim it comes from. Volumes of other plugins are not reported.
//! Each pod's volumes are asked concurrently, each under a short deadline;
//! a driver that fails or lacks `GET_VOLUME_STATS` leaves its volume out.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_csi::CsiPlugin;
use kubelet_server::stats::Summary;
use kubelet_server::stats::summary::{FsStats, PvcReference, VolumeStats};
use tracing::debug;

/// Deadline of one volume's stats during a scrape.
const VOLUME_STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// A non-negative count as reported.
fn count(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

/// Upstream's `VolumeStats` from the driver's usage.
fn to_stats(r: &kubelet_csi::PodVolumeRef, s: &kubelet_csi::client::VolumeStats) -> VolumeStats {
    let mut fs = FsStats {
        time: Some(Time(jiff::Timestamp::now())),
        ..FsStats::default()
    };
    if let Some((available, total, used)) = s.bytes {
        fs.available_bytes = count(available);
        fs.capacity_bytes = count(total);
        fs.used_bytes = count(used);
    }
    if let Some((free, total, used)) = s.inodes {
        fs.inodes_free = count(free);
        fs.inodes = count(total);
        fs.inodes_used = count(used);
    }
    VolumeStats {
        fs,
        name: r.name.clone(),
        pvc_ref: r.claim.as_ref().map(|(namespace, name)| PvcReference {
            name: name.clone(),
            namespace: namespace.clone(),
        }),
    }
}

/// `summary` with each pod's `volume` list holding its CSI volumes.
pub(super) async fn with_csi_volume_stats(
    csi: Option<&CsiPlugin>,
    mut summary: Summary,
) -> Summary {
    if let Some(csi) = csi {
        add_csi_volume_stats(csi, &mut summary).await;
    }
    summary
}

/// Fills each pod's `volume` list with its CSI volumes.
async fn add_csi_volume_stats(csi: &CsiPlugin, summary: &mut Summary) {
    let asks =
        summary.pods.iter().enumerate().flat_map(|(i, p)| {
            let uid = p.pod_ref.uid.clone();
            csi.pod_volumes(&uid).into_iter().map(move |r| {
            let uid = uid.clone();
            async move {
                let stats =
                    tokio::time::timeout(VOLUME_STATS_TIMEOUT, csi.volume_stats(&uid, &r.spec_name))
                        .await;
                match stats {
                    Ok(Ok(Some(s))) => Some((i, to_stats(&r, &s))),
                    Ok(Ok(None)) => None,
                    Ok(Err(e)) => {
                        debug!(pod.uid = %uid, volume = %r.name, error = %e, "No CSI volume stats");
                        None
                    }
                    Err(_) => {
                        debug!(pod.uid = %uid, volume = %r.name, "CSI volume stats timed out");
                        None
                    }
                }
            }
        })
        });
    let found = futures::future::join_all(asks).await;
    for (i, v) in found.into_iter().flatten() {
        if let Some(p) = summary.pods.get_mut(i) {
            p.volume.push(v);
        }
    }
    for p in &mut summary.pods {
        p.volume.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_usage_becomes_upstream_volume_stats() {
        let r = kubelet_csi::PodVolumeRef {
            spec_name: "pv-1".into(),
            name: "data".into(),
            claim: Some(("ns".into(), "claim".into())),
            unique_name: None,
        };
        let s = kubelet_csi::client::VolumeStats {
            bytes: Some((70, 100, 30)),
            inodes: Some((7, 10, 3)),
            abnormal: None,
        };
        let v = to_stats(&r, &s);
        assert_eq!(v.name, "data");
        assert_eq!(
            v.pvc_ref,
            Some(PvcReference {
                name: "claim".into(),
                namespace: "ns".into()
            })
        );
        assert_eq!(
            (v.fs.available_bytes, v.fs.capacity_bytes, v.fs.used_bytes),
            (Some(70), Some(100), Some(30))
        );
        assert_eq!(
            (v.fs.inodes_free, v.fs.inodes, v.fs.inodes_used),
            (Some(7), Some(10), Some(3))
        );
        let json = serde_json::to_value(&v).expect("json");
        assert_eq!(json["pvcRef"]["name"], "claim");
        assert_eq!(json["capacityBytes"], 100);
    }
}
