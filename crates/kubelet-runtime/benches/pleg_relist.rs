//! PLEG relist cost at 250 pods against the in-memory CRI (two list calls,
//! the diff, and dispatch), steady state and with every container changed.

use std::sync::Arc;
use std::time::Duration;

use cri::fake::FakeRuntime;
use criterion::{Criterion, criterion_group, criterion_main};
use kubelet_runtime::pleg::GenericPleg;
use kubelet_runtime::{KubeRuntimeManager, RuntimeConfig};

const PODS: usize = 250;

fn populate(fake: &FakeRuntime) -> Vec<String> {
    (0..PODS)
        .flat_map(|i| {
            fake.add_running_pod(&format!("uid-{i}"), &format!("pod-{i}"), 2)
                .1
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fake = FakeRuntime::new();
    let ids = populate(&fake);
    let manager = Arc::new(KubeRuntimeManager::new(
        Arc::new(fake.clone()),
        Arc::new(fake.clone()),
        RuntimeConfig::default(),
    ));
    let (pleg, mut rx) = rt.block_on(async {
        GenericPleg::new(
            manager,
            8,
            Duration::from_secs(2),
            tokio_util::task::TaskTracker::new(),
        )
    });
    rt.spawn(async move { while rx.recv().await.is_some() {} });
    rt.block_on(pleg.relist()).expect("first relist");

    c.bench_function("pleg_relist_250_pods_steady", |b| {
        b.iter(|| rt.block_on(pleg.relist()).expect("relist"));
    });
    c.bench_function("pleg_relist_250_pods_all_changed", |b| {
        let mut exited = false;
        b.iter(|| {
            // Flip every container between running and exited so each relist sees 500 changes.
            for id in &ids {
                if exited {
                    fake.restart_container(id);
                } else {
                    fake.exit_container(id, 1);
                }
            }
            exited = !exited;
            rt.block_on(pleg.relist()).expect("relist")
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
