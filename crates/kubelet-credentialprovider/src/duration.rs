//! `metav1.Duration` as the credential provider APIs carry it: a Go
//! duration string (`12h`, `1h30m`, `500ms`, `0`, `-5m`), as Go's
//! `time.ParseDuration` reads it.

/// Nanoseconds, signed, as Go's `time.Duration`.
pub type Nanos = i128;

/// Parses a Go duration; the error is Go's words.
pub fn parse(s: &str) -> Result<Nanos, String> {
    let invalid = || format!("time: invalid duration {s:?}");
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: Nanos = 0;
    while !rest.is_empty() {
        let int_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_end);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let end = a.find(|c: char| !c.is_ascii_digit()).unwrap_or(a.len());
                a.split_at(end)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(invalid());
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let scale: Nanos = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("time: missing unit in duration {s:?}")),
            u => return Err(format!("time: unknown unit {u:?} in duration {s:?}")),
        };
        let whole: Nanos = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| invalid())?
        };
        let mut part = whole.checked_mul(scale).ok_or_else(invalid)?;
        let mut div = scale;
        for d in frac.bytes().take(30) {
            div /= 10;
            if div == 0 {
                break;
            }
            part += Nanos::from(d - b'0') * div;
        }
        total = total.checked_add(part).ok_or_else(invalid)?;
        if total > Nanos::from(i64::MAX) {
            return Err(invalid());
        }
        rest = after;
    }
    Ok(if neg { -total } else { total })
}

/// A non-negative duration as a `std` one (negative ones are zero).
pub fn to_std(n: Nanos) -> std::time::Duration {
    std::time::Duration::from_nanos(u64::try_from(n.max(0)).unwrap_or(u64::MAX))
}

/// Go's `Duration.String` for error messages (`-1m0s`, `1h30m0s`, `500ms`).
pub fn format(n: Nanos) -> String {
    if n == 0 {
        return "0s".into();
    }
    let sign = if n < 0 { "-" } else { "" };
    let a = n.unsigned_abs();
    if a < 1_000_000_000 {
        let (v, unit) = match a {
            x if x < 1_000 => return format!("{sign}{x}ns"),
            x if x < 1_000_000 => (x as f64 / 1e3, "µs"),
            x => (x as f64 / 1e6, "ms"),
        };
        return format!("{sign}{v}{unit}");
    }
    let secs = a / 1_000_000_000;
    let frac = a % 1_000_000_000;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let s = if frac == 0 {
        format!("{s}")
    } else {
        let f = format!("{frac:09}");
        format!("{s}.{}", f.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, m) => format!("{sign}{m}m{s}s"),
        (h, m) => format!("{sign}{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse("12h"), Ok(12 * 3_600_000_000_000));
        assert_eq!(parse("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(parse("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("0s"), Ok(0));
        assert_eq!(parse("-1m"), Ok(-60_000_000_000));
        assert_eq!(parse("300ms"), Ok(300_000_000));
        assert!(parse("").is_err());
        assert!(parse("5").expect_err("unit").contains("missing unit"));
        assert!(parse("5d").expect_err("unit").contains("unknown unit"));
        assert_eq!(format(-60_000_000_000), "-1m0s");
        assert_eq!(format(5_400_000_000_000), "1h30m0s");
        assert_eq!(format(1_500_000_000), "1.5s");
        assert_eq!(format(300_000_000), "300ms");
    }
}
