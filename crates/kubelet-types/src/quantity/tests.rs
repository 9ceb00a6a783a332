//! Tables from upstream `quantity_test.go` and property checks against an
//! independent rational computation.

use super::*;

fn q(s: &str) -> Quantity {
    match Quantity::parse(s) {
        Ok(q) => q,
        Err(e) => panic!("{s}: {e}"),
    }
}

/// mantissa · 10^exp in nano-units.
fn dec(m: i128, exp: i32) -> i128 {
    let e = exp + 9;
    if e >= 0 {
        m * 10i128.pow(e.unsigned_abs())
    } else {
        m / 10i128.pow(e.unsigned_abs())
    }
}

#[test]
fn parse_table_from_upstream() {
    use Format::*;
    let table: &[(&str, i128, Format)] = &[
        ("0", 0, DecimalSI),
        ("0n", 0, DecimalSI),
        ("0u", 0, DecimalSI),
        ("0m", 0, DecimalSI),
        ("0Ki", 0, BinarySI),
        ("0k", 0, DecimalSI),
        ("0Mi", 0, BinarySI),
        ("0M", 0, DecimalSI),
        ("0Gi", 0, BinarySI),
        ("0G", 0, DecimalSI),
        ("0Ti", 0, BinarySI),
        ("0T", 0, DecimalSI),
        ("1", dec(1, 0), DecimalSI),
        ("1Ki", dec(1024, 0), BinarySI),
        ("8Ki", dec(8 * 1024, 0), BinarySI),
        ("7Mi", dec(7 << 20, 0), BinarySI),
        ("6Gi", dec(6 << 30, 0), BinarySI),
        ("5Ti", dec(5 << 40, 0), BinarySI),
        ("4Pi", dec(4 << 50, 0), BinarySI),
        ("3Ei", dec(3 << 60, 0), BinarySI),
        ("10Ti", dec(10 << 40, 0), BinarySI),
        ("100Ti", dec(100 << 40, 0), BinarySI),
        ("5n", dec(5, -9), DecimalSI),
        ("4u", dec(4, -6), DecimalSI),
        ("3m", dec(3, -3), DecimalSI),
        ("9", dec(9, 0), DecimalSI),
        ("8k", dec(8, 3), DecimalSI),
        ("50k", dec(5, 4), DecimalSI),
        ("7M", dec(7, 6), DecimalSI),
        ("6G", dec(6, 9), DecimalSI),
        ("5T", dec(5, 12), DecimalSI),
        ("40T", dec(4, 13), DecimalSI),
        ("300T", dec(3, 14), DecimalSI),
        ("2P", dec(2, 15), DecimalSI),
        ("1E", dec(1, 18), DecimalSI),
        ("1E-3", dec(1, -3), DecimalExponent),
        ("1e3", dec(1, 3), DecimalExponent),
        ("1E6", dec(1, 6), DecimalExponent),
        ("1e9", dec(1, 9), DecimalExponent),
        ("1E12", dec(1, 12), DecimalExponent),
        ("1e15", dec(1, 15), DecimalExponent),
        ("1E18", dec(1, 18), DecimalExponent),
        ("1e14", dec(1, 14), DecimalExponent),
        ("1e13", dec(1, 13), DecimalExponent),
        ("100.035k", dec(100_035, 0), DecimalSI),
        ("0.001", dec(1, -3), DecimalSI),
        ("0.0005k", dec(5, -1), DecimalSI),
        ("0.005", dec(5, -3), DecimalSI),
        ("0.05", dec(5, -2), DecimalSI),
        ("0.5", dec(5, -1), DecimalSI),
        ("0.00050k", dec(5, -1), DecimalSI),
        ("0.00500", dec(5, -3), DecimalSI),
        ("0.05000", dec(5, -2), DecimalSI),
        ("0.50000", dec(5, -1), DecimalSI),
        ("0.5e0", dec(5, -1), DecimalExponent),
        ("0.5e-1", dec(5, -2), DecimalExponent),
        ("0.5e-2", dec(5, -3), DecimalExponent),
        ("10.035M", dec(10_035, 3), DecimalSI),
        ("1.2e3", dec(12, 2), DecimalExponent),
        ("1.3E+6", dec(13, 5), DecimalExponent),
        ("1.40e9", dec(14, 8), DecimalExponent),
        ("1.53E12", dec(153, 10), DecimalExponent),
        ("1.6e15", dec(16, 14), DecimalExponent),
        ("1.7E18", dec(17, 17), DecimalExponent),
        ("9.01", dec(901, -2), DecimalSI),
        ("8.1k", dec(81, 2), DecimalSI),
        ("7.123456M", dec(7_123_456, 0), DecimalSI),
        ("6.987654321G", dec(6_987_654_321, 0), DecimalSI),
        ("5.444T", dec(5444, 9), DecimalSI),
        ("40.1T", dec(401, 11), DecimalSI),
        ("300.2T", dec(3002, 11), DecimalSI),
        ("2.5P", dec(25, 14), DecimalSI),
        ("1.01E", dec(101, 16), DecimalSI),
        // Things that saturate or round.
        ("3.001n", dec(4, -9), DecimalSI),
        ("1.1E-9", dec(2, -9), DecimalExponent),
        ("0.0000000001", dec(1, -9), DecimalSI),
        ("0.0000000005", dec(1, -9), DecimalSI),
        ("0.00000000050", dec(1, -9), DecimalSI),
        ("0.5e-9", dec(1, -9), DecimalExponent),
        ("0.9n", dec(1, -9), DecimalSI),
        ("0.00000012345", dec(124, -9), DecimalSI),
        ("0.00000012354", dec(124, -9), DecimalSI),
        ("9Ei", MAX_BINARY, BinarySI),
        ("9223372036854775807Ki", MAX_BINARY, BinarySI),
        ("12E", dec(12, 18), DecimalSI),
        // Fractional binary.
        ("100.035Ki", dec(10_243_584, -2), BinarySI),
        ("0.5Mi", dec(512 * 1024, 0), BinarySI),
        ("0.05Gi", dec(536_870_912, -1), BinarySI),
        ("0.025Ti", dec(274_877_906_944, -1), BinarySI),
        // Written by trolls.
        ("0.000000000001Ki", dec(2, -9), DecimalSI),
        (".001", dec(1, -3), DecimalSI),
        (".0001k", dec(100, -3), DecimalSI),
        ("1.", dec(1, 0), DecimalSI),
        ("1.G", dec(1, 9), DecimalSI),
    ];
    for (input, nanos, format) in table {
        for (prefix, sign) in [("", 1), ("+", 1), ("-", -1)] {
            let s = format!("{prefix}{input}");
            let got = q(&s);
            assert_eq!(got.as_nanos(), sign * nanos, "{s}");
            assert_eq!(got.format(), *format, "{s}");
        }
    }
}

#[test]
fn invalid_quantities_are_refused_as_upstream() {
    for s in [
        "",
        "1.1.M",
        "1+1.0M",
        "0.1mi",
        "0.1am",
        "aoeu",
        ".5i",
        "1i",
        "-3.01i",
        "-3.01e-",
        "1e4294967297",
        "1E2147483648",
        "1E-2147483648",
        " 1",
        "1 ",
        "1µ",
        "1e",
    ] {
        assert!(Quantity::parse(s).is_err(), "{s:?} parsed");
    }
    assert!(matches!(
        Quantity::parse("1.1.M"),
        Err(Error::QuantityFormat(_))
    ));
    assert!(matches!(
        Quantity::parse("0.1mi"),
        Err(Error::QuantitySuffix(_))
    ));
    // The exponent bounds themselves parse.
    assert!(Quantity::parse("1E2147483647").is_ok());
    assert!(Quantity::parse("1E-2147483647").is_ok());
    assert_eq!(q("1E-2147483647").as_nanos(), 1, "rounded up to a nano");
}

#[test]
fn canonical_strings_as_upstream() {
    for (input, canonical) in [
        ("1Ki", "1Ki"),
        ("1Mi", "1Mi"),
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
        ("1.5", "1500m"),
        ("1.5Gi", "1536Mi"),
        // Binary SI, no multiple of 1024: no suffix, which then reads as
        // decimal SI (the fuzz target's "62.5Ki").
        ("62.5Ki", "64000"),
        ("64000", "64k"),
        ("1073741824", "1073741824"),
        ("307200Ki", "300Mi"),
        ("5000m", "5"),
        ("0.5", "500m"),
        ("1.08", "1080m"),
        ("1080000000n", "1080m"),
        ("0.001T", "1G"),
        ("1000u", "1m"),
        ("1000E", "1e21"),
        ("5000E", "5e21"),
        ("1025", "1025"),
        (".001e12", "1e9"),
        ("0.001e0", "1e-3"),
        ("1000e-12", "1e-9"),
        ("80e-3", "80e-3"),
        ("300e6", "300e6"),
        ("00", "0"),
        ("-0", "0"),
        ("2000", "2k"),
        ("9Ei", "9223372036854775807"),
    ] {
        assert_eq!(q(input).to_string(), canonical, "{input}");
        if canonical != "0" {
            assert_eq!(q(&format!("-{input}")).to_string(), format!("-{canonical}"));
        }
    }
}

#[test]
fn binary_format_prints_whole_numbers_without_a_suffix() {
    assert_eq!(Quantity::new(2000, Format::BinarySI).to_string(), "2000");
    assert_eq!(Quantity::new(-2000, Format::BinarySI).to_string(), "-2000");
    assert_eq!(Quantity::new(5, Format::BinarySI).to_string(), "5");
    // 2^70 is past Ei: exact decimal digits, not a lost magnitude.
    let two_70 = Quantity::new(1 << 60, Format::BinarySI).as_nanos() * 1024;
    let big = Quantity {
        nanos: two_70,
        format: Format::BinarySI,
    };
    assert_eq!(big.to_string(), "1180591620717411303424");
    assert_eq!(q(&big.to_string()), big);
}

#[test]
fn milli_and_value_round_up_as_upstream() {
    assert_eq!(q("2.007").milli_value(), 2007);
    assert_eq!(q("250m").milli_value(), 250);
    assert_eq!(q("0.1m").milli_value(), 1, "MilliValue is a ceiling");
    assert_eq!(q("1n").milli_value(), 1);
    assert_eq!(q("1.0001").milli_value(), 1001);
    assert_eq!(q("2").milli_value(), 2000);
    assert_eq!(q("100.5").value(), 101, "Value rounds up");
    assert_eq!(q("128Mi").value(), 134_217_728);
    assert_eq!(q("1G").value(), 1_000_000_000);
    assert_eq!(q("0.5Ki").value(), 512);
    assert_eq!(q("1.5Ki").value(), 1536);
    assert_eq!(q("-9.01").value(), -10, "away from zero, as int64Amount");
    assert_eq!(
        q("1e30").value(),
        i64::MAX,
        "saturates where upstream overflows"
    );
    // A float would get these wrong.
    assert_eq!(q("0.3").milli_value(), 300);
    assert_eq!(q("4.35").milli_value(), 4350);
    assert_eq!(q("1.001").scaled_value(-3), 1001);
    assert_eq!(q("8.2Gi").value(), 8_804_682_957);
    assert_eq!(parse_milli_cpu(" 2.007 "), Some(2007));
    assert_eq!(parse_bytes("nope"), None);
    assert_eq!(parse_bytes("1e3"), Some(1000));
}

#[test]
fn comparison_ignores_format() {
    assert_eq!(q("1Ki"), q("1024"));
    assert_eq!(q("1"), q("1000m"));
    assert!(q("10000T") > q("100Gi"));
    assert!(q("50m") < q("100m"));
    assert_eq!(q("0"), Quantity::ZERO);
    let sum = Quantity::ZERO.saturating_add(q("1Gi"));
    assert_eq!(sum.to_string(), "1Gi", "zero takes the other side's format");
    assert_eq!(q("100m").saturating_add(Quantity::ZERO).to_string(), "100m");
    assert_eq!(
        Quantity::ZERO.saturating_sub(q("100m")).to_string(),
        "-100m"
    );
}

/// xorshift64*: deterministic pseudo-random cases without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn digits(r: &mut Rng, max: u64) -> String {
    (0..r.below(max + 1))
        .map(|_| char::from(b'0' + u8::try_from(r.below(10)).unwrap_or(0)))
        .collect()
}

/// `ceil(num / den)` for non-negative integers.
fn ceil_div(num: u128, den: u128) -> u128 {
    num.div_ceil(den)
}

#[test]
fn property_random_quantities_match_exact_rationals_and_round_trip() {
    let suffixes: &[(&str, u32, i32)] = &[
        ("", 10, 0),
        ("n", 10, -9),
        ("u", 10, -6),
        ("m", 10, -3),
        ("k", 10, 3),
        ("M", 10, 6),
        ("G", 10, 9),
        ("Ki", 2, 10),
        ("Mi", 2, 20),
        ("Gi", 2, 30),
        ("e2", 10, 2),
        ("E-4", 10, -4),
        ("e+5", 10, 5),
    ];
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let int = digits(&mut r, 6);
        let frac = digits(&mut r, 6);
        let dot = !frac.is_empty() || r.below(4) == 0;
        if int.is_empty() && !dot {
            continue;
        }
        let (suffix, base, exp) = suffixes[usize::try_from(r.below(13)).unwrap_or(0)];
        let s = format!("{int}{}{frac}{suffix}", if dot { "." } else { "" });
        let got = q(&s);

        // Exact rational: D · base^exp / 10^len(frac), D the digits as an integer.
        let d: u128 = format!("0{int}{frac}").parse().unwrap_or(0);
        let den_frac = 10u128.pow(u32::try_from(frac.len()).unwrap_or(0));
        let (num, den) = match (base, exp) {
            (2, e) => (d << e, den_frac),
            (_, e) if e >= 0 => (d * 10u128.pow(e.unsigned_abs()), den_frac),
            (_, e) => (d, den_frac * 10u128.pow(e.unsigned_abs())),
        };
        let want_milli = ceil_div(num * 1000, den);
        let want_value = ceil_div(num, den);
        assert_eq!(
            u128::try_from(got.milli_value()).ok(),
            Some(want_milli),
            "{s} milli"
        );
        assert_eq!(
            u128::try_from(got.value()).ok(),
            Some(want_value),
            "{s} value"
        );
        // Printing then parsing gives the same value back, and the negative mirrors it.
        let back = q(&got.to_string());
        assert_eq!(back, got, "{s} -> {got}");
        assert_eq!(q(&format!("-{s}")).as_nanos(), -got.as_nanos(), "-{s}");
    }
}
