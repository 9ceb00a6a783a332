//! The certificate directory (upstream `certificate.FileStore`): each issued
//! certificate and its key go to `<prefix>-<timestamp>.pem`, and the
//! `<prefix>-current.pem` symlink is switched to it atomically. The client
//! certificate uses prefix `kubelet-client`, the serving certificate
//! `kubelet-server`.
//!
//! Writing is blocking file IO: [`store_pair`] does it on tokio's blocking
//! pool.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::Error;
use crate::error::blocking;

/// File name prefix of client certificates.
pub const CLIENT_PREFIX: &str = "kubelet-client";
/// File name prefix of serving certificates.
pub const SERVER_PREFIX: &str = "kubelet-server";

/// The symlink the kubeconfig points at.
pub fn current_path(cert_dir: &Path) -> PathBuf {
    current_path_for(cert_dir, CLIENT_PREFIX)
}

/// The `<prefix>-current.pem` symlink.
pub fn current_path_for(cert_dir: &Path, prefix: &str) -> PathBuf {
    cert_dir.join(format!("{prefix}-current.pem"))
}

/// The private key kept while a bootstrap request is pending.
pub fn pending_key_path(cert_dir: &Path) -> PathBuf {
    cert_dir.join("kubelet-client.key.tmp")
}

/// Writes a file readable by root only. Blocking: call it off the runtime.
pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension("writing");
    std::fs::write(&tmp, data).map_err(Error::io(&tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(Error::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(Error::io(path))
}

/// Stores a certificate and key and points `kubelet-client-current.pem` at
/// them; returns that path.
pub async fn store_pair(
    cert_dir: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<PathBuf, Error> {
    store_pair_for(cert_dir, CLIENT_PREFIX, cert_pem, key_pem).await
}

/// Stores a certificate and key as `<prefix>-<timestamp>.pem` and points
/// `<prefix>-current.pem` at them; returns that path.
pub async fn store_pair_for(
    cert_dir: &Path,
    prefix: &'static str,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<PathBuf, Error> {
    let cert_dir = cert_dir.to_path_buf();
    let mut pem = cert_pem.to_vec();
    if !pem.ends_with(b"\n") {
        pem.push(b'\n');
    }
    pem.extend_from_slice(key_pem);
    blocking(move || store_pem(&cert_dir, prefix, &pem)).await
}

fn store_pem(cert_dir: &Path, prefix: &str, pem: &[u8]) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(cert_dir).map_err(Error::io(cert_dir))?;
    let stamp = jiff::Zoned::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
    let mut name = cert_dir.join(format!("{prefix}-{stamp}.pem"));
    let mut n = 1;
    while name.exists() {
        name = cert_dir.join(format!("{prefix}-{stamp}-{n}.pem"));
        n += 1;
    }
    write_private(&name, pem)?;
    let current = current_path_for(cert_dir, prefix);
    let link = cert_dir.join(format!("{prefix}-current.pem.updating"));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&name, &link).map_err(Error::io(&link))?;
    std::fs::rename(&link, &current).map_err(Error::io(&current))?;
    Ok(current)
}

/// Splits a combined PEM into (certificates, private key).
pub fn split_pem(pem: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let text = String::from_utf8_lossy(pem);
    let (mut certs, mut key) = (String::new(), String::new());
    let mut cur: Option<&mut String> = None;
    for line in text.lines() {
        if line.starts_with("-----BEGIN") {
            cur = Some(if line.contains("CERTIFICATE") {
                &mut certs
            } else {
                &mut key
            });
        }
        if let Some(buf) = cur.as_deref_mut() {
            buf.push_str(line);
            buf.push('\n');
        }
        if line.starts_with("-----END") {
            cur = None;
        }
    }
    (certs.into_bytes(), key.into_bytes())
}

/// Validity period of the first certificate in a PEM.
pub fn validity(cert_pem: &[u8]) -> Result<(SystemTime, SystemTime), Error> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use x509_parser::error::X509Error;
    let der = CertificateDer::from_pem_slice(cert_pem).map_err(|source| Error::Pem {
        what: "certificate",
        source,
    })?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).map_err(|e| {
        Error::X509(match e {
            x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e) => e,
            x509_parser::nom::Err::Incomplete(_) => X509Error::InvalidCertificate,
        })
    })?;
    let v = cert.validity();
    let to_time = |t: i64| {
        let secs = u64::try_from(t).unwrap_or(0);
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    };
    Ok((
        to_time(v.not_before.timestamp()),
        to_time(v.not_after.timestamp()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pairs_are_stored_behind_the_current_symlink() {
        let dir = tempfile::tempdir().expect("tmp");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let p = store_pair(
            dir.path(),
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .await
        .expect("store");
        let target = std::fs::read_link(&p).expect("symlink");
        assert!(
            target
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kubelet-client-2"))
        );
        let mode = std::fs::metadata(&target)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let (c, k) = split_pem(&std::fs::read(&p).expect("read"));
        assert_eq!(String::from_utf8_lossy(&c).trim(), cert.pem().trim());
        assert_eq!(
            String::from_utf8_lossy(&k).trim(),
            key.serialize_pem().trim()
        );
        let (nb, na) = validity(&c).expect("validity");
        assert!(nb < na);
        // A second pair moves the link.
        let p2 = store_pair(
            dir.path(),
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .await
        .expect("store");
        assert_ne!(std::fs::read_link(&p2).expect("link"), target);
    }
}
