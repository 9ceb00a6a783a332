//! Upstream's gRPC "Probing container" specs (`container_probe.go`: "should
//! *not* be restarted with a GRPC liveness probe", "should be restarted with
//! a GRPC liveness probe") against a small `grpc.health.v1` server this test
//! runs itself, plus a probe naming a service the server does not serve.
//!
//! agnhost's `grpc-health-checking` is not available here, so the pods run
//! on the host network of a kubelet whose node IP is 127.0.0.1: a probe goes
//! to the pod IP (127.0.0.1) and the port the test's server listens on.
//! Differences from upstream, each only in where the server runs: port 5000
//! is the local registry's here, so the server takes a free port; the
//! failing probe's port is another free port nobody listens on; its initial
//! delay is 15 s (upstream 60 s) and "not restarted" is watched for 60 s
//! (upstream 4 minutes).

use std::time::Duration;

use apiserver_double::Options;
use kubelet_prober::grpc_health::pb::health_check_response::ServingStatus;
use kubelet_prober::grpc_health::pb::health_server::{Health, HealthServer};
use kubelet_prober::grpc_health::pb::{HealthCheckRequest, HealthCheckResponse};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::Joined;
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

/// SERVING for the whole server (""), NOT_SERVING for "down", unknown otherwise.
struct Server;

#[tonic::async_trait]
impl Health for Server {
    async fn check(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let status = match req.into_inner().service.as_str() {
            "" => ServingStatus::Serving,
            "down" => ServingStatus::NotServing,
            other => return Err(Status::not_found(format!("unknown service {other}"))),
        };
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }
    // `Watch` keeps the generated default (unimplemented): probes only call `Check`.
}

fn free_port() -> u16 {
    kubelet_rs_integration::lane::free_port()
}

fn grpc_pod(port: u16, service: Option<&str>, initial_delay: i32) -> Value {
    let mut grpc = json!({"port": port});
    if let Some(s) = service {
        grpc["service"] = json!(s);
    }
    json!({
        "hostNetwork": true,
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "agnhost", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "sleep 600"],
            "livenessProbe": {"grpc": grpc, "initialDelaySeconds": initial_delay,
                              "timeoutSeconds": 5, "failureThreshold": 1}}]
    })
}

fn restarts(j: &Joined, name: &str) -> i64 {
    j.api_pod(name)
        .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64())
        .unwrap_or(0)
}

fn events(j: &Joined, name: &str) -> Vec<(String, String)> {
    let full = j.pod_name(name);
    j.api
        .list("events")
        .iter()
        .filter(|e| e["involvedObject"]["name"] == full.as_str())
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_liveness_probes_against_a_health_server() {
    let port = free_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind health server");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(HealthServer::new(Server))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let j = Joined::start_with(Options::default(), |f, _| {
        f.node_ip = Some("127.0.0.1".into());
    })
    .await;
    let wrong = free_port();
    j.create_pod("grpc-ok", grpc_pod(port, None, 15)).await;
    j.create_pod("grpc-wrong-port", grpc_pod(wrong, None, 15))
        .await;
    j.create_pod("grpc-down", grpc_pod(port, Some("down"), 15))
        .await;
    for name in ["grpc-ok", "grpc-wrong-port", "grpc-down"] {
        j.wait_api(name, Duration::from_secs(90), "running", |p| {
            p.is_some_and(|p| !p["status"]["containerStatuses"][0]["state"]["running"].is_null())
        })
        .await;
    }
    // Upstream: "should be restarted with a GRPC liveness probe" (wrong port),
    // and the same for a service the server reports NOT_SERVING.
    for name in ["grpc-wrong-port", "grpc-down"] {
        j.wait_api(
            name,
            Duration::from_secs(120),
            "restarted by its liveness probe",
            |p| {
                p.is_some_and(|p| {
                    p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
                })
            },
        )
        .await;
        let ev = events(&j, name);
        assert!(
            ev.iter()
                .any(|(r, m)| r == "Unhealthy" && m.starts_with("Liveness probe failed: ")),
            "{name}: no Unhealthy event: {ev:?}"
        );
        assert!(
            ev.iter()
                .any(|(r, m)| r == "Killing"
                    && m.contains("failed liveness probe, will be restarted")),
            "{name}: no Killing event: {ev:?}"
        );
    }
    let down = events(&j, "grpc-down");
    assert!(
        down.iter().any(|(_, m)| m.contains("NOT_SERVING")),
        "the NOT_SERVING status of the named service is in the message: {down:?}"
    );
    // Upstream: "should *not* be restarted with a GRPC liveness probe".
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        assert_eq!(
            restarts(&j, "grpc-ok"),
            0,
            "a SERVING server never restarts the container"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    server.abort();
    j.cleanup().await;
}
