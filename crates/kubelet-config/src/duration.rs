//! Go `time.Duration` as flags and KubeletConfiguration spell it ("20s",
//! "1m0s", "2h45m", "100ms", "-1s", "0"): Go's `time.ParseDuration` grammar
//! and `Duration.String` format, in exact integer nanoseconds.

use std::fmt;
use std::time::Duration;

const NS: u128 = 1;
const US: u128 = 1_000;
const MS: u128 = 1_000_000;
const SEC: u128 = 1_000_000_000;
const MIN: u128 = 60 * SEC;
const HOUR: u128 = 60 * MIN;

/// A signed Go duration in nanoseconds (`time.Duration`, an int64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(i64);

impl GoDuration {
    /// Parses `time.ParseDuration` syntax: an optional sign, then one or more
    /// decimal numbers each with a unit (ns, us, µs, μs, ms, s, m, h); "0" alone needs no unit.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("invalid duration {text:?}");
        let (negative, mut rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        if rest == "0" {
            return Ok(Self(0));
        }
        if rest.is_empty() {
            return Err(bad());
        }
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let int_end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let (int_part, after) = rest.split_at(int_end);
            let (frac_part, after) = match after.strip_prefix('.') {
                Some(f) => {
                    let end = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                    f.split_at(end)
                }
                None => ("", after),
            };
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(bad());
            }
            let unit_end = after
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(after.len());
            let (unit, next) = after.split_at(unit_end);
            let scale = match unit {
                "ns" => NS,
                "us" | "µs" | "μs" => US,
                "ms" => MS,
                "s" => SEC,
                "m" => MIN,
                "h" => HOUR,
                "" => return Err(format!("missing unit in duration {text:?}")),
                u => return Err(format!("unknown unit {u:?} in duration {text:?}")),
            };
            let whole: u128 = if int_part.is_empty() {
                0
            } else {
                int_part.parse().map_err(|_| bad())?
            };
            let mut value = whole.checked_mul(scale).ok_or_else(bad)?;
            // The fraction, exactly: digits / 10^len of this unit (Go truncates below 1ns).
            let mut denominator: u128 = 1;
            let mut numerator: u128 = 0;
            for d in frac_part.bytes().take(20) {
                numerator = numerator * 10 + u128::from(d - b'0');
                denominator *= 10;
            }
            value += numerator * scale / denominator;
            total = total.checked_add(value).ok_or_else(bad)?;
            rest = next;
        }
        let limit = if negative {
            u128::from(i64::MAX.unsigned_abs()) + 1
        } else {
            u128::from(i64::MAX.unsigned_abs())
        };
        if total > limit {
            return Err(bad());
        }
        let magnitude = i128::try_from(total).map_err(|_| bad())?;
        let signed = if negative { -magnitude } else { magnitude };
        i64::try_from(signed).map(Self).map_err(|_| bad())
    }

    /// Nanoseconds, as Go stores them.
    pub fn as_nanos(self) -> i64 {
        self.0
    }

    /// The duration when it is not negative.
    pub fn to_std(self) -> Option<Duration> {
        u64::try_from(self.0).ok().map(Duration::from_nanos)
    }

    /// A duration from a non-negative std one (saturating at Go's maximum).
    pub fn from_std(d: Duration) -> Self {
        Self(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

/// Writes `v / unit` with the fraction's trailing zeros dropped, as Go does.
fn fmt_fraction(f: &mut fmt::Formatter<'_>, v: u128, unit: u128, digits: u32) -> fmt::Result {
    write!(f, "{}", v / unit)?;
    let frac = v % unit;
    if frac != 0 {
        let text = format!("{frac:0width$}", width = digits as usize);
        write!(f, ".{}", text.trim_end_matches('0'))?;
    }
    Ok(())
}

impl fmt::Display for GoDuration {
    /// Go's `Duration.String`: "0s", "1.5ms", "100µs", "1m30s", "4h0m0s".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 0 {
            f.write_str("-")?;
        }
        let v = u128::from(self.0.unsigned_abs());
        if v == 0 {
            return f.write_str("0s");
        }
        if v < US {
            return write!(f, "{v}ns");
        }
        if v < MS {
            fmt_fraction(f, v, US, 3)?;
            return f.write_str("µs");
        }
        if v < SEC {
            fmt_fraction(f, v, MS, 6)?;
            return f.write_str("ms");
        }
        let hours = v / HOUR;
        let minutes = (v % HOUR) / MIN;
        let secs = v % MIN;
        if hours > 0 {
            write!(f, "{hours}h{minutes}m")?;
        } else if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        fmt_fraction(f, secs, SEC, 9)?;
        f.write_str("s")
    }
}

/// Parses a Go duration that must not be negative (KubeletConfiguration
/// periods and timeouts).
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let d = GoDuration::parse(s.trim())?;
    d.to_std().ok_or_else(|| format!("invalid duration {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_go_duration("1m0s"), Ok(Duration::from_secs(60)));
        assert_eq!(
            parse_go_duration("1h2m3.5s"),
            Ok(Duration::from_secs_f64(3723.5))
        );
        assert_eq!(parse_go_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_go_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("-1s").is_err());
        assert!(parse_go_duration("5d").is_err());
    }

    #[test]
    fn signed_durations_parse_and_print_as_go_does() {
        let cases = [
            ("-1s", -1_000_000_000, "-1s"),
            ("+5m", 300_000_000_000, "5m0s"),
            (".5s", 500_000_000, "500ms"),
            ("1.5h", 5_400_000_000_000, "1h30m0s"),
            ("4h", 14_400_000_000_000, "4h0m0s"),
            ("1m30s", 90_000_000_000, "1m30s"),
            ("1.5µs", 1_500, "1.5µs"),
            ("2us", 2_000, "2µs"),
            ("12ns", 12, "12ns"),
            ("100ms", 100_000_000, "100ms"),
            ("1.000000001s", 1_000_000_001, "1.000000001s"),
            ("0", 0, "0s"),
        ];
        for (text, nanos, shown) in cases {
            let d = GoDuration::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(d.as_nanos(), nanos, "{text}");
            assert_eq!(d.to_string(), shown, "{text}");
        }
        for bad in [
            "",
            "-",
            "s",
            "1",
            "1x",
            "1.s.",
            "..5s",
            "9999999999999999h",
            "1 s",
        ] {
            assert!(GoDuration::parse(bad).is_err(), "{bad:?} must not parse");
        }
        assert_eq!(
            GoDuration::parse("-1s").ok().and_then(GoDuration::to_std),
            None
        );
    }
}
