//! Probe implementations (upstream `pkg/probe`): the result type shared by
//! all of them, the error seam, and container port resolution
//! (`probe.ResolveContainerPort`). Each submodule implements one handler:
//! [`exec`], [`http`], [`tcp`] and [`grpc`].

pub mod exec;
pub mod grpc;
pub mod http;
pub mod tcp;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Upstream caps exec output and HTTP response bodies at 10 KiB.
pub const MAX_OUTPUT: usize = 10 * 1024;

/// The outcome of one probe attempt (upstream `probe.Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeOutcome {
    /// The container answered as healthy.
    Success,
    /// Healthy, with something worth an event (an HTTP redirect not followed).
    Warning,
    /// The container answered as unhealthy (or did not answer in time).
    Failure,
    /// The probe could not be run.
    Unknown,
}

impl ProbeOutcome {
    /// Upstream's lowercase spelling, used in event messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeOutcome::Success => "success",
            ProbeOutcome::Warning => "warning",
            ProbeOutcome::Failure => "failure",
            ProbeOutcome::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ProbeOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A probe's outcome and its output (the event message on failure).
pub type Output = (ProbeOutcome, String);

/// Why a probe could not be run at all (upstream returns `probe.Unknown`
/// with an error; the worker throws such a result away).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A port that is neither a number in 1..65535 nor a named container port.
    #[error("{0}")]
    Port(String),
    /// The runtime failed the exec for another reason than a timeout.
    #[error(transparent)]
    Exec(#[from] cri::CriError),
    /// The HTTP request could not be built from the probe.
    #[error("{0}")]
    Request(String),
    /// Reading the HTTP response body failed.
    #[error("{0}")]
    Body(String),
    /// The probe has no handler (no exec, httpGet, tcpSocket or grpc).
    #[error("missing probe handler for {pod}:{container}")]
    MissingHandler {
        /// The pod, as upstream `format.Pod`.
        pod: String,
        /// The container's name.
        container: String,
    },
}

impl ProbeError {
    /// The probe result upstream reports with this error (`probe.Failure`
    /// for a body read error, `probe.Unknown` otherwise).
    pub fn outcome(&self) -> ProbeOutcome {
        match self {
            ProbeError::Body(_) => ProbeOutcome::Failure,
            _ => ProbeOutcome::Unknown,
        }
    }
}

/// Resolves a probe's port against the container (upstream
/// `probe.ResolveContainerPort`): a number, or the name of one of the
/// container's ports, or a number written as a string.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    let n: i64 = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let named = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()));
            match named {
                Some(p) => i64::from(p.container_port),
                None => name.parse::<i64>().map_err(|_| {
                    ProbeError::Port(format!("strconv.Atoi: parsing {name:?}: invalid syntax"))
                })?,
            }
        }
    };
    match u16::try_from(n) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ProbeError::Port(format!("invalid port number: {n}"))),
    }
}

/// `host:port`, bracketing IPv6 literals (Go `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's `time.Duration.String()` for the whole-second timeouts probes use.
pub(crate) fn go_duration(d: std::time::Duration) -> String {
    if d.subsec_nanos() == 0 {
        let s = d.as_secs();
        let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
        if h > 0 {
            format!("{h}h{m}m{s}s")
        } else if m > 0 {
            format!("{m}m{s}s")
        } else {
            format!("{s}s")
        }
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// An io error as Go spells it (`connection refused`, not
/// `Connection refused (os error 111)`).
pub(crate) fn go_io_error(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::TimedOut {
        return "i/o timeout".to_string();
    }
    let s = e.to_string();
    let s = match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    };
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn container() -> Container {
        Container {
            name: "c".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn ports_resolve_by_number_name_or_numeric_string() {
        let c = container();
        assert_eq!(resolve_port(&IntOrString::Int(80), &c).unwrap(), 80);
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c).unwrap(),
            8080
        );
        assert_eq!(
            resolve_port(&IntOrString::String("81".into()), &c).unwrap(),
            81
        );
        assert_eq!(
            resolve_port(&IntOrString::String("nope".into()), &c)
                .unwrap_err()
                .to_string(),
            "strconv.Atoi: parsing \"nope\": invalid syntax"
        );
        assert_eq!(
            resolve_port(&IntOrString::Int(0), &c)
                .unwrap_err()
                .to_string(),
            "invalid port number: 0"
        );
        assert_eq!(
            resolve_port(&IntOrString::Int(65536), &c)
                .unwrap_err()
                .to_string(),
            "invalid port number: 65536"
        );
    }

    #[test]
    fn go_spellings() {
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(go_duration(std::time::Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(std::time::Duration::from_secs(90)), "1m30s");
        let e = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(go_io_error(&e).starts_with("connection refused"));
    }
}
