//! The token manager's refresh rule on paused time, with a fake TokenRequest
//! API.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

use k8s_openapi::api::authentication::v1::TokenRequestStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_client::clock::TokioClock;

use super::*;

/// Issues `t1`, `t2`, ... expiring `expirationSeconds` (or `ttl_override`)
/// after now, plus `skew` seconds; fails while `fail` is set.
struct Fake {
    clock: Arc<dyn Clock>,
    calls: AtomicUsize,
    fail: AtomicBool,
    skew: AtomicI64,
    ttl_override: AtomicI64,
    last: Mutex<Option<ApiTokenRequest>>,
}

impl Fake {
    fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            clock,
            calls: AtomicUsize::new(0),
            fail: AtomicBool::new(false),
            skew: AtomicI64::new(0),
            ttl_override: AtomicI64::new(0),
            last: Mutex::new(None),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl TokenSource for Fake {
    async fn create_token(
        &self,
        _: &str,
        _: &str,
        req: &ApiTokenRequest,
    ) -> Result<ApiTokenRequest, ObjectError> {
        *self.last.lock() = Some(req.clone());
        if self.fail.load(Ordering::SeqCst) {
            return Err(ObjectError::Other("apiserver down".into()));
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let mut answer = req.clone();
        let ttl = match self.ttl_override.load(Ordering::SeqCst) {
            0 => req.spec.expiration_seconds.unwrap_or(3600),
            t => t,
        };
        answer.spec.expiration_seconds = Some(ttl);
        let exp =
            self.clock.now() + SignedDuration::from_secs(ttl + self.skew.load(Ordering::SeqCst));
        answer.status = Some(TokenRequestStatus {
            token: format!("t{n}"),
            expiration_timestamp: Time(exp),
        });
        Ok(answer)
    }
}

fn request(uid: &str, seconds: i64) -> TokenRequest {
    TokenRequest {
        namespace: "ns".into(),
        service_account: "default".into(),
        audience: "vault".into(),
        expiration_seconds: seconds,
        pod_name: "p".into(),
        pod_uid: uid.into(),
    }
}

fn manager() -> (TokenManager, Arc<Fake>, CancellationToken) {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::default());
    let fake = Fake::new(clock.clone());
    let stop = CancellationToken::new();
    let m = TokenManager::with_source(fake.clone(), clock, &TaskTracker::new(), &stop);
    (m, fake, stop)
}

async fn advance(secs: u64) {
    tokio::time::advance(Duration::from_secs(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn a_token_is_reused_until_80_percent_of_its_lifetime() {
    let (m, fake, _stop) = manager();
    let req = request("u1", 3600);
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t1");
    let sent = fake.last.lock().clone().unwrap();
    assert_eq!(sent.spec.audiences, ["vault"]);
    assert_eq!(sent.spec.expiration_seconds, Some(3600));
    let bound = sent.spec.bound_object_ref.unwrap();
    assert_eq!(
        (bound.kind.as_deref(), bound.api_version.as_deref()),
        (Some("Pod"), Some("v1"))
    );
    assert_eq!(
        (bound.name.as_deref(), bound.uid.as_deref()),
        (Some("p"), Some("u1"))
    );

    // 80% of 3600 s is 2880 s; jitter moves the refresh up to 9 s earlier.
    advance(2880 - 10).await;
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t1");
    assert_eq!(fake.calls(), 1, "no refresh before 80% minus the jitter");
    advance(11).await;
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t2");
    assert_eq!(fake.calls(), 2);
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t2");
    assert_eq!(fake.calls(), 2, "the new token is cached");
}

#[tokio::test(start_paused = true)]
async fn requests_differing_in_any_field_have_their_own_tokens() {
    let (m, fake, _stop) = manager();
    let a = request("u1", 3600);
    let mut b = a.clone();
    b.audience = "other".into();
    let c = request("u2", 3600);
    assert_eq!(m.get_service_account_token(&a).await.unwrap(), "t1");
    assert_eq!(m.get_service_account_token(&b).await.unwrap(), "t2");
    assert_eq!(m.get_service_account_token(&c).await.unwrap(), "t3");
    assert_eq!(m.get_service_account_token(&a).await.unwrap(), "t1");
    assert_eq!(fake.calls(), 3);
    assert_eq!(m.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_token_older_than_24_hours_is_refreshed_whatever_its_lifetime() {
    let (m, fake, _stop) = manager();
    let req = request("u1", 7 * 24 * 3600);
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t1");
    advance(24 * 3600 - 10).await;
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t1");
    advance(11).await;
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t2");
    assert_eq!(fake.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_answers_lifetime_not_the_requested_one_drives_refresh() {
    let (m, fake, _stop) = manager();
    // The apiserver extends the token to two hours.
    fake.ttl_override.store(7200, Ordering::SeqCst);
    let req = request("u1", 3600);
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t1");
    advance(2880 + 10).await;
    assert_eq!(
        m.get_service_account_token(&req).await.unwrap(),
        "t1",
        "80% of 7200 s is not reached"
    );
    advance(5760 - 2890 + 1).await;
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t2");
}

#[tokio::test(start_paused = true)]
async fn a_token_issued_in_the_future_is_refreshed() {
    let (m, fake, _stop) = manager();
    // The token says it was issued 100 s from now (the clock went back).
    fake.skew.store(100, Ordering::SeqCst);
    let req = request("u1", 3600);
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t1");
    fake.skew.store(0, Ordering::SeqCst);
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t2");
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t2");
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_serves_the_old_token_until_it_expires() {
    let (m, fake, _stop) = manager();
    let req = request("u1", 3600);
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), "t1");
    fake.fail.store(true, Ordering::SeqCst);
    advance(3000).await;
    assert_eq!(
        m.get_service_account_token(&req).await.unwrap(),
        "t1",
        "still valid"
    );
    advance(601).await;
    let e = m.get_service_account_token(&req).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "token \"default\"/\"ns\"/[]string{\"vault\"}/3600/v1.BoundObjectReference{Kind:\"Pod\", APIVersion:\"v1\", Name:\"p\", UID:\"u1\"} expired and refresh failed: apiserver down"
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_cached_token_a_failure_is_an_error() {
    let (m, fake, _stop) = manager();
    fake.fail.store(true, Ordering::SeqCst);
    let e = m
        .get_service_account_token(&request("u1", 3600))
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "failed to fetch token: apiserver down");
}

#[tokio::test(start_paused = true)]
async fn expired_tokens_are_dropped_by_the_periodic_cleanup() {
    let (m, _fake, _stop) = manager();
    m.get_service_account_token(&request("u1", 600))
        .await
        .unwrap();
    m.get_service_account_token(&request("u2", 3600))
        .await
        .unwrap();
    assert_eq!(m.len(), 2);
    // Past the first token's expiry, then one cleanup period.
    advance(601).await;
    assert_eq!(m.len(), 2, "cleanup runs once a minute, not on expiry");
    advance(60).await;
    tokio::task::yield_now().await;
    assert_eq!(m.len(), 1, "the expired token is gone");
}

#[tokio::test(start_paused = true)]
async fn a_removed_pods_tokens_are_forgotten() {
    let (m, fake, _stop) = manager();
    let a = request("u1", 3600);
    m.get_service_account_token(&a).await.unwrap();
    m.get_service_account_token(&request("u2", 3600))
        .await
        .unwrap();
    m.delete_service_account_token("u1");
    assert_eq!(m.len(), 1);
    assert_eq!(m.get_service_account_token(&a).await.unwrap(), "t3");
    assert_eq!(fake.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_empty_audience_asks_for_the_apiservers_default() {
    let (m, fake, _stop) = manager();
    let mut req = request("u1", 3600);
    req.audience.clear();
    m.get_service_account_token(&req).await.unwrap();
    let sent = fake.last.lock().clone().unwrap();
    assert!(sent.spec.audiences.is_empty());
    assert!(cache_key(&req).contains("/[]string(nil)/"));
}

#[tokio::test]
async fn standalone_cannot_fetch_tokens() {
    let m = TokenManager::new(
        None,
        Arc::new(TokioClock::default()),
        &TaskTracker::new(),
        &CancellationToken::new(),
    );
    let e = m
        .get_service_account_token(&request("u1", 3600))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "failed to fetch token: cannot use TokenManager when kubelet is in standalone mode"
    );
}
