//! Kubernetes resource quantities (upstream
//! `k8s.io/apimachinery/pkg/api/resource` `Quantity`, `ParseQuantity`,
//! `MilliValue`, `Value`, `String`) in exact fixed point: no float is ever
//! involved, so `"2.007"` CPUs is exactly 2007 millicores.
//!
//! A parsed quantity is held as a signed count of nano-units (10^-9), the
//! finest precision upstream keeps: like `ParseQuantity`, parsing rounds a
//! non-zero value up (away from zero) to the next nano-unit, and caps
//! binary-suffixed values at 2^63-1. The count is an `i128`, so every value up
//! to about 1.7·10^29 is exact; larger magnitudes, which every upstream
//! accessor overflows anyway, saturate there.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::error::{Error, Result};

/// Nano-units per unit.
const NANOS: i128 = 1_000_000_000;
/// Upstream `maxAllowed` (2^63-1), the cap of binary-suffixed values, in nano-units.
const MAX_BINARY: i128 = i64::MAX as i128 * NANOS;

/// How a quantity is written (upstream `resource.Format`); kept from the
/// parsed string and used again to print it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `12e6`.
    DecimalExponent,
    /// `12Mi` (12·2^20).
    BinarySI,
    /// `12M` (12·10^6).
    DecimalSI,
}

/// An exact resource amount. Equality and order compare values only, as
/// upstream `Cmp` does: `1Ki` equals `1024`.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
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

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl Default for Quantity {
    fn default() -> Self {
        Self::ZERO
    }
}

/// The pieces of a quantity string (upstream `parseQuantityString`).
struct Parts<'a> {
    negative: bool,
    /// Integer digits without leading zeros ("0" when there are none).
    int: &'a str,
    /// Fractional digits, as written.
    frac: &'a str,
    suffix: &'a str,
}

fn split(s: &str) -> Option<Parts<'_>> {
    let b = s.as_bytes();
    let digits_from = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut pos = 0;
    let negative = match b.first() {
        Some(b'-') => {
            pos = 1;
            true
        }
        Some(b'+') => {
            pos = 1;
            false
        }
        _ => false,
    };
    while pos < b.len() && b[pos] == b'0' {
        pos += 1;
    }
    let start = pos;
    pos = digits_from(pos);
    let int = if pos == start { "0" } else { &s[start..pos] };
    let mut frac = "";
    if pos < b.len() && b[pos] == b'.' {
        let from = pos + 1;
        pos = digits_from(from);
        frac = &s[from..pos];
    }
    let suffix_start = pos;
    while pos < b.len() && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < b.len() && matches!(b[pos], b'-' | b'+') {
        pos += 1;
    }
    if digits_from(pos) != b.len() {
        return None;
    }
    Some(Parts {
        negative,
        int,
        frac,
        suffix: &s[suffix_start..],
    })
}

/// Upstream `quantitySuffixer.interpret`: (base, exponent, format).
fn interpret(suffix: &str) -> Option<(u32, i32, Format)> {
    let dec = |e| Some((10, e, Format::DecimalSI));
    let bin = |e| Some((2, e, Format::BinarySI));
    match suffix {
        "n" => dec(-9),
        "u" => dec(-6),
        "m" => dec(-3),
        "" => dec(0),
        "k" => dec(3),
        "M" => dec(6),
        "G" => dec(9),
        "T" => dec(12),
        "P" => dec(15),
        "E" => dec(18),
        "Ki" => bin(10),
        "Mi" => bin(20),
        "Gi" => bin(30),
        "Ti" => bin(40),
        "Pi" => bin(50),
        "Ei" => bin(60),
        s if s.len() > 1 && s.starts_with(['e', 'E']) => {
            let e: i64 = s[1..].parse().ok()?;
            // Upstream accepts [-MaxInt32, MaxInt32] and refuses what would not negate.
            let e = i32::try_from(e).ok().filter(|e| *e != i32::MIN)?;
            Some((10, e, Format::DecimalExponent))
        }
        _ => None,
    }
}

/// Doubles a big-endian decimal digit string in place.
fn double(digits: &mut Vec<u8>) {
    let mut carry = 0;
    for d in digits.iter_mut().rev() {
        let v = *d * 2 + carry;
        *d = v % 10;
        carry = v / 10;
    }
    if carry > 0 {
        digits.insert(0, carry);
    }
}

/// `ceil(digits · 10^exp10)` for a non-negative decimal digit string,
/// saturating at `i128::MAX`.
fn scale_ceil(digits: &[u8], exp10: i64) -> i128 {
    let first = digits.iter().position(|d| *d != 0);
    let Some(first) = first else { return 0 };
    let digits = &digits[first..];
    let (keep, round_up) = if exp10 >= 0 {
        (digits, false)
    } else {
        let cut = usize::try_from(-exp10).unwrap_or(usize::MAX);
        let kept = digits.len().saturating_sub(cut);
        (&digits[..kept], digits[kept..].iter().any(|d| *d != 0))
    };
    let zeros = u32::try_from(exp10.max(0)).unwrap_or(u32::MAX);
    let mut v: i128 = 0;
    for d in keep {
        match v
            .checked_mul(10)
            .and_then(|v| v.checked_add(i128::from(*d)))
        {
            Some(n) => v = n,
            None => return i128::MAX,
        }
    }
    if v != 0 {
        match 10i128.checked_pow(zeros).and_then(|p| v.checked_mul(p)) {
            Some(n) => v = n,
            None => return i128::MAX,
        }
    }
    v.saturating_add(i128::from(round_up))
}

impl Quantity {
    /// Zero.
    pub const ZERO: Self = Self {
        nanos: 0,
        format: Format::DecimalSI,
    };

    /// Parses a quantity exactly as upstream `ParseQuantity` (no surrounding
    /// whitespace; see [`Quantity::from_api`] for values read from JSON).
    ///
    /// # Errors
    /// [`Error::QuantityFormat`] or [`Error::QuantitySuffix`], as upstream.
    pub fn parse(s: &str) -> Result<Self> {
        if s.is_empty() {
            return Err(Error::QuantityFormat(s.to_string()));
        }
        let p = split(s).ok_or_else(|| Error::QuantityFormat(s.to_string()))?;
        let (base, exponent, mut format) =
            interpret(p.suffix).ok_or_else(|| Error::QuantitySuffix(s.to_string()))?;
        let mut digits: Vec<u8> = p
            .int
            .bytes()
            .chain(p.frac.bytes())
            .map(|c| c - b'0')
            .collect();
        let frac_len = i64::try_from(p.frac.len()).unwrap_or(i64::MAX);
        let mut exp10 = 9 - frac_len;
        if base == 10 {
            exp10 += i64::from(exponent);
        } else {
            for _ in 0..exponent {
                double(&mut digits);
            }
        }
        let mut nanos = scale_ceil(&digits, exp10);
        if format == Format::BinarySI {
            nanos = nanos.min(MAX_BINARY);
            if nanos > 0 && nanos < NANOS {
                format = Format::DecimalSI;
            }
        }
        if p.negative {
            nanos = -nanos;
        }
        Ok(Self { nanos, format })
    }

    /// Parses an API quantity as its JSON decoder does: surrounding whitespace
    /// is trimmed first (upstream `UnmarshalJSON`).
    ///
    /// # Errors
    /// As [`Quantity::parse`].
    pub fn from_api(q: &ApiQuantity) -> Result<Self> {
        Self::parse(q.0.trim())
    }

    /// `value` units in `format`.
    pub fn new(value: i64, format: Format) -> Self {
        Self {
            nanos: i128::from(value) * NANOS,
            format,
        }
    }

    /// `milli` thousandths of a unit, in DecimalSI (upstream `NewMilliQuantity`).
    pub fn from_milli(milli: i64) -> Self {
        Self {
            nanos: i128::from(milli) * 1_000_000,
            format: Format::DecimalSI,
        }
    }

    /// The format the quantity was written in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The exact value in nano-units.
    pub fn as_nanos(&self) -> i128 {
        self.nanos
    }

    /// True for zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// -1, 0 or 1.
    pub fn signum(&self) -> i32 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// `q / 10^scale` rounded away from zero (upstream `ScaledValue`; `scale`
    /// is an exponent: -3 is milli). Saturates at the `i64` bounds where
    /// upstream overflows.
    pub fn scaled_value(&self, scale: i32) -> i64 {
        let shift = i64::from(scale) + 9;
        let v = if shift >= 0 {
            match u32::try_from(shift)
                .ok()
                .and_then(|s| 10i128.checked_pow(s))
            {
                Some(div) => {
                    let q = self.nanos / div;
                    if self.nanos % div == 0 {
                        q
                    } else {
                        q + self.nanos.signum()
                    }
                }
                // A divisor beyond i128: any non-zero value rounds to ±1.
                None => self.nanos.signum(),
            }
        } else {
            u32::try_from(-shift)
                .ok()
                .and_then(|s| 10i128.checked_pow(s))
                .and_then(|m| self.nanos.checked_mul(m))
                .unwrap_or(if self.nanos < 0 { i128::MIN } else { i128::MAX })
        };
        i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
    }

    /// Upstream `Value`: whole units, rounded up (away from zero).
    pub fn value(&self) -> i64 {
        self.scaled_value(0)
    }

    /// Upstream `MilliValue`: `ceil(q · 1000)`, rounded away from zero.
    pub fn milli_value(&self) -> i64 {
        self.scaled_value(-3)
    }

    /// Rounded up (away from zero) to a whole thousandth, as upstream
    /// `RoundUp(resource.Milli)`, the apiserver's `SetDefaults_ResourceList`.
    #[must_use]
    pub fn round_up_milli(self) -> Self {
        let step = 1_000_000;
        let rem = self.nanos % step;
        let nanos = if rem == 0 {
            self.nanos
        } else {
            (self.nanos - rem).saturating_add(step * self.nanos.signum())
        };
        Self { nanos, ..self }
    }

    /// Adds `other`; a zero left side takes `other`'s format (upstream `Add`).
    /// Saturates far beyond any real resource amount.
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        Self {
            nanos: self.nanos.saturating_add(other.nanos),
            format: if self.nanos == 0 {
                other.format
            } else {
                self.format
            },
        }
    }

    /// Subtracts `other`; a zero left side takes `other`'s format (upstream `Sub`).
    #[must_use]
    pub fn saturating_sub(self, other: Self) -> Self {
        Self {
            nanos: self.nanos.saturating_sub(other.nanos),
            format: if self.nanos == 0 {
                other.format
            } else {
                self.format
            },
        }
    }

    /// The value as mantissa · 10^exponent with the exponent a multiple of 3,
    /// as large as keeps the mantissa whole (upstream `AsCanonicalBytes`).
    fn canonical_decimal(&self) -> (i128, i32) {
        let (mut m, mut e): (i128, i32) = (self.nanos, -9);
        while m != 0 && m % 10 == 0 {
            m /= 10;
            e += 1;
        }
        // Down to a multiple of 3; the mantissa grows by at most 100.
        while e.rem_euclid(3) != 0 {
            match m.checked_mul(10) {
                Some(v) => m = v,
                None => break,
            }
            e -= 1;
        }
        (m, e)
    }
}

impl fmt::Display for Quantity {
    /// The canonical form (upstream `String`): `1500m`, `1536Mi`, `1e3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let mut format = self.format;
        if format == Format::BinarySI {
            let small = self.nanos.abs() < 1024 * NANOS;
            if small || self.nanos % NANOS != 0 {
                format = Format::DecimalSI;
            } else {
                let (mut m, mut e) = (self.nanos / NANOS, 0);
                while m % 1024 == 0 {
                    m /= 1024;
                    e += 1;
                }
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].get(e);
                if let Some(s) = suffix {
                    return write!(f, "{m}{s}");
                }
                // Past Ei there is no binary suffix: exact decimal exponent form.
                format = Format::DecimalExponent;
            }
        }
        let (m, e) = self.canonical_decimal();
        if format == Format::DecimalSI {
            let si = match e {
                -9 => Some("n"),
                -6 => Some("u"),
                -3 => Some("m"),
                0 => Some(""),
                3 => Some("k"),
                6 => Some("M"),
                9 => Some("G"),
                12 => Some("T"),
                15 => Some("P"),
                18 => Some("E"),
                _ => None,
            };
            if let Some(s) = si {
                return write!(f, "{m}{s}");
            }
        }
        if e == 0 {
            write!(f, "{m}")
        } else {
            write!(f, "{m}e{e}")
        }
    }
}

impl FromStr for Quantity {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl TryFrom<&ApiQuantity> for Quantity {
    type Error = Error;

    fn try_from(q: &ApiQuantity) -> Result<Self> {
        Self::from_api(q)
    }
}

impl From<Quantity> for ApiQuantity {
    fn from(q: Quantity) -> Self {
        ApiQuantity(q.to_string())
    }
}

/// CPU in millicores, rounded up as upstream `MilliValue`: `"250m"` is 250,
/// `"2.007"` is 2007, `"0.1m"` is 1. `None` when it does not parse.
pub fn parse_milli_cpu(q: &str) -> Option<i64> {
    Quantity::parse(q.trim()).ok().map(|q| q.milli_value())
}

/// Bytes, rounded up as upstream `Value`: `"128Mi"`, `"1G"`, `"1e6"`, `"500k"`.
/// `None` when it does not parse.
pub fn parse_bytes(q: &str) -> Option<i64> {
    Quantity::parse(q.trim()).ok().map(|q| q.value())
}

#[cfg(test)]
mod tests;
