//! The one error type of `kubelet-types`: values from manifests, flags and
//! the API that do not parse (upstream `resource.ErrFormatWrong`,
//! `resource.ErrSuffix`, and the enum validations of `pkg/kubelet/apis/config`).

/// A value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Upstream `ErrFormatWrong`: the quantity is not a number followed by a suffix.
    #[error(
        "quantity {0:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    QuantityFormat(String),
    /// Upstream `ErrSuffix`: the suffix is none of the SI, binary or exponent forms.
    #[error("quantity {0:?}: unable to parse quantity's suffix")]
    QuantitySuffix(String),
    /// A `cgroupDriver` other than `cgroupfs` or `systemd`.
    #[error("invalid cgroup driver {0:?}: must be \"cgroupfs\" or \"systemd\"")]
    CgroupDriver(String),
    /// A word that names none of an enum's values (phase, QoS class, probe result).
    #[error("invalid {kind} {value:?}")]
    Unknown {
        /// What was being parsed.
        kind: &'static str,
        /// The value given.
        value: String,
    },
}

/// Result of a `kubelet-types` parse.
pub type Result<T, E = Error> = std::result::Result<T, E>;
