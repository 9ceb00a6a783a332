//! Resource quantities as the apiserver reads and writes them (upstream
//! `k8s.io/apimachinery/pkg/api/resource`: `ParseQuantity`, `RoundUp`,
//! `Cmp`, `Add` and the `String` form a quantity is written back in).
//!
//! Values are exact: an `i128` count of nano units, which is the finest
//! precision upstream keeps (it rounds anything finer up to `1n` on parse).
//! Upstream is arbitrary precision; values beyond about 10^29 are refused
//! here instead.

use std::cmp::Ordering;
use std::fmt;

/// Nano units per unit.
const NANO: i128 = 1_000_000_000;

/// How a quantity is written back (upstream `Format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `12e6`.
    DecimalExponent,
    /// `5Gi`.
    BinarySI,
    /// `5G`, `500m`.
    DecimalSI,
}

/// Why a quantity does not parse; the messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// `ErrFormatWrong`.
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    /// `ErrNumeric`.
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    /// `ErrSuffix`.
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// A parsed quantity. Equality and order compare values only, as upstream `Cmp`.
#[derive(Debug, Clone)]
pub struct Quantity {
    nanos: i128,
    format: Format,
    /// Upstream's parser keeps the text it was given when it judges it
    /// canonical already, and writes it back verbatim until the value changes.
    text: Option<Kept>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Kept {
    text: String,
    /// The decimal scale upstream's fast path stored the value with.
    scale: i32,
}

impl Quantity {
    /// Parses `s` as upstream `ParseQuantity` does.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let parts = Parts::split(s)?;
        let (base, exponent, mut format) = interpret(parts.suffix).ok_or(QuantityError::Suffix)?;
        // The digits, with trailing zeros folded into the exponent so that
        // long spellings of round numbers do not overflow.
        let digits = format!("{}{}", parts.int, parts.frac);
        let trimmed = digits.trim_end_matches('0');
        let mut exp10 = (digits.len() - trimmed.len()) as i64 - parts.frac.len() as i64;
        let mut mantissa: i128 = if trimmed.is_empty() {
            0
        } else {
            trimmed.parse().map_err(|_| QuantityError::Numeric)?
        };
        if base == 10 {
            exp10 += i64::from(exponent);
        } else {
            let factor = 1_i128
                .checked_shl(exponent as u32)
                .ok_or(QuantityError::Numeric)?;
            mantissa = mantissa.checked_mul(factor).ok_or(QuantityError::Numeric)?;
        }
        let mut nanos = to_nanos_rounding_up(mantissa, exp10).ok_or(QuantityError::Numeric)?;
        if format == Format::BinarySI {
            // Upstream caps binary quantities at 2^63-1 and writes ones below 1 in decimal.
            nanos = nanos.min(i128::from(i64::MAX) * NANO);
            if nanos > 0 && nanos < NANO {
                format = Format::DecimalSI;
            }
        }
        if parts.negative {
            nanos = -nanos;
        }
        let text = kept_text(&parts, base, exponent).map(|scale| Kept {
            text: s.to_string(),
            scale,
        });
        Ok(Self {
            nanos,
            format,
            text,
        })
    }

    /// The sign of the value: -1, 0 or 1.
    pub fn signum(&self) -> i32 {
        self.nanos.signum() as i32
    }

    /// Whether the value is a whole number.
    pub fn is_integer(&self) -> bool {
        self.nanos % NANO == 0
    }

    /// Whether the value is a whole multiple of `unit` (false for a zero unit).
    pub fn is_multiple_of(&self, unit: &Self) -> bool {
        unit.nanos != 0 && self.nanos % unit.nanos == 0
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Rounds the value up (away from zero) to `10^scale`, as upstream
    /// `RoundUp`; returns whether it was exact.
    pub fn round_up(&mut self, scale: i32) -> bool {
        if let Some(k) = &self.text
            && k.scale < scale
        {
            self.text = None;
        }
        let Some(unit) = pow10(i64::from(scale) + 9) else {
            return true;
        };
        if unit <= 1 {
            return true;
        }
        let rem = self.nanos % unit;
        if rem == 0 {
            return true;
        }
        self.text = None;
        self.nanos = self.nanos - rem + unit * self.nanos.signum();
        false
    }

    /// Adds `other` (upstream `Add`: the result keeps this quantity's format).
    pub fn add(&mut self, other: &Self) {
        self.text = None;
        self.nanos = self.nanos.saturating_add(other.nanos);
    }

    /// The canonical text, ignoring any text kept from parsing (upstream `CanonicalizeBytes`).
    pub fn canonical(&self) -> String {
        if self.nanos == 0 {
            return "0".to_string();
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let abs = self.nanos.unsigned_abs();
        let mut format = self.format;
        if format == Format::BinarySI {
            // Small or fractional binary values are written in decimal.
            let whole = abs.is_multiple_of(NANO as u128);
            if abs < 1024 * NANO as u128 || !whole {
                format = Format::DecimalSI;
            }
        }
        if format == Format::BinarySI {
            let mut n = abs / NANO as u128;
            let mut power = 0;
            while power < BINARY.len() && n.is_multiple_of(1024) {
                n /= 1024;
                power += 1;
            }
            let suffix = if power == 0 { "" } else { BINARY[power - 1] };
            return format!("{sign}{n}{suffix}");
        }
        // Mantissa times a power of ten that is a multiple of three.
        let mut m = abs;
        let mut exp: i32 = -9;
        while m.is_multiple_of(10) {
            m /= 10;
            exp += 1;
        }
        let r = exp.rem_euclid(3);
        m *= 10u128.pow(r as u32);
        exp -= r;
        if format == Format::DecimalExponent {
            return if exp == 0 {
                format!("{sign}{m}")
            } else {
                format!("{sign}{m}e{exp}")
            };
        }
        while exp > 18 {
            m *= 1000;
            exp -= 3;
        }
        let suffix = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        };
        format!("{sign}{m}{suffix}")
    }
}

impl fmt::Display for Quantity {
    /// The text upstream writes (`Quantity.String`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.text {
            Some(k) => f.write_str(&k.text),
            None => f.write_str(&self.canonical()),
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

const BINARY: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

fn pow10(e: i64) -> Option<i128> {
    u32::try_from(e).ok().and_then(|e| 10i128.checked_pow(e))
}

/// `mantissa * 10^exp10` in nano units, rounded up to a whole nano.
fn to_nanos_rounding_up(mantissa: i128, exp10: i64) -> Option<i128> {
    let shift = exp10 + 9;
    if mantissa == 0 {
        return Some(0);
    }
    if shift >= 0 {
        return pow10(shift).and_then(|p| mantissa.checked_mul(p));
    }
    // Finer than a nano: round up.
    Some(match pow10(-shift) {
        Some(p) => mantissa / p + i128::from(mantissa % p != 0),
        None => 1,
    })
}

/// The pieces of `<sign><digits>.<digits><suffix>` (upstream `parseQuantityString`).
struct Parts<'a> {
    negative: bool,
    /// Integer digits without leading zeros; `"0"` when there are none.
    int: &'a str,
    frac: &'a str,
    suffix: &'a str,
}

impl<'a> Parts<'a> {
    fn split(s: &'a str) -> Result<Self, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::Format);
        }
        let b = s.as_bytes();
        let mut i = 0;
        let negative = b[0] == b'-';
        if matches!(b[0], b'-' | b'+') {
            i = 1;
        }
        while i < b.len() && b[i] == b'0' {
            i += 1;
        }
        if i == b.len() {
            // Only a sign and zeros.
            return Ok(Self {
                negative,
                int: "0",
                frac: "",
                suffix: "",
            });
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let int = if i == start { "0" } else { &s[start..i] };
        let mut frac = "";
        if i < b.len() && b[i] == b'.' {
            i += 1;
            let f = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            frac = &s[f..i];
        }
        let suffix_start = i;
        while i < b.len() && b"eEinumkKMGTP".contains(&b[i]) {
            i += 1;
        }
        if i < b.len() && matches!(b[i], b'-' | b'+') {
            i += 1;
        }
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i < b.len() {
            return Err(QuantityError::Format);
        }
        Ok(Self {
            negative,
            int,
            frac,
            suffix: &s[suffix_start..],
        })
    }
}

/// Base, exponent and format of a suffix (upstream `suffixHandler.interpret`).
fn interpret(suffix: &str) -> Option<(u32, i32, Format)> {
    let decimal = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(e) = decimal {
        return Some((10, e, Format::DecimalSI));
    }
    if let Some(i) = BINARY.iter().position(|b| *b == suffix) {
        return Some((2, 10 * (i as i32 + 1), Format::BinarySI));
    }
    let rest = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))?;
    if rest.is_empty() {
        return None;
    }
    let e: i32 = rest.parse().ok()?;
    Some((10, e, Format::DecimalExponent))
}

/// Whether upstream's int64 fast path keeps the text as written, and the
/// scale it stores; `None` when it does not.
fn kept_text(p: &Parts<'_>, base: u32, exponent: i32) -> Option<i32> {
    let digits = p.int.len() as i32 + p.frac.len() as i32;
    let (precision, scale) = if base == 2 {
        if p.frac.is_empty() {
            (15 - p.int.len() as i32 - exponent * 3 / 10 - 1, 0)
        } else {
            (-1, 0)
        }
    } else {
        (18 - digits, exponent - p.frac.len() as i32)
    };
    if precision < 0 || scale < -9 {
        return None;
    }
    let shifted = format!("{}{}", p.int, p.frac);
    let value: i64 = shifted.parse().ok()?;
    if base == 2 {
        (exponent % 10 == 0 && value & 0x07 != 0).then_some(scale)
    } else {
        (scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0')).then_some(scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(q: &str) -> String {
        Quantity::parse(q).expect(q).to_string()
    }

    #[test]
    fn written_back_as_upstream_writes_it() {
        for (input, want) in [
            ("0", "0"),
            ("000", "0"),
            ("0m", "0"),
            ("100m", "100m"),
            ("0.5", "500m"),
            ("1000m", "1"),
            ("1.5", "1500m"),
            ("1500", "1500"),
            ("2000", "2k"),
            ("1.5Gi", "1536Mi"),
            ("1024Mi", "1Gi"),
            ("128Mi", "128Mi"),
            ("1Ki", "1Ki"),
            ("1000Ki", "1000Ki"),
            ("0.5Ki", "512"),
            ("1e3", "1e3"),
            ("1.5e3", "1500"),
            ("1G", "1G"),
            ("0.0000000001", "1n"),
            ("-1.5", "-1500m"),
            (".5", "500m"),
        ] {
            assert_eq!(s(input), want, "{input}");
        }
    }

    #[test]
    fn text_kept_by_the_fast_path_survives() {
        // Upstream keeps these spellings verbatim (quantity.go fast path).
        assert_eq!(s("1.500"), "1.500");
        assert_eq!(s("+1"), "+1");
        let q = Quantity::parse("2.007").expect("q");
        assert_eq!(
            (q.to_string(), q.canonical()),
            ("2.007".into(), "2007m".into())
        );
        // ... until rounding changes the value.
        let mut q = Quantity::parse("1.500001").expect("q");
        assert_eq!(q.to_string(), "1.500001");
        assert!(!q.round_up(-3));
        assert_eq!(q.to_string(), "1501m");
    }

    #[test]
    fn round_up_to_milli() {
        let mut q = Quantity::parse("0.0001").expect("q");
        assert!(!q.round_up(-3));
        assert_eq!(q.to_string(), "1m");
        let mut q = Quantity::parse("250m").expect("q");
        assert!(q.round_up(-3));
        assert_eq!(q.to_string(), "250m");
        let mut q = Quantity::parse("-0.0001").expect("q");
        q.round_up(-3);
        assert_eq!(q.to_string(), "-1m");
    }

    #[test]
    fn compare_and_add_by_value() {
        let a = Quantity::parse("1").expect("a");
        let b = Quantity::parse("1000m").expect("b");
        assert_eq!(a.cmp(&b), Ordering::Equal);
        let mut c = Quantity::parse("1Gi").expect("c");
        c.add(&Quantity::parse("1Gi").expect("d"));
        assert_eq!(c.to_string(), "2Gi");
        assert!(Quantity::parse("0").expect("z").is_zero());
        assert_eq!(Quantity::parse("-1m").expect("n").signum(), -1);
    }

    #[test]
    fn malformed_quantities_are_refused() {
        assert_eq!(Quantity::parse(""), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1x"), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1 Gi"), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1Gb"), Err(QuantityError::Format));
        assert_eq!(Quantity::parse("1mi"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("1e"), Err(QuantityError::Suffix));
    }
}
