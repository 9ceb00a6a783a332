//! The kubelet's serving certificate for port 10250 (upstream
//! `InitializeTLS` in `cmd/kubelet/app/server.go` and the server's
//! `tls.Config.GetCertificate` callback over the serving
//! `certificate.Manager`): one swappable identity that the TLS acceptor
//! resolves per handshake. It comes from `tlsCertFile`/`tlsPrivateKeyFile`
//! ([`ServingCert::from_files`]), from a self-signed pair in `--cert-dir`
//! ([`super::self_signed`]) or from the `kubernetes.io/kubelet-serving`
//! signer ([`super::serving_manager`]).
//!
//! Files given as `tlsCertFile`/`tlsPrivateKeyFile` (and the self-signed
//! pair) are re-read every minute and a changed pair is installed
//! ([`ServingCert::reload_files`], upstream
//! `NewKubeletServerCertificateDynamicFileManager`, feature
//! `ReloadKubeletServerCertificateFile`, on by default).
//!
//! With no certificate yet (a serving CSR not approved), or an expired one,
//! [`ServingCert`] resolves to nothing and the handshake fails, as upstream's
//! "no serving certificate available for the kubelet".

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::Error;
use crate::client::certified_key;
use crate::error::blocking;

/// What the kubelet needs to know about a certificate it serves with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Subject common name.
    pub common_name: String,
    /// Subject organizations.
    pub organizations: Vec<String>,
    /// DNS subject alternative names.
    pub dns_names: BTreeSet<String>,
    /// IP subject alternative names.
    pub ips: BTreeSet<IpAddr>,
}

impl CertInfo {
    /// Reads the leaf (first) certificate of a DER chain.
    pub fn from_der(der: &[u8]) -> Result<Self, Error> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| {
            Error::X509(match e {
                x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e) => e,
                x509_parser::nom::Err::Incomplete(_) => {
                    x509_parser::error::X509Error::InvalidCertificate
                }
            })
        })?;
        let to_time =
            |t: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
        let subject = cert.subject();
        let mut info = Self {
            not_before: to_time(cert.validity().not_before.timestamp()),
            not_after: to_time(cert.validity().not_after.timestamp()),
            common_name: subject
                .iter_common_name()
                .next()
                .and_then(|c| c.as_str().ok())
                .unwrap_or_default()
                .to_string(),
            organizations: subject
                .iter_organization()
                .filter_map(|o| o.as_str().ok().map(String::from))
                .collect(),
            dns_names: BTreeSet::new(),
            ips: BTreeSet::new(),
        };
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(d) => {
                        info.dns_names.insert((*d).to_string());
                    }
                    GeneralName::IPAddress(b) => {
                        if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                            info.ips.insert(IpAddr::from(v4));
                        } else if let Ok(v6) = <[u8; 16]>::try_from(*b) {
                            info.ips.insert(IpAddr::from(v6));
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(info)
    }

    /// Reads the leaf certificate of a PEM chain.
    pub fn from_pem(pem: &[u8]) -> Result<Self, Error> {
        let der = CertificateDer::from_pem_slice(pem).map_err(|source| Error::Pem {
            what: "certificate",
            source,
        })?;
        Self::from_der(der.as_ref())
    }
}

#[derive(Debug)]
struct Current {
    key: Arc<CertifiedKey>,
    info: CertInfo,
}

/// The serving identity of port 10250, replaceable while the server runs:
/// new handshakes use the newest certificate, open connections keep theirs.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Option<Current>>,
    generation: watch::Sender<u64>,
}

impl Default for ServingCert {
    fn default() -> Self {
        Self {
            current: RwLock::new(None),
            generation: watch::Sender::new(0),
        }
    }
}

impl ServingCert {
    /// No certificate yet: every handshake fails until one is [`set`](Self::set).
    pub fn empty() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Loads `tlsCertFile` (PEM chain, leaf first) and `tlsPrivateKeyFile`
    /// (PEM PKCS#8, SEC1 or PKCS#1 key) off the async runtime.
    pub async fn from_files(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, Error> {
        let (cert_file, key_file) = (cert_file.to_path_buf(), key_file.to_path_buf());
        let (key, info) = blocking(move || load_pair(&cert_file, &key_file)).await?;
        let this = Self::empty();
        this.set(key, info);
        Ok(this)
    }

    /// Installs a new identity; `info` describes its leaf certificate.
    pub fn set(&self, key: CertifiedKey, info: CertInfo) {
        *self.current.write() = Some(Current {
            key: Arc::new(key),
            info,
        });
        self.generation.send_modify(|g| *g += 1);
    }

    /// The identity to serve with: none before the first certificate, and
    /// none once it has expired (upstream `manager.Current`).
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        let guard = self.current.read();
        let c = guard.as_ref()?;
        (SystemTime::now() <= c.info.not_after).then(|| c.key.clone())
    }

    /// The installed certificate's details, expired or not.
    pub fn info(&self) -> Option<CertInfo> {
        self.current.read().as_ref().map(|c| c.info.clone())
    }

    /// Counts installed identities; changes each time one is installed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

/// How often [`ServingCert::reload_files`] looks at the files (upstream's
/// dynamic certificate content resyncs every minute).
pub const FILE_RELOAD_PERIOD: Duration = Duration::from_secs(60);

impl ServingCert {
    /// Re-reads `cert_file` and `key_file` every [`FILE_RELOAD_PERIOD`]
    /// until `stop`, and installs them when their content changed and they
    /// load; a pair that does not load is logged and the served one kept.
    pub async fn reload_files(
        self: Arc<Self>,
        cert_file: PathBuf,
        key_file: PathBuf,
        stop: CancellationToken,
    ) {
        let mut seen = digest(&cert_file, &key_file).await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(FILE_RELOAD_PERIOD) => {}
            }
            let now = digest(&cert_file, &key_file).await;
            if now.is_none() || now == seen {
                continue;
            }
            seen = now;
            let (c, k) = (cert_file.clone(), key_file.clone());
            match blocking(move || load_pair(&c, &k)).await {
                Ok((key, info)) => {
                    info!(cert = %cert_file.display(), "Serving certificate files changed; serving the new pair");
                    self.set(key, info);
                }
                Err(e) => {
                    warn!(error = %e, "Changed serving certificate files do not load; keeping the current pair")
                }
            }
        }
    }
}

/// A digest of both files' content, or none when one cannot be read.
async fn digest(cert: &Path, key: &Path) -> Option<[u8; 32]> {
    let (c, k) = (cert.to_path_buf(), key.to_path_buf());
    let read = blocking(move || {
        let mut h = Sha256::new();
        h.update(std::fs::read(&c).map_err(Error::io(&c))?);
        h.update(b"\0");
        h.update(std::fs::read(&k).map_err(Error::io(&k))?);
        Ok(h.finalize().into())
    });
    match read.await {
        Ok(d) => Some(d),
        Err(e) => {
            warn!(error = %e, "Cannot read the serving certificate files");
            None
        }
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let key = self.current();
        if key.is_none() {
            tracing::debug!("No serving certificate available for the kubelet");
        }
        key
    }
}

/// Parses a certificate chain and key given as PEM, and checks that they belong together.
pub fn parse_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<(CertifiedKey, CertInfo), Error> {
    let key = certified_key(cert_pem, key_pem)?;
    let info = CertInfo::from_pem(cert_pem)?;
    Ok((key, info))
}

/// Reads a certificate file and a key file. Blocking.
pub(crate) fn load_pair(cert: &Path, key: &Path) -> Result<(CertifiedKey, CertInfo), Error> {
    let file_err = |path: &PathBuf| {
        let path = path.clone();
        move |source| Error::CertificateFile {
            path,
            source: Box::new(source),
        }
    };
    let (cert, key) = (cert.to_path_buf(), key.to_path_buf());
    let cert_pem = std::fs::read(&cert).map_err(Error::io(&cert))?;
    let key_pem = std::fs::read(&key).map_err(Error::io(&key))?;
    let info = CertInfo::from_pem(&cert_pem).map_err(file_err(&cert))?;
    let certified = certified_key(&cert_pem, &key_pem).map_err(|e| match e {
        Error::Pem {
            what: "private key",
            ..
        }
        | Error::UnsupportedKey(_) => file_err(&key)(e),
        e => file_err(&cert)(e),
    })?;
    certified.keys_match().map_err(|_| Error::KeyMismatch {
        cert: cert.clone(),
        key: key.clone(),
    })?;
    Ok((certified, info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn pair(names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        let cert = params.self_signed(&key).expect("cert");
        (cert.pem(), key.serialize_pem())
    }

    #[tokio::test]
    async fn files_load_and_resolve_until_replaced() {
        let dir = tempfile::tempdir().expect("tmp");
        let (c, k) = pair(&["node-a"]);
        let (cp, kp) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cp, &c).expect("write");
        std::fs::write(&kp, &k).expect("write");
        let serving = ServingCert::from_files(&cp, &kp).await.expect("load");
        let info = serving.info().expect("info");
        assert!(info.dns_names.contains("node-a"));
        let first = serving.current().expect("a certificate");
        let changes = serving.subscribe();
        let (c2, k2) = pair(&["node-b"]);
        let (key, info) = parse_pair(c2.as_bytes(), k2.as_bytes()).expect("parse");
        serving.set(key, info);
        assert!(changes.has_changed().expect("open"));
        let second = serving.current().expect("a certificate");
        assert_ne!(first.cert[0], second.cert[0]);
    }

    #[tokio::test(start_paused = true)]
    async fn changed_files_are_served_within_a_minute_and_broken_ones_ignored() {
        let dir = tempfile::tempdir().expect("tmp");
        let (cp, kp) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c, k) = pair(&["old"]);
        std::fs::write(&cp, &c).expect("write");
        std::fs::write(&kp, &k).expect("write");
        let serving = ServingCert::from_files(&cp, &kp).await.expect("load");
        let stop = CancellationToken::new();
        let task = tokio::spawn(
            serving
                .clone()
                .reload_files(cp.clone(), kp.clone(), stop.clone()),
        );
        tokio::time::sleep(FILE_RELOAD_PERIOD * 2).await;
        assert_eq!(
            *serving.subscribe().borrow(),
            1,
            "unchanged files are not reinstalled"
        );

        let (c, k) = pair(&["new"]);
        std::fs::write(&cp, &c).expect("write");
        std::fs::write(&kp, &k).expect("write");
        tokio::time::sleep(FILE_RELOAD_PERIOD + Duration::from_secs(1)).await;
        let info = serving.info().expect("info");
        assert!(info.dns_names.contains("new"), "{info:?}");

        std::fs::write(&kp, "broken").expect("write");
        tokio::time::sleep(FILE_RELOAD_PERIOD + Duration::from_secs(1)).await;
        assert_eq!(serving.info(), Some(info));
        assert!(serving.current().is_some());
        stop.cancel();
        task.await.expect("stops");
    }

    #[test]
    fn an_empty_or_expired_certificate_resolves_to_nothing() {
        let serving = ServingCert::empty();
        assert!(serving.current().is_none());
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["n".to_string()]).expect("params");
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let cert = params.self_signed(&key).expect("cert");
        let (k, info) =
            parse_pair(cert.pem().as_bytes(), key.serialize_pem().as_bytes()).expect("parse");
        serving.set(k, info);
        assert!(serving.info().is_some());
        assert!(serving.current().is_none(), "expired");
    }

    #[tokio::test]
    async fn bad_files_are_typed_errors_naming_the_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let (c, k) = pair(&["n"]);
        let (_, other_key) = pair(&["n"]);
        let cp = dir.path().join("tls.crt");
        let kp = dir.path().join("tls.key");
        let missing = dir.path().join("missing.key");
        std::fs::write(&cp, &c).expect("write");
        std::fs::write(&kp, &k).expect("write");

        let e = ServingCert::from_files(&cp, &missing)
            .await
            .expect_err("missing");
        assert!(
            matches!(&e, Error::Io { path, .. } if *path == missing),
            "{e}"
        );

        let garbage = dir.path().join("garbage.key");
        std::fs::write(&garbage, "not a key").expect("write");
        let e = ServingCert::from_files(&cp, &garbage)
            .await
            .expect_err("garbage");
        assert!(
            matches!(&e, Error::CertificateFile { path, .. } if *path == garbage),
            "{e}"
        );

        let e = ServingCert::from_files(&kp, &kp)
            .await
            .expect_err("no cert");
        assert!(
            matches!(&e, Error::CertificateFile { path, .. } if *path == kp),
            "{e}"
        );

        let wrong = dir.path().join("wrong.key");
        std::fs::write(&wrong, &other_key).expect("write");
        let e = ServingCert::from_files(&cp, &wrong)
            .await
            .expect_err("mismatch");
        assert!(matches!(e, Error::KeyMismatch { .. }), "{e}");
    }
}
