//! Manager tests (upstream `prober_manager_test.go`).

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use k8s_openapi::api::core::v1::{ContainerStatus, HTTPGetAction, Probe, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_runtime::{ProbeResult, ProbeResults};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::test_support::*;
use crate::testing::{Exec, FakeExec, FakeRecorder};

/// A pod with a probed app container (startup, readiness, liveness), a
/// sidecar with readiness, and a plain init container with a probe that
/// is ignored (upstream probes only restartable init containers).
fn probed_pod(uid: &str) -> Pod {
    let mut app = container("app");
    app.startup_probe = Some(exec_probe("startup", 1, 3));
    app.readiness_probe = Some(exec_probe("ready", 1, 3));
    app.liveness_probe = Some(exec_probe("live", 1, 3));
    let mut sidecar = container("sidecar");
    sidecar.restart_policy = Some("Always".into());
    sidecar.readiness_probe = Some(exec_probe("sidecar-ready", 1, 3));
    let mut init = container("init");
    init.readiness_probe = Some(exec_probe("init-ready", 1, 3));
    let mut p = pod(uid, vec![app, container("plain")]);
    p.spec.as_mut().unwrap().init_containers = Some(vec![init, sidecar]);
    p
}

#[tokio::test(start_paused = true)]
async fn add_pod_is_idempotent_and_skips_plain_init_containers() {
    let env = Env::new();
    let p = probed_pod("u1");
    env.m.add_pod(&p);
    assert_eq!(env.m.worker_count(), 4);
    env.m.add_pod(&p);
    assert_eq!(env.m.worker_count(), 4);
    env.m.add_pod(&probed_pod("u2"));
    assert_eq!(env.m.worker_count(), 8);
}

#[tokio::test(start_paused = true)]
async fn stop_remove_and_cleanup() {
    let env = Env::new();
    let p1 = probed_pod("u1");
    let p2 = probed_pod("u2");
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.m.add_pod(&p1);
    env.m.add_pod(&p2);
    env.at(0.5).await;
    assert_eq!(env.results.readiness.get("c1"), Some(ProbeResult::Success));

    env.m.stop_liveness_and_startup(&p1);
    env.settle().await;
    assert_eq!(env.m.worker_count(), 6, "readiness workers keep running");
    assert_eq!(env.results.liveness.get("c1"), None);
    assert_eq!(env.results.startup.get("c1"), None);

    env.m.remove_pod(&p1);
    env.settle().await;
    assert_eq!(env.m.worker_count(), 4);
    assert_eq!(env.results.readiness.get("c1"), None);

    env.m.cleanup_pods(&HashSet::from(["u2".to_string()]));
    env.settle().await;
    assert_eq!(env.m.worker_count(), 4);
    env.m.cleanup_pods(&HashSet::new());
    env.settle().await;
    assert_eq!(env.m.worker_count(), 0);

    // A removed pod can be added again.
    env.m.add_pod(&p1);
    assert_eq!(env.m.worker_count(), 4);
    env.shutdown.cancel();
    env.settle().await;
    assert_eq!(env.m.worker_count(), 0, "shutdown stops every worker");
}

fn find<'a>(s: &'a [ContainerStatus], name: &str) -> &'a ContainerStatus {
    s.iter().find(|c| c.name == name).unwrap()
}

#[tokio::test(start_paused = true)]
async fn update_pod_status_started_and_ready() {
    let env = Env::new();
    let p = probed_pod("u1");
    env.m.add_pod(&p);
    let mut s = status(vec![
        running("app", "c1", env.wall, false),
        running("plain", "c2", env.wall, false),
    ]);
    s.init_container_statuses = Some(vec![
        terminated("init", "i1", 0),
        running("sidecar", "s1", env.wall, false),
    ]);

    // Before any probe ran: a startup worker exists, so not started.
    env.m.update_pod_status(&p, &mut s);
    let cs = s.container_statuses.clone().unwrap();
    assert_eq!(
        (find(&cs, "app").started, find(&cs, "app").ready),
        (Some(false), false)
    );
    // No probes: started and ready once running.
    assert_eq!(
        (find(&cs, "plain").started, find(&cs, "plain").ready),
        (Some(true), true)
    );
    let ics = s.init_container_statuses.clone().unwrap();
    assert!(
        find(&ics, "init").ready,
        "init container that exited 0 is ready"
    );
    // The sidecar's readiness has not run yet: not ready, and asked to probe now.
    assert_eq!(
        (find(&ics, "sidecar").started, find(&ics, "sidecar").ready),
        (Some(true), false)
    );

    // Results arrive: startup and readiness succeeded.
    env.results.startup.set("c1", ProbeResult::Success, "u1");
    env.results.readiness.set("c1", ProbeResult::Success, "u1");
    env.results.readiness.set("s1", ProbeResult::Success, "u1");
    env.m.update_pod_status(&p, &mut s);
    let cs = s.container_statuses.clone().unwrap();
    assert_eq!(
        (find(&cs, "app").started, find(&cs, "app").ready),
        (Some(true), true)
    );
    assert!(find(&s.init_container_statuses.clone().unwrap(), "sidecar").ready);

    // A container that is not running is neither started nor ready.
    let mut s2 = status(vec![terminated("app", "c1", 1)]);
    env.m.update_pod_status(&p, &mut s2);
    let cs = s2.container_statuses.unwrap();
    assert_eq!((cs[0].started, cs[0].ready), (Some(false), false));
}

/// Asking for status while readiness is unknown triggers a probe at once
/// instead of waiting for the period.
#[tokio::test(start_paused = true)]
async fn update_pod_status_triggers_readiness_probe() {
    let env = Env::new();
    let mut c = container("app");
    let mut probe = exec_probe("ready", 1, 3);
    probe.period_seconds = Some(100);
    c.readiness_probe = Some(probe);
    let p = pod("u1", vec![c]);
    env.m.add_pod(&p);
    env.at(0.5).await;
    assert_eq!(env.calls("ready"), 0, "no status yet");
    let mut s = status(vec![running("app", "c1", env.wall, true)]);
    env.status.set("u1", s.clone());
    env.m.update_pod_status(&p, &mut s);
    assert!(!s.container_statuses.as_ref().unwrap()[0].ready);
    env.at(1.0).await;
    assert_eq!(env.calls("ready"), 1);
    env.m.update_pod_status(&p, &mut s);
    assert!(s.container_statuses.as_ref().unwrap()[0].ready);
}

async fn http_server() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let svc = hyper::service::service_fn(
                move |req: http::Request<hyper::body::Incoming>| async move {
                    let (code, location) = match req.uri().path() {
                        "/healthz" => (200, String::new()),
                        // Another host name for this server: not followed.
                        "/elsewhere" => (302, format!("http://localhost:{port}/healthz")),
                        _ => (500, String::new()),
                    };
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .status(code)
                            .header("Location", location)
                            .body(Full::new(Bytes::from_static(b"ok")))
                            .unwrap(),
                    )
                },
            );
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc),
            );
        }
    });
    port
}

/// HTTP and TCP probes through the manager against local servers, on real
/// time (sockets and a paused clock do not mix); periods of 1s.
#[tokio::test]
async fn http_and_tcp_probes_end_to_end() {
    let port = http_server().await;
    let results = ProbeResults::default();
    let status = Arc::new(FakeStatus::default());
    let rec = Arc::new(FakeRecorder::default());
    let m = Manager::new(
        results.clone(),
        Arc::new(FakeExec::new()),
        status.clone(),
        rec.clone(),
        CancellationToken::new(),
    );
    let http_probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(port)),
            ..Default::default()
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        ..Default::default()
    };
    let mut good = container("good");
    good.readiness_probe = Some(http_probe("/healthz"));
    // A TCP probe to a closed port fails (threshold 1).
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    good.liveness_probe = Some(Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(i32::from(closed_port)),
            host: None,
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        ..Default::default()
    });
    let mut bad = container("bad");
    bad.liveness_probe = Some(http_probe("/broken"));
    let mut moved = container("moved");
    moved.readiness_probe = Some(http_probe("/elsewhere"));
    let p = pod("u1", vec![good, bad, moved]);
    let now = jiff::Timestamp::now();
    status.set(
        "u1",
        status_of(vec![
            running("good", "g1", now, true),
            running("bad", "b1", now, true),
            running("moved", "m1", now, true),
        ]),
    );
    m.add_pod(&p);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if results.readiness.get("g1") == Some(ProbeResult::Success)
            && results.liveness.get("b1") == Some(ProbeResult::Failure)
            && results.liveness.get("g1") == Some(ProbeResult::Failure)
            && results.readiness.get("m1") == Some(ProbeResult::Success)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "probes did not settle: {:?}",
            rec.events()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = rec.events();
    let mut unhealthy: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "Unhealthy")
        .map(|e| (e.field_path.clone().unwrap(), e.message.clone()))
        .collect();
    unhealthy.sort();
    assert_eq!(
        unhealthy,
        vec![
            (
                "spec.containers{bad}".to_string(),
                "Liveness probe failed: HTTP probe failed with statuscode: 500".to_string()
            ),
            (
                "spec.containers{good}".to_string(),
                format!(
                    "Liveness probe failed: dial tcp 127.0.0.1:{closed_port}: connect: connection refused"
                )
            ),
        ]
    );
    let warning = events
        .iter()
        .find(|e| e.reason == "ProbeWarning")
        .expect("warning event");
    assert_eq!(
        warning.message,
        "Readiness probe warning: Probe terminated redirects, Response body: ok"
    );
    assert_eq!(
        warning.field_path.as_deref(),
        Some("spec.containers{moved}")
    );
    m.remove_pod(&p);
}

fn status_of(cs: Vec<ContainerStatus>) -> k8s_openapi::api::core::v1::PodStatus {
    status(cs)
}

/// The scripted exec answers per container and defaults to exit 0.
#[tokio::test]
async fn fake_exec_defaults_to_success() {
    let f = FakeExec::new();
    f.set("x", Exec::exit(2, "no"));
    let r = cri::RuntimeService::exec_sync(&f, "y", vec![], Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0);
    let r = cri::RuntimeService::exec_sync(&f, "x", vec![], Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 2);
}

#[tokio::test(start_paused = true)]
async fn probes_are_counted_and_timed_until_their_worker_stops() {
    let env = Env::new();
    let p = probed_pod("u1");
    env.status
        .set("u1", status(vec![running("app", "c1", env.wall, true)]));
    env.m.add_pod(&p);
    env.at(0.5).await;
    let text = env.metrics.prober().render();
    assert!(
        text.contains(
            "prober_probe_total{probe_type=\"Readiness\",result=\"successful\",container=\"app\""
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "prober_probe_duration_seconds_count{probe_type=\"Readiness\",container=\"app\""
        ),
        "{text}"
    );
    env.m.remove_pod(&p);
    env.settle().await;
    assert!(
        !env.metrics.prober().render().contains("pod_uid=\"u1\""),
        "a stopped worker's series are gone"
    );
}
