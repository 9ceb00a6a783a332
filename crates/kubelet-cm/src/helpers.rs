//! CPU and huge page conversions and a pod's cgroup resources (upstream
//! `cm/helpers_linux.go`: `MilliCPUToShares`, `MilliCPUToQuota`,
//! `HugePageLimits`, `ResourceConfigForPod`; `getCPUWeight`; and
//! `component-helpers/resource` `PodRequests`/`PodLimits`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::qos::{QosClass, pod_qos};
use kubelet_types::quantity::Quantity;

use crate::cgroup_manager::ResourceConfig;

/// Smallest cpu.shares the kernel takes.
pub const MIN_SHARES: u64 = 2;
/// Largest cpu.shares the kernel takes.
pub const MAX_SHARES: u64 = 262_144;
const SHARES_PER_CPU: i64 = 1024;
const MILLI_CPU_TO_CPU: i64 = 1000;
/// Default CFS period: 100 ms in µs.
pub const QUOTA_PERIOD: i64 = 100_000;
/// Smallest CFS quota: 1 ms in µs.
pub const MIN_QUOTA_PERIOD: i64 = 1000;

/// Upstream `MilliCPUToShares`: 0 → 2, else `milli*1024/1000` within [2, 262144].
pub fn milli_cpu_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    let shares = milli.saturating_mul(SHARES_PER_CPU) / MILLI_CPU_TO_CPU;
    u64::try_from(shares).map_or(MIN_SHARES, |s| s.clamp(MIN_SHARES, MAX_SHARES))
}

/// Upstream `MilliCPUToQuota`: 0 for no limit, else `milli*period/1000`, at least 1 ms.
pub fn milli_cpu_to_quota(milli: i64, period: i64) -> i64 {
    if milli == 0 {
        return 0;
    }
    (milli.saturating_mul(period) / MILLI_CPU_TO_CPU).max(MIN_QUOTA_PERIOD)
}

/// Upstream `getCPUWeight`: cpu.shares [2, 262144] onto cgroup v2 cpu.weight [1, 10000].
pub fn cpu_shares_to_weight(shares: u64) -> u64 {
    if shares >= MAX_SHARES {
        return 10_000;
    }
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

/// The page size in bytes of a `hugepages-<size>` resource name
/// (upstream `HugePageSizeFromResourceName`).
pub fn hugepage_size_from_resource(name: &str) -> Option<i64> {
    let size = name.strip_prefix("hugepages-")?;
    Quantity::parse(size)
        .ok()
        .map(|q| q.value())
        .filter(|v| *v > 0)
}

/// The kernel's spelling of a page size: `2MB`, `1GB` (upstream
/// `HugePageUnitSizeFromByteSize`, 1024-based units).
pub fn hugepage_unit_size(bytes: i64) -> Option<String> {
    let units = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut size = bytes;
    let mut i = 0;
    while size >= 1024 && size % 1024 == 0 && i + 1 < units.len() {
        size /= 1024;
        i += 1;
    }
    (i > 0 && size > 0).then(|| format!("{size}{}", units[i]))
}

/// Bytes of a kernel page size spelling (`2MB` -> 2097152), the inverse of [`hugepage_unit_size`].
pub fn hugepage_unit_size_to_bytes(s: &str) -> Option<i64> {
    let units = [
        ("KB", 1i64 << 10),
        ("MB", 1 << 20),
        ("GB", 1 << 30),
        ("TB", 1 << 40),
        ("PB", 1 << 50),
    ];
    units.iter().find_map(|(u, mult)| {
        s.strip_suffix(u)
            .and_then(|n| n.parse::<i64>().ok())
            .map(|n| n.saturating_mul(*mult))
    })
}

/// The host's huge page sizes in the kernel's spelling, from the
/// `hugepages-<n>kB` directories of `/sys/kernel/mm/hugepages` (runc's
/// `HugePageSizes`). Blocking IO.
pub fn host_hugepage_sizes(dir: &std::path::Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: i64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            hugepage_unit_size(kb.saturating_mul(1024))
        })
        .collect();
    out.sort();
    out
}

/// Page size in bytes -> bytes, summed over the `hugepages-*` entries
/// (upstream `HugePageLimits`).
pub fn hugepage_limits(list: &BTreeMap<String, Quantity>) -> BTreeMap<i64, i64> {
    let mut out = BTreeMap::new();
    for (k, v) in list {
        if let Some(size) = hugepage_size_from_resource(k) {
            *out.entry(size).or_insert(0) += v.value();
        }
    }
    out
}

/// A resource list as quantities; unparsable entries are skipped.
pub fn resource_list(
    m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, Quantity> {
    m.into_iter()
        .flatten()
        .filter_map(|(k, v)| Quantity::from_api(v).ok().map(|q| (k.clone(), q)))
        .collect()
}

fn add(into: &mut BTreeMap<String, Quantity>, from: &BTreeMap<String, Quantity>) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_default();
        *e = (*e).saturating_add(*v);
    }
}

fn max_into(into: &mut BTreeMap<String, Quantity>, from: &BTreeMap<String, Quantity>) {
    for (k, v) in from {
        match into.get(k) {
            Some(have) if have >= v => {}
            _ => {
                into.insert(k.clone(), *v);
            }
        }
    }
}

fn is_restartable(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Sums a pod's per-container lists the way upstream `PodRequests` and
/// `PodLimits` do: regular and sidecar containers add up, an init
/// container counts with the sidecars started before it, and the pod
/// needs the larger of the two. `each` sees every container's list.
fn pod_resources(
    p: &Pod,
    pick: impl Fn(&Container) -> BTreeMap<String, Quantity>,
    mut each: impl FnMut(&BTreeMap<String, Quantity>),
) -> BTreeMap<String, Quantity> {
    let Some(spec) = p.spec.as_ref() else {
        return BTreeMap::new();
    };
    let mut total = BTreeMap::new();
    for c in &spec.containers {
        let r = pick(c);
        each(&r);
        add(&mut total, &r);
    }
    let mut sidecars = BTreeMap::new();
    let mut init = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let r = pick(c);
        each(&r);
        let need = if is_restartable(c) {
            add(&mut total, &r);
            add(&mut sidecars, &r);
            sidecars.clone()
        } else {
            let mut tmp = r.clone();
            add(&mut tmp, &sidecars);
            tmp
        };
        max_into(&mut init, &need);
    }
    max_into(&mut total, &init);
    total
}

/// The pod's effective requests, with overhead (upstream `resource.PodRequests`).
pub fn pod_requests(p: &Pod) -> BTreeMap<String, Quantity> {
    let mut r = pod_resources(
        p,
        |c| resource_list(c.resources.as_ref().and_then(|r| r.requests.as_ref())),
        |_| {},
    );
    let overhead = resource_list(p.spec.as_ref().and_then(|s| s.overhead.as_ref()));
    add(&mut r, &overhead);
    r
}

/// The pod's effective limits, with overhead on limited resources
/// (upstream `resource.PodLimits`); `each` sees every container's limits.
pub fn pod_limits(
    p: &Pod,
    each: impl FnMut(&BTreeMap<String, Quantity>),
) -> BTreeMap<String, Quantity> {
    let mut l = pod_resources(
        p,
        |c| resource_list(c.resources.as_ref().and_then(|r| r.limits.as_ref())),
        each,
    );
    for (k, v) in resource_list(p.spec.as_ref().and_then(|s| s.overhead.as_ref())) {
        if let Some(have) = l.get_mut(&k) {
            *have = (*have).saturating_add(v);
        }
    }
    l
}

/// CFS settings the node applies (`cpuCFSQuota`, `cpuCFSQuotaPeriod` and the
/// `CustomCPUCFSQuotaPeriod` feature gate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfsSettings {
    /// `cpuCFSQuota`: enforce CPU limits with a CFS quota.
    pub enforce_cpu_limits: bool,
    /// `cpuCFSQuotaPeriod` in µs.
    pub period_us: i64,
    /// `CustomCPUCFSQuotaPeriod`: quotas follow `period_us` instead of 100 ms.
    pub custom_period: bool,
}

impl Default for CfsSettings {
    fn default() -> Self {
        Self {
            enforce_cpu_limits: true,
            period_us: QUOTA_PERIOD,
            custom_period: false,
        }
    }
}

impl CfsSettings {
    /// The period quotas are computed over.
    pub fn quota_period(&self) -> i64 {
        if self.custom_period {
            self.period_us
        } else {
            QUOTA_PERIOD
        }
    }
}

/// The pod cgroup's settings (upstream `ResourceConfigForPod`, without
/// pod-level resources or MemoryQoS): shares from requests; for Guaranteed
/// pods, and Burstable ones whose every container has the limit, the CFS
/// quota from the CPU limit (-1 when `cpuCFSQuota` is off) and the memory
/// limit; huge pages from requests.
pub fn resource_config_for_pod(p: &Pod, cfs: CfsSettings) -> ResourceConfig {
    let reqs = pod_requests(p);
    let (mut cpu_limits_declared, mut memory_limits_declared) = (true, true);
    let limits = pod_limits(p, |l| {
        if l.get("cpu").is_none_or(Quantity::is_zero) {
            cpu_limits_declared = false;
        }
        if l.get("memory").is_none_or(Quantity::is_zero) {
            memory_limits_declared = false;
        }
    });
    let cpu_requests = reqs.get("cpu").map_or(0, Quantity::milli_value);
    let cpu_limits = limits.get("cpu").map_or(0, Quantity::milli_value);
    let memory_limits = limits.get("memory").map_or(0, Quantity::value);
    let shares = milli_cpu_to_shares(cpu_requests);
    let quota = if cfs.enforce_cpu_limits {
        milli_cpu_to_quota(cpu_limits, cfs.quota_period())
    } else {
        -1
    };
    let period = u64::try_from(cfs.period_us).unwrap_or(QUOTA_PERIOD as u64);
    let mut rc = ResourceConfig {
        hugepage_limit: hugepage_limits(&reqs),
        ..Default::default()
    };
    match pod_qos(p) {
        QosClass::Guaranteed => {
            rc.cpu_shares = Some(shares);
            rc.cpu_quota = Some(quota);
            rc.cpu_period = Some(period);
            rc.memory = Some(memory_limits);
        }
        QosClass::Burstable => {
            rc.cpu_shares = Some(shares);
            if cpu_limits_declared {
                rc.cpu_quota = Some(quota);
                rc.cpu_period = Some(period);
            }
            if memory_limits_declared {
                rc.memory = Some(memory_limits);
            }
        }
        QosClass::BestEffort => rc.cpu_shares = Some(MIN_SHARES),
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    #[test]
    fn cpu_conversions_match_upstream() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
        assert_eq!(milli_cpu_to_quota(5, 100_000), 1000, "at least 1 ms");
        assert_eq!(milli_cpu_to_quota(250, 100_000), 25_000);
        assert_eq!(milli_cpu_to_quota(250, 50_000), 12_500);
        assert_eq!(cpu_shares_to_weight(2), 1);
        assert_eq!(cpu_shares_to_weight(1024), 39);
        assert_eq!(cpu_shares_to_weight(MAX_SHARES), 10_000);
    }

    #[test]
    fn hugepage_names_and_sizes() {
        assert_eq!(hugepage_size_from_resource("hugepages-2Mi"), Some(2 << 20));
        assert_eq!(hugepage_size_from_resource("hugepages-1Gi"), Some(1 << 30));
        assert_eq!(hugepage_size_from_resource("memory"), None);
        assert_eq!(hugepage_unit_size(2 << 20).as_deref(), Some("2MB"));
        assert_eq!(hugepage_unit_size(1 << 30).as_deref(), Some("1GB"));
        assert_eq!(hugepage_unit_size(64 << 10).as_deref(), Some("64KB"));
        assert_eq!(hugepage_unit_size_to_bytes("2MB"), Some(2 << 20));
        assert_eq!(hugepage_unit_size_to_bytes("1GB"), Some(1 << 30));
        let sys = tempfile::tempdir().expect("tempdir");
        for d in ["hugepages-2048kB", "hugepages-1048576kB", "other"] {
            std::fs::create_dir(sys.path().join(d)).expect("mkdir");
        }
        assert_eq!(host_hugepage_sizes(sys.path()), vec!["1GB", "2MB"]);
    }

    #[test]
    fn guaranteed_pod_gets_shares_quota_and_memory() {
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "250m", "memory": "64Mi", "hugepages-2Mi": "4Mi"},
                                        "requests": {"cpu": "250m", "memory": "64Mi", "hugepages-2Mi": "4Mi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}, "requests": {"cpu": "250m", "memory": "64Mi"}}}]}}),
        );
        let rc = resource_config_for_pod(&p, CfsSettings::default());
        assert_eq!(rc.cpu_shares, Some(512));
        assert_eq!(rc.cpu_quota, Some(50_000));
        assert_eq!(rc.cpu_period, Some(100_000));
        assert_eq!(rc.memory, Some(128 << 20));
        assert_eq!(rc.hugepage_limit.get(&(2 << 20)), Some(&(4 << 20)));
        let off = CfsSettings {
            enforce_cpu_limits: false,
            ..Default::default()
        };
        assert_eq!(resource_config_for_pod(&p, off).cpu_quota, Some(-1));
        // The period is always the configured one; the quota follows it only with the gate.
        let period = CfsSettings {
            period_us: 50_000,
            ..Default::default()
        };
        let rc = resource_config_for_pod(&p, period);
        assert_eq!((rc.cpu_quota, rc.cpu_period), (Some(50_000), Some(50_000)));
        let gated = CfsSettings {
            custom_period: true,
            ..period
        };
        assert_eq!(resource_config_for_pod(&p, gated).cpu_quota, Some(25_000));
    }

    #[test]
    fn burstable_pod_gets_limits_only_when_every_container_has_them() {
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "500m"}, "requests": {"cpu": "100m", "memory": "32Mi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "100m"}}}]}}),
        );
        let rc = resource_config_for_pod(&p, CfsSettings::default());
        assert_eq!(rc.cpu_shares, Some(204));
        assert_eq!((rc.cpu_quota, rc.cpu_period, rc.memory), (None, None, None));
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "100m"}}}]}}),
        );
        let rc = resource_config_for_pod(&p, CfsSettings::default());
        assert_eq!(rc.cpu_quota, Some(50_000));
        assert_eq!(rc.memory, Some(64 << 20));
    }

    #[test]
    fn best_effort_pod_gets_minimum_shares() {
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [{"name": "a"}]}}),
        );
        let rc = resource_config_for_pod(&p, CfsSettings::default());
        assert_eq!(rc.cpu_shares, Some(2));
        assert_eq!((rc.cpu_quota, rc.memory), (None, None));
    }

    #[test]
    fn init_containers_count_by_upstream_rules() {
        // Regular 100m; init 300m; sidecar 50m before a 200m init: max(100+50, 300, 200+50) = 300m.
        let p = pod(serde_json::json!({"metadata": {"uid": "u"}, "spec": {
            "initContainers": [
                {"name": "i1", "resources": {"requests": {"cpu": "300m"}}},
                {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}},
                {"name": "i2", "resources": {"requests": {"cpu": "200m"}}}],
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}],
            "overhead": {"cpu": "10m"}}}));
        assert_eq!(pod_requests(&p)["cpu"].milli_value(), 310);
    }
}
