//! Client certificate rotation (upstream `certificate.Manager` from
//! `NewKubeletClientCertificateManager`, with `rotateCertificates`): at a
//! jittered 70-90% of the certificate's lifetime, request a new one with the
//! current credentials, store it, and switch the client to it in place.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::Client;
use rand::Rng;
use rcgen::KeyPair;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{csr, store};
use crate::Error;
use crate::client::{DynamicCert, certified_key};

/// Rotates the kubelet client certificate.
pub struct CertManager {
    /// Client that presents the certificate being rotated.
    pub client: Client,
    /// Where certificates live.
    pub cert_dir: PathBuf,
    /// The identity the client presents.
    pub cert: Arc<DynamicCert>,
    /// Node name.
    pub node: String,
}

/// When to rotate: a random point between 70% and 90% of the validity.
pub fn rotation_deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let total = not_after.duration_since(not_before).unwrap_or_default();
    not_before + total.mul_f64(0.7 + 0.2 * jitter.clamp(0.0, 1.0))
}

impl CertManager {
    async fn current_validity(&self) -> Result<(SystemTime, SystemTime), Error> {
        let path = store::current_path(&self.cert_dir);
        let pem = tokio::fs::read(&path).await.map_err(Error::io(&path))?;
        store::validity(&store::split_pem(&pem).0)
    }

    async fn rotate(&self) -> Result<(), Error> {
        let key = KeyPair::generate()?;
        let request = csr::request_pem(&self.node, &key)?;
        let cert = csr::request_certificate(&self.client, &request, None, Duration::from_secs(900))
            .await?;
        let key_pem = key.serialize_pem();
        let identity = certified_key(&cert, key_pem.as_bytes())?;
        store::store_pair(&self.cert_dir, &cert, key_pem.as_bytes()).await?;
        self.cert.set(identity);
        Ok(())
    }

    /// Rotates whenever the deadline passes, until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut failures = 0u32;
        loop {
            let wait = match self.current_validity().await {
                Ok((nb, na)) => {
                    let deadline = rotation_deadline(nb, na, rand::rng().random::<f64>());
                    let wait = deadline
                        .duration_since(SystemTime::now())
                        .unwrap_or_default();
                    info!(expires = %jiff::Timestamp::try_from(na).map(|t| t.to_string()).unwrap_or_default(),
                        rotate_in = ?wait, "Client certificate rotation scheduled");
                    wait
                }
                Err(e) => {
                    warn!(error = %e, "Cannot read the current client certificate; rotating now");
                    Duration::ZERO
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            match self.rotate().await {
                Ok(()) => {
                    failures = 0;
                    info!("Rotated client certificate; new connections use it");
                }
                Err(e) => {
                    failures += 1;
                    let backoff = Duration::from_secs(2u64.saturating_pow(failures.min(8)))
                        .min(Duration::from_secs(300));
                    warn!(error = %e, ?backoff, "Client certificate rotation failed");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_between_70_and_90_percent() {
        let nb = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let na = nb + Duration::from_secs(100);
        assert_eq!(rotation_deadline(nb, na, 0.0), nb + Duration::from_secs(70));
        assert_eq!(rotation_deadline(nb, na, 1.0), nb + Duration::from_secs(90));
        assert_eq!(rotation_deadline(nb, na, 0.5), nb + Duration::from_secs(80));
    }

    /// Issue 7 fix 4.8: reading the current certificate to schedule rotation
    /// does not block the runtime (here the read never completes: a FIFO
    /// with no writer).
    #[test]
    fn a_blocking_certificate_read_does_not_stall_the_runtime() {
        kubelet_test_util::blocking::assert_runtime_not_stalled_by(
            "pki/kubelet-client-current.pem",
            |dir| async move {
                let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
                let client = kube::Client::try_from(config).expect("client");
                let manager = CertManager {
                    client,
                    cert_dir: dir.join("pki"),
                    cert: Arc::new(DynamicCert::default()),
                    node: "n".into(),
                };
                manager.run(CancellationToken::new()).await;
            },
        );
    }
}
