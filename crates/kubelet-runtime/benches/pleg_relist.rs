//! PLEG relist cost at 250 pods against the in-memory CRI (two list calls,
//! the diff, and dispatch), steady state and with every container changed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cri::fake::FakeRuntime;
use cri::{ImageService as _, RuntimeService as _, pb};
use criterion::{Criterion, criterion_group, criterion_main};
use kubelet_runtime::pleg::GenericPleg;
use kubelet_runtime::{KubeRuntimeManager, RuntimeConfig};
use kubelet_types::labels as l;

const PODS: usize = 250;

async fn populate(fake: &FakeRuntime) -> Vec<String> {
    let mut ids = vec![];
    fake.pull_image("img", None, None).await.expect("pull");
    for i in 0..PODS {
        let labels = HashMap::from([
            (l::POD_UID.to_string(), format!("uid-{i}")),
            (l::POD_NAME.to_string(), format!("pod-{i}")),
            (l::POD_NAMESPACE.to_string(), "default".to_string()),
        ]);
        let sb = fake
            .run_pod_sandbox(
                pb::PodSandboxConfig {
                    labels: labels.clone(),
                    ..Default::default()
                },
                "",
            )
            .await
            .expect("sandbox");
        for c in 0..2 {
            let mut labels = labels.clone();
            labels.insert(l::CONTAINER_NAME.to_string(), format!("c{c}"));
            let id = fake
                .create_container(
                    &sb,
                    pb::ContainerConfig {
                        labels,
                        ..Default::default()
                    },
                    Default::default(),
                )
                .await
                .expect("container");
            fake.start_container(&id).await.expect("start");
            ids.push(id);
        }
    }
    ids
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fake = FakeRuntime::new();
    let ids = rt.block_on(populate(&fake));
    let manager = Arc::new(KubeRuntimeManager::new(
        Arc::new(fake.clone()),
        Arc::new(fake.clone()),
        RuntimeConfig::default(),
    ));
    let (pleg, mut rx) =
        rt.block_on(async { GenericPleg::new(manager, 8, Duration::from_secs(2)) });
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
                    rt.block_on(fake.start_container(id)).expect("start");
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
