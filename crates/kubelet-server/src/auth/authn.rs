//! Request authentication (upstream `DelegatingAuthenticatorConfig.New` as
//! `cmd/kubelet/app/auth.go` `BuildAuthn` configures it): a union of
//! - x509 client certificates verified against `clientCAFile` (upstream
//!   `authentication/request/x509`: user from the CN, groups from the O
//!   attributes; the CA file is reloaded when it changes),
//! - bearer tokens through a TokenReview (upstream `bearertoken` and
//!   `plugin/pkg/authenticator/token/webhook`), cached for `cacheTTL` by the
//!   token's SHA-256,
//!
//! with `system:authenticated` added to whoever passes, and, when enabled,
//! anonymous (`system:anonymous` in `system:unauthenticated`) for requests no
//! authenticator recognised. An error (a bad certificate, a rejected token, a
//! failed review) is never turned into anonymous, as upstream's
//! `NewFailOnError`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use parking_lot::RwLock;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::cache::TtlCache;
use super::{AuthError, UserInfo, review_call};
use crate::serve::PeerCertificates;

/// How often `clientCAFile` is re-read (upstream's dynamic CA content
/// re-checks every minute).
pub const CA_RELOAD_INTERVAL: Duration = Duration::from_secs(60);

/// The client CA bundle, reloadable.
pub struct ClientCa {
    path: PathBuf,
    current: RwLock<(Vec<u8>, Arc<dyn ClientCertVerifier>)>,
}

fn verifier_for(pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| e.to_string())?;
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate found".into());
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| e.to_string())
}

impl ClientCa {
    /// Reads `path`; an unreadable or empty bundle is an error, as upstream.
    pub async fn load(path: PathBuf) -> Result<Self, AuthError> {
        let pem = tokio::fs::read(&path)
            .await
            .map_err(|e| AuthError::ClientCa {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        let v = verifier_for(&pem).map_err(|reason| AuthError::ClientCa {
            path: path.clone(),
            reason,
        })?;
        Ok(Self {
            path,
            current: RwLock::new((pem, v)),
        })
    }

    /// Re-reads the file; a changed, valid bundle replaces the current one.
    /// A broken file keeps the last good bundle (logged), as upstream.
    pub async fn reload(&self) {
        let pem = match tokio::fs::read(&self.path).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot read client CA file");
                return;
            }
        };
        if self.current.read().0 == pem {
            return;
        }
        match verifier_for(&pem) {
            Ok(v) => {
                *self.current.write() = (pem, v);
                tracing::info!(path = %self.path.display(), "loaded a new client CA bundle");
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "client CA file holds no usable CA; keeping the last one");
            }
        }
    }

    /// Reloads every [`CA_RELOAD_INTERVAL`] until `stop` fires.
    pub async fn run_reload(&self, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(CA_RELOAD_INTERVAL) => self.reload().await,
            }
        }
    }

    /// The user a verified chain names; `Ok(None)` for a certificate without
    /// a common name (upstream `CommonNameUserConversion`).
    pub fn authenticate(
        &self,
        chain: &[CertificateDer<'_>],
    ) -> Result<Option<UserInfo>, AuthError> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Ok(None);
        };
        let verifier = self.current.read().1.clone();
        verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| AuthError::Certificate(e.to_string()))?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| AuthError::Certificate(e.to_string()))?;
        let subject = cert.subject();
        let Some(cn) = subject
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .filter(|s| !s.is_empty())
        else {
            return Ok(None);
        };
        let groups = subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok())
            .map(str::to_string)
            .collect();
        Ok(Some(UserInfo {
            name: cn.to_string(),
            groups,
            ..UserInfo::default()
        }))
    }
}

/// Reviews a bearer token (the TokenReview seam).
#[async_trait::async_trait]
pub trait TokenReviewer: Send + Sync + 'static {
    /// `Ok(Some(user))` when authenticated, `Err(InvalidToken)` when not.
    async fn review(&self, token: &str) -> Result<UserInfo, AuthError>;
}

/// TokenReview through the apiserver (`authentication.k8s.io/v1`).
pub struct KubeTokenReviewer {
    api: Api<TokenReview>,
}

impl KubeTokenReviewer {
    /// Reviews through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }
}

#[async_trait::async_trait]
impl TokenReviewer for KubeTokenReviewer {
    async fn review(&self, token: &str) -> Result<UserInfo, AuthError> {
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let pp = PostParams::default();
        let out = review_call("TokenReview", || self.api.create(&pp, &tr)).await?;
        let status = out.status.unwrap_or_default();
        if !status.authenticated.unwrap_or(false) {
            return Err(AuthError::InvalidToken(
                status.error.filter(|e| !e.is_empty()),
            ));
        }
        let u = status.user.unwrap_or_default();
        Ok(UserInfo {
            name: u.username.unwrap_or_default(),
            uid: u.uid.unwrap_or_default(),
            groups: u.groups.unwrap_or_default(),
            extra: u.extra.unwrap_or_default().into_iter().collect(),
        })
    }
}

/// The authenticator chain.
pub struct Authenticator {
    client_ca: Option<Arc<ClientCa>>,
    token: Option<Arc<dyn TokenReviewer>>,
    cache_ttl: Duration,
    /// Results by SHA-256 of the token: the user, or `None` for a rejected token.
    cache: TtlCache<[u8; 32], Option<UserInfo>>,
    anonymous: bool,
}

/// The bearer token of a request (upstream `bearertoken`): `Bearer <token>`,
/// the scheme case-insensitive; anything else is no token.
fn bearer(req: &Request) -> Option<String> {
    let h = req
        .headers()
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = h.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

impl Authenticator {
    /// A chain of the given authenticators; `cache_ttl` applies to token
    /// review results, both accepted and rejected (upstream passes
    /// `cacheTTL` for both).
    pub fn new(
        client_ca: Option<Arc<ClientCa>>,
        token: Option<Arc<dyn TokenReviewer>>,
        cache_ttl: Duration,
        anonymous: bool,
    ) -> Self {
        Self {
            client_ca,
            token,
            cache_ttl,
            cache: TtlCache::new(),
            anonymous,
        }
    }

    pub(crate) fn client_ca(&self) -> Option<&Arc<ClientCa>> {
        self.client_ca.as_ref()
    }

    /// Who sent `req`: `Ok(None)` when nobody was recognised and anonymous
    /// is off. A used bearer token is removed from the request.
    pub async fn authenticate(&self, req: &mut Request) -> Result<Option<UserInfo>, AuthError> {
        let mut errors = Vec::new();
        let mut user = None;
        if let (Some(ca), Some(certs)) =
            (&self.client_ca, req.extensions().get::<PeerCertificates>())
        {
            match ca.authenticate(&certs.0) {
                Ok(u) => user = u,
                Err(e) => errors.push(e),
            }
        }
        if user.is_none()
            && let Some(reviewer) = &self.token
            && let Some(token) = bearer(req)
        {
            match self.review_token(reviewer.as_ref(), &token).await {
                Ok(u) => {
                    req.headers_mut().remove(http::header::AUTHORIZATION);
                    user = Some(u);
                }
                Err(e) => errors.push(e),
            }
        }
        if let Some(mut u) = user {
            if !u.groups.iter().any(|g| g == "system:authenticated") {
                u.groups.push("system:authenticated".into());
            }
            return Ok(Some(u));
        }
        if let Some(e) = errors.into_iter().next() {
            return Err(e);
        }
        Ok(self.anonymous.then(|| UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..UserInfo::default()
        }))
    }

    async fn review_token(
        &self,
        reviewer: &dyn TokenReviewer,
        token: &str,
    ) -> Result<UserInfo, AuthError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cache.get(&key) {
            return hit.ok_or(AuthError::InvalidToken(None));
        }
        match reviewer.review(token).await {
            Ok(u) => {
                self.cache.insert(key, Some(u.clone()), self.cache_ttl);
                Ok(u)
            }
            Err(AuthError::InvalidToken(e)) => {
                self.cache.insert(key, None, self.cache_ttl);
                Err(AuthError::InvalidToken(e))
            }
            // Failed reviews are not cached.
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    struct FakeReviewer {
        calls: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl TokenReviewer for FakeReviewer {
        async fn review(&self, token: &str) -> Result<UserInfo, AuthError> {
            self.calls.lock().push(token.to_string());
            match token {
                "good" => Ok(UserInfo {
                    name: "alice".into(),
                    groups: vec!["devs".into()],
                    ..UserInfo::default()
                }),
                "broken" => Err(AuthError::ReviewTimeout("TokenReview")),
                _ => Err(AuthError::InvalidToken(None)),
            }
        }
    }

    fn req(auth: Option<&str>) -> Request {
        let mut b = http::Request::builder().uri("/pods");
        if let Some(a) = auth {
            b = b.header(http::header::AUTHORIZATION, a);
        }
        b.body(axum::body::Body::empty()).expect("request")
    }

    fn chain(anonymous: bool) -> (Arc<FakeReviewer>, Authenticator) {
        let f = Arc::new(FakeReviewer {
            calls: Mutex::new(vec![]),
        });
        let a = Authenticator::new(None, Some(f.clone()), Duration::from_secs(120), anonymous);
        (f, a)
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_reviewed_once_per_ttl() {
        let (f, a) = chain(false);
        for _ in 0..3 {
            let mut r = req(Some("Bearer good"));
            let u = a.authenticate(&mut r).await.expect("ok").expect("user");
            assert_eq!(u.name, "alice");
            assert_eq!(u.groups, vec!["devs", "system:authenticated"]);
            assert!(r.headers().get(http::header::AUTHORIZATION).is_none());
        }
        assert_eq!(f.calls.lock().len(), 1);
        for _ in 0..2 {
            assert!(matches!(
                a.authenticate(&mut req(Some("bearer bad"))).await,
                Err(AuthError::InvalidToken(_))
            ));
        }
        assert_eq!(f.calls.lock().len(), 2);
        // Failures of the review itself are not cached.
        for _ in 0..2 {
            assert!(
                a.authenticate(&mut req(Some("Bearer broken")))
                    .await
                    .is_err()
            );
        }
        assert_eq!(f.calls.lock().len(), 4);
        tokio::time::advance(Duration::from_secs(121)).await;
        a.authenticate(&mut req(Some("Bearer good")))
            .await
            .expect("ok");
        assert_eq!(f.calls.lock().len(), 5);
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled_and_never_after_an_error() {
        let (_, off) = chain(false);
        assert_eq!(
            off.authenticate(&mut req(None)).await.expect("no error"),
            None
        );
        // Not a bearer token: nothing recognised, not an error.
        assert_eq!(
            off.authenticate(&mut req(Some("Basic abc")))
                .await
                .expect("no error"),
            None
        );
        let (_, on) = chain(true);
        let u = on
            .authenticate(&mut req(None))
            .await
            .expect("ok")
            .expect("anonymous");
        assert_eq!(u.name, "system:anonymous");
        assert_eq!(u.groups, vec!["system:unauthenticated"]);
        assert!(on.authenticate(&mut req(Some("Bearer bad"))).await.is_err());
    }

    fn ca(cn: &str) -> (rcgen::CertificateParams, rcgen::KeyPair, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let pem = p.self_signed(&key).expect("ca").pem();
        (p, key, pem)
    }

    fn leaf(
        ca: &(rcgen::CertificateParams, rcgen::KeyPair, String),
        cn: &str,
    ) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "team-a");
        if !cn.is_empty() {
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        }
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let issuer = rcgen::Issuer::from_params(&ca.0, &ca.1);
        p.signed_by(&key, &issuer).expect("leaf").der().clone()
    }

    #[tokio::test]
    async fn client_certificates_name_user_and_groups_and_follow_ca_reloads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.crt");
        let (old, new) = (ca("old-ca"), ca("new-ca"));
        tokio::fs::write(&path, &old.2).await.expect("write");
        let c = ClientCa::load(path.clone()).await.expect("loads");
        let u = c
            .authenticate(&[leaf(&old, "bob")])
            .expect("verifies")
            .expect("user");
        assert_eq!(u.name, "bob");
        assert_eq!(u.groups, vec!["team-a"]);
        assert_eq!(c.authenticate(&[leaf(&old, "")]).expect("verifies"), None);
        assert!(matches!(
            c.authenticate(&[leaf(&new, "eve")]),
            Err(AuthError::Certificate(_))
        ));
        // A broken file keeps the last good bundle.
        tokio::fs::write(&path, "garbage").await.expect("write");
        c.reload().await;
        assert!(c.authenticate(&[leaf(&old, "bob")]).is_ok());
        tokio::fs::write(&path, &new.2).await.expect("write");
        c.reload().await;
        assert_eq!(
            c.authenticate(&[leaf(&new, "eve")])
                .expect("verifies")
                .map(|u| u.name),
            Some("eve".to_string())
        );
        assert!(c.authenticate(&[leaf(&old, "bob")]).is_err());
        assert!(matches!(
            ClientCa::load(dir.path().join("missing")).await,
            Err(AuthError::ClientCa { .. })
        ));
    }
}
