//! CPU cost of probing: 300 workers (100 pods, each with an exec readiness
//! probe and an HTTP liveness probe on one container and a TCP readiness
//! probe on another) against local fakes for three 1-second periods. The
//! measured "time" is the process CPU time (user + system, from
//! /proc/self/stat) an iteration used, so time / 900 is the CPU cost of
//! one probe, including the in-process HTTP server's side of each HTTP and
//! TCP probe. On the 2-core development VM: about 125ms per iteration, so
//! about 140us of CPU per probe.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use http_body_util::Full;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStatus, ExecAction, HTTPGetAction,
    Pod, PodSpec, PodStatus, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_prober::testing::{FakeExec, FakeRecorder};
use kubelet_prober::{Manager, StatusProvider};
use kubelet_runtime::ProbeResults;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

const PODS: usize = 100;
const PERIODS: u64 = 3;
/// Three workers per pod, one probe each per period.
const PROBES: u64 = (PODS as u64) * 3 * PERIODS;

#[derive(Default)]
struct Statuses(Mutex<HashMap<String, PodStatus>>);

impl StatusProvider for Statuses {
    fn get_pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.0.lock().get(uid).cloned()
    }
}

async fn http_server() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let svc = hyper::service::service_fn(|_req| async {
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc),
            );
        }
    });
    port
}

fn probe(period: i32) -> Probe {
    Probe {
        period_seconds: Some(period),
        ..Default::default()
    }
}

fn pod(i: usize, port: u16) -> Pod {
    let port = IntOrString::Int(i32::from(port));
    let app = Container {
        name: "app".into(),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..probe(1)
        }),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: port.clone(),
                ..Default::default()
            }),
            ..probe(1)
        }),
        ..Default::default()
    };
    let side = Container {
        name: "side".into(),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction { port, host: None }),
            ..probe(1)
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("p{i}")),
            namespace: Some("bench".into()),
            uid: Some(format!("uid-{i}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![app, side],
            ..Default::default()
        }),
        status: None,
    }
}

fn running(name: &str, id: String) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        container_id: Some(format!("containerd://{id}")),
        started: Some(true),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(jiff::Timestamp::now())),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// User + system CPU time of this process (clock ticks of 10ms, the Linux
/// default USER_HZ).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    Duration::from_millis(fields.iter().sum::<u64>() * 10)
}

async fn run_once(port: u16) -> Duration {
    let statuses = Arc::new(Statuses::default());
    let pods: Vec<Pod> = (0..PODS).map(|i| pod(i, port)).collect();
    for (i, _) in pods.iter().enumerate() {
        statuses.0.lock().insert(
            format!("uid-{i}"),
            PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some("127.0.0.1".into()),
                container_statuses: Some(vec![
                    running("app", format!("a{i}")),
                    running("side", format!("s{i}")),
                ]),
                ..Default::default()
            },
        );
    }
    let shutdown = CancellationToken::new();
    let m = Manager::new(
        ProbeResults::default(),
        Arc::new(FakeExec::new()),
        statuses,
        Arc::new(FakeRecorder::default()),
        shutdown.clone(),
    );
    let before = cpu_time();
    for p in &pods {
        m.add_pod(p);
    }
    assert_eq!(m.worker_count(), 300);
    tokio::time::sleep(Duration::from_secs(PERIODS)).await;
    let used = cpu_time().saturating_sub(before);
    shutdown.cancel();
    while m.worker_count() > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    used
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let port = rt.block_on(http_server());
    let mut g = c.benchmark_group("probe_workers");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        // The measured time is CPU time, far below the 3s of wall time an
        // iteration takes; a short target keeps criterion at one iteration
        // per sample (about 35s in all; it may warn the target is too short).
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(PROBES));
    g.bench_function("300_workers_3_periods_cpu_time", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(run_once(port))).sum())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
