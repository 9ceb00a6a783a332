//! The serving certificate from the certificates API (upstream
//! `NewKubeletServerCertificateManager` in `pkg/kubelet/certificate/kubelet.go`
//! over client-go's `certificate.Manager`, with `serverTLSBootstrap`):
//! - the request: signer `kubernetes.io/kubelet-serving`, subject
//!   `O=system:nodes, CN=system:node:<node>`, usages digital signature, key
//!   encipherment and server auth (what signers before 1.25 require), SANs from the
//!   node's addresses (Hostname/InternalDNS/ExternalDNS as DNS names,
//!   InternalIP/ExternalIP as IPs); nothing is requested before the node has
//!   an address;
//! - the file store `kubelet-server-current.pem` in `--cert-dir`, read first
//!   so a restart serves the stored certificate without a new request, and
//!   `tlsCertFile`/`tlsPrivateKeyFile` as its fallback when given;
//! - rotation at a jittered 70–90% of the lifetime, at once when the
//!   certificate no longer matches the node's addresses, with retries after
//!   2, 4, 8 and 16 s (10% jitter) and then every 32 s.
//!
//! Each issued certificate is stored and swapped into the [`ServingCert`]
//! the moment it arrives. Serving CSRs are never auto-approved upstream: a
//! cluster admin or an external approver approves them.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::NodeAddress;
use kube::Client;
use rand::Rng;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::manager::rotation_deadline;
use super::serving::{CertInfo, ServingCert, load_pair, parse_pair};
use super::{csr, store};
use crate::Error;
use crate::clock::{Clock, SystemClock};
use crate::error::blocking;

/// The signer of kubelet serving certificates.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The usages requested, in upstream order. Key encipherment too, although
/// the key is ECDSA: signers before 1.25 sign only this exact set, and
/// upstream kubelets requested it through 1.26 (newer ones drop it for
/// ECDSA keys, which every release from 1.25 accepts either way).
pub const USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];
/// How long one request waits for approval and issuance (upstream
/// `certificateWaitTimeout`).
pub const CSR_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// What the serving CSR asks for (upstream `getTemplate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The node name; the subject is `CN=system:node:<node>, O=system:nodes`.
    pub node: String,
    /// DNS SANs, in address order without repeats.
    pub dns_names: Vec<String>,
    /// IP SANs, in address order without repeats.
    pub ips: Vec<IpAddr>,
}

impl Template {
    /// The template for the node's addresses, or none while it has no
    /// usable address (upstream `addressesToHostnamesAndIPs`).
    pub fn from_addresses(node: &str, addresses: &[NodeAddress]) -> Option<Self> {
        let mut t = Self {
            node: node.to_string(),
            dns_names: Vec::new(),
            ips: Vec::new(),
        };
        for a in addresses.iter().filter(|a| !a.address.is_empty()) {
            match a.type_.as_str() {
                "Hostname" | "InternalDNS" | "ExternalDNS" if !t.dns_names.contains(&a.address) => {
                    t.dns_names.push(a.address.clone());
                }
                "InternalIP" | "ExternalIP" => match a.address.parse::<IpAddr>() {
                    Ok(ip) if !t.ips.contains(&ip) => t.ips.push(ip),
                    Ok(_) => {}
                    Err(_) => {
                        warn!(address = %a.address, "Ignoring a node address that is not an IP")
                    }
                },
                _ => {}
            }
        }
        (!t.dns_names.is_empty() || !t.ips.is_empty()).then_some(t)
    }

    /// Whether `cert` has this template's subject and exactly its SANs
    /// (upstream `certSatisfiesTemplate`).
    pub fn satisfied_by(&self, cert: &CertInfo) -> bool {
        cert.common_name == format!("system:node:{}", self.node)
            && cert.organizations == ["system:nodes"]
            && cert.dns_names == self.dns_names.iter().cloned().collect::<BTreeSet<_>>()
            && cert.ips == self.ips.iter().copied().collect::<BTreeSet<_>>()
    }

    /// The PEM certificate request, signed with `key`.
    pub fn request_pem(&self, key: &KeyPair) -> Result<String, Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("system:node:{}", self.node));
        for d in &self.dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName(d.as_str().try_into()?));
        }
        params
            .subject_alt_names
            .extend(self.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        Ok(params.serialize_request(key)?.pem()?)
    }
}

/// The CSR exchange, as a seam for tests.
pub trait Signer: Send + Sync + 'static {
    /// Submits `csr_pem` for `signer` with `usages` and returns the issued
    /// PEM certificate (chain).
    fn request(
        &self,
        csr_pem: &str,
        signer: &str,
        usages: &[&str],
    ) -> impl Future<Output = Result<Vec<u8>, Error>> + Send;
}

impl Signer for Client {
    async fn request(
        &self,
        csr_pem: &str,
        signer: &str,
        usages: &[&str],
    ) -> Result<Vec<u8>, Error> {
        csr::request_certificate_for(self, csr_pem, None, signer, usages, CSR_TIMEOUT).await
    }
}

/// The wait before retry number `failures` (1-based) after failed requests:
/// 2, 4, 8, 16 s stretched by up to 10% (`jitter` in 0..1), then 32 s
/// (upstream: `wait.Backoff{2s, ×2, jitter 0.1, 5 steps}`, then
/// `PollInfinite(32s)`).
pub fn retry_delay(failures: u32, jitter: f64) -> Duration {
    if failures >= 5 {
        return Duration::from_secs(32);
    }
    let base = Duration::from_secs(1u64 << failures.clamp(1, 4));
    base.mul_f64(1.0 + 0.1 * jitter.clamp(0.0, 1.0))
}

struct Inner<S> {
    signer: S,
    cert_dir: PathBuf,
    fallback: Option<(PathBuf, PathBuf)>,
    node: String,
    cert: Arc<ServingCert>,
    clock: Arc<dyn Clock>,
}

/// Requests, stores and rotates the kubelet's serving certificate.
pub struct ServingCertManager<S = Client> {
    inner: Inner<S>,
    addresses: watch::Receiver<Vec<NodeAddress>>,
}

impl ServingCertManager<Client> {
    /// A manager that requests certificates through `client` for `node`,
    /// stores them in `cert_dir`, and follows the node's `addresses`.
    pub fn new(
        client: Client,
        cert_dir: PathBuf,
        node: String,
        addresses: watch::Receiver<Vec<NodeAddress>>,
    ) -> Self {
        Self::with_signer(client, cert_dir, node, addresses, Arc::new(SystemClock))
    }
}

impl<S: Signer> ServingCertManager<S> {
    /// A manager over any [`Signer`] and clock (tests).
    pub fn with_signer(
        signer: S,
        cert_dir: PathBuf,
        node: String,
        addresses: watch::Receiver<Vec<NodeAddress>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner: Inner {
                signer,
                cert_dir,
                fallback: None,
                node,
                cert: ServingCert::empty(),
                clock,
            },
            addresses,
        }
    }

    /// Serves `tlsCertFile`/`tlsPrivateKeyFile` when no certificate is
    /// stored yet (upstream's `FileStore` with `certFile`/`keyFile`).
    pub fn with_fallback_files(mut self, cert_file: PathBuf, key_file: PathBuf) -> Self {
        self.inner.fallback = Some((cert_file, key_file));
        self
    }

    /// The certificate this manager keeps current; hand it to the TLS acceptor.
    pub fn cert(&self) -> Arc<ServingCert> {
        self.inner.cert.clone()
    }

    /// Loads `kubelet-server-current.pem`, or else the fallback files, if
    /// a usable pair is there (upstream `FileStore.Current`). `run` does
    /// this first; calling it before starting the server serves the stored
    /// certificate at once.
    pub async fn load_stored(&self) -> bool {
        let path = store::current_path_for(&self.inner.cert_dir, store::SERVER_PREFIX);
        let p = path.clone();
        let fallback = self.inner.fallback.clone();
        let loaded = blocking(move || match std::fs::read(&p) {
            Ok(pem) => {
                let (cert, key) = store::split_pem(&pem);
                parse_pair(&cert, &key)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match &fallback {
                Some((c, k)) if c.exists() && k.exists() => load_pair(c, k),
                _ => Err(Error::io(&p)(e)),
            },
            Err(e) => Err(Error::io(&p)(e)),
        })
        .await;
        match loaded {
            Ok((key, info)) => {
                info!(cert = %path.display(), "Loaded the stored serving certificate");
                self.inner.cert.set(key, info);
                true
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                warn!(error = %e, "Stored serving certificate is unusable; requesting a new one");
                false
            }
        }
    }

    /// Keeps the serving certificate current until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        if self.inner.cert.info().is_none() {
            self.load_stored().await;
        }
        let mut open = true;
        let mut failures = 0u32;
        let mut jitter = rand::rng().random::<f64>();
        loop {
            let template =
                Template::from_addresses(&self.inner.node, &self.addresses.borrow_and_update());
            let wait = match &template {
                None => {
                    info!(
                        "Waiting for the node's addresses before requesting a serving certificate"
                    );
                    None
                }
                Some(_) if failures > 0 => Some(retry_delay(failures, rand::rng().random())),
                Some(t) => Some(self.inner.until_rotation(t, jitter)),
            };
            let sleep = async {
                match wait {
                    Some(w) => tokio::time::sleep(w).await,
                    None => std::future::pending().await,
                }
            };
            let node = &self.inner.node;
            tokio::select! {
                () = stop.cancelled() => return,
                () = sleep => {}
                () = template_changed(&mut self.addresses, &mut open, node, template.as_ref()) => continue,
            }
            let Some(template) = template else { continue };
            let result = tokio::select! {
                () = stop.cancelled() => return,
                r = self.inner.rotate(&template) => r,
                () = template_changed(&mut self.addresses, &mut open, node, Some(&template)) => {
                    info!("Node addresses changed while waiting for a serving certificate; requesting again");
                    continue;
                }
            };
            match result {
                Ok(()) => {
                    failures = 0;
                    jitter = rand::rng().random();
                }
                Err(e) => {
                    failures += 1;
                    warn!(error = %e, failures, "Serving certificate request failed");
                }
            }
        }
    }
}

impl<S: Signer> Inner<S> {
    /// How long until the current certificate should be replaced: zero
    /// without one or when it does not match the template.
    fn until_rotation(&self, template: &Template, jitter: f64) -> Duration {
        let Some(info) = self.cert.info() else {
            return Duration::ZERO;
        };
        if !template.satisfied_by(&info) {
            info!("Serving certificate does not match the node's addresses; rotating");
            return Duration::ZERO;
        }
        let deadline = rotation_deadline(info.not_before, info.not_after, jitter);
        let now = SystemTime::from(self.clock.now());
        let wait = deadline.duration_since(now).unwrap_or_default();
        info!(rotate_in = ?wait, "Serving certificate rotation scheduled");
        wait
    }

    async fn rotate(&self, template: &Template) -> Result<(), Error> {
        let key = KeyPair::generate()?;
        let request = template.request_pem(&key)?;
        let cert = self.signer.request(&request, SIGNER, &USAGES).await?;
        let key_pem = key.serialize_pem();
        let (certified, info) = parse_pair(&cert, key_pem.as_bytes())?;
        store::store_pair_for(
            &self.cert_dir,
            store::SERVER_PREFIX,
            &cert,
            key_pem.as_bytes(),
        )
        .await?;
        self.cert.set(certified, info);
        info!(dns = ?template.dns_names, ips = ?template.ips, "Serving certificate issued; new connections use it");
        Ok(())
    }
}

/// Returns once the node's addresses give a template other than `current`
/// (an update that changes nothing the certificate names is ignored);
/// never, once the sender is gone (`open` turns false).
async fn template_changed(
    rx: &mut watch::Receiver<Vec<NodeAddress>>,
    open: &mut bool,
    node: &str,
    current: Option<&Template>,
) {
    loop {
        if !*open || rx.changed().await.is_err() {
            *open = false;
            std::future::pending::<()>().await;
        }
        if Template::from_addresses(node, &rx.borrow_and_update()).as_ref() != current {
            return;
        }
    }
}

#[cfg(test)]
#[path = "serving_manager_tests.rs"]
mod tests;
