//! The cost of one eviction `synchronize` at 110 pods (upstream's default
//! `maxPods`): observations, thresholds, local storage checks, and with
//! memory pressure the ranking and one eviction.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use kubelet_eviction::stats::{
    ContainerStats, FsSignal, FsUsage, MemorySignal, NodeStats, PodStats, Summary,
};
use kubelet_eviction::{
    ActivePods, Config, Deps, Eviction, EvictionError, Manager, NoMetrics, PodEvictor,
    SummaryProvider, ThresholdConfig, parse_thresholds,
};

const GI: u64 = 1 << 30;

struct Fake {
    pods: Vec<Arc<Pod>>,
    mem_available: u64,
}

#[async_trait::async_trait]
impl SummaryProvider for Fake {
    async fn summary(&self) -> Result<Summary, EvictionError> {
        let now = Some(SystemTime::now());
        Ok(Summary {
            node: NodeStats {
                memory: Some(MemorySignal {
                    available_bytes: self.mem_available,
                    working_set_bytes: 16 * GI - self.mem_available,
                    time: now,
                }),
                nodefs: Some(FsSignal {
                    available_bytes: Some(100 * GI),
                    capacity_bytes: Some(200 * GI),
                    inodes_free: Some(1_000_000),
                    inodes: Some(2_000_000),
                    time: now,
                }),
                pids: Some((4_000_000, 1000, now)),
                ..Default::default()
            },
            pods: (0..110)
                .map(|n| PodStats {
                    uid: format!("uid-{n}"),
                    memory_working_set: Some((n * 10) << 20),
                    process_count: Some(3),
                    containers: vec![ContainerStats {
                        name: "c".into(),
                        memory_working_set: Some((n * 10) << 20),
                        rootfs: FsUsage {
                            used_bytes: Some(1 << 20),
                            inodes_used: Some(10),
                        },
                        logs: FsUsage {
                            used_bytes: Some(1 << 16),
                            inodes_used: Some(1),
                        },
                    }],
                    volumes: vec![(
                        "cache".into(),
                        FsUsage {
                            used_bytes: Some(1 << 20),
                            inodes_used: Some(1),
                        },
                    )],
                    ephemeral_used_bytes: Some(3 << 20),
                })
                .collect(),
        })
    }
}

#[async_trait::async_trait]
impl ActivePods for Fake {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.pods.clone()
    }
    async fn cleaned_up(&self, _: &Pod) -> bool {
        true
    }
}

struct NoKill;

#[async_trait::async_trait]
impl PodEvictor for NoKill {
    async fn evict(&self, _: &Arc<Pod>, _: Eviction) -> Result<(), EvictionError> {
        Ok(())
    }
}

fn pods() -> Vec<Arc<Pod>> {
    (0..110)
        .map(|n| {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("p{n}"), "namespace": "ns", "uid": format!("uid-{n}")},
                    "spec": {"priority": n % 3, "containers": [{"name": "c", "resources": {
                        "requests": {"memory": "100Mi"},
                        "limits": {"ephemeral-storage": "1Gi"}}}],
                        "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}]}
                }))
                .expect("pod"),
            )
        })
        .collect()
}

fn manager(mem_available: u64) -> Manager {
    let hard = kubelet_config::cluster::default_eviction_hard();
    let empty = Default::default();
    let thresholds = parse_thresholds(&ThresholdConfig {
        hard: &hard,
        soft: &empty,
        soft_grace_period: &Default::default(),
        minimum_reclaim: &empty,
        enforce_allocatable_pods: false,
    })
    .expect("thresholds");
    let fake = Arc::new(Fake {
        pods: pods(),
        mem_available,
    });
    Manager::new(
        Config {
            thresholds,
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period_seconds: 0,
            monitoring_interval: Duration::from_secs(10),
            local_storage_capacity_isolation: true,
            node_name: "bench".into(),
        },
        Deps {
            summary: fake.clone(),
            pods: fake,
            evictor: Arc::new(NoKill),
            images: None,
            containers: None,
            recorder: Arc::new(kubelet_types::events::NoopRecorder),
            metrics: Arc::new(NoMetrics),
        },
        kubelet_eviction::Pressure::channel().0,
    )
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let calm = manager(8 * GI);
    c.bench_function("synchronize_110_pods_no_pressure", |b| {
        b.iter(|| rt.block_on(calm.synchronize()))
    });
    let pressed = manager(50 << 20);
    c.bench_function("synchronize_110_pods_memory_pressure_rank_and_evict", |b| {
        b.iter(|| rt.block_on(pressed.synchronize()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
