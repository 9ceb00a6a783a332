//! Container log rotation settings (upstream `containerLogMaxSize`,
//! `containerLogMaxFiles`, `containerLogMaxWorkers`,
//! `containerLogMonitorInterval`), validated as upstream's
//! `ValidateKubeletConfiguration` and `NewContainerLogManager` do.

use std::time::Duration;

use super::Inputs;
use crate::settings::SettingValue;
use crate::{ConfigError, invalid};

/// The log manager's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerLogConfig {
    /// `containerLogMaxSize` (`10Mi`), as written (a quantity).
    pub max_size: String,
    /// `containerLogMaxFiles` (5).
    pub max_files: i32,
    /// `containerLogMaxWorkers` (1).
    pub max_workers: i32,
    /// `containerLogMonitorInterval` (10s).
    pub monitor_interval: Duration,
}

impl Default for ContainerLogConfig {
    fn default() -> Self {
        Self {
            max_size: "10Mi".into(),
            max_files: 5,
            max_workers: 1,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

impl ContainerLogConfig {
    /// `containerLogMaxSize` in bytes (upstream `parseMaxSize`); negative
    /// turns rotation off, as upstream. `None` only for a value `resolve`
    /// would have refused.
    pub fn max_size_bytes(&self) -> Option<i64> {
        kubelet_types::quantity::parse_bytes(&self.max_size)
    }
}

/// The shortest `containerLogMonitorInterval` upstream accepts.
const MIN_MONITOR_INTERVAL: Duration = Duration::from_secs(3);

/// Resolves the fields: the two flag-backed ones flag over file over
/// default, the two config-file-only ones file over default.
pub fn resolve(inputs: &Inputs<'_>) -> Result<ContainerLogConfig, ConfigError> {
    let d = ContainerLogConfig::default();
    let max_size = match inputs.setting("containerLogMaxSize") {
        None => d.max_size,
        Some(SettingValue::String(s)) => s.trim().to_string(),
        Some(v) => return Err(invalid("containerLogMaxSize", v.to_string(), "a quantity")),
    };
    // Upstream refuses the kubelet's start in `NewContainerLogManager`.
    if kubelet_types::quantity::parse_bytes(&max_size).is_none() {
        let allowed = format!("failed to parse container log max size {max_size:?}");
        return Err(invalid("containerLogMaxSize", max_size, allowed));
    }
    let max_files = inputs.int("containerLogMaxFiles", i64::from(d.max_files))?;
    if max_files <= 1 {
        return Err(invalid(
            "containerLogMaxFiles",
            max_files.to_string(),
            "invalid configuration: containerLogMaxFiles must be greater than 1",
        ));
    }
    let max_workers = inputs.file_int("containerLogMaxWorkers", i64::from(d.max_workers))?;
    if max_workers < 1 {
        return Err(invalid(
            "containerLogMaxWorkers",
            max_workers.to_string(),
            "invalid configuration: containerLogMaxWorkers must be greater than or equal to 1",
        ));
    }
    let monitor_interval =
        inputs.file_duration("containerLogMonitorInterval", d.monitor_interval)?;
    if monitor_interval < MIN_MONITOR_INTERVAL {
        return Err(invalid(
            "containerLogMonitorInterval",
            format!("{monitor_interval:?}"),
            "invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal to 3s",
        ));
    }
    let int32 = |field: &'static str, v: i64| {
        i32::try_from(v).map_err(|_| invalid(field, v.to_string(), "a 32-bit integer"))
    };
    Ok(ContainerLogConfig {
        max_size,
        max_files: int32("containerLogMaxFiles", max_files)?,
        max_workers: int32("containerLogMaxWorkers", max_workers)?,
        monitor_interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::KubeletConfiguration;
    use crate::flags::Flags;
    use crate::{ConfigError, KubeletConfig};

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn resolve(args: &[&str], file: &str) -> Result<ContainerLogConfig, ConfigError> {
        let flags = Flags::parse_args(std::iter::once("kubelet").chain(args.iter().copied()))
            .expect("flags");
        let (file, _) = KubeletConfiguration::parse(&format!("{HEAD}{file}")).expect("file");
        KubeletConfig::resolve(&flags, Some(&file), "h").map(|c| c.housekeeping.container_log)
    }

    fn refused(args: &[&str], file: &str) -> (String, String) {
        match resolve(args, file) {
            Err(ConfigError::Invalid { field, allowed, .. }) => (field.to_string(), allowed),
            other => panic!("{args:?} {file:?} must be refused: {other:?}"),
        }
    }

    #[test]
    fn upstream_defaults() {
        let c = resolve(&[], "").expect("resolve");
        assert_eq!(c, ContainerLogConfig::default());
        assert_eq!(c.max_size_bytes(), Some(10 * 1024 * 1024));
    }

    #[test]
    fn flags_over_file_and_file_only_fields() {
        let file = "containerLogMaxSize: 20Mi\ncontainerLogMaxFiles: 4\n\
                    containerLogMaxWorkers: 3\ncontainerLogMonitorInterval: 5s\n";
        let c = resolve(&[], file).expect("resolve");
        assert_eq!(c.max_size_bytes(), Some(20 * 1024 * 1024));
        assert_eq!(
            (c.max_files, c.max_workers, c.monitor_interval),
            (4, 3, Duration::from_secs(5))
        );
        let c = resolve(
            &[
                "--container-log-max-size=1Mi",
                "--container-log-max-files=2",
            ],
            file,
        )
        .expect("resolve");
        assert_eq!(c.max_size, "1Mi");
        assert_eq!(c.max_files, 2);
        assert_eq!(c.max_workers, 3, "the file's value stays");
    }

    #[test]
    fn negative_size_turns_rotation_off() {
        let c = resolve(&[], "containerLogMaxSize: \"-1\"\n").expect("resolve");
        assert_eq!(c.max_size_bytes(), Some(-1));
    }

    #[test]
    fn refusals_carry_upstreams_messages() {
        let (f, m) = refused(&["--container-log-max-files=1"], "");
        assert_eq!(f, "containerLogMaxFiles");
        assert_eq!(
            m,
            "invalid configuration: containerLogMaxFiles must be greater than 1"
        );
        let (f, m) = refused(&[], "containerLogMaxWorkers: 0\n");
        assert_eq!(f, "containerLogMaxWorkers");
        assert_eq!(
            m,
            "invalid configuration: containerLogMaxWorkers must be greater than or equal to 1"
        );
        let (f, m) = refused(&[], "containerLogMonitorInterval: 2s\n");
        assert_eq!(f, "containerLogMonitorInterval");
        assert_eq!(
            m,
            "invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal to 3s"
        );
        let (f, m) = refused(&[], "containerLogMaxSize: 10MB\n");
        assert_eq!(f, "containerLogMaxSize");
        assert_eq!(m, "failed to parse container log max size \"10MB\"");
        // The smallest accepted values.
        let c = resolve(
            &["--container-log-max-files=2"],
            "containerLogMaxWorkers: 1\ncontainerLogMonitorInterval: 3s\n",
        )
        .expect("resolve");
        assert_eq!(c.monitor_interval, Duration::from_secs(3));
    }
}
