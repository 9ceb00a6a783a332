//! Image garbage collection settings (upstream `imageGCHighThresholdPercent`,
//! `imageGCLowThresholdPercent`, `imageMinimumGCAge`, `imageMaximumGCAge`),
//! validated as upstream's `ValidateKubeletConfiguration` does.

use std::time::Duration;

use super::Inputs;
use crate::{ConfigError, GoDuration, invalid};

/// Upstream `ImageGCPolicy`, as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageGcConfig {
    /// `imageGCHighThresholdPercent` (85).
    pub high_threshold_percent: i32,
    /// `imageGCLowThresholdPercent` (80).
    pub low_threshold_percent: i32,
    /// `imageMinimumGCAge` (2m).
    pub minimum_gc_age: Duration,
    /// `imageMaximumGCAge` (0: off).
    pub maximum_gc_age: Duration,
}

impl Default for ImageGcConfig {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_gc_age: Duration::from_secs(120),
            maximum_gc_age: Duration::ZERO,
        }
    }
}

const HIGH: &str = "imageGCHighThresholdPercent";
const LOW: &str = "imageGCLowThresholdPercent";
const MIN_AGE: &str = "imageMinimumGCAge";
const MAX_AGE: &str = "imageMaximumGCAge";

/// Resolves the fields (flag over file over upstream's default) and
/// validates them with upstream's messages.
pub fn resolve(inputs: &Inputs<'_>) -> Result<ImageGcConfig, ConfigError> {
    let d = ImageGcConfig::default();
    let high = inputs.int(HIGH, i64::from(d.high_threshold_percent))?;
    let low = inputs.int(LOW, i64::from(d.low_threshold_percent))?;
    let minimum_gc_age = inputs.duration(MIN_AGE, d.minimum_gc_age)?;
    let maximum_gc_age = maximum_age(inputs)?;
    let percent = |field: &'static str, flag: &str, v: i64| {
        i32::try_from(v)
            .ok()
            .filter(|p| (0..=100).contains(p))
            .ok_or_else(|| {
                invalid(
                    field,
                    v.to_string(),
                    format!("{field} ({flag}) {v} must be between 0 and 100, inclusive"),
                )
            })
    };
    let high_threshold_percent = percent(HIGH, "--image-gc-high-threshold", high)?;
    let low_threshold_percent = percent(LOW, "--image-gc-low-threshold", low)?;
    if low_threshold_percent >= high_threshold_percent {
        return Err(invalid(
            LOW,
            low.to_string(),
            format!(
                "{LOW} (--image-gc-low-threshold) {low} must be less than {HIGH} \
                 (--image-gc-high-threshold) {high}"
            ),
        ));
    }
    if !maximum_gc_age.is_zero() && maximum_gc_age <= minimum_gc_age {
        let max = GoDuration::from_std(maximum_gc_age);
        let min = GoDuration::from_std(minimum_gc_age);
        return Err(invalid(
            MAX_AGE,
            max.to_string(),
            format!("{MAX_AGE} {max} must be greater than {MIN_AGE} {min}"),
        ));
    }
    Ok(ImageGcConfig {
        high_threshold_percent,
        low_threshold_percent,
        minimum_gc_age,
        maximum_gc_age,
    })
}

/// `imageMaximumGCAge`: config-file only; negative is refused with
/// upstream's message rather than as an unparsable duration.
fn maximum_age(inputs: &Inputs<'_>) -> Result<Duration, ConfigError> {
    if let Some(serde_json::Value::String(s)) = inputs.file_only(MAX_AGE)
        && let Ok(d) = GoDuration::parse(s.trim())
        && d.as_nanos() < 0
    {
        return Err(invalid(
            MAX_AGE,
            s.clone(),
            format!("{MAX_AGE} {d} must not be negative"),
        ));
    }
    inputs.file_duration(MAX_AGE, Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::KubeletConfiguration;
    use crate::flags::Flags;
    use crate::settings::resolve_settings;

    fn resolve_with(args: &[&str], file: &str) -> Result<ImageGcConfig, ConfigError> {
        let mut v = vec!["kubelet-rs"];
        v.extend_from_slice(args);
        let flags = Flags::parse_args(v).expect("flags");
        let file = if file.is_empty() {
            KubeletConfiguration::default()
        } else {
            KubeletConfiguration::parse(&format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{file}"
            ))
            .expect("file")
            .0
        };
        let settings = resolve_settings(&flags, &file)?;
        resolve(&Inputs {
            flags: &flags,
            file: &file,
            settings: &settings,
        })
    }

    fn message(r: Result<ImageGcConfig, ConfigError>) -> String {
        r.expect_err("refused").to_string()
    }

    #[test]
    fn defaults_are_upstreams() {
        assert_eq!(
            resolve_with(&[], "").expect("valid"),
            ImageGcConfig::default()
        );
        assert_eq!(
            ImageGcConfig::default(),
            ImageGcConfig {
                high_threshold_percent: 85,
                low_threshold_percent: 80,
                minimum_gc_age: Duration::from_secs(120),
                maximum_gc_age: Duration::ZERO,
            }
        );
    }

    #[test]
    fn flags_win_over_the_file() {
        let c = resolve_with(
            &[
                "--image-gc-high-threshold=70",
                "--minimum-image-ttl-duration=30s",
            ],
            "imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 50\n\
             imageMinimumGCAge: 5m\nimageMaximumGCAge: 72h\n",
        )
        .expect("valid");
        assert_eq!(c.high_threshold_percent, 70);
        assert_eq!(c.low_threshold_percent, 50);
        assert_eq!(c.minimum_gc_age, Duration::from_secs(30));
        assert_eq!(c.maximum_gc_age, Duration::from_secs(72 * 3600));
    }

    #[test]
    fn zero_minimum_age_in_the_file_means_the_default_but_a_flag_zero_is_zero() {
        let c = resolve_with(&[], "imageMinimumGCAge: 0s\n").expect("valid");
        assert_eq!(c.minimum_gc_age, Duration::from_secs(120));
        let c = resolve_with(&["--minimum-image-ttl-duration=0s"], "").expect("valid");
        assert_eq!(c.minimum_gc_age, Duration::ZERO);
    }

    #[test]
    fn thresholds_outside_0_to_100_are_refused_with_upstreams_message() {
        let m = message(resolve_with(&["--image-gc-high-threshold=101"], ""));
        assert!(
            m.contains(
                "imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, inclusive"
            ),
            "{m}"
        );
        let m = message(resolve_with(&[], "imageGCLowThresholdPercent: -1\n"));
        assert!(
            m.contains(
                "imageGCLowThresholdPercent (--image-gc-low-threshold) -1 must be between 0 and 100, inclusive"
            ),
            "{m}"
        );
    }

    #[test]
    fn low_must_be_below_high() {
        let m = message(resolve_with(
            &[
                "--image-gc-high-threshold=60",
                "--image-gc-low-threshold=60",
            ],
            "",
        ));
        assert!(
            m.contains(
                "imageGCLowThresholdPercent (--image-gc-low-threshold) 60 must be less than \
                 imageGCHighThresholdPercent (--image-gc-high-threshold) 60"
            ),
            "{m}"
        );
        // 100/99 (image GC off) and 1/0 are both valid.
        assert!(
            resolve_with(
                &[
                    "--image-gc-high-threshold=100",
                    "--image-gc-low-threshold=99"
                ],
                ""
            )
            .is_ok()
        );
        assert!(
            resolve_with(
                &["--image-gc-high-threshold=1", "--image-gc-low-threshold=0"],
                ""
            )
            .is_ok()
        );
    }

    #[test]
    fn maximum_age_must_exceed_minimum_age_and_not_be_negative() {
        let m = message(resolve_with(
            &[],
            "imageMinimumGCAge: 2m\nimageMaximumGCAge: 1m\n",
        ));
        assert!(
            m.contains("imageMaximumGCAge 1m0s must be greater than imageMinimumGCAge 2m0s"),
            "{m}"
        );
        let m = message(resolve_with(&[], "imageMaximumGCAge: -1s\n"));
        assert!(
            m.contains("imageMaximumGCAge -1s must not be negative"),
            "{m}"
        );
        let c = resolve_with(&[], "imageMaximumGCAge: 0s\n").expect("0 is off");
        assert_eq!(c.maximum_gc_age, Duration::ZERO);
        let c = resolve_with(&[], "imageMaximumGCAge: 3m\n").expect("above 2m");
        assert_eq!(c.maximum_gc_age, Duration::from_secs(180));
    }
}
