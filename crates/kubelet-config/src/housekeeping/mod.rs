//! The settings of the subsystems that keep a node alive for months
//! (upstream `KubeletConfiguration` fields and the deprecated
//! `KubeletFlags` of container GC): container and image garbage
//! collection, container log rotation, eviction, graceful node shutdown.
//! Each is resolved flag over `--config` file over upstream's default, and
//! validated as upstream's `ValidateKubeletConfiguration` does; the
//! subsystems turn them into their own policies.

pub mod container_gc;
pub mod container_log;
pub mod eviction;
pub mod image_gc;
pub mod shutdown;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::file::KubeletConfiguration;
use crate::flags::Flags;
use crate::settings::SettingValue;
use crate::{ConfigError, invalid};

/// All of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Housekeeping {
    /// Container garbage collection.
    pub container_gc: container_gc::ContainerGcConfig,
    /// Image garbage collection.
    pub image_gc: image_gc::ImageGcConfig,
    /// Container log rotation.
    pub container_log: container_log::ContainerLogConfig,
    /// Eviction.
    pub eviction: eviction::EvictionConfig,
    /// Graceful node shutdown.
    pub shutdown: shutdown::ShutdownConfig,
}

/// What each resolution reads.
pub struct Inputs<'a> {
    /// The command line.
    pub flags: &'a Flags,
    /// The `--config` file (empty without one).
    pub file: &'a KubeletConfiguration,
    /// Flag-backed fields, resolved flag over file.
    pub settings: &'a BTreeMap<&'static str, SettingValue>,
}

impl Inputs<'_> {
    /// A flag-backed field, resolved.
    pub fn setting(&self, field: &str) -> Option<&SettingValue> {
        self.settings.get(field)
    }

    /// A config-file-only field (no flag spelling), raw.
    pub fn file_only(&self, field: &str) -> Option<&serde_json::Value> {
        self.file.other.get(field)
    }

    /// A command-line-only flag (`minimum-container-ttl-duration`), as given
    /// (the last value wins).
    pub fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .extra
            .get(name)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    /// A flag-backed duration field, or `default`.
    pub fn duration(
        &self,
        field: &'static str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match self.setting(field) {
            None => Ok(default),
            Some(SettingValue::Duration(d)) => d
                .to_std()
                .ok_or_else(|| invalid(field, d.to_string(), "a duration of 0 or more")),
            Some(v) => Err(invalid(field, v.to_string(), "a duration")),
        }
    }

    /// A flag-backed integer field, or `default`.
    pub fn int(&self, field: &'static str, default: i64) -> Result<i64, ConfigError> {
        match self.setting(field) {
            None => Ok(default),
            Some(SettingValue::Int(i)) => Ok(*i),
            Some(v) => Err(invalid(field, v.to_string(), "an integer")),
        }
    }

    /// A flag-backed map field (empty when not set).
    pub fn map(&self, field: &'static str) -> Result<BTreeMap<String, String>, ConfigError> {
        match self.setting(field) {
            None => Ok(BTreeMap::new()),
            Some(SettingValue::Map(m)) => Ok(m.clone()),
            Some(v) => Err(invalid(field, v.to_string(), "a map")),
        }
    }

    /// A config-file-only duration field (`imageMaximumGCAge`), or `default`.
    pub fn file_duration(
        &self,
        field: &'static str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match self.file_only(field) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(serde_json::Value::String(s)) => {
                crate::parse_go_duration(s).map_err(|e| invalid(field, s.clone(), e))
            }
            Some(v) => Err(invalid(field, v.to_string(), "a duration such as 10s")),
        }
    }

    /// A config-file-only integer field, or `default`.
    pub fn file_int(&self, field: &'static str, default: i64) -> Result<i64, ConfigError> {
        match self.file_only(field) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(v) => v
                .as_i64()
                .ok_or_else(|| invalid(field, v.to_string(), "an integer")),
        }
    }
}

/// Resolves and validates all of them.
pub fn resolve(inputs: &Inputs<'_>) -> Result<Housekeeping, ConfigError> {
    Ok(Housekeeping {
        container_gc: container_gc::resolve(inputs)?,
        image_gc: image_gc::resolve(inputs)?,
        container_log: container_log::resolve(inputs)?,
        eviction: eviction::resolve(inputs)?,
        shutdown: shutdown::resolve(inputs)?,
    })
}
