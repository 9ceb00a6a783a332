//! The self-signed serving certificate (upstream `InitializeTLS` with no
//! `tlsCertFile`/`tlsPrivateKeyFile` and no `serverTLSBootstrap`, and
//! `certutil.GenerateSelfSignedCertKey`): `<certDir>/kubelet.crt` and
//! `kubelet.key`, reused when present and usable, otherwise generated as a
//! throwaway CA `<host>-ca@<unix>` and a serving certificate `<host>@<unix>`
//! signed by it, valid one year from an hour ago, written leaf first then
//! CA. The SANs are the host (as an IP or a DNS name) followed by the given
//! IPs and DNS names.
//!
//! Unlike upstream's RSA-2048 keys these are ECDSA P-256 (what rcgen makes
//! with ring); clients accept both.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use tracing::{info, warn};

use super::serving::{CertInfo, ServingCert, load_pair};
use super::store::write_private;
use crate::Error;
use crate::error::blocking;

/// `kubelet.crt` in the certificate directory.
pub fn cert_path(cert_dir: &Path) -> PathBuf {
    cert_dir.join("kubelet.crt")
}

/// `kubelet.key` in the certificate directory.
pub fn key_path(cert_dir: &Path) -> PathBuf {
    cert_dir.join("kubelet.key")
}

/// Loads `kubelet.crt`/`kubelet.key` from `cert_dir`, or generates them for
/// `host` with the extra SANs `ips` and `dns_names` when they are missing,
/// unusable or expired.
pub async fn load_or_generate(
    cert_dir: &Path,
    host: &str,
    ips: &[IpAddr],
    dns_names: &[String],
) -> Result<Arc<ServingCert>, Error> {
    let (dir, host, ips, dns) = (
        cert_dir.to_path_buf(),
        host.to_string(),
        ips.to_vec(),
        dns_names.to_vec(),
    );
    let (key, info) = blocking(move || load_or_generate_blocking(&dir, &host, &ips, &dns)).await?;
    let serving = ServingCert::empty();
    serving.set(key, info);
    Ok(serving)
}

fn load_or_generate_blocking(
    dir: &Path,
    host: &str,
    ips: &[IpAddr],
    dns: &[String],
) -> Result<(rustls::sign::CertifiedKey, CertInfo), Error> {
    let (cert, key) = (cert_path(dir), key_path(dir));
    if cert.exists() || key.exists() {
        match load_pair(&cert, &key) {
            Ok((k, info)) if info.not_after > SystemTime::now() => {
                info!(cert = %cert.display(), "Using existing self-signed serving certificate");
                return Ok((k, info));
            }
            Ok(_) => {
                warn!(cert = %cert.display(), "Self-signed serving certificate expired; generating a new one")
            }
            Err(e) => {
                warn!(error = %e, "Unusable self-signed serving certificate; generating a new one")
            }
        }
    }
    let (cert_pem, key_pem) = generate(host, ips, dns)?;
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    write_public(&cert, cert_pem.as_bytes())?;
    write_private(&key, key_pem.as_bytes())?;
    info!(cert = %cert.display(), key = %key.display(), "Generated self-signed serving certificate");
    load_pair(&cert, &key)
}

fn write_public(path: &Path, data: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension("writing");
    std::fs::write(&tmp, data).map_err(Error::io(&tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
        .map_err(Error::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(Error::io(path))
}

/// A CA and a serving certificate signed by it: (certificate bundle PEM,
/// serving key PEM).
pub fn generate(host: &str, ips: &[IpAddr], dns: &[String]) -> Result<(String, String), Error> {
    let now = time::OffsetDateTime::now_utc();
    let unix = now.unix_timestamp();
    let valid_from = now - time::Duration::HOUR;
    let valid_to = valid_from + time::Duration::days(365);

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{host}-ca@{unix}"));
    ca.not_before = valid_from;
    ca.not_after = valid_to;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name = DistinguishedName::new();
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{host}@{unix}"));
    leaf.not_before = valid_from;
    leaf.not_after = valid_to;
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::DigitalSignature,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let mut sans = Vec::new();
    match host.parse::<IpAddr>() {
        Ok(ip) => sans.push(SanType::IpAddress(ip)),
        Err(_) => sans.push(SanType::DnsName(host.try_into()?)),
    }
    sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    for d in dns {
        sans.push(SanType::DnsName(d.as_str().try_into()?));
    }
    leaf.subject_alt_names = sans;
    let issuer = Issuer::from_params(&ca, &ca_key);
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((
        format!("{}{}", cert.pem(), ca_cert.pem()),
        key.serialize_pem(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;

    #[tokio::test]
    async fn generated_once_with_the_node_sans_then_reused() {
        let dir = tempfile::tempdir().expect("tmp");
        let pki = dir.path().join("pki");
        let ips: Vec<IpAddr> = vec![
            "10.0.0.5".parse().expect("ip"),
            "fd00::5".parse().expect("ip"),
        ];
        let dns = vec!["node-a.example".to_string()];
        let first = load_or_generate(&pki, "node-a", &ips, &dns)
            .await
            .expect("generate");
        let info = first.info().expect("info");
        assert_eq!(
            info.dns_names.iter().cloned().collect::<Vec<_>>(),
            ["node-a", "node-a.example"]
        );
        assert_eq!(info.ips, ips.iter().copied().collect());
        assert!(
            info.common_name.starts_with("node-a@"),
            "{}",
            info.common_name
        );
        assert!(first.current().is_some());

        let crt = std::fs::read_to_string(cert_path(&pki)).expect("crt");
        assert_eq!(crt.matches("BEGIN CERTIFICATE").count(), 2, "leaf and CA");
        let mode = |p: PathBuf| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(key_path(&pki)), 0o600);
        assert_eq!(mode(cert_path(&pki)), 0o644);

        // The chain verifies: the CA in the bundle signed the leaf.
        let ders: Vec<_> = rustls_pki_types::CertificateDer::pem_slice_iter(crt.as_bytes())
            .collect::<Result<_, _>>()
            .expect("pem");
        let (_, leaf) = x509_parser::parse_x509_certificate(&ders[0]).expect("leaf");
        let (_, ca) = x509_parser::parse_x509_certificate(&ders[1]).expect("ca");
        assert!(ca.is_ca());
        assert!(ca.subject().to_string().contains("node-a-ca@"));
        leaf.verify_signature(Some(ca.public_key()))
            .expect("signed by the CA");

        // A second start reuses the files, even for other SANs.
        let second = load_or_generate(&pki, "node-a", &[], &[])
            .await
            .expect("reuse");
        assert_eq!(second.info(), Some(info));
        assert_eq!(std::fs::read_to_string(cert_path(&pki)).expect("crt"), crt);
    }

    #[tokio::test]
    async fn an_ip_host_is_an_ip_san_and_broken_files_are_replaced() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(cert_path(dir.path()), "junk").expect("write");
        std::fs::write(key_path(dir.path()), "junk").expect("write");
        let serving = load_or_generate(dir.path(), "192.168.1.7", &[], &[])
            .await
            .expect("generate");
        let info = serving.info().expect("info");
        assert!(info.dns_names.is_empty());
        assert_eq!(
            info.ips.into_iter().collect::<Vec<_>>(),
            ["192.168.1.7".parse::<IpAddr>().expect("ip")]
        );
    }

    #[test]
    fn a_blocking_certificate_read_does_not_stall_the_runtime() {
        kubelet_test_util::blocking::assert_runtime_not_stalled_by(
            "pki/kubelet.crt",
            |dir| async move {
                let _ = load_or_generate(&dir.join("pki"), "n", &[], &[]).await;
            },
        );
    }
}
