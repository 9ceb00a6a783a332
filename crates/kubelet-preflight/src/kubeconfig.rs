//! The kubeconfigs a start would read, as upstream's `buildKubeletClientConfig`
//! and `bootstrap.LoadClientCert` do: `--kubeconfig` loads (client-go's
//! `clientcmd` rules: a current context naming a cluster with a server and a
//! user), its client certificate and key are readable and belong together
//! (`tls.X509KeyPair`) and the certificate is valid; when it is missing or
//! its certificate expired and `--bootstrap-kubeconfig` is given, the kubelet
//! bootstraps a new one, so that is fine as long as the bootstrap kubeconfig
//! is. Neither given means standalone: nothing to check. The certificates
//! ([`cert`]) include the node API's ([`serving`]) and the `--cert-dir` ones.

mod cert;
mod serving;

use std::path::{Path, PathBuf};

use base64::Engine;
use jiff::Timestamp;
use kube::config::{AuthInfo, Kubeconfig};
use kubelet_config::KubeletConfig;
use secrecy::ExposeSecret;

use crate::finding::{Finding, Kind, Severity, error_line};
use crate::report::Report;
use cert::{Renewal, Subject};

/// Reports unreadable kubeconfigs and invalid or expiring certificates.
pub(crate) fn check(cfg: &KubeletConfig, report: &mut Report) {
    let now = Timestamp::now();
    let rotate = cfg.cluster.rotate_certificates;
    let bootstrap = cfg.bootstrap_kubeconfig.as_deref();
    let mut need_bootstrap = false;
    if let Some(path) = cfg.kubeconfig.as_deref() {
        if !path.exists() {
            match bootstrap {
                Some(b) => report.push(
                    Finding::info(
                        Kind::Kubeconfig,
                        format!(
                            "{} does not exist yet: the kubelet will request a client certificate with the bootstrap kubeconfig {}",
                            path.display(),
                            b.display()
                        ),
                    )
                    .in_file(path)
                    .field("--kubeconfig"),
                ),
                None => report.push(
                    Finding::error(
                        Kind::Kubeconfig,
                        format!(
                            "invalid kubeconfig: stat {}: no such file or directory, and no --bootstrap-kubeconfig to create it from",
                            path.display()
                        ),
                    )
                    .in_file(path)
                    .field("--kubeconfig"),
                ),
            }
            need_bootstrap = true;
        } else {
            let ctx = Ctx {
                now,
                rotate,
                bootstrap,
            };
            need_bootstrap = !check_file(path, "--kubeconfig", &ctx, report);
        }
    } else if bootstrap.is_some() {
        need_bootstrap = true;
    }
    if let Some(b) = bootstrap {
        check_bootstrap(b, need_bootstrap, now, rotate, report);
    }
    serving::check(cfg, now, report);
}

/// The bootstrap kubeconfig: only read when the kubelet has to bootstrap, so
/// its problems are errors then and warnings otherwise.
fn check_bootstrap(path: &Path, needed: bool, now: Timestamp, rotate: bool, report: &mut Report) {
    let mut sub = Report::default();
    if path.exists() {
        let ctx = Ctx {
            now,
            rotate,
            bootstrap: None,
        };
        check_file(path, "--bootstrap-kubeconfig", &ctx, &mut sub);
    } else {
        sub.push(
            Finding::error(
                Kind::Kubeconfig,
                format!(
                    "unable to read bootstrap kubeconfig: open {}: no such file or directory",
                    path.display()
                ),
            )
            .in_file(path)
            .field("--bootstrap-kubeconfig"),
        );
    }
    for mut f in sub.findings {
        if !needed && f.severity == Severity::Error {
            f.severity = Severity::Warning;
            f.message
                .push_str(" (not used while --kubeconfig is valid)");
        }
        report.push(f);
    }
}

/// What one kubeconfig check needs to know.
struct Ctx<'a> {
    now: Timestamp,
    rotate: bool,
    /// The bootstrap kubeconfig, which replaces an expired client certificate.
    bootstrap: Option<&'a Path>,
}

/// Checks one kubeconfig file; true when a start could use it as it is.
fn check_file(path: &Path, flag: &str, ctx: &Ctx<'_>, report: &mut Report) -> bool {
    let errors_before = report.count(Severity::Error);
    let err = |message: String| Finding::error(Kind::Kubeconfig, message).in_file(path);
    let kc = match Kubeconfig::read_from(path) {
        Ok(kc) => kc,
        Err(e) => {
            // The YAML parser's message goes on with a source snippet: keep its first line.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default().trim_end();
            let message = format!("unable to load kubeconfig: {first}");
            let line = error_line(&message);
            report.push(err(message).at_line(line).field(flag));
            return false;
        }
    };
    let Some(current) = kc.current_context.as_deref().filter(|c| !c.is_empty()) else {
        report.push(err("current-context is not set".into()).field("current-context"));
        return false;
    };
    let Some(context) = kc
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.as_ref())
    else {
        report.push(
            err(format!("context {current:?} (current-context) not found"))
                .field("current-context"),
        );
        return false;
    };
    let cluster_field = format!("clusters[{:?}]", context.cluster);
    match kc
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
    {
        None => report.push(
            err(format!(
                "cluster {:?} of context {current:?} not found",
                context.cluster
            ))
            .field(format!("contexts[{current:?}].cluster")),
        ),
        Some(cluster) => {
            match cluster.server.as_deref().filter(|s| !s.is_empty()) {
                None => report.push(
                    err(format!("no server found for cluster {:?}", context.cluster))
                        .field(format!("{cluster_field}.server")),
                ),
                Some(s) if !(s.starts_with("https://") || s.starts_with("http://")) => report.push(
                    err(format!(
                        "server {s:?} of cluster {:?} is not an https:// URL",
                        context.cluster
                    ))
                    .field(format!("{cluster_field}.server")),
                ),
                Some(_) => {}
            }
            let ca = Subject {
                what: "CA certificate",
                file: path,
                field: None,
                renewal: Renewal::Operator,
                on_expiry: (Severity::Error, ""),
            };
            if let Some(file) = cluster.certificate_authority.as_deref() {
                let file = PathBuf::from(file);
                let field = format!("{cluster_field}.certificate-authority");
                if let Some(pem) = read(&file, &field, report) {
                    cert::check_pem(
                        &pem,
                        &Subject {
                            file: &file,
                            field: Some(field),
                            ..ca
                        },
                        ctx.now,
                        report,
                    );
                }
            } else if let Some(data) = cluster.certificate_authority_data.as_deref() {
                let field = format!("{cluster_field}.certificate-authority-data");
                if let Some(pem) = decode(data, path, &field, report) {
                    cert::check_pem(
                        &pem,
                        &Subject {
                            field: Some(field),
                            ..ca
                        },
                        ctx.now,
                        report,
                    );
                }
            }
        }
    }
    let mut usable = true;
    match context.user.as_deref() {
        None | Some("") => {}
        Some(user) => match kc
            .auth_infos
            .iter()
            .find(|u| u.name == user)
            .and_then(|u| u.auth_info.as_ref())
        {
            None => report.push(
                err(format!("user {user:?} of context {current:?} not found"))
                    .field(format!("contexts[{current:?}].user")),
            ),
            Some(auth) => usable = check_user(path, user, auth, ctx, report),
        },
    }
    usable && report.count(Severity::Error) == errors_before
}

/// The user's credentials; false when its client certificate is unusable.
fn check_user(
    path: &Path,
    user: &str,
    auth: &AuthInfo,
    ctx: &Ctx<'_>,
    report: &mut Report,
) -> bool {
    let field = format!("users[{user:?}]");
    let cert = if let Some(f) = auth.client_certificate.as_deref() {
        let file = PathBuf::from(f);
        read(&file, &format!("{field}.client-certificate"), report).map(|pem| (pem, file))
    } else if let Some(d) = auth.client_certificate_data.as_deref() {
        decode(d, path, &format!("{field}.client-certificate-data"), report)
            .map(|pem| (pem, path.to_path_buf()))
    } else {
        None
    };
    let key = if let Some(f) = auth.client_key.as_deref() {
        let file = PathBuf::from(f);
        read(&file, &format!("{field}.client-key"), report).map(|pem| (pem, file))
    } else if let Some(d) = auth.client_key_data.as_ref() {
        decode(
            d.expose_secret(),
            path,
            &format!("{field}.client-key-data"),
            report,
        )
        .map(|pem| (pem, path.to_path_buf()))
    } else {
        None
    };
    let has_cert = auth.client_certificate.is_some() || auth.client_certificate_data.is_some();
    let has_key = auth.client_key.is_some() || auth.client_key_data.is_some();
    if has_cert != has_key {
        report.push(
            Finding::error(
                Kind::Kubeconfig,
                format!(
                    "user {user:?} has a client {} without a {}",
                    if has_cert { "certificate" } else { "key" },
                    if has_cert { "key" } else { "certificate" }
                ),
            )
            .in_file(path)
            .field(field.clone()),
        );
    }
    if let Some(tf) = auth.token_file.as_deref()
        && let Err(e) = std::fs::metadata(tf)
    {
        report.push(
            Finding::error(
                Kind::Kubeconfig,
                format!("cannot read token file {tf}: {e}"),
            )
            .in_file(path)
            .field(format!("{field}.tokenFile")),
        );
    }
    if !has_cert
        && auth.token.is_none()
        && auth.token_file.is_none()
        && auth.exec.is_none()
        && auth.auth_provider.is_none()
        && auth.username.is_none()
    {
        report.push(
            Finding::warning(
                Kind::Kubeconfig,
                format!("user {user:?} has no client certificate, token or exec plugin: requests would be anonymous"),
            )
            .in_file(path)
            .field(field.clone()),
        );
    }
    let Some((cert_pem, cert_file)) = cert else {
        return !has_cert;
    };
    let on_expiry = match ctx.bootstrap {
        Some(_) => (
            Severity::Warning,
            "the kubelet will bootstrap a new one with --bootstrap-kubeconfig",
        ),
        None => (Severity::Error, ""),
    };
    let subject = Subject {
        what: "client certificate",
        file: &cert_file,
        field: Some(format!(
            "{field}.{}",
            if auth.client_certificate.is_some() {
                "client-certificate"
            } else {
                "client-certificate-data"
            }
        )),
        renewal: Renewal::ClientRotation(ctx.rotate),
        on_expiry,
    };
    let outcome = cert::check_pem(&cert_pem, &subject, ctx.now, report);
    if let Some((key_pem, key_file)) = key
        && outcome.parsed
    {
        cert::check_key(&cert_pem, &key_pem, &subject, &key_file, report);
    }
    outcome.parsed && !outcome.expired
}

/// Reads a file a kubeconfig names; an error finding when it cannot.
fn read(file: &Path, field: &str, report: &mut Report) -> Option<Vec<u8>> {
    match std::fs::read(file) {
        Ok(b) => Some(b),
        Err(e) => {
            report.push(
                Finding::error(
                    Kind::Kubeconfig,
                    format!("cannot read {}: {e}", file.display()),
                )
                .in_file(file)
                .field(field),
            );
            None
        }
    }
}

/// Decodes inline `*-data`; an error finding when it is not base64.
fn decode(data: &str, kubeconfig: &Path, field: &str, report: &mut Report) -> Option<Vec<u8>> {
    let compact: String = data.split_whitespace().collect();
    match base64::engine::general_purpose::STANDARD.decode(compact) {
        Ok(b) => Some(b),
        Err(e) => {
            report.push(
                Finding::error(
                    Kind::Kubeconfig,
                    format!("{field} is not valid base64: {e}"),
                )
                .in_file(kubeconfig)
                .field(field),
            );
            None
        }
    }
}

#[cfg(test)]
#[path = "kubeconfig/tests.rs"]
mod tests;
