//! A kubelet-rs process for tests: started without a container runtime (a
//! bogus endpoint, healthz off, an empty static pod directory), its stderr
//! collected line by line, killed if a test fails before stopping it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use tokio::time::Instant;

pub const BIN: &str = env!("CARGO_BIN_EXE_kubelet-rs");

/// A running kubelet-rs.
pub struct Kubelet {
    child: Child,
    lines: Receiver<String>,
    /// Every stderr line seen so far.
    pub seen: Vec<String>,
}

/// A loopback port nothing listens on right now, from lane 1's range of
/// the integration tests (`tests/lane.rs`: 20000-24999, below the kernel's
/// ephemeral ports): the other lane's `:0` binds, running at the same time,
/// never take it before the kubelet binds it.
pub fn free_port() -> u16 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id();
    (0..5_000u32)
        .map(|i| 20_000 + (seed.wrapping_add(i) % 5_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free loopback port in 20000..25000")
}

/// Lane 1's machine lock, which every kubelet test on the real runtime
/// holds (`tests/lane.rs`).
pub fn machine_lock() -> std::fs::File {
    let f = std::fs::File::create("/tmp/kubelet-rs-integration.lock").expect("lock file");
    f.lock().expect("lock");
    f
}

/// Flags that let kubelet-rs start without containerd, each instance in `dir/name`.
pub fn standalone_args(dir: &Path, name: &str) -> Vec<String> {
    let root = dir.join(name);
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    vec![
        format!(
            "--container-runtime-endpoint=unix://{}",
            dir.join("no-runtime.sock").display()
        ),
        "--healthz-port=0".into(),
        // The node API on a loopback port of its own; no read-only port.
        "--address=127.0.0.1".into(),
        format!("--port={}", free_port()),
        "--read-only-port=0".into(),
        format!("--root-dir={}", root.join("root").display()),
        format!("--pod-manifest-path={}", manifests.display()),
        format!("--hostname-override={name}"),
    ]
}

impl Kubelet {
    /// Starts kubelet-rs with `args`.
    pub fn start(args: &[String]) -> Kubelet {
        let mut child = Command::new(BIN)
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kubelet-rs");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kubelet {
            child,
            lines,
            seen: vec![],
        }
    }

    /// Waits until a stderr line contains `needle`; false on timeout or when
    /// the process closed stderr (exited) first.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> bool {
        if self.seen.iter().any(|l| l.contains(needle)) {
            return true;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Collects what stderr has printed so far, without waiting.
    pub fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// The exit status if the process has exited, waiting up to `timeout`.
    pub fn exited_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.drain();
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(sent.success(), "SIGTERM to {pid}");
        let status = self.child.wait().expect("wait");
        // Let the reader thread pass on the last lines.
        std::thread::sleep(Duration::from_millis(50));
        self.drain();
        status
    }

    /// Stderr so far, for assertion messages.
    pub fn output(&mut self) -> String {
        self.drain();
        self.seen.join("\n")
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
