//! One certificate file (or inline kubeconfig data): every PEM certificate in
//! it parsed, not yet valid or expired an error (Go's x509 verification
//! refuses both), expiring within [`SOON_DAYS`] a warning that says whether
//! the kubelet renews it (`rotateCertificates` for the client certificate,
//! `serverTLSBootstrap` for the serving one, as upstream's
//! `certificate.Manager` does), and the private key matching the leaf (Go's
//! `tls.X509KeyPair`).

use std::path::Path;

use jiff::Timestamp;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::pem::Pem;

use crate::finding::{Finding, Kind, Severity};
use crate::report::Report;

/// Days before notAfter from which an expiry is worth a warning.
pub(crate) const SOON_DAYS: i64 = 30;

/// Who renews a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Nobody: the operator (CA bundles, files the kubelet only reads).
    Operator,
    /// The kubelet's client certificate manager, when `rotateCertificates`.
    ClientRotation(bool),
    /// The kubelet's serving certificate manager, when `serverTLSBootstrap`.
    ServingRotation(bool),
}

impl Renewal {
    fn note(self) -> &'static str {
        match self {
            Self::Operator => "renew it before then",
            Self::ClientRotation(true) => {
                "the kubelet rotates its client certificate before then (rotateCertificates is on)"
            }
            Self::ClientRotation(false) => "renew it before then (rotateCertificates is off)",
            Self::ServingRotation(true) => {
                "the kubelet rotates its serving certificate before then (serverTLSBootstrap is on)"
            }
            Self::ServingRotation(false) => "renew it before then (serverTLSBootstrap is off)",
        }
    }
}

/// What is being checked, and where it is.
#[derive(Debug, Clone)]
pub(crate) struct Subject<'a> {
    /// `client certificate`, `CA certificate`, `serving certificate`.
    pub(crate) what: &'a str,
    /// The file it is in (the kubeconfig, for inline data).
    pub(crate) file: &'a Path,
    /// The field naming it (`users[0].user.client-certificate-data`, `tlsCertFile`).
    pub(crate) field: Option<String>,
    /// Who renews it.
    pub(crate) renewal: Renewal,
    /// How bad an expired certificate is (a warning when the kubelet would
    /// bootstrap a new one), and what to add to the message then.
    pub(crate) on_expiry: (Severity, &'a str),
}

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Outcome {
    /// At least one certificate parsed.
    pub(crate) parsed: bool,
    /// A certificate is expired or not yet valid.
    pub(crate) expired: bool,
}

fn finding(s: &Subject<'_>, severity: Severity, message: String) -> Finding {
    let f = Finding::new(Kind::Certificate, severity, message).in_file(s.file);
    match &s.field {
        Some(field) => f.field(field.clone()),
        None => f,
    }
}

/// `less than a day`, `1 day`, `12 days`.
fn days(n: i64) -> String {
    match n {
        0 => "less than a day".into(),
        1 => "1 day".into(),
        n => format!("{n} days"),
    }
}

fn time(seconds: i64) -> String {
    Timestamp::from_second(seconds).map_or_else(|_| seconds.to_string(), |t| t.to_string())
}

/// Checks every certificate in `pem` against `now`.
pub(crate) fn check_pem(
    pem: &[u8],
    s: &Subject<'_>,
    now: Timestamp,
    report: &mut Report,
) -> Outcome {
    let mut out = Outcome::default();
    let mut earliest: Option<(i64, String)> = None;
    let mut problems = 0;
    for (i, block) in Pem::iter_from_buffer(pem).enumerate() {
        let block = match block {
            Ok(b) => b,
            Err(e) => {
                report.push(finding(
                    s,
                    Severity::Error,
                    format!("{} is not valid PEM: {e}", s.what),
                ));
                return out;
            }
        };
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = match block.parse_x509() {
            Ok(c) => c,
            Err(e) => {
                report.push(finding(
                    s,
                    Severity::Error,
                    format!("{} (block {}) cannot be parsed: {e}", s.what, i + 1),
                ));
                problems += 1;
                continue;
            }
        };
        out.parsed = true;
        let name = cert.subject().to_string();
        let (nb, na) = (
            cert.validity().not_before.timestamp(),
            cert.validity().not_after.timestamp(),
        );
        let now_s = now.as_second();
        let (sev, note) = s.on_expiry;
        let tail = if note.is_empty() {
            String::new()
        } else {
            format!("; {note}")
        };
        if now_s < nb {
            out.expired = true;
            problems += 1;
            report.push(finding(
                s,
                sev,
                format!(
                    "{} {name:?} is not yet valid: notBefore {} is after the current time {}{tail}",
                    s.what,
                    time(nb),
                    time(now_s)
                ),
            ));
        } else if now_s > na {
            out.expired = true;
            problems += 1;
            report.push(finding(
                s,
                sev,
                format!(
                    "{} {name:?} has expired: notAfter {} is before the current time {}{tail}",
                    s.what,
                    time(na),
                    time(now_s)
                ),
            ));
        } else if na - now_s < SOON_DAYS * 86400 {
            problems += 1;
            report.push(finding(
                s,
                Severity::Warning,
                format!(
                    "{} {name:?} expires in {}, on {} (within {SOON_DAYS} days): {}",
                    s.what,
                    days((na - now_s) / 86400),
                    time(na),
                    s.renewal.note()
                ),
            ));
        }
        if earliest.as_ref().is_none_or(|(t, _)| na < *t) {
            earliest = Some((na, name));
        }
    }
    if !out.parsed && problems == 0 {
        report.push(finding(
            s,
            Severity::Error,
            format!("{} holds no PEM certificate", s.what),
        ));
    } else if problems == 0
        && let Some((na, name)) = earliest
    {
        report.push(finding(
            s,
            Severity::Info,
            format!("{} {name:?} is valid until {}", s.what, time(na)),
        ));
    }
    out
}

/// Whether the private key in `key_pem` belongs to the first certificate in
/// `cert_pem`. `Ok(false)` is a mismatch; `Err` says why it cannot be told.
pub(crate) fn key_matches(cert_pem: &[u8], key_pem: &[u8]) -> Result<bool, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("private key: {e}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("private key: {e}"))?;
    match CertifiedKey::new(certs, signer).keys_match() {
        Ok(()) => Ok(true),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// Reports a key that does not match its certificate, or cannot be read.
pub(crate) fn check_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    s: &Subject<'_>,
    key_file: &Path,
    report: &mut Report,
) {
    match key_matches(cert_pem, key_pem) {
        Ok(true) => {}
        Ok(false) => report.push(finding(
            s,
            Severity::Error,
            format!(
                "tls: private key does not match public key: the key in {} is not the {}'s",
                key_file.display(),
                s.what
            ),
        )),
        Err(e) => report.push(finding(
            s,
            Severity::Error,
            format!(
                "cannot load the {}'s key pair from {}: {e}",
                s.what,
                key_file.display()
            ),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    /// A self-signed certificate and its key, valid from `from` to `to`
    /// (days from now, negative in the past).
    pub(crate) fn pair(cn: &str, from: i64, to: i64) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(vec![cn.to_string()]).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let day = |d: i64| {
            let t = Timestamp::now() + jiff::SignedDuration::from_hours(24 * d);
            let date = t.to_zoned(jiff::tz::TimeZone::UTC).date();
            rcgen::date_time_ymd(
                i32::from(date.year()),
                u8::try_from(date.month()).expect("month"),
                u8::try_from(date.day()).expect("day"),
            )
        };
        p.not_before = day(from);
        p.not_after = day(to);
        let cert = p.self_signed(&key).expect("sign");
        (cert.pem(), key.serialize_pem())
    }

    fn subject(file: &Path) -> Subject<'_> {
        Subject {
            what: "client certificate",
            file,
            field: Some("users[0].user.client-certificate-data".into()),
            renewal: Renewal::ClientRotation(true),
            on_expiry: (Severity::Error, ""),
        }
    }

    fn run(pem: &str) -> (Outcome, Report) {
        let mut r = Report::default();
        let o = check_pem(
            pem.as_bytes(),
            &subject(Path::new("/k.conf")),
            Timestamp::now(),
            &mut r,
        );
        (o, r)
    }

    #[test]
    fn expired_and_not_yet_valid_are_errors_with_the_dates() {
        let (pem, _) = pair("old", -400, -10);
        let (o, r) = run(&pem);
        assert!(o.expired);
        assert_eq!(r.findings.len(), 1);
        let f = &r.findings[0];
        assert_eq!((f.kind, f.severity), (Kind::Certificate, Severity::Error));
        assert!(
            f.message
                .starts_with("client certificate \"CN=old\" has expired: notAfter 20"),
            "{}",
            f.message
        );
        assert_eq!(f.file.as_deref(), Some(Path::new("/k.conf")));
        let (pem, _) = pair("new", 5, 400);
        let (o, r) = run(&pem);
        assert!(o.expired);
        assert!(
            r.findings[0]
                .message
                .contains("is not yet valid: notBefore"),
            "{}",
            r.findings[0].message
        );
    }

    #[test]
    fn expiring_soon_is_a_warning_naming_rotation_and_far_is_info() {
        let (pem, _) = pair("soon", -10, 10);
        let (o, r) = run(&pem);
        assert!(!o.expired);
        assert_eq!(r.findings[0].severity, Severity::Warning);
        assert!(
            r.findings[0].message.contains("within 30 days"),
            "{}",
            r.findings[0].message
        );
        assert!(
            r.findings[0].message.contains("rotateCertificates is on"),
            "{}",
            r.findings[0].message
        );
        assert_eq!(
            [days(0), days(1), days(12)],
            ["less than a day", "1 day", "12 days"]
        );
        let (pem, _) = pair("far", -10, 365);
        let (_, r) = run(&pem);
        assert_eq!(r.findings[0].severity, Severity::Info);
        assert!(
            r.findings[0].message.contains("is valid until"),
            "{}",
            r.findings[0].message
        );
        let (_, r) = run("not a certificate");
        assert_eq!(r.findings[0].severity, Severity::Error);
    }

    #[test]
    fn the_key_must_be_the_certificates() {
        let (cert, key) = pair("a", -1, 100);
        let (_, other) = pair("b", -1, 100);
        assert_eq!(key_matches(cert.as_bytes(), key.as_bytes()), Ok(true));
        assert_eq!(key_matches(cert.as_bytes(), other.as_bytes()), Ok(false));
        assert!(key_matches(cert.as_bytes(), b"junk").is_err());
        let mut r = Report::default();
        check_key(
            cert.as_bytes(),
            other.as_bytes(),
            &subject(Path::new("/k.conf")),
            Path::new("/k.key"),
            &mut r,
        );
        assert!(
            r.findings[0]
                .message
                .starts_with("tls: private key does not match public key")
        );
    }
}
