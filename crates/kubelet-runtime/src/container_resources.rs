//! Container resources for CRI (upstream `kuberuntime_container_linux.go`
//! `generateLinuxContainerResources`, `calculateLinuxResources` and
//! `GetHugepageLimitsFromResources`, with `cm/helpers_linux.go` and
//! `qos/policy.go` from [`kubelet_cm`]): cpu shares, CFS quota and period,
//! memory limit, huge page limits and the OOM score adjustment of one
//! container, and `memory.oom.group` on cgroup v2 (the container is killed
//! whole on OOM unless `singleProcessOOMKill`). (Swap, MemoryQoS and
//! pod-level resources are not done.)

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_cm::helpers::{
    hugepage_size_from_resource, hugepage_unit_size, milli_cpu_to_quota, milli_cpu_to_shares,
    resource_list,
};
use kubelet_cm::policy::container_oom_score_adjust;

use crate::runtime_config::RuntimeConfig;

/// One hugepage limit per host page size: 0, or the container's
/// `hugepages-<size>` limit (upstream `GetHugepageLimitsFromResources`).
fn hugepage_limits(cfg: &RuntimeConfig, c: &Container) -> Vec<pb::HugepageLimit> {
    let limits = resource_list(c.resources.as_ref().and_then(|r| r.limits.as_ref()));
    let wanted: Vec<(String, u64)> = limits
        .iter()
        .filter_map(|(k, v)| {
            let size = hugepage_unit_size(hugepage_size_from_resource(k)?)?;
            Some((size, u64::try_from(v.value()).unwrap_or(0)))
        })
        .collect();
    cfg.hugepage_sizes
        .iter()
        .map(|size| pb::HugepageLimit {
            page_size: size.clone(),
            limit: wanted
                .iter()
                .find(|(s, _)| s == size)
                .map_or(0, |(_, l)| *l),
        })
        .collect()
}

pub(crate) fn resources(
    cfg: &RuntimeConfig,
    p: &Pod,
    c: &Container,
) -> pb::LinuxContainerResources {
    let res = c.resources.as_ref();
    let requests = resource_list(res.and_then(|r| r.requests.as_ref()));
    let limits = resource_list(res.and_then(|r| r.limits.as_ref()));
    let cpu_limit = limits.get("cpu").map_or(0, |q| q.milli_value());
    // A request defaults to the limit (the apiserver does this for new
    // pods; upstream repeats it for old ones).
    let cpu_request = match (requests.get("cpu"), limits.get("cpu")) {
        (None, Some(l)) => l.milli_value(),
        (r, _) => r.map_or(0, |q| q.milli_value()),
    };
    let mut out = pb::LinuxContainerResources {
        cpu_shares: i64::try_from(milli_cpu_to_shares(cpu_request)).unwrap_or(i64::MAX),
        memory_limit_in_bytes: limits.get("memory").map_or(0, |q| q.value()),
        oom_score_adj: container_oom_score_adjust(p, c, cfg.machine_memory_bytes),
        hugepage_limits: hugepage_limits(cfg, c),
        ..Default::default()
    };
    if cfg.cfs.enforce_cpu_limits {
        // With cpuCFSQuota the period is always set; a container without a
        // CPU limit gets quota 0, which the runtime leaves unlimited.
        let period = cfg.cfs.quota_period();
        out.cpu_period = period;
        out.cpu_quota = milli_cpu_to_quota(cpu_limit, period);
    }
    if cfg.oom_group_kill {
        out.unified
            .insert("memory.oom.group".to_string(), "1".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_cm::CfsSettings;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    fn cfg() -> RuntimeConfig {
        RuntimeConfig {
            machine_memory_bytes: 10 << 30,
            hugepage_sizes: vec!["1GB".into(), "2MB".into()],
            ..RuntimeConfig::default()
        }
    }

    fn first(p: &Pod) -> &Container {
        &p.spec.as_ref().expect("spec").containers[0]
    }

    #[test]
    fn cgroup_v2_containers_are_killed_whole_on_oom() {
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [{"name": "a"}]}}),
        );
        assert!(resources(&cfg(), &p, first(&p)).unified.is_empty());
        let v2 = RuntimeConfig {
            oom_group_kill: true,
            ..cfg()
        };
        let r = resources(&v2, &p, first(&p));
        assert_eq!(
            r.unified.get("memory.oom.group").map(String::as_str),
            Some("1")
        );
    }

    #[test]
    fn guaranteed_container_gets_shares_quota_memory_and_hugepages() {
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [{"name": "a",
            "resources": {"limits": {"cpu": "250m", "memory": "64Mi", "hugepages-2Mi": "4Mi"},
                          "requests": {"cpu": "250m", "memory": "64Mi", "hugepages-2Mi": "4Mi"}}}]}}),
        );
        let r = resources(&cfg(), &p, first(&p));
        assert_eq!(r.cpu_shares, 256);
        assert_eq!((r.cpu_quota, r.cpu_period), (25_000, 100_000));
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        assert_eq!(r.oom_score_adj, -997);
        assert_eq!(
            r.hugepage_limits,
            vec![
                pb::HugepageLimit {
                    page_size: "1GB".into(),
                    limit: 0
                },
                pb::HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 << 20
                },
            ]
        );
    }

    #[test]
    fn cfs_quota_follows_cpu_cfs_quota_and_its_period() {
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [{"name": "a",
            "resources": {"limits": {"cpu": "500m"}}}]}}),
        );
        let mut c = cfg();
        let r = resources(&c, &p, first(&p));
        assert_eq!(r.cpu_shares, 512, "the request defaults to the limit");
        assert_eq!((r.cpu_quota, r.cpu_period), (50_000, 100_000));
        c.cfs = CfsSettings {
            enforce_cpu_limits: false,
            ..CfsSettings::default()
        };
        let r = resources(&c, &p, first(&p));
        assert_eq!(
            (r.cpu_quota, r.cpu_period),
            (0, 0),
            "cpuCFSQuota off: no quota"
        );
        // The period only moves with the CustomCPUCFSQuotaPeriod gate.
        c.cfs = CfsSettings {
            period_us: 50_000,
            ..CfsSettings::default()
        };
        assert_eq!(resources(&c, &p, first(&p)).cpu_period, 100_000);
        c.cfs.custom_period = true;
        let r = resources(&c, &p, first(&p));
        assert_eq!((r.cpu_quota, r.cpu_period), (25_000, 50_000));
    }

    #[test]
    fn best_effort_and_burstable_scores() {
        let be = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [{"name": "a"}]}}),
        );
        let r = resources(&cfg(), &be, first(&be));
        assert_eq!(
            (r.cpu_shares, r.oom_score_adj, r.memory_limit_in_bytes),
            (2, 1000, 0)
        );
        assert_eq!(
            (r.cpu_quota, r.cpu_period),
            (0, 100_000),
            "period set, quota unlimited"
        );
        let b = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [{"name": "a",
            "resources": {"requests": {"memory": "1Gi"}}}]}}),
        );
        assert_eq!(resources(&cfg(), &b, first(&b)).oom_score_adj, 900);
    }
}
