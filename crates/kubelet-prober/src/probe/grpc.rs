//! gRPC probes (upstream `pkg/probe/grpc`): `grpc.health.v1.Health/Check`
//! with the probe's service name on `podIP:port`, plaintext, within the
//! timeout. `SERVING` succeeds; anything else fails with upstream's message.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use super::{Output, ProbeOutcome, go_duration, join_host_port};
use crate::grpc_health::pb::health_check_response::ServingStatus;
use crate::grpc_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// grpc-go's first reconnect backoff; a blocking dial retries until its deadline.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// Calls Health/Check for `service` on `host:port` within `timeout`.
pub async fn probe(host: &str, service: &str, port: u16, timeout: Duration) -> Output {
    let addr = join_host_port(host, port);
    let deadline = Instant::now() + timeout;
    let endpoint = match Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(crate::USER_AGENT))
    {
        Ok(e) => e.connect_timeout(timeout),
        Err(e) => {
            return (
                ProbeOutcome::Failure,
                format!("error: failed to connect service at {addr:?}: {e}"),
            );
        }
    };
    // Upstream dials with WithBlock: connection errors are retried until the
    // deadline, which is then what the probe reports.
    let channel = match tokio::time::timeout_at(deadline, connect(&endpoint)).await {
        Ok(c) => c,
        Err(_) => {
            return (
                ProbeOutcome::Failure,
                format!(
                    "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
                    go_duration(timeout)
                ),
            );
        }
    };
    let mut client = HealthClient::new(channel);
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: service.to_string(),
    });
    req.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let rpc_timeout = || {
        (
            ProbeOutcome::Failure,
            format!(
                "timeout: health rpc did not complete within {}",
                go_duration(timeout)
            ),
        )
    };
    match tokio::time::timeout_at(deadline, client.check(req)).await {
        Err(_) => rpc_timeout(),
        Ok(Err(status)) => match status.code() {
            Code::Unimplemented => (
                ProbeOutcome::Failure,
                format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                    status.message()
                ),
            ),
            Code::DeadlineExceeded => rpc_timeout(),
            // tonic's own enforcement of the deadline we sent.
            Code::Cancelled if status.message() == "Timeout expired" => rpc_timeout(),
            code => (
                ProbeOutcome::Failure,
                format!(
                    "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
                    status.message()
                ),
            ),
        },
        Ok(Ok(resp)) => {
            let status = resp.into_inner().status();
            if status == ServingStatus::Serving {
                (ProbeOutcome::Success, "service is serving".to_string())
            } else {
                (
                    ProbeOutcome::Failure,
                    format!(
                        "service unhealthy (responded with {:?})",
                        status.as_str_name()
                    ),
                )
            }
        }
    }
}

/// Connects, retrying with grpc-go's backoff (1s, x1.6) until it works; the
/// caller bounds it with the probe's deadline.
async fn connect(endpoint: &Endpoint) -> Channel {
    let mut backoff = FIRST_BACKOFF;
    loop {
        match endpoint.connect().await {
            Ok(c) => return c,
            Err(e) => {
                tracing::trace!(error = %e, "grpc probe dial failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = backoff.mul_f64(1.6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc_health::pb::HealthCheckResponse;
    use crate::grpc_health::pb::health_server::{Health, HealthServer};

    struct Fixed(ServingStatus);

    #[tonic::async_trait]
    impl Health for Fixed {
        async fn check(
            &self,
            req: tonic::Request<HealthCheckRequest>,
        ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
            if req.get_ref().service == "missing" {
                return Err(tonic::Status::not_found("unknown service"));
            }
            Ok(tonic::Response::new(HealthCheckResponse {
                status: self.0 as i32,
            }))
        }
    }

    async fn serve(status: ServingStatus) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(l);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(HealthServer::new(Fixed(status)))
                .serve_with_incoming(incoming),
        );
        port
    }

    #[tokio::test]
    async fn serving_succeeds_not_serving_fails() {
        let t = Duration::from_secs(5);
        let port = serve(ServingStatus::Serving).await;
        assert_eq!(
            probe("127.0.0.1", "", port, t).await,
            (ProbeOutcome::Success, "service is serving".to_string())
        );
        let port = serve(ServingStatus::NotServing).await;
        assert_eq!(
            probe("127.0.0.1", "", port, t).await,
            (
                ProbeOutcome::Failure,
                "service unhealthy (responded with \"NOT_SERVING\")".to_string()
            )
        );
        let (outcome, msg) = probe("127.0.0.1", "missing", port, t).await;
        assert_eq!(outcome, ProbeOutcome::Failure);
        assert_eq!(
            msg,
            "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
        );
    }

    #[tokio::test]
    async fn non_grpc_server_and_closed_port_fail() {
        // A plain TCP server that never speaks HTTP/2: the rpc times out.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        let (outcome, msg) = probe("127.0.0.1", "", port, Duration::from_secs(1)).await;
        assert_eq!(outcome, ProbeOutcome::Failure);
        assert!(msg.starts_with("timeout: "), "{msg}");

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let (outcome, msg) = probe("127.0.0.1", "", port, Duration::from_secs(1)).await;
        assert_eq!(outcome, ProbeOutcome::Failure);
        assert_eq!(
            msg,
            format!(
                "timeout: failed to connect service \"127.0.0.1:{port}\" within 1s: context deadline exceeded"
            )
        );
    }
}
