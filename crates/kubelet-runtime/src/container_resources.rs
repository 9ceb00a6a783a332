//! Container resources for CRI (upstream `kuberuntime_container_linux.go`
//! `generateLinuxContainerResources`, `cm/helpers_linux.go` `MilliCPUToShares`
//! and `qos/policy.go` `GetContainerOOMScoreAdjust`): cpu shares, CFS quota
//! and period, memory limit and the OOM score adjustment of one container.

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity::{parse_bytes, parse_milli_cpu};
use crate::runtime_config::RuntimeConfig;
use kubelet_types::qos::{QosClass, pod_qos};
use kubelet_types::quantity::Quantity;

const CPU_PERIOD: i64 = 100_000;
const MIN_SHARES: i64 = 2;

/// Upstream `milliCPUToShares`.
fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli * 1024 / 1000).max(MIN_SHARES)
}

/// OOM score adjustment by QoS (upstream `qos.GetContainerOOMScoreAdjust`).
fn oom_score_adj(p: &Pod, c: &Container, machine_memory: i64) -> i64 {
    match pod_qos(p) {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let req = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("memory"))
                .and_then(|q| Quantity::from_api(q).ok())
                .map_or(0, |q| q.value());
            if machine_memory <= 0 {
                return 999;
            }
            let adj = 1000 - (1000 * req) / machine_memory;
            adj.clamp(3, 999)
        }
    }
}

pub(crate) fn resources(
    cfg: &RuntimeConfig,
    p: &Pod,
    c: &Container,
) -> pb::LinuxContainerResources {
    let res = c.resources.as_ref();
    let get = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
               k: &str| m.and_then(|m| m.get(k)).map(|q| q.0.clone());
    let limits = res.and_then(|r| r.limits.as_ref());
    let requests = res.and_then(|r| r.requests.as_ref());
    let cpu_limit = get(limits, "cpu").and_then(|q| parse_milli_cpu(&q));
    let cpu_request = get(requests, "cpu")
        .and_then(|q| parse_milli_cpu(&q))
        .or(cpu_limit);
    let mem_limit = get(limits, "memory")
        .and_then(|q| parse_bytes(&q))
        .unwrap_or(0);
    let mut out = pb::LinuxContainerResources {
        cpu_shares: milli_cpu_to_shares(cpu_request.unwrap_or(0)),
        memory_limit_in_bytes: mem_limit,
        oom_score_adj: oom_score_adj(p, c, cfg.machine_memory_bytes),
        ..Default::default()
    };
    if let Some(m) = cpu_limit {
        out.cpu_period = CPU_PERIOD;
        out.cpu_quota = (m * CPU_PERIOD / 1000).max(1000);
    }
    out
}
