//! Eviction signals and thresholds (upstream `pkg/kubelet/eviction/api`
//! and `ParseThresholdConfig` in `helpers.go`): which signals exist, the
//! node condition and resource of each, and thresholds parsed from
//! `evictionHard`, `evictionSoft`, `evictionSoftGracePeriod` and
//! `evictionMinimumReclaim`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use kubelet_types::quantity::{Format, Quantity};

use crate::EvictionError;

/// An eviction signal (upstream `evictionapi.Signal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// `memory.available`: capacity minus the root cgroup's working set.
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable minus the pods' working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`.
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `containerfs.available` (accepted, same filesystem as the node's).
    ContainerFsAvailable,
    /// `containerfs.inodesFree`.
    ContainerFsInodesFree,
    /// `pid.available`.
    PidAvailable,
}

/// A node condition eviction reports (upstream `v1.NodeConditionType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeCondition {
    /// `MemoryPressure`.
    MemoryPressure,
    /// `DiskPressure`.
    DiskPressure,
    /// `PIDPressure`.
    PidPressure,
}

impl NodeCondition {
    /// The API name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryPressure => "MemoryPressure",
            Self::DiskPressure => "DiskPressure",
            Self::PidPressure => "PIDPressure",
        }
    }
}

/// What a signal measures (upstream `signalToResource`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// `memory`.
    Memory,
    /// `ephemeral-storage`.
    EphemeralStorage,
    /// `inodes` (internal to eviction).
    Inodes,
    /// `pids` (internal to eviction).
    Pids,
}

impl Resource {
    /// Upstream's resource name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }

    /// How quantities of this resource print (bytes binary, counts decimal).
    pub fn format(self) -> Format {
        match self {
            Self::Memory | Self::EphemeralStorage => Format::BinarySI,
            Self::Inodes | Self::Pids => Format::DecimalSI,
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Signal {
    /// Every signal.
    pub const ALL: [Signal; 9] = [
        Self::MemoryAvailable,
        Self::AllocatableMemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::ContainerFsAvailable,
        Self::ContainerFsInodesFree,
        Self::PidAvailable,
    ];

    /// The signal's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::ContainerFsAvailable => "containerfs.available",
            Self::ContainerFsInodesFree => "containerfs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The signal named `s` (upstream `validSignal`).
    pub fn parse(s: &str) -> Result<Self, EvictionError> {
        Self::ALL
            .into_iter()
            .find(|sig| sig.as_str() == s)
            .ok_or_else(|| EvictionError::Config(format!("unsupported eviction signal {s}")))
    }

    /// The node condition it drives (upstream `signalToNodeCondition`).
    pub fn node_condition(self) -> NodeCondition {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => {
                NodeCondition::MemoryPressure
            }
            Self::PidAvailable => NodeCondition::PidPressure,
            _ => NodeCondition::DiskPressure,
        }
    }

    /// The resource it measures (upstream `signalToResource`).
    pub fn resource(self) -> Resource {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => Resource::Memory,
            Self::NodeFsAvailable | Self::ImageFsAvailable | Self::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Self::NodeFsInodesFree | Self::ImageFsInodesFree | Self::ContainerFsInodesFree => {
                Resource::Inodes
            }
            Self::PidAvailable => Resource::Pids,
        }
    }

    /// Memory signals are reclaimed first (upstream `byEvictionPriority`).
    pub fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A threshold's value: a quantity, or a share of capacity (upstream
/// `ThresholdValue`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    /// An absolute quantity (bytes, inodes, pids).
    Quantity(Quantity),
    /// A fraction of capacity, 0 to 1.
    Percentage(f32),
}

impl ThresholdValue {
    /// The quantity it stands for given `capacity` (upstream
    /// `GetThresholdQuantity`), in the resource's units.
    pub fn quantity(&self, capacity: i64, format: Format) -> Quantity {
        match self {
            Self::Quantity(q) => *q,
            Self::Percentage(p) => {
                // Upstream multiplies in float64 and truncates.
                let v = (capacity as f64 * f64::from(*p)) as i64;
                Quantity::new(v, format)
            }
        }
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Quantity(q) => write!(f, "{q}"),
            Self::Percentage(p) => write!(f, "{}%", p * 100.0),
        }
    }
}

/// One threshold (upstream `evictionapi.Threshold`; the operator is always
/// `LessThan`). A grace period of zero makes it hard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// Met when the signal's available amount is below this.
    pub value: ThresholdValue,
    /// How long it must hold before pods are evicted (soft thresholds).
    pub grace_period: Duration,
    /// What must be reclaimed beyond the threshold before it is resolved.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// Upstream `isHardEvictionThreshold`.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// Same signal, value and grace period (upstream `hasThreshold`).
    pub fn same(&self, o: &Threshold) -> bool {
        self.signal == o.signal && self.grace_period == o.grace_period && self.value == o.value
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "threshold(signal={}, operator=LessThan, value={}, gracePeriod={:?})",
            self.signal, self.value, self.grace_period
        )
    }
}

fn parse_percentage(s: &str) -> Result<f32, EvictionError> {
    let n: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|e| EvictionError::Config(format!("strconv.ParseFloat: parsing {s:?}: {e}")))?;
    Ok((n as f32) / 100.0)
}

fn parse_quantity(s: &str) -> Result<Quantity, EvictionError> {
    Quantity::parse(s).map_err(|e| EvictionError::Config(e.to_string()))
}

/// Upstream `parseThresholdStatement`: `None` for `0%` and `100%`.
fn parse_statement(signal: &str, val: &str) -> Result<Option<Threshold>, EvictionError> {
    let signal = Signal::parse(signal)?;
    let value = if val.ends_with('%') {
        if val == "0%" || val == "100%" {
            return Ok(None);
        }
        let p = parse_percentage(val)?;
        if p < 0.0 {
            return Err(EvictionError::Config(format!(
                "eviction percentage threshold {signal} must be >= 0%: {val}"
            )));
        }
        if p > 1.0 {
            return Err(EvictionError::Config(format!(
                "eviction percentage threshold {signal} must be <= 100%: {val}"
            )));
        }
        ThresholdValue::Percentage(p)
    } else {
        let q = parse_quantity(val)?;
        if q.signum() <= 0 {
            return Err(EvictionError::Config(format!(
                "eviction threshold {signal} must be positive: {q}"
            )));
        }
        ThresholdValue::Quantity(q)
    };
    Ok(Some(Threshold {
        signal,
        value,
        grace_period: Duration::ZERO,
        min_reclaim: None,
    }))
}

fn parse_min_reclaim(signal: Signal, val: &str) -> Result<ThresholdValue, EvictionError> {
    if val.ends_with('%') {
        let p = parse_percentage(val)?;
        if p <= 0.0 {
            return Err(EvictionError::Config(format!(
                "eviction percentage minimum reclaim {signal} must be positive: {val}"
            )));
        }
        return Ok(ThresholdValue::Percentage(p));
    }
    let q = parse_quantity(val)?;
    if q.signum() < 0 {
        return Err(EvictionError::Config(format!(
            "negative eviction minimum reclaim specified for {signal}"
        )));
    }
    Ok(ThresholdValue::Quantity(q))
}

/// The eviction settings as written (signal name to value).
#[derive(Clone, Debug, PartialEq)]
pub struct ThresholdConfig<'a> {
    /// `evictionHard`.
    pub hard: &'a BTreeMap<String, String>,
    /// `evictionSoft`.
    pub soft: &'a BTreeMap<String, String>,
    /// `evictionSoftGracePeriod` (Go durations).
    pub soft_grace_period: &'a BTreeMap<String, Duration>,
    /// `evictionMinimumReclaim`.
    pub minimum_reclaim: &'a BTreeMap<String, String>,
    /// `enforceNodeAllocatable` contains `pods`: hard `memory.available`
    /// thresholds are copied to `allocatableMemory.available`.
    pub enforce_allocatable_pods: bool,
}

/// Upstream `ParseThresholdConfig`.
pub fn parse_thresholds(c: &ThresholdConfig<'_>) -> Result<Vec<Threshold>, EvictionError> {
    let mut out = Vec::new();
    for (s, v) in c.hard {
        out.extend(parse_statement(s, v)?);
    }
    for s in c.soft_grace_period.keys() {
        Signal::parse(s)?;
    }
    let mut min_reclaims = BTreeMap::new();
    for (s, v) in c.minimum_reclaim {
        let signal = Signal::parse(s)?;
        min_reclaims.insert(signal, parse_min_reclaim(signal, v)?);
    }
    for (s, v) in c.soft {
        if let Some(mut t) = parse_statement(s, v)? {
            t.grace_period = *c.soft_grace_period.get(s).ok_or_else(|| {
                EvictionError::Config(format!(
                    "grace period must be specified for the soft eviction threshold {}",
                    t.signal
                ))
            })?;
            out.push(t);
        }
    }
    for t in &mut out {
        t.min_reclaim = min_reclaims.get(&t.signal).copied();
    }
    if c.enforce_allocatable_pods {
        let extra: Vec<Threshold> = out
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..*t
            })
            .collect();
        out.extend(extra);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn hard_soft_and_min_reclaim() {
        let hard = map(&[("memory.available", "150Mi"), ("nodefs.available", "10%")]);
        let soft = map(&[("memory.available", "300Mi")]);
        let grace = [("memory.available".to_string(), Duration::from_secs(30))].into();
        let min = map(&[("memory.available", "0"), ("nodefs.available", "500Mi")]);
        let t = parse_thresholds(&ThresholdConfig {
            hard: &hard,
            soft: &soft,
            soft_grace_period: &grace,
            minimum_reclaim: &min,
            enforce_allocatable_pods: true,
        })
        .expect("valid");
        assert_eq!(t.len(), 4);
        let mem_hard = t
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .expect("hard memory");
        assert_eq!(mem_hard.value.to_string(), "150Mi");
        let nodefs = t
            .iter()
            .find(|t| t.signal == Signal::NodeFsAvailable)
            .expect("nodefs");
        assert_eq!(nodefs.value, ThresholdValue::Percentage(0.1));
        assert_eq!(
            nodefs.min_reclaim,
            Some(ThresholdValue::Quantity(
                Quantity::parse("500Mi").expect("q")
            ))
        );
        let soft = t.iter().find(|t| !t.is_hard()).expect("soft");
        assert_eq!(soft.grace_period, Duration::from_secs(30));
        assert!(
            t.iter()
                .any(|t| t.signal == Signal::AllocatableMemoryAvailable && t.is_hard())
        );
    }

    #[test]
    fn upstream_errors() {
        let empty = BTreeMap::new();
        let no_grace = BTreeMap::new();
        let err = |hard: &[(&str, &str)], soft: &[(&str, &str)]| {
            let hard = map(hard);
            let soft = map(soft);
            parse_thresholds(&ThresholdConfig {
                hard: &hard,
                soft: &soft,
                soft_grace_period: &no_grace,
                minimum_reclaim: &empty,
                enforce_allocatable_pods: false,
            })
            .expect_err("invalid")
            .to_string()
        };
        assert_eq!(
            err(&[("mem.available", "1Gi")], &[]),
            "unsupported eviction signal mem.available"
        );
        assert_eq!(
            err(&[("memory.available", "-1Gi")], &[]),
            "eviction threshold memory.available must be positive: -1Gi"
        );
        assert_eq!(
            err(&[("memory.available", "110%")], &[]),
            "eviction percentage threshold memory.available must be <= 100%: 110%"
        );
        assert_eq!(
            err(&[], &[("memory.available", "1Gi")]),
            "grace period must be specified for the soft eviction threshold memory.available"
        );
    }

    #[test]
    fn zero_and_full_percentages_are_ignored() {
        let hard = map(&[("memory.available", "0%"), ("nodefs.available", "100%")]);
        let empty = BTreeMap::new();
        let t = parse_thresholds(&ThresholdConfig {
            hard: &hard,
            soft: &empty,
            soft_grace_period: &BTreeMap::new(),
            minimum_reclaim: &empty,
            enforce_allocatable_pods: false,
        })
        .expect("valid");
        assert!(t.is_empty());
    }

    #[test]
    fn percentage_of_capacity() {
        let v = ThresholdValue::Percentage(0.1);
        assert_eq!(v.quantity(1000, Format::DecimalSI).value(), 100);
    }
}
