//! Request parsing for the streaming endpoints: the remote-command stream
//! options (upstream `remotecommand.NewOptions`), the port-forward ports
//! (upstream `portforward.NewV4Options`), and the upgrade and WebSocket
//! sub-protocol headers (upstream `httpstream.IsUpgradeRequest`,
//! `wsstream.IsWebSocketRequest`).

use http::HeaderMap;
use http::header::{CONNECTION, SEC_WEBSOCKET_PROTOCOL, UPGRADE};

/// Query parameter naming the command of `/exec` (upstream `api.ExecCommandParam`).
pub const COMMAND_PARAM: &str = "command";
/// Query parameter asking for stdin (upstream `api.ExecStdinParam`).
pub const STDIN_PARAM: &str = "input";
/// Query parameter asking for stdout (upstream `api.ExecStdoutParam`).
pub const STDOUT_PARAM: &str = "output";
/// Query parameter asking for stderr (upstream `api.ExecStderrParam`).
pub const STDERR_PARAM: &str = "error";
/// Query parameter asking for a terminal (upstream `api.ExecTTYParam`).
pub const TTY_PARAM: &str = "tty";
/// Query parameter naming the ports of a WebSocket port-forward (upstream `api.PortHeader`).
pub const PORT_PARAM: &str = "port";

/// Which streams a remote command (exec, attach) carries (upstream
/// `remotecommand.Options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// The client sends stdin.
    pub stdin: bool,
    /// The client reads stdout.
    pub stdout: bool,
    /// The client reads stderr (never with a terminal).
    pub stderr: bool,
    /// The command runs in a terminal.
    pub tty: bool,
}

/// A request the streaming endpoints refuse with 400 (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// Neither stdin, stdout nor stderr was asked for.
    #[error("you must specify at least 1 of stdin, stdout, stderr")]
    NoStreams,
    /// A WebSocket port-forward named no port.
    #[error("query parameter \"port\" is required")]
    PortRequired,
    /// A `port` parameter was empty.
    #[error("query parameter \"port\" cannot be empty")]
    PortEmpty,
    /// A port is not a 16-bit number.
    #[error("unable to parse {0:?} as a port")]
    PortParse(String),
    /// Port zero.
    #[error("port {0:?} must be > 0")]
    PortZero(String),
}

/// The values of `name` in a raw query string, in order.
pub fn query_values(query: Option<&str>, name: &str) -> Vec<String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .collect()
}

fn flag(query: Option<&str>, name: &str) -> bool {
    // Go's `FormValue` reads the first value.
    query_values(query, name).first().map(String::as_str) == Some("1")
}

impl StreamOptions {
    /// Upstream `remotecommand.NewOptions`: `tty`, `input`, `output`,
    /// `error` are on when `1`; a terminal drops stderr; at least one stream
    /// is required.
    pub fn from_query(query: Option<&str>) -> Result<Self, OptionsError> {
        let tty = flag(query, TTY_PARAM);
        let stdin = flag(query, STDIN_PARAM);
        let stdout = flag(query, STDOUT_PARAM);
        let mut stderr = flag(query, STDERR_PARAM);
        if tty && stderr {
            tracing::debug!("exec with tty and stderr is not supported, bypassing stderr");
            stderr = false;
        }
        if !stdin && !stdout && !stderr {
            return Err(OptionsError::NoStreams);
        }
        Ok(Self {
            stdin,
            stdout,
            stderr,
            tty,
        })
    }
}

/// Upstream `portforward.NewV4Options`: a WebSocket request names its ports
/// in `port` parameters (each a comma-separated list); an SPDY request names
/// them per stream, so none are parsed.
pub fn ports_from_query(query: Option<&str>, websocket: bool) -> Result<Vec<i32>, OptionsError> {
    if !websocket {
        return Ok(Vec::new());
    }
    let values = query_values(query, PORT_PARAM);
    if values.is_empty() {
        return Err(OptionsError::PortRequired);
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err(OptionsError::PortEmpty);
        }
        for p in value.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|_| OptionsError::PortParse(value.clone()))?;
            if port == 0 {
                return Err(OptionsError::PortZero(value.clone()));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

fn header_tokens<'a>(
    headers: &'a HeaderMap,
    name: &'a http::HeaderName,
) -> impl Iterator<Item = String> + 'a {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Upstream `httpstream.IsUpgradeRequest`: a `Connection` header names `upgrade`.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    header_tokens(headers, &CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

/// Upstream `wsstream.IsWebSocketRequest`: an upgrade to `websocket`.
pub fn is_websocket(headers: &HeaderMap) -> bool {
    is_upgrade(headers)
        && headers
            .get(UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The WebSocket sub-protocols the client offers, in its order of preference.
pub fn websocket_protocols(headers: &HeaderMap) -> Vec<String> {
    header_tokens(headers, &SEC_WEBSOCKET_PROTOCOL).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_options_follow_remotecommand() {
        let o = StreamOptions::from_query(Some("command=ls&output=1&error=1")).unwrap();
        assert_eq!(
            o,
            StreamOptions {
                stdout: true,
                stderr: true,
                ..Default::default()
            }
        );
        // A terminal bypasses stderr.
        let o = StreamOptions::from_query(Some("tty=1&error=1&input=1")).unwrap();
        assert!(o.tty && o.stdin && !o.stderr);
        // Only "1" switches a stream on.
        assert_eq!(
            StreamOptions::from_query(Some("output=true&input=0")),
            Err(OptionsError::NoStreams)
        );
        // tty and stderr alone leave no stream.
        assert_eq!(
            StreamOptions::from_query(Some("tty=1&error=1"))
                .unwrap_err()
                .to_string(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
        assert_eq!(
            StreamOptions::from_query(None),
            Err(OptionsError::NoStreams)
        );
    }

    #[test]
    fn ports_follow_new_v4_options() {
        assert_eq!(ports_from_query(None, false), Ok(vec![]));
        assert_eq!(
            ports_from_query(Some("port=80"), false),
            Ok(vec![]),
            "SPDY names ports per stream"
        );
        assert_eq!(
            ports_from_query(Some("port=80,8080&port=9090"), true),
            Ok(vec![80, 8080, 9090])
        );
        assert_eq!(
            ports_from_query(None, true).unwrap_err().to_string(),
            "query parameter \"port\" is required"
        );
        assert_eq!(
            ports_from_query(Some("port="), true),
            Err(OptionsError::PortEmpty)
        );
        assert_eq!(
            ports_from_query(Some("port=80,x"), true),
            Err(OptionsError::PortParse("80,x".into()))
        );
        assert_eq!(
            ports_from_query(Some("port=70000"), true),
            Err(OptionsError::PortParse("70000".into()))
        );
        assert_eq!(
            ports_from_query(Some("port=0"), true)
                .unwrap_err()
                .to_string(),
            "port \"0\" must be > 0"
        );
    }

    #[test]
    fn upgrade_and_protocol_headers() {
        let mut h = HeaderMap::new();
        assert!(!is_upgrade(&h));
        h.insert(CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        h.insert(UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(is_upgrade(&h));
        assert!(!is_websocket(&h));
        h.insert(UPGRADE, "WebSocket".parse().unwrap());
        assert!(is_websocket(&h));
        h.append(
            SEC_WEBSOCKET_PROTOCOL,
            "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
        );
        h.append(SEC_WEBSOCKET_PROTOCOL, "channel.k8s.io".parse().unwrap());
        assert_eq!(
            websocket_protocols(&h),
            ["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"]
        );
    }
}
