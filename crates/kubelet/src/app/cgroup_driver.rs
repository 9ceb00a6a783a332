//! The cgroup driver in effect (upstream `cmd/kubelet/app/server.go`
//! `getCgroupDriverFromCRI`, feature `KubeletCgroupDriverFromCRI`, on by
//! default since 1.30): the runtime's answer to CRI `RuntimeConfig` wins over
//! `cgroupDriver`; a runtime that does not implement the call (containerd
//! before 2.0) leaves the configured driver. Upstream asks up to three times,
//! two seconds apart, and exits when the runtime never answers. kubelet-rs
//! asks again only a runtime that answered with an error; one that is not
//! listening (no socket, refused) is not waited for, as kubelet-rs starts
//! without its runtime and waits for it: the configured driver is kept, and
//! a warning says so. The driver is decided once, at start, as upstream.

use std::time::Duration;

use cri::RemoteRuntime;
use cri::pb;
use kubelet_types::CgroupDriver;
use tracing::{info, warn};

/// The feature gate.
pub const GATE: &str = "KubeletCgroupDriverFromCRI";
/// Attempts at `RuntimeConfig` before the configured driver is kept.
const ATTEMPTS: u32 = 3;
/// Between two attempts.
const RETRY: Duration = Duration::from_secs(2);

/// Where the driver in effect came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverSource {
    /// CRI `RuntimeConfig`.
    Runtime,
    /// `cgroupDriver` / `--cgroup-driver`.
    Config,
}

/// The runtime's side of the question, so the choice is testable.
#[async_trait::async_trait]
pub trait AskRuntime: Send + Sync {
    /// `RuntimeConfig`'s Linux section; `Ok(None)` when not implemented.
    async fn runtime_config(&self) -> Result<Option<pb::LinuxRuntimeConfiguration>, cri::CriError>;
}

#[async_trait::async_trait]
impl AskRuntime for RemoteRuntime {
    async fn runtime_config(&self) -> Result<Option<pb::LinuxRuntimeConfiguration>, cri::CriError> {
        RemoteRuntime::runtime_config(self).await
    }
}

/// The driver to use: the runtime's when the gate is on and it answers,
/// else `configured`.
pub async fn resolve(
    rt: &dyn AskRuntime,
    configured: CgroupDriver,
    gate_on: bool,
) -> (CgroupDriver, DriverSource) {
    if !gate_on {
        return (configured, DriverSource::Config);
    }
    for attempt in 1..=ATTEMPTS {
        match rt.runtime_config().await {
            Ok(Some(linux)) => match pb::CgroupDriver::try_from(linux.cgroup_driver) {
                Ok(d) => {
                    let driver = match d {
                        pb::CgroupDriver::Systemd => CgroupDriver::Systemd,
                        pb::CgroupDriver::Cgroupfs => CgroupDriver::Cgroupfs,
                    };
                    info!(
                        cgroup_driver = driver.as_str(),
                        "Using cgroup driver setting received from the CRI runtime"
                    );
                    return (driver, DriverSource::Runtime);
                }
                Err(_) => {
                    warn!(
                        driver = linux.cgroup_driver,
                        "The runtime returned an unknown cgroup driver; using cgroupDriver from the kubelet config"
                    );
                    return (configured, DriverSource::Config);
                }
            },
            Ok(None) => {
                info!(
                    "CRI implementation should be updated to support RuntimeConfig when KubeletCgroupDriverFromCRI feature gate has been enabled. Falling back to using cgroupDriver from kubelet config."
                );
                return (configured, DriverSource::Config);
            }
            Err(e @ cri::CriError::Unavailable { .. }) => {
                warn!(
                    error = %e,
                    cgroup_driver = configured.as_str(),
                    "The runtime is not listening to say its cgroup driver; using cgroupDriver from the kubelet config"
                );
                return (configured, DriverSource::Config);
            }
            Err(e) if attempt < ATTEMPTS => {
                info!(error = %e, attempt, "RuntimeConfig failed; asking again");
                tokio::time::sleep(RETRY).await;
            }
            Err(e) => {
                warn!(
                    error = %e,
                    cgroup_driver = configured.as_str(),
                    "The runtime did not say its cgroup driver; using cgroupDriver from the kubelet config"
                );
            }
        }
    }
    (configured, DriverSource::Config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    struct Answers(Mutex<Vec<Result<Option<pb::LinuxRuntimeConfiguration>, cri::CriError>>>);

    #[async_trait::async_trait]
    impl AskRuntime for Answers {
        async fn runtime_config(
            &self,
        ) -> Result<Option<pb::LinuxRuntimeConfiguration>, cri::CriError> {
            let mut a = self.0.lock();
            if a.is_empty() {
                return Ok(None);
            }
            a.remove(0)
        }
    }

    fn linux(d: pb::CgroupDriver) -> Result<Option<pb::LinuxRuntimeConfiguration>, cri::CriError> {
        Ok(Some(pb::LinuxRuntimeConfiguration {
            cgroup_driver: d as i32,
        }))
    }

    fn down() -> Result<Option<pb::LinuxRuntimeConfiguration>, cri::CriError> {
        Err(cri::CriError::Unavailable {
            op: "RuntimeConfig",
            message: "connection refused".into(),
        })
    }

    fn starting() -> Result<Option<pb::LinuxRuntimeConfiguration>, cri::CriError> {
        Err(cri::CriError::Rpc {
            op: "RuntimeConfig",
            code: cri::Code::Unknown,
            message: "server is not initialized yet".into(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn the_runtimes_driver_wins_and_unimplemented_keeps_the_config() {
        let rt = Answers(Mutex::new(vec![linux(pb::CgroupDriver::Systemd)]));
        assert_eq!(
            resolve(&rt, CgroupDriver::Cgroupfs, true).await,
            (CgroupDriver::Systemd, DriverSource::Runtime)
        );
        let rt = Answers(Mutex::new(vec![linux(pb::CgroupDriver::Cgroupfs)]));
        assert_eq!(
            resolve(&rt, CgroupDriver::Systemd, true).await,
            (CgroupDriver::Cgroupfs, DriverSource::Runtime)
        );
        let rt = Answers(Mutex::new(vec![Ok(None)]));
        assert_eq!(
            resolve(&rt, CgroupDriver::Systemd, true).await,
            (CgroupDriver::Systemd, DriverSource::Config)
        );
        // The gate off: the runtime is not asked.
        let rt = Answers(Mutex::new(vec![linux(pb::CgroupDriver::Systemd)]));
        assert_eq!(
            resolve(&rt, CgroupDriver::Cgroupfs, false).await,
            (CgroupDriver::Cgroupfs, DriverSource::Config)
        );
        assert_eq!(rt.0.lock().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_still_starting_is_asked_again_one_not_listening_is_not() {
        let rt = Answers(Mutex::new(vec![
            starting(),
            linux(pb::CgroupDriver::Systemd),
        ]));
        let t0 = tokio::time::Instant::now();
        assert_eq!(
            resolve(&rt, CgroupDriver::Cgroupfs, true).await,
            (CgroupDriver::Systemd, DriverSource::Runtime)
        );
        assert_eq!(t0.elapsed(), RETRY);
        let rt = Answers(Mutex::new(vec![starting(), starting(), starting()]));
        assert_eq!(
            resolve(&rt, CgroupDriver::Cgroupfs, true).await,
            (CgroupDriver::Cgroupfs, DriverSource::Config)
        );
        assert!(rt.0.lock().is_empty(), "three attempts");
        // Not listening: not waited for.
        let rt = Answers(Mutex::new(vec![down(), linux(pb::CgroupDriver::Systemd)]));
        let t0 = tokio::time::Instant::now();
        assert_eq!(
            resolve(&rt, CgroupDriver::Cgroupfs, true).await,
            (CgroupDriver::Cgroupfs, DriverSource::Config)
        );
        assert_eq!(t0.elapsed(), std::time::Duration::ZERO);
    }
}
