//! Upstream `LogRotatePolicy` and `parseMaxSize`: the settings the manager
//! runs with.

use std::time::Duration;

use crate::LogsError;

/// How container logs are rotated; the same for every container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRotatePolicy {
    /// Rotate a live file once it holds this many bytes (`containerLogMaxSize`).
    pub max_size: u64,
    /// Live file plus rotated files, at most (`containerLogMaxFiles`, >= 2).
    pub max_files: usize,
    /// Containers rotated at once, at most (`containerLogMaxWorkers`, >= 1).
    pub max_workers: usize,
    /// How often logs are looked at (`containerLogMonitorInterval`).
    pub monitor_interval: Duration,
}

impl LogRotatePolicy {
    /// Upstream `NewContainerLogManager`'s checks. `Ok(None)`: a negative
    /// `max_size` turns rotation off, as upstream's stub manager.
    pub fn new(
        max_size: &str,
        max_files: i32,
        max_workers: i32,
        monitor_interval: Duration,
    ) -> Result<Option<Self>, LogsError> {
        if max_files <= 1 {
            return Err(LogsError::Policy(format!(
                "invalid MaxFiles {max_files}, must be > 1"
            )));
        }
        let size = kubelet_types::quantity::parse_bytes(max_size).ok_or_else(|| {
            LogsError::Policy(format!(
                "failed to parse container log max size {max_size:?}"
            ))
        })?;
        let Ok(size) = u64::try_from(size) else {
            return Ok(None);
        };
        Ok(Some(Self {
            max_size: size,
            max_files: usize::try_from(max_files).unwrap_or(usize::MAX),
            max_workers: usize::try_from(max_workers.max(1)).unwrap_or(1),
            monitor_interval,
        }))
    }

    /// Rotated files kept before a rotation adds one: the new live file and
    /// the newly rotated one take the other two places (upstream
    /// `removeExcessLogs`).
    pub fn max_rotated_kept(&self) -> usize {
        self.max_files.saturating_sub(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_checks() {
        let p = LogRotatePolicy::new("10Mi", 5, 1, Duration::from_secs(10))
            .expect("valid")
            .expect("on");
        assert_eq!(p.max_size, 10 * 1024 * 1024);
        assert_eq!(p.max_rotated_kept(), 3);
        assert!(
            LogRotatePolicy::new("-1", 5, 1, Duration::from_secs(10))
                .expect("valid")
                .is_none()
        );
        assert!(LogRotatePolicy::new("10Mi", 1, 1, Duration::from_secs(10)).is_err());
        assert!(LogRotatePolicy::new("ten", 5, 1, Duration::from_secs(10)).is_err());
    }
}
