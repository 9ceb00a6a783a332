//! Shared fixtures for the worker and manager tests: a status provider the
//! test writes, pods with probes, and a manager on tokio's paused clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    ExecAction, Pod, PodSpec, PodStatus, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kubelet_runtime::ProbeResults;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::manager::{Manager, StatusProvider};
use crate::testing::{FakeExec, FakeRecorder};

/// Statuses the test sets per pod UID.
#[derive(Default)]
pub(crate) struct FakeStatus(Mutex<HashMap<String, PodStatus>>);

impl FakeStatus {
    pub(crate) fn set(&self, uid: &str, status: PodStatus) {
        self.0.lock().insert(uid.to_string(), status);
    }
}

impl StatusProvider for FakeStatus {
    fn get_pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.0.lock().get(uid).cloned()
    }
}

/// A manager and its fakes; the wall clock starts at `wall` at tokio time `t0`.
pub(crate) struct Env {
    pub(crate) m: Manager,
    pub(crate) metrics: Arc<kubelet_metrics::KubeletMetrics>,
    pub(crate) exec: Arc<FakeExec>,
    pub(crate) rec: Arc<FakeRecorder>,
    pub(crate) status: Arc<FakeStatus>,
    pub(crate) results: ProbeResults,
    pub(crate) wall: Timestamp,
    pub(crate) t0: Instant,
    pub(crate) shutdown: CancellationToken,
}

impl Env {
    /// No jitter: the first probe runs at once.
    pub(crate) fn new() -> Self {
        Self::with_jitter(false)
    }

    pub(crate) fn with_jitter(jitter: bool) -> Self {
        let exec = Arc::new(FakeExec::new());
        let rec = Arc::new(FakeRecorder::default());
        let status = Arc::new(FakeStatus::default());
        let results = ProbeResults::default();
        let wall = Timestamp::from_second(1_700_000_000).unwrap();
        let shutdown = CancellationToken::new();
        let metrics = Arc::new(kubelet_metrics::KubeletMetrics::new());
        let m = Manager::with_clock(
            results.clone(),
            exec.clone(),
            status.clone(),
            rec.clone(),
            shutdown.clone(),
            Clock::tokio(wall),
            jitter,
        )
        .with_metrics(metrics.clone());
        Env {
            metrics,
            m,
            exec,
            rec,
            status,
            results,
            wall,
            t0: Instant::now(),
            shutdown,
        }
    }

    /// Sleeps until `secs` after the start (lets workers run up to then).
    pub(crate) async fn at(&self, secs: f64) {
        tokio::time::sleep_until(self.t0 + Duration::from_secs_f64(secs)).await;
    }

    /// Lets exiting workers finish without moving the clock far.
    pub(crate) async fn settle(&self) {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Exec calls whose command's first word is `cmd`.
    pub(crate) fn calls(&self, cmd: &str) -> usize {
        self.exec
            .calls()
            .iter()
            .filter(|c| c.1.first().map(String::as_str) == Some(cmd))
            .count()
    }

    /// Messages of recorded events with `reason`.
    pub(crate) fn events(&self, reason: &str) -> Vec<String> {
        self.rec
            .events()
            .into_iter()
            .filter(|e| e.reason == reason)
            .map(|e| e.message)
            .collect()
    }
}

/// An exec probe running `cmd`, every 10s, with the given thresholds.
pub(crate) fn exec_probe(cmd: &str, success: i32, failure: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![cmd.to_string()]),
        }),
        period_seconds: Some(10),
        timeout_seconds: Some(1),
        success_threshold: Some(success),
        failure_threshold: Some(failure),
        ..Default::default()
    }
}

pub(crate) fn container(name: &str) -> Container {
    Container {
        name: name.to_string(),
        image: Some("busybox".into()),
        ..Default::default()
    }
}

pub(crate) fn pod(uid: &str, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            ..Default::default()
        }),
        status: None,
    }
}

/// A running container status with runtime ID `id`, started at `at`.
pub(crate) fn running(name: &str, id: &str, at: Timestamp, started: bool) -> ContainerStatus {
    ContainerStatus {
        name: name.to_string(),
        container_id: Some(format!("containerd://{id}")),
        started: Some(started),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(at)),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container status that exited with `code`.
pub(crate) fn terminated(name: &str, id: &str, code: i32) -> ContainerStatus {
    ContainerStatus {
        name: name.to_string(),
        container_id: Some(format!("containerd://{id}")),
        started: Some(false),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A Running pod status with these container statuses.
pub(crate) fn status(containers: Vec<ContainerStatus>) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("127.0.0.1".into()),
        container_statuses: Some(containers),
        ..Default::default()
    }
}
