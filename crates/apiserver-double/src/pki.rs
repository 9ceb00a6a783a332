//! The cluster CA: serving certificate of the double, client certificates for
//! tests, and the `kubernetes.io/kube-apiserver-client-kubelet` signer
//! (upstream kube-controller-manager `csrsigning`, which backdates 5 minutes).

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Errors of the PKI.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen failed.
    #[error("certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// The request cannot be signed.
    #[error("{0}")]
    Invalid(String),
}

/// A CA that signs everything the double hands out.
pub struct Ca {
    key: KeyPair,
    params: CertificateParams,
    /// PEM of the CA certificate.
    pub cert_pem: String,
    der: CertificateDer<'static>,
}

/// A certificate and its key, in PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Certificate PEM.
    pub cert_pem: String,
    /// PKCS#8 key PEM.
    pub key_pem: String,
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn validity(params: &mut CertificateParams, lifetime: Duration) {
    backdated(params, lifetime, Duration::from_secs(300));
}

fn backdated(params: &mut CertificateParams, lifetime: Duration, backdate: Duration) {
    let backdate = time::Duration::try_from(backdate).unwrap_or(time::Duration::ZERO);
    params.not_before = now() - backdate;
    params.not_after = now() + time::Duration::try_from(lifetime).unwrap_or(time::Duration::DAY);
}

impl Ca {
    /// A fresh self-signed CA (`kubernetes`).
    pub fn new() -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "kubernetes");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::CrlSign,
        ];
        validity(&mut params, Duration::from_secs(10 * 365 * 86400));
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            der: cert.der().clone(),
            key,
            params,
        })
    }

    /// DER of the CA certificate.
    pub fn der(&self) -> CertificateDer<'static> {
        self.der.clone()
    }

    fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::from_params(&self.params, &self.key)
    }

    /// The apiserver's serving certificate (127.0.0.1, localhost).
    pub fn serving(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), PkiError> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "kubernetes".to_string()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params, Duration::from_secs(365 * 86400));
        let cert = params.signed_by(&key, &self.issuer())?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone(), self.der()], key_der))
    }

    /// A client certificate for `user` in `groups` (what `kubeadm` gives admins).
    pub fn client(
        &self,
        user: &str,
        groups: &[&str],
        lifetime: Duration,
    ) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params, lifetime);
        let cert = params.signed_by(&key, &self.issuer())?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Signs a PEM CSR as a client certificate valid for `lifetime`.
    pub fn sign_client_csr(
        &self,
        csr_pem: &str,
        lifetime: Duration,
        backdate: Duration,
    ) -> Result<String, PkiError> {
        let mut req = CertificateSigningRequestParams::from_pem(csr_pem)?;
        req.params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        req.params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        req.params.is_ca = IsCa::ExplicitNoCa;
        backdated(&mut req.params, lifetime, backdate);
        Ok(req.signed_by(&self.issuer())?.pem())
    }
}

impl Ca {
    /// Signs a PEM CSR as a serving certificate with its requested SANs
    /// (the `kubernetes.io/kubelet-serving` signer).
    pub fn sign_serving_csr(
        &self,
        csr_pem: &str,
        key_encipherment: bool,
        lifetime: Duration,
        backdate: Duration,
    ) -> Result<String, PkiError> {
        let mut req = CertificateSigningRequestParams::from_pem(csr_pem)?;
        req.params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if key_encipherment {
            req.params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        req.params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        req.params.is_ca = IsCa::ExplicitNoCa;
        backdated(&mut req.params, lifetime, backdate);
        Ok(req.signed_by(&self.issuer())?.pem())
    }
}

/// Subject of a certificate request, for the approver.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestSubject {
    /// Common name.
    pub common_name: String,
    /// Organizations.
    pub organizations: Vec<String>,
    /// Whether any SAN (DNS, IP, email, URI) is requested.
    pub has_sans: bool,
}

/// Reads the subject of a PEM CSR and checks its signature.
pub fn csr_subject(csr_pem: &str) -> Result<RequestSubject, PkiError> {
    let req = CertificateSigningRequestParams::from_pem(csr_pem)?;
    let der = req_der(csr_pem)?;
    let (_, parsed) = X509CertificationRequest::from_der(&der)
        .map_err(|e| PkiError::Invalid(format!("cannot parse CSR: {e}")))?;
    let subject = &parsed.certification_request_info.subject;
    Ok(RequestSubject {
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
        has_sans: !req.params.subject_alt_names.is_empty(),
    })
}

fn req_der(pem: &str) -> Result<Vec<u8>, PkiError> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .map(|d| d.as_ref().to_vec())
        .map_err(|e| PkiError::Invalid(format!("CSR is not PEM: {e}")))
}

/// User, groups (CN and O) and serial number of a client certificate.
pub fn identity_of(der: &[u8]) -> Option<(String, Vec<String>, String)> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(String::from))
        .collect();
    Some((user, groups, cert.raw_serial_as_string()))
}
