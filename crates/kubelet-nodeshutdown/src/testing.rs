//! A systemd-logind and systemd for tests, on a private `dbus-daemon`
//! (machines without systemd): `org.freedesktop.login1.Manager` with
//! `Inhibit` (a real file descriptor, the write end of a pipe, so a test
//! sees when the kubelet closes it), `InhibitDelayMaxUSec` and the
//! `PrepareForShutdown` signal; `org.freedesktop.systemd1.Manager.KillUnit`,
//! which on SIGHUP to `systemd-logind.service` reads the kubelet's
//! `99-kubelet.conf` drop-in as logind would.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use zbus::Connection;

use crate::systemd::{
    KUBELET_LOGIND_CONF, LOGIND_INTERFACE, LOGIND_OBJECT, LOGIND_SERVICE, SYSTEMD_OBJECT,
    SYSTEMD_SERVICE,
};

/// One `Inhibit` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InhibitCall {
    /// `shutdown`.
    pub what: String,
    /// `kubelet`.
    pub who: String,
    /// Why.
    pub why: String,
    /// `delay`.
    pub mode: String,
}

#[derive(Default)]
struct State {
    delay_usec: Mutex<u64>,
    conf_dir: PathBuf,
    inhibits: Mutex<Vec<(InhibitCall, Arc<std::io::PipeReader>)>>,
    kill_units: Mutex<Vec<(String, String, i32)>>,
}

struct Login1 {
    state: Arc<State>,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Login1 {
    async fn inhibit(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let (reader, writer) =
            std::io::pipe().map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        self.state.inhibits.lock().push((
            InhibitCall {
                what: what.into(),
                who: who.into(),
                why: why.into(),
                mode: mode.into(),
            },
            Arc::new(reader),
        ));
        Ok(std::os::fd::OwnedFd::from(writer).into())
    }

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    async fn inhibit_delay_max_usec(&self) -> u64 {
        *self.state.delay_usec.lock()
    }
}

struct Systemd1 {
    state: Arc<State>,
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl Systemd1 {
    async fn kill_unit(&self, name: &str, who: &str, signal: i32) -> zbus::fdo::Result<()> {
        self.state
            .kill_units
            .lock()
            .push((name.into(), who.into(), signal));
        if name == "systemd-logind.service" && signal == 1 {
            let path = self.state.conf_dir.join(KUBELET_LOGIND_CONF);
            if let Ok(text) = tokio::fs::read_to_string(&path).await
                && let Some(secs) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("InhibitDelayMaxSec="))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            {
                *self.state.delay_usec.lock() = secs * 1_000_000;
            }
        }
        Ok(())
    }
}

/// The private bus, logind and systemd. Dropping it stops the daemon.
pub struct TestLogind {
    /// The bus address for the kubelet.
    pub address: String,
    daemon: tokio::process::Child,
    conn: Connection,
    state: Arc<State>,
}

/// Why the test bus could not start.
#[derive(Debug, thiserror::Error)]
pub enum TestBusError {
    /// `dbus-daemon` could not run.
    #[error("starting dbus-daemon")]
    Daemon(#[source] std::io::Error),
    /// It printed no address in time.
    #[error("dbus-daemon printed no address")]
    NoAddress,
    /// The services could not register.
    #[error("serving logind")]
    Serve(#[source] zbus::Error),
}

const BUS_CONFIG: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path=SOCKET</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#;

impl TestLogind {
    /// Starts `dbus-daemon` on a socket in `dir` and serves logind (with
    /// `inhibit_delay_max` as its `InhibitDelayMaxUSec`) and systemd on it;
    /// the kubelet's drop-in goes to [`TestLogind::logind_conf_dir`].
    pub async fn start(dir: &Path, inhibit_delay_max: Duration) -> Result<Self, TestBusError> {
        let config = dir.join("bus.conf");
        let socket = dir.join("system_bus_socket");
        let text = BUS_CONFIG.replace("SOCKET", &socket.to_string_lossy());
        tokio::fs::write(&config, text)
            .await
            .map_err(TestBusError::Daemon)?;
        let mut daemon = tokio::process::Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .arg("--nofork")
            .arg("--print-address")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(TestBusError::Daemon)?;
        let stdout = daemon.stdout.take().ok_or(TestBusError::NoAddress)?;
        let mut line = String::new();
        let mut lines = BufReader::new(stdout);
        match tokio::time::timeout(Duration::from_secs(10), lines.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(TestBusError::NoAddress),
        }
        let address = line.trim().to_string();
        let state = Arc::new(State {
            delay_usec: Mutex::new(u64::try_from(inhibit_delay_max.as_micros()).unwrap_or(0)),
            conf_dir: dir.join("logind.conf.d"),
            ..Default::default()
        });
        let conn = zbus::connection::Builder::address(address.as_str())
            .map_err(TestBusError::Serve)?
            .name(LOGIND_SERVICE)
            .map_err(TestBusError::Serve)?
            .name(SYSTEMD_SERVICE)
            .map_err(TestBusError::Serve)?
            .serve_at(
                LOGIND_OBJECT,
                Login1 {
                    state: state.clone(),
                },
            )
            .map_err(TestBusError::Serve)?
            .serve_at(
                SYSTEMD_OBJECT,
                Systemd1 {
                    state: state.clone(),
                },
            )
            .map_err(TestBusError::Serve)?
            .build()
            .await
            .map_err(TestBusError::Serve)?;
        Ok(Self {
            address,
            daemon,
            conn,
            state,
        })
    }

    /// Where the kubelet should write its drop-in.
    pub fn logind_conf_dir(&self) -> PathBuf {
        self.state.conf_dir.clone()
    }

    /// logind's `InhibitDelayMaxUSec` now.
    pub fn inhibit_delay_max(&self) -> Duration {
        Duration::from_micros(*self.state.delay_usec.lock())
    }

    /// The `Inhibit` calls so far.
    pub fn inhibit_calls(&self) -> Vec<InhibitCall> {
        self.state
            .inhibits
            .lock()
            .iter()
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// The `KillUnit` calls so far: unit, whom, signal.
    pub fn kill_unit_calls(&self) -> Vec<(String, String, i32)> {
        self.state.kill_units.lock().clone()
    }

    /// Whether the `i`th lock handed out has been closed by every holder,
    /// now, without waiting: a non-blocking read of the pipe's read end
    /// gives end-of-file once every write end is closed, and "would block"
    /// while one is still open.
    pub fn lock_released(&self, i: usize) -> bool {
        let Some(reader) = self.state.inhibits.lock().get(i).map(|(_, r)| r.clone()) else {
            return false;
        };
        let nonblocking = fcntl(&*reader, FcntlArg::F_GETFL).and_then(|flags| {
            let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
            fcntl(&*reader, FcntlArg::F_SETFL(flags))
        });
        if nonblocking.is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        loop {
            match (&*reader).read(&mut buf) {
                Ok(0) => return true,
                // Nothing is ever written; skip it if it were.
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    /// Waits at most `within` for the `i`th lock to be released
    /// ([`TestLogind::lock_released`]); whether it was.
    pub async fn wait_lock_released(&self, i: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.lock_released(i) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Emits `PrepareForShutdown(active)`, as logind does when a shutdown
    /// starts (`true`) or is cancelled (`false`).
    pub async fn prepare_for_shutdown(&self, active: bool) -> Result<(), zbus::Error> {
        self.conn
            .emit_signal(
                None::<&str>,
                LOGIND_OBJECT,
                LOGIND_INTERFACE,
                "PrepareForShutdown",
                &active,
            )
            .await
    }

    /// Stops the bus daemon (the kubelet's watch then ends).
    pub async fn stop(mut self) {
        let _ = self.daemon.kill().await;
    }
}
