//! The PLEG's metrics (upstream `generic.go` `updateRunningPodAndContainerMetrics`
//! and the relist duration and interval observed in `Relist`).

use std::collections::HashSet;

use cri::pb;
use kubelet_metrics::KubeletMetrics;
use kubelet_types::labels as l;

use crate::pod_status::ContainerState;

/// `kubelet_running_pods` (pods with a ready sandbox) and
/// `kubelet_running_containers` by state (upstream
/// `updateRunningPodAndContainerMetrics`; a state no container is in reads 0).
pub(super) fn record_running(
    m: &KubeletMetrics,
    sandboxes: &[pb::PodSandbox],
    containers: &[pb::Container],
) {
    let running_pods: HashSet<&String> = sandboxes
        .iter()
        .filter(|s| s.state == pb::PodSandboxState::SandboxReady as i32)
        .filter_map(|s| s.labels.get(l::POD_UID))
        .collect();
    let mut by_state = [
        ("created", 0),
        ("running", 0),
        ("exited", 0),
        ("unknown", 0),
    ];
    for c in containers {
        let i = match ContainerState::from_cri(c.state) {
            ContainerState::Created => 0,
            ContainerState::Running => 1,
            ContainerState::Exited => 2,
            ContainerState::Unknown => 3,
        };
        by_state[i].1 += 1;
    }
    m.set_running(running_pods.len(), &by_state);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use cri::fake::FakeRuntime;
    use kubelet_metrics::parse::{MetricFamily, parse};
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::manager::KubeRuntimeManager;
    use crate::pleg::GenericPleg;
    use crate::runtime_config::RuntimeConfig;

    fn sample(f: &MetricFamily, suffix: &str) -> Option<f64> {
        f.samples
            .iter()
            .find(|s| s.name.ends_with(suffix))
            .map(|s| s.value)
    }

    #[tokio::test(start_paused = true)]
    async fn relists_record_duration_interval_and_running_counts() {
        let fake = FakeRuntime::new();
        fake.add_running_pod("u1", "pod-u1", 2);
        let (sb, _) = fake.add_running_pod("u2", "pod-u2", 1);
        fake.kill_sandbox(&sb);
        let manager = Arc::new(KubeRuntimeManager::new(
            Arc::new(fake.clone()),
            Arc::new(fake.clone()),
            RuntimeConfig::default(),
        ));
        let (pleg, _rx) = GenericPleg::new(manager, 4, Duration::from_secs(2), TaskTracker::new());
        let metrics = Arc::new(KubeletMetrics::new());
        pleg.set_metrics(metrics.clone());

        pleg.relist().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        pleg.relist().await.unwrap();
        fake.set_down(true);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(pleg.relist().await.is_err());

        let f = parse(&metrics.render()).unwrap();
        let duration = &f["kubelet_pleg_relist_duration_seconds"];
        assert_eq!(
            sample(duration, "_count"),
            Some(3.0),
            "failed relists count too"
        );
        let interval = &f["kubelet_pleg_relist_interval_seconds"];
        assert_eq!(
            sample(interval, "_count"),
            Some(1.0),
            "only between successful relists"
        );
        assert_eq!(sample(interval, "_sum"), Some(1.0));
        assert_eq!(f["kubelet_running_pods"].samples[0].value, 1.0);
        let running = f["kubelet_running_containers"]
            .samples
            .iter()
            .find(|s| s.label("container_state") == Some("running"))
            .map(|s| s.value);
        assert_eq!(running, Some(3.0));
        assert!(sample(&f["kubelet_pleg_last_seen_seconds"], "").is_some_and(|t| t > 0.0));
    }
}
