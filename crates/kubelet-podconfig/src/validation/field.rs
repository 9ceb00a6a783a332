//! Field paths and errors as upstream's `k8s.io/apimachinery/pkg/util/validation/field`
//! renders them: `spec.containers[0].name: Invalid value: "Foo": <detail>`.

use std::fmt;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A struct field: `.name`.
    Field(String),
    /// A list index: `[0]`.
    Index(usize),
    /// A map key: `[cpu]`.
    Key(String),
}

/// A field path (upstream `field.Path`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Path(Vec<Seg>);

impl Path {
    /// A path of one field.
    pub fn new(name: &str) -> Self {
        Self(vec![Seg::Field(name.to_string())])
    }

    /// This path and a field.
    pub fn child(&self, name: &str) -> Self {
        let mut v = self.0.clone();
        v.push(Seg::Field(name.to_string()));
        Self(v)
    }

    /// This path and a list index.
    pub fn index(&self, i: usize) -> Self {
        let mut v = self.0.clone();
        v.push(Seg::Index(i));
        Self(v)
    }

    /// This path and a map key.
    pub fn key(&self, k: &str) -> Self {
        let mut v = self.0.clone();
        v.push(Seg::Key(k.to_string()));
        Self(v)
    }

    /// The steps.
    pub fn segments(&self) -> &[Seg] {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Seg::Field(n) if i == 0 => f.write_str(n)?,
                Seg::Field(n) => write!(f, ".{n}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
                Seg::Key(k) => write!(f, "[{k}]")?,
            }
        }
        Ok(())
    }
}

/// What is wrong (upstream `field.ErrorType`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorType {
    /// `Required value`.
    Required,
    /// `Invalid value: <value>`.
    Invalid(String),
    /// `Duplicate value: <value>`.
    Duplicate(String),
    /// `Unsupported value: <value>: supported values: …`.
    NotSupported(String, Vec<&'static str>),
    /// `Forbidden`.
    Forbidden,
    /// `Not found: <value>`.
    NotFound(String),
}

/// One validation error (upstream `field.Error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where.
    pub path: Path,
    /// What kind of error, with the value.
    pub kind: ErrorType,
    /// Why, in upstream's words.
    pub detail: String,
}

/// Upstream's `%q` of a string value.
pub fn quote(s: &str) -> String {
    format!("{s:?}")
}

impl FieldError {
    /// `Required value`.
    pub fn required(path: Path, detail: &str) -> Self {
        Self {
            path,
            kind: ErrorType::Required,
            detail: detail.to_string(),
        }
    }

    /// `Invalid value: "text"` for a string value.
    pub fn invalid(path: Path, value: &str, detail: impl Into<String>) -> Self {
        Self {
            path,
            kind: ErrorType::Invalid(quote(value)),
            detail: detail.into(),
        }
    }

    /// `Invalid value: 3` for a number.
    pub fn invalid_num(path: Path, value: i64, detail: impl Into<String>) -> Self {
        Self {
            path,
            kind: ErrorType::Invalid(value.to_string()),
            detail: detail.into(),
        }
    }

    /// `Duplicate value: "text"`.
    pub fn duplicate(path: Path, value: &str) -> Self {
        Self {
            path,
            kind: ErrorType::Duplicate(quote(value)),
            detail: String::new(),
        }
    }

    /// `Unsupported value: "text": supported values: …`.
    pub fn not_supported(path: Path, value: &str, supported: &[&'static str]) -> Self {
        Self {
            path,
            kind: ErrorType::NotSupported(quote(value), supported.to_vec()),
            detail: String::new(),
        }
    }

    /// `Forbidden: detail`.
    pub fn forbidden(path: Path, detail: &str) -> Self {
        Self {
            path,
            kind: ErrorType::Forbidden,
            detail: detail.to_string(),
        }
    }
}

impl FieldError {
    /// `Not found: "text"`.
    pub fn not_found(path: Path, value: &str) -> Self {
        Self {
            path,
            kind: ErrorType::NotFound(quote(value)),
            detail: String::new(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.path)?;
        match &self.kind {
            ErrorType::Required => f.write_str("Required value")?,
            ErrorType::Invalid(v) => write!(f, "Invalid value: {v}")?,
            ErrorType::Duplicate(v) => write!(f, "Duplicate value: {v}")?,
            ErrorType::NotSupported(v, list) => {
                let quoted: Vec<String> = list.iter().map(|s| quote(s)).collect();
                write!(
                    f,
                    "Unsupported value: {v}: supported values: {}",
                    quoted.join(", ")
                )?;
            }
            ErrorType::Forbidden => f.write_str("Forbidden")?,
            ErrorType::NotFound(v) => write!(f, "Not found: {v}")?,
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// Every error of one object (upstream `field.ErrorList`).
pub type ErrorList = Vec<FieldError>;

/// The list as upstream's file source prints it in `invalid pod: %v`:
/// `[first second]`.
pub fn render(errs: &[FieldError]) -> String {
    let items: Vec<String> = errs.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_render_as_upstream_field_errors() {
        let p = Path::new("spec").child("containers").index(0);
        assert_eq!(
            FieldError::invalid(p.child("name"), "Foo", "bad").to_string(),
            "spec.containers[0].name: Invalid value: \"Foo\": bad"
        );
        assert_eq!(
            FieldError::required(p.child("image"), "").to_string(),
            "spec.containers[0].image: Required value"
        );
        assert_eq!(
            FieldError::not_supported(Path::new("spec").child("restartPolicy"), "x", &["A", "B"])
                .to_string(),
            "spec.restartPolicy: Unsupported value: \"x\": supported values: \"A\", \"B\""
        );
        let k = p.child("resources").child("requests").key("cpu");
        assert_eq!(
            FieldError::invalid_num(k, -1, "must be greater than or equal to 0").to_string(),
            "spec.containers[0].resources.requests[cpu]: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(
            FieldError::forbidden(p.child("exec"), "may not specify more than 1 handler type")
                .to_string(),
            "spec.containers[0].exec: Forbidden: may not specify more than 1 handler type"
        );
        assert_eq!(
            render(&[
                FieldError::duplicate(Path::new("a"), "x"),
                FieldError::required(Path::new("b"), "")
            ]),
            "[a: Duplicate value: \"x\" b: Required value]"
        );
    }
}
