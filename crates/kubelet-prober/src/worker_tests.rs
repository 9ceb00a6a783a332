//! Worker behaviour on paused time (upstream `worker_test.go`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_runtime::ProbeResult;
use kubelet_types::events::EventType;

use crate::test_support::*;
use crate::testing::Exec;

/// Readiness starts as Failure and turns Success only after
/// successThreshold consecutive successes, one per period.
#[tokio::test(start_paused = true)]
async fn readiness_success_after_threshold() {
    let env = Env::new();
    let mut c = container("app");
    c.readiness_probe = Some(exec_probe("ready", 2, 3));
    let p = pod("u1", vec![c]);
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.m.add_pod(&p);

    env.at(0.5).await;
    assert_eq!(env.calls("ready"), 1);
    assert_eq!(env.results.readiness.get("c1"), Some(ProbeResult::Failure));
    env.at(9.5).await;
    assert_eq!(env.calls("ready"), 1, "next probe one period later");
    env.at(10.5).await;
    assert_eq!(env.calls("ready"), 2);
    assert_eq!(env.results.readiness.get("c1"), Some(ProbeResult::Success));
    let (id, _, timeout) = &env.exec.calls()[0];
    assert_eq!((id.as_str(), *timeout), ("c1", Duration::from_secs(1)));
}

/// No probe before initialDelaySeconds have passed since startedAt.
#[tokio::test(start_paused = true)]
async fn initial_delay_from_started_at() {
    let env = Env::new();
    let mut c = container("app");
    let mut probe = exec_probe("ready", 1, 3);
    probe.initial_delay_seconds = Some(15);
    c.readiness_probe = Some(probe);
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.m.add_pod(&pod("u1", vec![c]));

    env.at(10.5).await;
    assert_eq!(env.calls("ready"), 0);
    assert_eq!(env.results.readiness.get("c1"), Some(ProbeResult::Failure));
    env.at(20.5).await;
    assert_eq!(env.calls("ready"), 1);
    assert_eq!(env.results.readiness.get("c1"), Some(ProbeResult::Success));
}

/// Liveness turns Failure at failureThreshold with an Unhealthy event per
/// failed probe, then holds (no probes) until a new container ID appears.
#[tokio::test(start_paused = true)]
async fn liveness_failure_holds_until_new_container() {
    let env = Env::new();
    let mut c = container("app");
    c.liveness_probe = Some(exec_probe("live", 1, 3));
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.exec.set("c1", Exec::exit(1, "boom"));
    env.m.add_pod(&pod("u1", vec![c]));

    env.at(10.5).await;
    assert_eq!(env.calls("live"), 2);
    assert_eq!(env.results.liveness.get("c1"), Some(ProbeResult::Success));
    env.at(20.5).await;
    assert_eq!(env.results.liveness.get("c1"), Some(ProbeResult::Failure));
    let events = env.rec.events();
    assert_eq!(events.len(), 3);
    for e in &events {
        assert_eq!(e.kind, EventType::Warning);
        assert_eq!(e.reason, "Unhealthy");
        assert_eq!(e.message, "Liveness probe failed: boom");
        assert_eq!(e.field_path.as_deref(), Some("spec.containers{app}"));
    }
    env.at(40.5).await;
    assert_eq!(env.calls("live"), 3, "on hold: no probes");

    // The runtime restarted the container.
    env.status
        .set("u1", status(vec![running("app", "c2", env.wall, true)]));
    env.at(50.5).await;
    assert_eq!(env.calls("live"), 4);
    assert_eq!(env.results.liveness.get("c1"), None, "old result forgotten");
    assert_eq!(env.results.liveness.get("c2"), Some(ProbeResult::Success));
}

/// Liveness and readiness wait until the startup probe has succeeded (the
/// status's `started`); the startup worker stops probing once started.
#[tokio::test(start_paused = true)]
async fn startup_gates_liveness_and_readiness() {
    let env = Env::new();
    let mut c = container("app");
    c.startup_probe = Some(exec_probe("startup", 1, 3));
    c.liveness_probe = Some(exec_probe("live", 1, 3));
    c.readiness_probe = Some(exec_probe("ready", 1, 3));
    let p = pod("u1", vec![c]);
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, false)]));
    env.m.add_pod(&p);

    env.at(0.5).await;
    assert_eq!(env.results.startup.get("c1"), Some(ProbeResult::Success));
    assert_eq!((env.calls("live"), env.calls("ready")), (0, 0));
    let mut s = status(vec![running("app", "c1", env.wall, false)]);
    env.m.update_pod_status(&p, &mut s);
    assert_eq!(
        s.container_statuses.as_ref().unwrap()[0].started,
        Some(true)
    );

    env.at(10.5).await;
    assert_eq!((env.calls("live"), env.calls("ready")), (0, 0));
    // The status manager now reports the container started.
    env.status.set("u1", s);
    env.at(20.5).await;
    assert_eq!((env.calls("live"), env.calls("ready")), (1, 1));
    assert_eq!(env.calls("startup"), 2, "startup probes only until started");
}

/// Startup starts Unknown; a startup failure past the threshold holds the
/// worker like liveness.
#[tokio::test(start_paused = true)]
async fn startup_failure_is_reported_and_held() {
    let env = Env::new();
    let mut c = container("app");
    c.startup_probe = Some(exec_probe("startup", 1, 2));
    let mut probe = exec_probe("startup", 1, 2);
    probe.initial_delay_seconds = Some(5);
    c.startup_probe = Some(probe);
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, false)]));
    env.exec.set("c1", Exec::exit(1, "not yet"));
    env.m.add_pod(&pod("u1", vec![c]));

    env.at(0.5).await;
    assert_eq!(env.results.startup.get("c1"), Some(ProbeResult::Unknown));
    env.at(20.5).await;
    assert_eq!(env.results.startup.get("c1"), Some(ProbeResult::Failure));
    assert_eq!(
        env.events("Unhealthy"),
        vec!["Startup probe failed: not yet"; 2]
    );
    env.at(40.5).await;
    assert_eq!(env.calls("startup"), 2);
}

/// An exec probe that runs past timeoutSeconds fails with upstream's message.
#[tokio::test(start_paused = true)]
async fn exec_timeout_fails() {
    let env = Env::new();
    let mut c = container("app");
    let mut probe = exec_probe("sleep", 1, 1);
    probe.exec.as_mut().unwrap().command = Some(vec!["sleep".into(), "10".into()]);
    probe.timeout_seconds = Some(2);
    c.readiness_probe = Some(probe);
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.exec.set("c1", Exec::Hang);
    env.m.add_pod(&pod("u1", vec![c]));

    env.at(1.5).await;
    assert!(env.events("Unhealthy").is_empty());
    env.at(2.5).await;
    assert_eq!(
        env.events("Unhealthy"),
        vec!["Readiness probe failed: command \"sleep 10\" timed out"]
    );
    assert_eq!(env.exec.calls()[0].2, Duration::from_secs(2));
    assert_eq!(env.results.readiness.get("c1"), Some(ProbeResult::Failure));
}

/// A runtime error is retried three times, reported as errored, and the
/// result is thrown away.
#[tokio::test(start_paused = true)]
async fn exec_error_is_retried_and_discarded() {
    let env = Env::new();
    let mut c = container("app");
    c.liveness_probe = Some(exec_probe("live", 1, 1));
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.exec.set("c1", Exec::NotFound);
    env.m.add_pod(&pod("u1", vec![c]));

    env.at(0.5).await;
    assert_eq!(env.calls("live"), 3);
    assert_eq!(
        env.events("Unhealthy"),
        vec![
            "Liveness probe errored and resulted in unknown state: ExecSync: not found: container c1 not found"
        ]
    );
    assert_eq!(env.results.liveness.get("c1"), Some(ProbeResult::Success));
}

/// A terminated container sets Failure; the worker exits when the container
/// will not be restarted, and stays when it will.
#[tokio::test(start_paused = true)]
async fn terminated_container_stops_worker_under_restart_never() {
    let env = Env::new();
    let mut c = container("app");
    c.readiness_probe = Some(exec_probe("ready", 1, 3));
    let mut never = pod("u1", vec![c.clone()]);
    never.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    let always = pod("u2", vec![c]);
    env.status
        .set("u1", status(vec![terminated("app", "c1", 0)]));
    env.status
        .set("u2", status(vec![terminated("app", "c2", 0)]));
    env.m.add_pod(&never);
    env.m.add_pod(&always);

    env.at(0.5).await;
    env.settle().await;
    assert_eq!(env.m.worker_count(), 1);
    assert_eq!(
        env.results.readiness.get("c1"),
        None,
        "exiting worker forgets"
    );
    assert_eq!(env.results.readiness.get("c2"), Some(ProbeResult::Failure));
    assert_eq!(env.calls("ready"), 0);
}

/// A pod in a terminal phase stops its workers.
#[tokio::test(start_paused = true)]
async fn terminal_phase_stops_worker() {
    let env = Env::new();
    let mut c = container("app");
    c.readiness_probe = Some(exec_probe("ready", 1, 3));
    let mut s = status(vec![running("app", "c1", env.wall, true)]);
    s.phase = Some("Succeeded".into());
    env.status.set("u1", s);
    env.m.add_pod(&pod("u1", vec![c]));
    env.at(0.5).await;
    env.settle().await;
    assert_eq!(env.m.worker_count(), 0);
}

/// A pod being deleted: liveness records a last Success and stops;
/// readiness keeps probing.
#[tokio::test(start_paused = true)]
async fn deletion_stops_liveness_not_readiness() {
    let env = Env::new();
    let mut c = container("app");
    c.liveness_probe = Some(exec_probe("live", 1, 1));
    c.readiness_probe = Some(exec_probe("ready", 1, 1));
    let mut p = pod("u1", vec![c]);
    p.metadata.deletion_timestamp = Some(Time(env.wall));
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.exec.set("c1", Exec::exit(1, "down"));
    env.m.add_pod(&p);

    env.at(10.5).await;
    env.settle().await;
    assert_eq!(env.calls("live"), 0);
    assert_eq!(env.calls("ready"), 2);
    assert_eq!(env.m.worker_count(), 1);
    assert_eq!(env.results.liveness.get("c1"), None);
    assert_eq!(env.results.readiness.get("c1"), Some(ProbeResult::Failure));
}

/// No status or no container status yet: the worker waits.
#[tokio::test(start_paused = true)]
async fn waits_for_status() {
    let env = Env::new();
    let mut c = container("app");
    c.readiness_probe = Some(exec_probe("ready", 1, 3));
    env.m.add_pod(&pod("u1", vec![c]));
    env.at(10.5).await;
    assert_eq!(env.calls("ready"), 0);
    assert_eq!(env.m.worker_count(), 1);
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.at(20.5).await;
    assert_eq!(env.calls("ready"), 1);
}

/// Right after start the first probe waits a random part of the period,
/// then probes every period.
#[tokio::test(start_paused = true)]
async fn first_probe_is_jittered_within_a_period() {
    let env = Env::with_jitter(true);
    let mut c = container("app");
    c.readiness_probe = Some(exec_probe("ready", 1, 3));
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.m.add_pod(&pod("u1", vec![c]));
    env.at(9.999).await;
    assert_eq!(env.calls("ready"), 1);
    env.at(19.999).await;
    assert_eq!(env.calls("ready"), 2);
}
