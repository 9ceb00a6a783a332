//! Field errors as the apiserver reports them (upstream
//! `k8s.io/apimachinery/pkg/util/validation/field`) and the generic checks
//! of `k8s.io/apimachinery/pkg/util/validation` that pod validation uses
//! (`IsDNS1123Label`, `IsDNS1123Subdomain`, `IsValidPortName`, ...).

use std::collections::HashSet;
use std::fmt;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

/// A bad value as upstream prints it: strings quoted, numbers bare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadValue {
    /// A string.
    Str(String),
    /// A number.
    Int(i64),
    /// A value already formatted as Go's `%#v` prints it (`[]string{"a"}`).
    Raw(String),
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Str(s) => write!(f, "{s:?}"),
            Self::Int(n) => write!(f, "{n}"),
            Self::Raw(s) => f.write_str(s),
        }
    }
}

impl From<&str> for BadValue {
    fn from(s: &str) -> Self {
        Self::Str(s.to_string())
    }
}

impl From<i64> for BadValue {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<i32> for BadValue {
    fn from(n: i32) -> Self {
        Self::Int(i64::from(n))
    }
}

/// The kind of a field error (upstream `field.ErrorType`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorType {
    /// `Required value`.
    Required,
    /// `Invalid value`.
    Invalid(BadValue),
    /// `Unsupported value`.
    NotSupported(BadValue),
    /// `Duplicate value`.
    Duplicate(BadValue),
    /// `Not found`.
    NotFound(BadValue),
    /// `Forbidden`.
    Forbidden,
    /// `Too long` (the value is not printed).
    TooLong,
}

/// One validation error (upstream `field.Error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `spec.containers[0].image`.
    pub field: String,
    /// What is wrong.
    pub kind: ErrorType,
    /// Further detail, possibly empty.
    pub detail: String,
}

impl FieldError {
    fn new(field: &str, kind: ErrorType, detail: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            kind,
            detail: detail.into(),
        }
    }

    /// `field.Required`.
    pub fn required(field: &str, detail: &str) -> Self {
        Self::new(field, ErrorType::Required, detail)
    }

    /// `field.Invalid`.
    pub fn invalid(field: &str, value: impl Into<BadValue>, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Invalid(value.into()), detail)
    }

    /// `field.NotSupported`.
    pub fn not_supported(field: &str, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self::new(
            field,
            ErrorType::NotSupported(value.into()),
            format!("supported values: {}", list.join(", ")),
        )
    }

    /// `field.Duplicate`.
    pub fn duplicate(field: &str, value: impl Into<BadValue>) -> Self {
        Self::new(field, ErrorType::Duplicate(value.into()), "")
    }

    /// `field.NotFound`.
    pub fn not_found(field: &str, value: &str) -> Self {
        Self::new(field, ErrorType::NotFound(value.into()), "")
    }

    /// `field.Forbidden`.
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self::new(field, ErrorType::Forbidden, detail)
    }

    /// `field.TooLong` with the detail the release words (`max` bytes).
    pub fn too_long(field: &str, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::TooLong, detail)
    }

    /// The message without the field (upstream `ErrorBody`).
    pub fn body(&self) -> String {
        let mut s = match &self.kind {
            ErrorType::Required => "Required value".to_string(),
            ErrorType::Forbidden => "Forbidden".to_string(),
            ErrorType::TooLong => "Too long".to_string(),
            ErrorType::Invalid(v) => format!("Invalid value: {v}"),
            ErrorType::NotSupported(v) => format!("Unsupported value: {v}"),
            ErrorType::Duplicate(v) => format!("Duplicate value: {v}"),
            ErrorType::NotFound(v) => format!("Not found: {v}"),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// The `StatusCause` reason.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::Invalid(_) => "FieldValueInvalid",
            ErrorType::NotSupported(_) => "FieldValueNotSupported",
            ErrorType::Duplicate(_) => "FieldValueDuplicate",
            ErrorType::NotFound(_) => "FieldValueNotFound",
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// The message of upstream's aggregate of `errs`: one error alone, several
/// in brackets, duplicates dropped.
pub fn aggregate(errs: &[FieldError]) -> String {
    let mut seen = HashSet::new();
    let msgs: Vec<String> = errs
        .iter()
        .map(ToString::to_string)
        .filter(|m| seen.insert(m.clone()))
        .collect();
    match msgs.as_slice() {
        [one] => one.clone(),
        _ => format!("[{}]", msgs.join(", ")),
    }
}

/// The `details.causes` of a 422 `Status`.
pub fn causes(errs: &[FieldError]) -> Value {
    Value::Array(
        errs.iter()
            .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
            .collect(),
    )
}

pub(crate) const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
pub(crate) const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub(crate) const NEGATIVE_MSG: &str = "must be greater than or equal to 0";
pub(crate) const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";

pub(crate) fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// Upstream `IsDNS1123Label`.
pub(crate) fn dns1123_label(field: &str, s: &str, errs: &mut Vec<FieldError>) {
    if s.len() > 63 {
        errs.push(FieldError::invalid(
            field,
            s,
            "must be no more than 63 characters",
        ));
    }
    if !is_label(s) {
        errs.push(FieldError::invalid(field, s, DNS1123_LABEL_MSG));
    }
}

/// Upstream `IsDNS1123Subdomain`.
pub(crate) fn dns1123_subdomain(field: &str, s: &str, errs: &mut Vec<FieldError>) {
    if s.len() > 253 {
        errs.push(FieldError::invalid(
            field,
            s,
            "must be no more than 253 characters",
        ));
    }
    if !s.split('.').all(is_label) {
        errs.push(FieldError::invalid(field, s, DNS1123_SUBDOMAIN_MSG));
    }
}

/// Upstream `IsValidPortName`.
pub(crate) fn port_name(field: &str, s: &str, errs: &mut Vec<FieldError>) {
    if s.len() > 15 {
        errs.push(FieldError::invalid(
            field,
            s,
            "must be no more than 15 characters",
        ));
    }
    if !s
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        || s.is_empty()
    {
        errs.push(FieldError::invalid(
            field,
            s,
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
        ));
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push(FieldError::invalid(
            field,
            s,
            "must contain at least one letter (a-z)",
        ));
    }
    if s.contains("--") {
        errs.push(FieldError::invalid(
            field,
            s,
            "must not contain consecutive hyphens",
        ));
    }
    if s.starts_with('-') || s.ends_with('-') {
        errs.push(FieldError::invalid(
            field,
            s,
            "must not begin or end with a hyphen",
        ));
    }
}

pub(crate) fn port_num(field: &str, n: i32, errs: &mut Vec<FieldError>) {
    if !(1..=65535).contains(&n) {
        errs.push(FieldError::invalid(field, n, PORT_RANGE_MSG));
    }
}

pub(crate) fn port_num_or_name(field: &str, p: &IntOrString, errs: &mut Vec<FieldError>) {
    match p {
        IntOrString::Int(n) => port_num(field, *n, errs),
        IntOrString::String(s) => port_name(field, s, errs),
    }
}

pub(crate) fn nonnegative(field: &str, n: Option<i32>, errs: &mut Vec<FieldError>) {
    if let Some(n) = n.filter(|n| *n < 0) {
        errs.push(FieldError::invalid(field, n, NEGATIVE_MSG));
    }
}

pub(crate) fn supported(
    field: &str,
    value: Option<&str>,
    allowed: &[&str],
    errs: &mut Vec<FieldError>,
) {
    match value.unwrap_or("") {
        "" => errs.push(FieldError::required(field, "")),
        v if allowed.contains(&v) => {}
        v => errs.push(FieldError::not_supported(field, v, allowed)),
    }
}
