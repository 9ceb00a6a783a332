//! The ports and sockets a start would listen on, tried as kubeadm's
//! `PortOpenCheck` does: bind, and release at once. The node API `port`
//! (10250) on `address` when `enableServer`, `readOnlyPort` when non-zero,
//! `healthzPort` on `healthzBindAddress` when non-zero, and the pod-resources
//! socket (upstream `<root-dir>/pod-resources/kubelet.sock`), which a start
//! would take over from a kubelet still serving it.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::Path;

use kubelet_config::KubeletConfig;

use crate::finding::{Finding, Kind};
use crate::report::Report;

/// One port the kubelet listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listen {
    /// The config field that sets it (`port`, `healthzPort`, `readOnlyPort`).
    pub(crate) field: &'static str,
    /// The address it binds.
    pub(crate) address: IpAddr,
    /// The port.
    pub(crate) port: u16,
}

/// The ports a start with `cfg` binds.
pub(crate) fn listens(cfg: &KubeletConfig) -> Vec<Listen> {
    let mut out = Vec::new();
    if cfg.server.enable_server {
        out.push(Listen {
            field: "port",
            address: cfg.server.address,
            port: cfg.server.port,
        });
    }
    if cfg.server.read_only_port != 0 {
        out.push(Listen {
            field: "readOnlyPort",
            address: cfg.server.address,
            port: cfg.server.read_only_port,
        });
    }
    if cfg.healthz_port != 0 {
        out.push(Listen {
            field: "healthzPort",
            address: cfg.healthz_bind_address,
            port: cfg.healthz_port,
        });
    }
    out
}

/// Reports taken ports and a pod-resources socket in use.
pub(crate) fn check(cfg: &KubeletConfig, report: &mut Report) {
    check_listens(&listens(cfg), report);
    let socket = cfg.root_dir.join("pod-resources").join("kubelet.sock");
    check_socket(&socket, report);
}

/// Tries each port; two of the kubelet's own on one port are an error too.
pub(crate) fn check_listens(listens: &[Listen], report: &mut Report) {
    let mut seen: BTreeMap<u16, &'static str> = BTreeMap::new();
    for l in listens {
        if let Some(first) = seen.insert(l.port, l.field) {
            report.push(
                Finding::error(
                    Kind::Port,
                    format!("Port {} is set for both {first} and {}", l.port, l.field),
                )
                .field(l.field),
            );
            continue;
        }
        report.push(try_bind(l));
    }
}

fn try_bind(l: &Listen) -> Finding {
    let addr = SocketAddr::new(l.address, l.port);
    match TcpListener::bind(addr) {
        // Dropped at once: the port is free again.
        Ok(listener) => {
            drop(listener);
            Finding::info(
                Kind::Port,
                format!("Port {} is free on {}", l.port, l.address),
            )
            .field(l.field)
        }
        Err(e) => {
            let message = match e.kind() {
                ErrorKind::AddrInUse => format!("Port {} is in use", l.port),
                ErrorKind::AddrNotAvailable => format!(
                    "cannot listen on {addr}: {} is not an address of this node ({e})",
                    l.address
                ),
                ErrorKind::PermissionDenied => format!(
                    "cannot listen on {addr}: {e} (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
                ),
                _ => format!("cannot listen on {addr}: {e}"),
            };
            Finding::error(Kind::Port, message).field(l.field)
        }
    }
}

/// A socket someone still accepts on is in use; a stale one is removed at start.
pub(crate) fn check_socket(socket: &Path, report: &mut Report) {
    if !socket.exists() {
        return;
    }
    if is_served(socket) {
        report.push(
            Finding::error(
                Kind::Port,
                format!(
                    "pod-resources socket {} is in use: another kubelet is serving it",
                    socket.display()
                ),
            )
            .in_file(socket),
        );
    }
}

/// Whether someone accepts on `socket`: a non-blocking connect, so a
/// server with a full backlog (`EAGAIN`) cannot hang the check.
fn is_served(socket: &Path) -> bool {
    use nix::errno::Errno;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket as open};
    use std::os::fd::AsRawFd;
    let Ok(fd) = open(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    let Ok(addr) = UnixAddr::new(socket) else {
        return false;
    };
    matches!(connect(fd.as_raw_fd(), &addr), Ok(()) | Err(Errno::EAGAIN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Severity;
    use std::net::Ipv4Addr;

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn an_occupied_port_is_upstreams_error_and_a_free_one_is_info() {
        let taken = TcpListener::bind((LOOPBACK, 0)).expect("bind");
        let busy = taken.local_addr().expect("addr").port();
        let free = {
            let l = TcpListener::bind((LOOPBACK, 0)).expect("bind");
            l.local_addr().expect("addr").port()
        };
        let mut r = Report::default();
        check_listens(
            &[
                Listen {
                    field: "port",
                    address: LOOPBACK,
                    port: busy,
                },
                Listen {
                    field: "healthzPort",
                    address: LOOPBACK,
                    port: free,
                },
            ],
            &mut r,
        );
        assert_eq!(r.findings.len(), 2);
        assert_eq!(r.findings[0].severity, Severity::Error);
        assert_eq!(r.findings[0].message, format!("Port {busy} is in use"));
        assert_eq!(r.findings[0].field.as_deref(), Some("port"));
        assert_eq!(r.findings[1].severity, Severity::Info);
        // The check released the free port.
        TcpListener::bind((LOOPBACK, free)).expect("released");
        drop(taken);
    }

    #[test]
    fn the_same_port_twice_and_a_foreign_address_are_errors() {
        let mut r = Report::default();
        let foreign = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)); // TEST-NET-1
        check_listens(
            &[
                Listen {
                    field: "port",
                    address: foreign,
                    port: 10250,
                },
                Listen {
                    field: "healthzPort",
                    address: LOOPBACK,
                    port: 10250,
                },
            ],
            &mut r,
        );
        assert_eq!(r.count(Severity::Error), 2, "{:?}", r.findings);
        assert!(
            r.findings[0]
                .message
                .contains("is not an address of this node")
        );
        assert_eq!(
            r.findings[1].message,
            "Port 10250 is set for both port and healthzPort"
        );
    }

    #[test]
    fn ports_follow_the_config() {
        let flags = kubelet_config::Flags::parse_args([
            "kubelet",
            "--port=11250",
            "--healthz-port=0",
            "--read-only-port=11255",
            "--address=127.0.0.1",
        ])
        .expect("flags");
        let cfg = KubeletConfig::resolve(&flags, None, "node").expect("config");
        let l = listens(&cfg);
        assert_eq!(
            l.iter().map(|l| (l.field, l.port)).collect::<Vec<_>>(),
            [("port", 11250), ("readOnlyPort", 11255)]
        );
        assert!(l.iter().all(|l| l.address == LOOPBACK));
    }

    #[test]
    fn a_served_socket_is_in_use_and_a_stale_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("kubelet.sock");
        let mut r = Report::default();
        check_socket(&sock, &mut r);
        assert!(r.findings.is_empty());
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        check_socket(&sock, &mut r);
        assert_eq!(r.count(Severity::Error), 1);
        assert!(r.findings[0].message.contains("is in use"));
        drop(listener);
        let mut r = Report::default();
        check_socket(&sock, &mut r);
        assert!(r.findings.is_empty(), "{:?}", r.findings);
    }
}
