//! Container garbage collection settings (upstream `KubeletFlags`
//! `--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`,
//! `--maximum-dead-containers`, deprecated but still honoured upstream;
//! `kubecontainer.GCPolicy`).

use std::time::Duration;

use super::Inputs;
use crate::{ConfigError, invalid, parse_go_duration};

/// Upstream `GCPolicy`.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerGcConfig {
    /// `--minimum-container-ttl-duration` (0).
    pub min_age: Duration,
    /// `--maximum-dead-containers-per-container` (1).
    pub max_per_pod_container: i32,
    /// `--maximum-dead-containers` (-1: no limit).
    pub max_containers: i32,
}

impl Default for ContainerGcConfig {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// Resolves the flags. A negative TTL is refused as upstream's
/// `NewContainerGC` refuses it ("invalid minimum garbage collection age").
pub fn resolve(inputs: &Inputs<'_>) -> Result<ContainerGcConfig, ConfigError> {
    let d = ContainerGcConfig::default();
    let f = inputs.flags;
    let min_age = match &f.minimum_container_ttl_duration {
        None => d.min_age,
        Some(raw) => parse_go_duration(raw)
            .map_err(|e| invalid("minimum-container-ttl-duration", raw.as_str(), e))?,
    };
    Ok(ContainerGcConfig {
        min_age,
        max_per_pod_container: f
            .maximum_dead_containers_per_container
            .unwrap_or(d.max_per_pod_container),
        max_containers: f.maximum_dead_containers.unwrap_or(d.max_containers),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::file::KubeletConfiguration;
    use crate::flags::Flags;

    /// The policy, or the error naming what was refused (the command
    /// line parser checks the Go value syntax first).
    fn resolve_args(args: &[&str]) -> Result<ContainerGcConfig, String> {
        let flags = Flags::parse_args(std::iter::once("kubelet").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let file = KubeletConfiguration::default();
        let settings = BTreeMap::new();
        resolve(&Inputs {
            flags: &flags,
            file: &file,
            settings: &settings,
        })
        .map_err(|e| match e {
            ConfigError::Invalid { field, .. } => field.to_string(),
            e => e.to_string(),
        })
    }

    #[test]
    fn defaults_are_upstreams() {
        let c = resolve_args(&[]).expect("resolve");
        assert_eq!(c.min_age, Duration::ZERO);
        assert_eq!(c.max_per_pod_container, 1);
        assert_eq!(c.max_containers, -1);
    }

    #[test]
    fn flags_set_the_policy_last_value_wins() {
        let c = resolve_args(&[
            "--minimum-container-ttl-duration=1m30s",
            "--maximum-dead-containers-per-container=3",
            "--maximum-dead-containers=5",
            "--maximum-dead-containers=100",
        ])
        .expect("resolve");
        assert_eq!(c.min_age, Duration::from_secs(90));
        assert_eq!(c.max_per_pod_container, 3);
        assert_eq!(c.max_containers, 100);
        // Negative limits mean "no limit", as upstream.
        let c = resolve_args(&["--maximum-dead-containers-per-container=-1"]).expect("resolve");
        assert_eq!(c.max_per_pod_container, -1);
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (
                &["--minimum-container-ttl-duration=-1s"][..],
                "minimum-container-ttl-duration",
            ),
            (
                &["--maximum-dead-containers=lots"][..],
                "maximum-dead-containers",
            ),
        ] {
            match resolve_args(args) {
                Err(e) => assert!(e.contains(flag), "{args:?}: {e}"),
                Ok(c) => panic!("{args:?} accepted: {c:?}"),
            }
        }
    }
}
