//! Version strings as upstream reads them (`k8s.io/apimachinery/pkg/util/version`):
//! [`parse_semantic`] (`ParseSemantic`), [`parse_generic`] (`ParseGeneric`) and
//! [`parse_runtime_version`], the kubelet's `newRuntimeVersion`: semantic
//! first, generic if that fails. A version prints as upstream's `String()`:
//! the numeric components, then `-<pre-release>` and `+<build>` for semantic
//! versions. Whatever follows the numbers of a generic version is dropped, so
//! the runtime version `1.6.20~ds1` prints as `1.6.20`.
//!
//! The grammar, from upstream's regular expressions: optional leading
//! whitespace (`\s`: tab, newline, form feed, carriage return, space), an
//! optional `v`, dot-separated decimal components, then the rest up to the
//! end of the string, which may hold no newline. A generic version has two or
//! more components, the first without a leading zero; a semantic one exactly
//! three, none with a leading zero, and its rest must be `-<pre-release>`
//! and/or `+<build>` (dot-separated `[0-9A-Za-z-]` identifiers, numeric
//! pre-release identifiers without leading zeros), then only whitespace.

use std::fmt;

/// A parsed version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    components: Vec<u64>,
    pre_release: String,
    build_metadata: String,
}

/// Why a string is not a version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// No leading number.
    #[error("could not parse {0:?} as version")]
    Unparseable(String),
    /// Too few (generic) or not exactly three (semantic) components.
    #[error("illegal version string {0:?}")]
    Components(String),
    /// A component with a leading zero where none is allowed.
    #[error("illegal zero-prefixed version component {component:?} in {version:?}")]
    ZeroPrefixed {
        /// The component.
        component: String,
        /// The whole string.
        version: String,
    },
    /// A component that does not fit 64 bits.
    #[error("illegal non-numeric version component {component:?} in {version:?}")]
    NonNumeric {
        /// The component.
        component: String,
        /// The whole string.
        version: String,
    },
    /// A semantic version whose rest is not `-<pre-release>+<build>`.
    #[error("could not parse pre-release/metadata ({extra}) in version {version:?}")]
    Extra {
        /// The rest after the numbers.
        extra: String,
        /// The whole string.
        version: String,
    },
}

/// Go's `\s` in RE2: ASCII tab, newline, form feed, carriage return and space.
fn is_go_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\x0c' | '\r' | ' ')
}

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

/// Splits `s` into its numeric part and the rest, as `versionMatchRE` does.
fn split(s: &str) -> Option<(&str, &str)> {
    let body = s.trim_start_matches(is_go_space);
    let body = body.strip_prefix('v').unwrap_or(body);
    let bytes = body.as_bytes();
    let mut end = 0;
    loop {
        let digits = bytes[end..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            // Either no number at all, or a '.' not followed by a digit (left in the rest).
            if end == 0 {
                return None;
            }
            end -= 1;
            break;
        }
        end += digits;
        if bytes.get(end) != Some(&b'.') {
            break;
        }
        end += 1;
    }
    let (numbers, rest) = body.split_at(end);
    // `.` does not match a newline, and `$` is the end of the text.
    (!rest.contains('\n')).then_some((numbers, rest))
}

/// Dot-separated non-empty identifiers.
fn identifiers_ok(s: &str) -> bool {
    s.split('.')
        .all(|id| !id.is_empty() && id.chars().all(is_identifier_char))
}

/// The `-<pre-release>` and `+<build>` of a semantic version, as `extraMatchRE`.
fn split_extra(extra: &str) -> Option<(&str, &str)> {
    let ident_run = |s: &str| -> usize {
        s.find(|c: char| !(is_identifier_char(c) || c == '.'))
            .unwrap_or(s.len())
    };
    let mut rest = extra;
    let mut pre = "";
    if let Some(after) = rest.strip_prefix('-') {
        let n = ident_run(after);
        pre = &after[..n];
        if !identifiers_ok(pre) {
            return None;
        }
        rest = &after[n..];
    }
    let mut build = "";
    if let Some(after) = rest.strip_prefix('+') {
        let n = ident_run(after);
        build = &after[..n];
        if !identifiers_ok(build) {
            return None;
        }
        rest = &after[n..];
    }
    rest.chars().all(is_go_space).then_some((pre, build))
}

fn parse(s: &str, semver: bool) -> Result<Version, VersionError> {
    let (numbers, extra) = split(s).ok_or_else(|| VersionError::Unparseable(s.to_string()))?;
    let parts: Vec<&str> = numbers.split('.').collect();
    if (semver && parts.len() != 3) || (!semver && parts.len() < 2) {
        return Err(VersionError::Components(s.to_string()));
    }
    let mut components = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        if (i == 0 || semver) && part.starts_with('0') && *part != "0" {
            return Err(VersionError::ZeroPrefixed {
                component: (*part).to_string(),
                version: s.to_string(),
            });
        }
        components.push(part.parse::<u64>().map_err(|_| VersionError::NonNumeric {
            component: (*part).to_string(),
            version: s.to_string(),
        })?);
    }
    let mut v = Version {
        components,
        pre_release: String::new(),
        build_metadata: String::new(),
    };
    if semver && !extra.is_empty() {
        let (pre, build) = split_extra(extra).ok_or_else(|| VersionError::Extra {
            extra: extra.to_string(),
            version: s.to_string(),
        })?;
        for id in pre.split('.') {
            if id.parse::<u64>().is_ok() && id.starts_with('0') && id != "0" {
                return Err(VersionError::ZeroPrefixed {
                    component: id.to_string(),
                    version: s.to_string(),
                });
            }
        }
        v.pre_release = pre.to_string();
        v.build_metadata = build.to_string();
    }
    Ok(v)
}

/// Upstream `ParseGeneric`.
pub fn parse_generic(s: &str) -> Result<Version, VersionError> {
    parse(s, false)
}

/// Upstream `ParseSemantic`.
pub fn parse_semantic(s: &str) -> Result<Version, VersionError> {
    parse(s, true)
}

/// The kubelet's `newRuntimeVersion`: semantic if it parses as such, else generic.
pub fn parse_runtime_version(s: &str) -> Result<Version, VersionError> {
    parse_semantic(s).or_else(|_| parse_generic(s))
}

impl Version {
    /// The numeric components.
    pub fn components(&self) -> &[u64] {
        &self.components
    }

    /// The pre-release, empty unless semantic.
    pub fn pre_release(&self) -> &str {
        &self.pre_release
    }

    /// The build metadata, empty unless semantic.
    pub fn build_metadata(&self) -> &str {
        &self.build_metadata
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.components.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{c}")?;
        }
        if !self.pre_release.is_empty() {
            write!(f, "-{}", self.pre_release)?;
        }
        if !self.build_metadata.is_empty() {
            write!(f, "+{}", self.build_metadata)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_versions_print_as_upstream() {
        // (runtime's version, what upstream's `String()` prints, or None: "Unknown")
        let table: &[(&str, Option<&str>)] = &[
            ("1.6.20~ds1", Some("1.6.20")),
            ("1.7.0-rc.1", Some("1.7.0-rc.1")),
            ("v1.7.2", Some("1.7.2")),
            ("2.0.0+unknown", Some("2.0.0+unknown")),
            ("1.7.0-rc.1+abc.2", Some("1.7.0-rc.1+abc.2")),
            ("1.4.12-0ubuntu1", Some("1.4.12-0ubuntu1")),
            ("1.2.3-01", Some("1.2.3")),
            (" 1.6.20 ", Some("1.6.20")),
            ("1.6", Some("1.6")),
            ("1.6.20.1", Some("1.6.20.1")),
            ("1.6.", Some("1.6")),
            ("1.06.2", Some("1.6.2")),
            ("20.10.21+dfsg1", Some("20.10.21+dfsg1")),
            ("garbage", None),
            ("", None),
            ("1", None),
            ("01.2.3", None),
            ("V1.2.3", None),
            ("1.6.20\n", None),
            ("99999999999999999999.1", None),
        ];
        for (raw, want) in table {
            let got = parse_runtime_version(raw).ok().map(|v| v.to_string());
            assert_eq!(got.as_deref(), *want, "{raw:?}");
        }
    }

    #[test]
    fn semantic_and_generic_differ_as_upstream() {
        assert!(parse_semantic("1.6").is_err());
        assert!(parse_semantic("1.6.20~ds1").is_err());
        assert!(parse_semantic("1.06.2").is_err());
        assert!(parse_semantic("1.2.3-").is_err());
        assert!(parse_semantic("1.2.3-rc..1").is_err());
        assert!(parse_semantic("1.2.3+").is_err());
        assert_eq!(
            parse_generic("1.7.0-rc.1").map(|v| v.to_string()),
            Ok("1.7.0".to_string()),
            "generic drops the rest"
        );
        let v = parse_semantic("v1.7.0-rc.1+build.5").expect("semver");
        assert_eq!(
            (v.components(), v.pre_release(), v.build_metadata()),
            (&[1, 7, 0][..], "rc.1", "build.5")
        );
        assert!(matches!(
            parse_generic("x1.2"),
            Err(VersionError::Unparseable(_))
        ));
        assert!(matches!(
            parse_generic("1"),
            Err(VersionError::Components(_))
        ));
        assert!(matches!(
            parse_generic("01.2"),
            Err(VersionError::ZeroPrefixed { .. })
        ));
    }
}
