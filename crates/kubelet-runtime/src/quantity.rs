//! Just enough of Kubernetes resource quantities (`resource.Quantity`) to turn
//! CPU and memory requests and limits into CRI resources.

/// CPU in millicores: "250m" -> 250, "2" -> 2000, "0.5" -> 500.
pub fn parse_milli_cpu(q: &str) -> Option<i64> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        return m.parse::<i64>().ok();
    }
    let v: f64 = q.parse().ok()?;
    #[allow(clippy::cast_possible_truncation)]
    Some((v * 1000.0).ceil() as i64)
}

/// Bytes: "128Mi", "1G", "1e6", "500k", plain integers.
pub fn parse_bytes(q: &str) -> Option<i64> {
    let q = q.trim();
    const SUFFIXES: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("Ei", 1_152_921_504_606_846_976.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, mult) in SUFFIXES {
        if let Some(n) = q.strip_suffix(suffix) {
            let v: f64 = n.parse().ok()?;
            #[allow(clippy::cast_possible_truncation)]
            return Some((v * mult).ceil() as i64);
        }
    }
    let v: f64 = q.parse().ok()?;
    #[allow(clippy::cast_possible_truncation)]
    Some(v.ceil() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_milli_cpu("250m"), Some(250));
        assert_eq!(parse_milli_cpu("2"), Some(2000));
        assert_eq!(parse_milli_cpu("0.5"), Some(500));
        assert_eq!(parse_bytes("128Mi"), Some(134_217_728));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("1e3"), Some(1000));
        assert_eq!(parse_bytes("nope"), None);
    }
}
