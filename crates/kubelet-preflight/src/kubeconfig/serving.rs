//! The certificates outside the kubeconfigs that a start reads: the node
//! API's `tlsCertFile` (with `tlsPrivateKeyFile`) or, without one, the
//! `--cert-dir` pair upstream's `InitializeTLS` uses (`kubelet.crt` /
//! `kubelet.key`, self-signed and never renewed, or
//! `kubelet-server-current.pem` under `serverTLSBootstrap`), the
//! `clientCAFile` that authenticates clients of the node API, and the client
//! certificate a bootstrap stored (`kubelet-client-current.pem`, certificate
//! and key in one file).

use std::path::Path;

use jiff::Timestamp;
use kubelet_config::KubeletConfig;

use super::cert::{self, Renewal, Subject};
use crate::finding::{Finding, Kind, Severity};
use crate::report::Report;

/// Reports the node API's and `--cert-dir`'s certificates.
pub(crate) fn check(cfg: &KubeletConfig, now: Timestamp, report: &mut Report) {
    let s = &cfg.server;
    let serving = Renewal::ServingRotation(s.server_tls_bootstrap);
    if let Some(file) = s.tls_cert_file.as_deref() {
        let subject = Subject {
            what: "serving certificate",
            file,
            field: Some("tlsCertFile".into()),
            renewal: Renewal::Operator,
            on_expiry: (Severity::Error, ""),
        };
        check_file(
            file,
            s.tls_private_key_file.as_deref(),
            &subject,
            now,
            report,
        );
    } else if s.server_tls_bootstrap {
        let file = cfg.cert_dir.join("kubelet-server-current.pem");
        if file.exists() {
            let subject = Subject {
                what: "serving certificate",
                file: &file,
                field: Some("--cert-dir".into()),
                renewal: serving,
                on_expiry: (
                    Severity::Warning,
                    "the kubelet requests a new one (serverTLSBootstrap is on)",
                ),
            };
            check_file(&file, Some(&file), &subject, now, report);
        }
    } else {
        let file = cfg.cert_dir.join("kubelet.crt");
        if file.exists() {
            let subject = Subject {
                what: "self-signed serving certificate",
                file: &file,
                field: Some("--cert-dir".into()),
                renewal: Renewal::Operator,
                on_expiry: (
                    Severity::Error,
                    "the kubelet reuses it as it is: delete kubelet.crt and kubelet.key to have a new pair made at start",
                ),
            };
            check_file(
                &file,
                Some(&cfg.cert_dir.join("kubelet.key")),
                &subject,
                now,
                report,
            );
        }
    }
    if let Some(file) = s.authentication.client_ca_file.as_deref() {
        let subject = Subject {
            what: "client CA certificate",
            file,
            field: Some("clientCAFile".into()),
            renewal: Renewal::Operator,
            on_expiry: (Severity::Error, ""),
        };
        check_file(file, None, &subject, now, report);
    }
    if cfg.kubeconfig.is_some() || cfg.bootstrap_kubeconfig.is_some() {
        let file = cfg.cert_dir.join("kubelet-client-current.pem");
        if file.exists() {
            let subject = Subject {
                what: "client certificate",
                file: &file,
                field: Some("--cert-dir".into()),
                renewal: Renewal::ClientRotation(cfg.cluster.rotate_certificates),
                on_expiry: match cfg.bootstrap_kubeconfig {
                    Some(_) => (
                        Severity::Warning,
                        "the kubelet will bootstrap a new one with --bootstrap-kubeconfig",
                    ),
                    None => (Severity::Error, ""),
                },
            };
            check_file(&file, Some(&file), &subject, now, report);
        }
    }
}

/// One certificate file and, when given, its key file.
fn check_file(
    file: &Path,
    key: Option<&Path>,
    subject: &Subject<'_>,
    now: Timestamp,
    report: &mut Report,
) {
    let field = subject.field.clone().unwrap_or_default();
    let Some(pem) = read(file, &field, report) else {
        return;
    };
    let outcome = cert::check_pem(&pem, subject, now, report);
    if let Some(key) = key
        && outcome.parsed
        && let Some(key_pem) = read(key, &field, report)
    {
        cert::check_key(&pem, &key_pem, subject, key, report);
    }
}

fn read(file: &Path, field: &str, report: &mut Report) -> Option<Vec<u8>> {
    match std::fs::read(file) {
        Ok(b) => Some(b),
        Err(e) => {
            report.push(
                Finding::error(
                    Kind::Certificate,
                    format!("cannot read {}: {e}", file.display()),
                )
                .in_file(file)
                .field(field),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::cert::tests::pair;
    use super::*;

    fn cfg(args: &[&str]) -> KubeletConfig {
        let mut all = vec!["kubelet"];
        all.extend_from_slice(args);
        let flags = kubelet_config::Flags::parse_args(all).expect("flags");
        KubeletConfig::resolve(&flags, None, "node").expect("config")
    }

    #[test]
    fn tls_cert_file_client_ca_and_cert_dir_files_are_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let (old, old_key) = pair("old-serving", -100, -1);
        let (ca, _) = pair("ca", -1, 3650);
        let (soon, soon_key) = pair("system:node:n1", -1, 5);
        std::fs::write(d.join("tls.crt"), &old).expect("write");
        std::fs::write(d.join("tls.key"), &old_key).expect("write");
        std::fs::write(d.join("ca.crt"), &ca).expect("write");
        std::fs::create_dir(d.join("pki")).expect("mkdir");
        std::fs::write(
            d.join("pki/kubelet-client-current.pem"),
            format!("{soon}{soon_key}"),
        )
        .expect("write");
        let c = cfg(&[
            &format!("--tls-cert-file={}", d.join("tls.crt").display()),
            &format!("--tls-private-key-file={}", d.join("tls.key").display()),
            &format!("--client-ca-file={}", d.join("ca.crt").display()),
            &format!("--cert-dir={}", d.join("pki").display()),
            &format!("--kubeconfig={}", d.join("kubelet.conf").display()),
            "--rotate-certificates=true",
        ]);
        let mut r = Report::default();
        check(&c, Timestamp::now(), &mut r);
        let by_field = |f: &str| {
            r.findings
                .iter()
                .filter(|x| x.field.as_deref() == Some(f))
                .map(|x| (x.severity, x.message.clone()))
                .collect::<Vec<_>>()
        };
        let tls = by_field("tlsCertFile");
        assert_eq!(tls.len(), 1, "{tls:?}");
        assert_eq!(tls[0].0, Severity::Error);
        assert!(tls[0].1.contains("has expired"), "{}", tls[0].1);
        let ca = by_field("clientCAFile");
        assert_eq!(ca[0].0, Severity::Info, "{ca:?}");
        let client = by_field("--cert-dir");
        assert_eq!(client.len(), 1, "{client:?}");
        assert_eq!(client[0].0, Severity::Warning);
        assert!(
            client[0].1.contains("rotateCertificates is on"),
            "{}",
            client[0].1
        );
    }

    #[test]
    fn a_self_signed_kubelet_crt_with_a_foreign_key_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let (crt, _) = pair("node@1", -1, 365);
        let (_, other) = pair("x", -1, 365);
        std::fs::write(d.join("kubelet.crt"), &crt).expect("write");
        std::fs::write(d.join("kubelet.key"), &other).expect("write");
        let c = cfg(&[&format!("--cert-dir={}", d.display())]);
        let mut r = Report::default();
        check(&c, Timestamp::now(), &mut r);
        assert_eq!(r.count(Severity::Error), 1, "{:?}", r.findings);
        assert!(r.findings.iter().any(|f| {
            f.message
                .starts_with("tls: private key does not match public key")
        }));
    }
}
