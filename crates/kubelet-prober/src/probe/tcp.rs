//! TCP probes (upstream `pkg/probe/tcp`): the probe succeeds when a TCP
//! connection to `host:port` opens within the timeout; any error is a
//! failure whose output is the dial error.

use std::time::Duration;

use tokio::net::TcpStream;

use super::{Output, ProbeOutcome, go_io_error, join_host_port};

/// Connects to `host:port` within `timeout`.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> Output {
    let addr = join_host_port(host, port);
    match tokio::time::timeout(timeout, TcpStream::connect(addr.as_str())).await {
        Ok(Ok(_stream)) => (ProbeOutcome::Success, String::new()),
        Ok(Err(e)) => (
            ProbeOutcome::Failure,
            format!("dial tcp {addr}: connect: {}", go_io_error(&e)),
        ),
        Err(_) => (
            ProbeOutcome::Failure,
            format!("dial tcp {addr}: i/o timeout"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn open_port_succeeds_closed_port_fails() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (outcome, out) = probe("127.0.0.1", port, Duration::from_secs(5)).await;
        assert_eq!((outcome, out.as_str()), (ProbeOutcome::Success, ""));
        drop(l);
        let (outcome, out) = probe("127.0.0.1", port, Duration::from_secs(5)).await;
        assert_eq!(outcome, ProbeOutcome::Failure);
        assert_eq!(
            out,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );
    }
}
