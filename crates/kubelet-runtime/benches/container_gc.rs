//! Container garbage collection at 110 pods (the default `maxPods`) against
//! the in-memory CRI: the minute's pass when nothing is due (list sandboxes
//! and containers, group, decide), which is what the loop costs a node in
//! steady state.

use std::sync::Arc;
use std::time::Duration;

use cri::fake::FakeRuntime;
use criterion::{Criterion, criterion_group, criterion_main};
use kubelet_runtime::{KubeRuntimeManager, RuntimeConfig};

const PODS: usize = 110;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fake = FakeRuntime::new();
    for i in 0..PODS {
        fake.add_running_pod(&format!("uid-{i}"), &format!("pod-{i}"), 2);
    }
    let logs = tempfile::tempdir().expect("tempdir");
    let manager = KubeRuntimeManager::new(
        Arc::new(fake.clone()),
        Arc::new(fake.clone()),
        RuntimeConfig {
            pod_logs_dir: logs.path().to_path_buf(),
            ..RuntimeConfig::default()
        },
    );
    let live = |_: &str| Some(false);
    c.bench_function("container_gc_110_pods_nothing_due", |b| {
        b.iter(|| {
            rt.block_on(manager.garbage_collect(Duration::ZERO, 1, -1, true, false, &live))
                .expect("gc")
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
