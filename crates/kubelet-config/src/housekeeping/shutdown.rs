//! Graceful node shutdown settings (upstream `shutdownGracePeriod`,
//! `shutdownGracePeriodCriticalPods`, `shutdownGracePeriodByPodPriority`),
//! validated as upstream's `ValidateKubeletConfiguration` does, and two
//! kubelet-rs config-file fields for where logind is reached:
//! `shutdownSystemBusAddress` (default: `DBUS_SYSTEM_BUS_ADDRESS`, else
//! sd-bus's `unix:path=/run/dbus/system_bus_socket`) and
//! `shutdownLogindConfigDirectory` (default: upstream's
//! `/etc/systemd/logind.conf.d`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Inputs;
use crate::duration::GoDuration;
use crate::settings::SettingValue;
use crate::{ConfigError, invalid};

/// One `shutdownGracePeriodByPodPriority` entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityGrace {
    /// Pods at this priority or above (up to the next entry).
    #[serde(default)]
    pub priority: i32,
    /// Their grace period, in seconds.
    #[serde(default)]
    pub shutdown_grace_period_seconds: i64,
}

/// The node shutdown manager's settings.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ShutdownConfig {
    /// `shutdownGracePeriod` (0: off).
    pub grace_period: Duration,
    /// `shutdownGracePeriodCriticalPods` (0).
    pub grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority` (empty).
    pub by_pod_priority: Vec<PriorityGrace>,
    /// `shutdownSystemBusAddress` (kubelet-rs): the system bus; `None`:
    /// `DBUS_SYSTEM_BUS_ADDRESS` or sd-bus's default socket.
    pub system_bus_address: Option<String>,
    /// `shutdownLogindConfigDirectory` (kubelet-rs): where the
    /// `99-kubelet.conf` logind drop-in goes; `None`: upstream's
    /// `/etc/systemd/logind.conf.d`.
    pub logind_config_directory: Option<PathBuf>,
}

impl ShutdownConfig {
    /// Whether graceful shutdown is on (upstream: a non-zero
    /// `shutdownGracePeriod` or any `shutdownGracePeriodByPodPriority`).
    pub fn enabled(&self) -> bool {
        !self.grace_period.is_zero() || !self.by_pod_priority.is_empty()
    }
}

/// A flag-backed duration as given (negative allowed, so the refusal is
/// upstream's), 0 when unset.
fn raw_duration(inputs: &Inputs<'_>, field: &'static str) -> Result<GoDuration, ConfigError> {
    match inputs.setting(field) {
        None => Ok(GoDuration::from_std(Duration::ZERO)),
        Some(SettingValue::Duration(d)) => Ok(*d),
        Some(v) => Err(invalid(field, v.to_string(), "a duration")),
    }
}

fn file_string(inputs: &Inputs<'_>, field: &'static str) -> Result<Option<String>, ConfigError> {
    match inputs.file_only(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(invalid(field, v.to_string(), "a string")),
    }
}

/// Resolves and validates the fields.
pub fn resolve(inputs: &Inputs<'_>) -> Result<ShutdownConfig, ConfigError> {
    let period = raw_duration(inputs, "shutdownGracePeriod")?;
    let critical = raw_duration(inputs, "shutdownGracePeriodCriticalPods")?;
    let second = GoDuration::from_std(Duration::from_secs(1)).as_nanos();
    if critical.as_nanos() > period.as_nanos() {
        return Err(invalid(
            "shutdownGracePeriodCriticalPods",
            critical.to_string(),
            format!(
                "invalid configuration: shutdownGracePeriodCriticalPods {critical} must be <= shutdownGracePeriod {period}"
            ),
        ));
    }
    for (field, d) in [
        ("shutdownGracePeriod", period),
        ("shutdownGracePeriodCriticalPods", critical),
    ] {
        let n = d.as_nanos();
        if n < 0 || (n > 0 && n < second) {
            return Err(invalid(
                field,
                d.to_string(),
                format!(
                    "invalid configuration: {field} {d} must be either zero or otherwise >= 1 sec"
                ),
            ));
        }
    }
    let by_pod_priority = match inputs.file_only("shutdownGracePeriodByPodPriority") {
        None | Some(serde_json::Value::Null) => vec![],
        Some(v) => Vec::<PriorityGrace>::deserialize(v).map_err(|e| {
            invalid(
                "shutdownGracePeriodByPodPriority",
                v.to_string(),
                format!("a list of {{priority, shutdownGracePeriodSeconds}}: {e}"),
            )
        })?,
    };
    if !by_pod_priority.is_empty() && (period.as_nanos() > 0 || critical.as_nanos() > 0) {
        return Err(invalid(
            "shutdownGracePeriodByPodPriority",
            format!("{} entries", by_pod_priority.len()),
            "invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time",
        ));
    }
    Ok(ShutdownConfig {
        grace_period: period.to_std().unwrap_or_default(),
        grace_period_critical_pods: critical.to_std().unwrap_or_default(),
        by_pod_priority,
        system_bus_address: file_string(inputs, "shutdownSystemBusAddress")?,
        logind_config_directory: file_string(inputs, "shutdownLogindConfigDirectory")?
            .map(PathBuf::from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::KubeletConfiguration;
    use crate::flags::Flags;
    use crate::{ConfigError, KubeletConfig};

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn resolve(args: &[&str], file: &str) -> Result<ShutdownConfig, ConfigError> {
        let flags = Flags::parse_args(std::iter::once("kubelet").chain(args.iter().copied()))
            .expect("flags");
        let (file, _) = KubeletConfiguration::parse(&format!("{HEAD}{file}")).expect("file");
        KubeletConfig::resolve(&flags, Some(&file), "h").map(|c| c.housekeeping.shutdown)
    }

    fn refused(args: &[&str], file: &str) -> (String, String) {
        match resolve(args, file) {
            Err(ConfigError::Invalid { field, allowed, .. }) => (field.to_string(), allowed),
            other => panic!("{args:?} {file:?} must be refused: {other:?}"),
        }
    }

    #[test]
    fn off_by_default() {
        let c = resolve(&[], "").expect("resolve");
        assert_eq!(c, ShutdownConfig::default());
        assert!(!c.enabled());
    }

    #[test]
    fn flags_over_file() {
        let c = resolve(
            &["--shutdown-grace-period=30s"],
            "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 4s\n\
             shutdownSystemBusAddress: unix:path=/tmp/bus\n\
             shutdownLogindConfigDirectory: /tmp/logind.conf.d\n",
        )
        .expect("resolve");
        assert_eq!(c.grace_period, Duration::from_secs(30));
        assert_eq!(c.grace_period_critical_pods, Duration::from_secs(4));
        assert_eq!(c.system_bus_address.as_deref(), Some("unix:path=/tmp/bus"));
        assert_eq!(
            c.logind_config_directory,
            Some(PathBuf::from("/tmp/logind.conf.d"))
        );
        assert!(c.enabled());
    }

    #[test]
    fn by_pod_priority_from_the_file() {
        let c = resolve(
            &[],
            "shutdownGracePeriodByPodPriority:\n\
             - priority: 100000\n  shutdownGracePeriodSeconds: 10\n\
             - priority: 0\n  shutdownGracePeriodSeconds: 20\n",
        )
        .expect("resolve");
        assert_eq!(
            c.by_pod_priority,
            vec![
                PriorityGrace {
                    priority: 100_000,
                    shutdown_grace_period_seconds: 10
                },
                PriorityGrace {
                    priority: 0,
                    shutdown_grace_period_seconds: 20
                },
            ]
        );
        assert!(c.enabled());
    }

    #[test]
    fn upstream_refusals() {
        assert_eq!(
            refused(&["--shutdown-grace-period=10s", "--shutdown-grace-period-critical-pods=20s"], ""),
            (
                "shutdownGracePeriodCriticalPods".into(),
                "invalid configuration: shutdownGracePeriodCriticalPods 20s must be <= shutdownGracePeriod 10s".into()
            )
        );
        assert_eq!(
            refused(&[], "shutdownGracePeriod: 500ms\n"),
            (
                "shutdownGracePeriod".into(),
                "invalid configuration: shutdownGracePeriod 500ms must be either zero or otherwise >= 1 sec".into()
            )
        );
        assert_eq!(
            refused(&[], "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 200ms\n"),
            (
                "shutdownGracePeriodCriticalPods".into(),
                "invalid configuration: shutdownGracePeriodCriticalPods 200ms must be either zero or otherwise >= 1 sec".into()
            )
        );
        assert_eq!(
            refused(
                &["--shutdown-grace-period=10s"],
                "shutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: 5\n"
            ),
            (
                "shutdownGracePeriodByPodPriority".into(),
                "invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time".into()
            )
        );
        assert_eq!(
            refused(&[], "shutdownGracePeriodByPodPriority: soon\n").0,
            "shutdownGracePeriodByPodPriority"
        );
    }
}
