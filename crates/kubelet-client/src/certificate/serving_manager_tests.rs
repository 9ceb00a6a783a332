//! Unit tests of the serving certificate manager: a fake signer whose
//! certificates are dated by a clock that moves with paused tokio time.

use super::*;
use crate::clock::TokioClock;
use parking_lot::Mutex;
use rcgen::{BasicConstraints, CertificateSigningRequestParams, IsCa, Issuer};
use std::sync::atomic::{AtomicU32, Ordering};

fn addr(type_: &str, address: &str) -> NodeAddress {
    NodeAddress {
        type_: type_.to_string(),
        address: address.to_string(),
    }
}

/// Signs every request for `lifetime` from the clock's now, after failing
/// the first `fail` requests.
struct FakeSigner {
    ca_key: KeyPair,
    ca: CertificateParams,
    clock: TokioClock,
    lifetime: Duration,
    fail: AtomicU32,
    requests: Mutex<Vec<Seen>>,
}

/// One request the fake signer saw: when, signer, usages, requested SANs.
type Seen = (tokio::time::Instant, String, Vec<String>, Vec<String>);

impl FakeSigner {
    fn new(clock: TokioClock, lifetime: Duration, fail: u32) -> Arc<Self> {
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Arc::new(Self {
            ca_key,
            ca,
            clock,
            lifetime,
            fail: AtomicU32::new(fail),
            requests: Mutex::new(Vec::new()),
        })
    }

    fn times(&self) -> Vec<Duration> {
        let r = self.requests.lock();
        r.iter().map(|(t, ..)| t.duration_since(r[0].0)).collect()
    }
}

impl Signer for Arc<FakeSigner> {
    async fn request(
        &self,
        csr_pem: &str,
        signer: &str,
        usages: &[&str],
    ) -> Result<Vec<u8>, Error> {
        let mut req = CertificateSigningRequestParams::from_pem(csr_pem).expect("csr");
        let sans = req
            .params
            .subject_alt_names
            .iter()
            .map(|s| match s {
                SanType::DnsName(d) => d.as_str().to_string(),
                SanType::IpAddress(ip) => ip.to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        self.requests.lock().push((
            tokio::time::Instant::now(),
            signer.to_string(),
            usages.iter().map(|u| u.to_string()).collect(),
            sans,
        ));
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
            .is_ok()
        {
            return Err(Error::CsrDeleted { name: "x".into() });
        }
        let now =
            time::OffsetDateTime::from_unix_timestamp(self.clock.now().as_second()).expect("time");
        req.params.not_before = now;
        req.params.not_after = now + time::Duration::try_from(self.lifetime).expect("lifetime");
        let issuer = Issuer::from_params(&self.ca, &self.ca_key);
        Ok(req.signed_by(&issuer).expect("sign").pem().into_bytes())
    }
}

fn manager(
    signer: &Arc<FakeSigner>,
    dir: &std::path::Path,
    addresses: Vec<NodeAddress>,
) -> (
    ServingCertManager<Arc<FakeSigner>>,
    watch::Sender<Vec<NodeAddress>>,
) {
    let (tx, rx) = watch::channel(addresses);
    let m = ServingCertManager::with_signer(
        signer.clone(),
        dir.to_path_buf(),
        "node-a".into(),
        rx,
        Arc::new(signer.clock),
    );
    (m, tx)
}

#[test]
fn templates_follow_upstreams_address_rules() {
    let addresses = [
        addr("InternalIP", "10.0.0.5"),
        addr("Hostname", "node-a"),
        addr("ExternalDNS", "node-a.example"),
        addr("InternalDNS", "node-a"),
        addr("ExternalIP", "10.0.0.5"),
        addr("ExternalIP", "fd00::5"),
        addr("InternalIP", ""),
        addr("Other", "x"),
    ];
    let t = Template::from_addresses("node-a", &addresses).expect("template");
    assert_eq!(t.dns_names, ["node-a", "node-a.example"]);
    assert_eq!(
        t.ips,
        [
            "10.0.0.5".parse::<IpAddr>().expect("ip"),
            "fd00::5".parse().expect("ip")
        ]
    );
    assert_eq!(Template::from_addresses("node-a", &[]), None);
    assert_eq!(
        Template::from_addresses("node-a", &[addr("InternalIP", "")]),
        None
    );
}

#[test]
fn retries_back_off_like_upstream() {
    let secs: Vec<u64> = (1..=7).map(|f| retry_delay(f, 0.0).as_secs()).collect();
    assert_eq!(secs, [2, 4, 8, 16, 32, 32, 32]);
    assert_eq!(retry_delay(1, 1.0), Duration::from_millis(2200));
}

#[tokio::test(start_paused = true)]
async fn requests_at_once_then_rotates_between_70_and_90_percent() {
    let dir = tempfile::tempdir().expect("tmp");
    let signer = FakeSigner::new(TokioClock::default(), Duration::from_secs(1000), 0);
    let (m, _tx) = manager(
        &signer,
        dir.path(),
        vec![addr("Hostname", "node-a"), addr("InternalIP", "10.0.0.5")],
    );
    let cert = m.cert();
    let mut issued = cert.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.run(stop.clone()));
    issued.changed().await.expect("issued");
    {
        let r = signer.requests.lock();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, "kubernetes.io/kubelet-serving");
        assert_eq!(
            r[0].2,
            ["digital signature", "key encipherment", "server auth"]
        );
        assert_eq!(r[0].3, ["node-a", "10.0.0.5"]);
    }
    let info = cert.info().expect("info");
    assert_eq!(info.ips, ["10.0.0.5".parse::<IpAddr>().expect("ip")].into());
    assert!(
        store::current_path_for(dir.path(), store::SERVER_PREFIX).exists(),
        "stored"
    );

    tokio::time::sleep(Duration::from_secs(695)).await;
    assert_eq!(signer.requests.lock().len(), 1, "not before 70%");
    tokio::time::sleep(Duration::from_secs(210)).await;
    assert_eq!(signer.requests.lock().len(), 2, "by 90%");
    stop.cancel();
    task.await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn failed_requests_are_retried_with_backoff() {
    let dir = tempfile::tempdir().expect("tmp");
    let signer = FakeSigner::new(TokioClock::default(), Duration::from_secs(100_000), 6);
    let (m, _tx) = manager(&signer, dir.path(), vec![addr("InternalIP", "10.0.0.5")]);
    let cert = m.cert();
    let mut issued = cert.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.run(stop.clone()));
    issued.changed().await.expect("issued after retries");
    let times = signer.times();
    assert_eq!(times.len(), 7);
    let gaps: Vec<f64> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    for (gap, base) in gaps.iter().zip([2.0, 4.0, 8.0, 16.0, 32.0, 32.0]) {
        assert!(
            *gap >= base && *gap <= base * 1.1 + 0.001,
            "gap {gap} for {base}: {gaps:?}"
        );
    }
    assert!(cert.current().is_some());
    stop.cancel();
    task.await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn waits_for_addresses_and_requests_again_when_they_change() {
    let dir = tempfile::tempdir().expect("tmp");
    let signer = FakeSigner::new(TokioClock::default(), Duration::from_secs(100_000), 0);
    let (m, tx) = manager(&signer, dir.path(), vec![]);
    let cert = m.cert();
    let mut issued = cert.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(signer.requests.lock().is_empty(), "no SANs, no request");
    assert!(cert.current().is_none());

    tx.send_replace(vec![addr("InternalIP", "10.0.0.5")]);
    issued.changed().await.expect("issued");
    // The same addresses in another form change nothing.
    tx.send_replace(vec![
        addr("InternalIP", "10.0.0.5"),
        addr("ExternalIP", "10.0.0.5"),
    ]);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(signer.requests.lock().len(), 1);

    tx.send_replace(vec![addr("InternalIP", "10.0.0.6")]);
    issued.changed().await.expect("issued again");
    assert_eq!(signer.requests.lock()[1].3, ["10.0.0.6"]);
    assert_eq!(
        cert.info().expect("info").ips,
        ["10.0.0.6".parse::<IpAddr>().expect("ip")].into()
    );
    stop.cancel();
    task.await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn fallback_files_are_served_without_a_request() {
    let dir = tempfile::tempdir().expect("tmp");
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec!["node-a".to_string()]).expect("params");
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(DnType::CommonName, "system:node:node-a");
    let cert = params.self_signed(&key).expect("cert");
    let (cp, kp) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cp, cert.pem()).expect("write");
    std::fs::write(&kp, key.serialize_pem()).expect("write");

    let signer = FakeSigner::new(TokioClock::default(), Duration::from_secs(1000), 0);
    let (m, _tx) = manager(
        &signer,
        &dir.path().join("pki"),
        vec![addr("Hostname", "node-a")],
    );
    let m = m.with_fallback_files(cp, kp);
    let serving = m.cert();
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(signer.requests.lock().is_empty());
    assert_eq!(
        serving.info().expect("info").dns_names,
        ["node-a".to_string()].into()
    );
    stop.cancel();
    task.await.expect("stops");
}
