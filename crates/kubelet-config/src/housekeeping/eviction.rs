//! Eviction settings (upstream `evictionHard`, `evictionSoft`,
//! `evictionSoftGracePeriod`, `evictionMinimumReclaim`,
//! `evictionPressureTransitionPeriod`, `evictionMaxPodGracePeriod`,
//! `localStorageCapacityIsolation`), as
//! written: the eviction manager parses the thresholds (upstream
//! `eviction.ParseThresholdConfig`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Inputs;
use crate::settings::SettingValue;
use crate::{ConfigError, invalid};

/// The eviction manager's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    /// `evictionSoft`: signal -> threshold.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal -> duration.
    pub soft_grace_period: BTreeMap<String, String>,
    /// `evictionMinimumReclaim`: signal -> quantity or percentage.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod` (5m).
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (0).
    pub max_pod_grace_period: i64,
    /// `localStorageCapacityIsolation` (true): evict pods over their
    /// ephemeral-storage limits and emptyDir size limits.
    pub local_storage_capacity_isolation: bool,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self {
            soft: BTreeMap::new(),
            soft_grace_period: BTreeMap::new(),
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: 0,
            local_storage_capacity_isolation: true,
        }
    }
}

/// Resolves the fields (`evictionHard` is in [`crate::ClusterConfig`]).
/// Grace periods must be Go durations of 0 or more (upstream
/// `parseGracePeriods`: "invalid eviction grace period specified"); the
/// signals and quantities are checked by the eviction manager at start
/// (upstream `ParseThresholdConfig` in `NewMainKubelet`'s caller).
pub fn resolve(inputs: &Inputs<'_>) -> Result<EvictionConfig, ConfigError> {
    let d = EvictionConfig::default();
    let soft_grace_period = inputs.map("evictionSoftGracePeriod")?;
    for v in soft_grace_period.values() {
        match crate::GoDuration::parse(v) {
            Ok(g) if g.to_std().is_some() => {}
            Ok(_) => {
                return Err(invalid(
                    "evictionSoftGracePeriod",
                    v.clone(),
                    format!(
                        "invalid eviction grace period specified: {v}, must be a positive value"
                    ),
                ));
            }
            Err(e) => return Err(invalid("evictionSoftGracePeriod", v.clone(), e)),
        }
    }
    let max_pod_grace_period = inputs.int("evictionMaxPodGracePeriod", d.max_pod_grace_period)?;
    let local_storage_capacity_isolation = match inputs.setting("localStorageCapacityIsolation") {
        None => d.local_storage_capacity_isolation,
        Some(SettingValue::Bool(b)) => *b,
        Some(v) => {
            return Err(invalid(
                "localStorageCapacityIsolation",
                v.to_string(),
                "a boolean",
            ));
        }
    };
    Ok(EvictionConfig {
        soft: inputs.map("evictionSoft")?,
        soft_grace_period,
        minimum_reclaim: inputs.map("evictionMinimumReclaim")?,
        pressure_transition_period: inputs.duration(
            "evictionPressureTransitionPeriod",
            d.pressure_transition_period,
        )?,
        max_pod_grace_period,
        local_storage_capacity_isolation,
    })
}

/// `evictionSoftGracePeriod` as durations (validated by [`resolve`]).
pub fn soft_grace_periods(c: &EvictionConfig) -> BTreeMap<String, Duration> {
    c.soft_grace_period
        .iter()
        .filter_map(|(k, v)| {
            let d = crate::parse_go_duration(v).ok()?;
            Some((k.clone(), d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::KubeletConfiguration;
    use crate::flags::Flags;
    use crate::settings::SettingValue;

    fn resolve_with(
        settings: &[(&'static str, SettingValue)],
    ) -> Result<EvictionConfig, ConfigError> {
        let flags = Flags::parse_args(["kubelet"]).expect("flags");
        let file = KubeletConfiguration::default();
        let settings: BTreeMap<&'static str, SettingValue> = settings.iter().cloned().collect();
        resolve(&Inputs {
            flags: &flags,
            file: &file,
            settings: &settings,
        })
    }

    fn map(pairs: &[(&str, &str)]) -> SettingValue {
        SettingValue::Map(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn defaults_are_upstreams() {
        let c = resolve_with(&[]).expect("resolve");
        assert_eq!(c, EvictionConfig::default());
        assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
    }

    #[test]
    fn settings_are_read() {
        let c = resolve_with(&[
            ("evictionSoft", map(&[("memory.available", "1Gi")])),
            (
                "evictionSoftGracePeriod",
                map(&[("memory.available", "1m30s")]),
            ),
            (
                "evictionMinimumReclaim",
                map(&[("nodefs.available", "500Mi")]),
            ),
            ("evictionMaxPodGracePeriod", SettingValue::Int(30)),
        ])
        .expect("resolve");
        assert_eq!(c.soft["memory.available"], "1Gi");
        assert_eq!(c.minimum_reclaim["nodefs.available"], "500Mi");
        assert_eq!(c.max_pod_grace_period, 30);
        assert!(c.local_storage_capacity_isolation, "default true");
        assert_eq!(
            soft_grace_periods(&c)["memory.available"],
            Duration::from_secs(90)
        );
    }

    #[test]
    fn local_storage_capacity_isolation_can_be_turned_off() {
        let c = resolve_with(&[("localStorageCapacityIsolation", SettingValue::Bool(false))])
            .expect("resolve");
        assert!(!c.local_storage_capacity_isolation);
    }

    #[test]
    fn local_storage_capacity_isolation_from_the_flag_and_the_file() {
        let c = crate::KubeletConfig::resolve(
            &Flags::parse_args(["kubelet", "--local-storage-capacity-isolation=false"])
                .expect("flags"),
            None,
            "n1",
        )
        .expect("resolve");
        assert!(!c.housekeeping.eviction.local_storage_capacity_isolation);
        let file: KubeletConfiguration = serde_json::from_value(serde_json::json!({
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "localStorageCapacityIsolation": false
        }))
        .expect("file");
        let c =
            crate::KubeletConfig::resolve(&Flags::default(), Some(&file), "n1").expect("resolve");
        assert!(!c.housekeeping.eviction.local_storage_capacity_isolation);
        let c = crate::KubeletConfig::resolve(&Flags::default(), None, "n1").expect("resolve");
        assert!(c.housekeeping.eviction.local_storage_capacity_isolation);
    }

    #[test]
    fn bad_grace_periods_are_refused() {
        let err = resolve_with(&[(
            "evictionSoftGracePeriod",
            map(&[("memory.available", "soon")]),
        )])
        .expect_err("invalid");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                field: "evictionSoftGracePeriod",
                ..
            }
        ));
        let err = resolve_with(&[(
            "evictionSoftGracePeriod",
            map(&[("memory.available", "-1s")]),
        )])
        .expect_err("invalid");
        assert!(
            err.to_string().contains("must be a positive value"),
            "{err}"
        );
    }
}
