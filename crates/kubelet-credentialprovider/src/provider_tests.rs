//! Tests of one provider: matching, cache by key type and duration (on
//! paused time), single flight and token mode, with a fake plugin.
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::api::AuthConfig;
use crate::config::TokenAttributes;
use crate::serviceaccount::{ServiceAccountData, ServiceAccountTokens, TokenSourceError};

/// What the plugin was sent: image, token and annotations.
type Sent = (String, String, BTreeMap<String, String>);

/// Answers with a fixed response after an optional wait; counts runs and
/// keeps what it was sent.
#[derive(Default)]
struct FakePlugin {
    key_type: Option<CacheKeyType>,
    duration: Option<Nanos>,
    runs: AtomicUsize,
    delay: Option<Duration>,
    fail: bool,
    /// Answer with the token sent as the password.
    echo_token: bool,
    sent: Mutex<Vec<Sent>>,
}

#[async_trait::async_trait]
impl Plugin for FakePlugin {
    async fn exec_plugin(
        &self,
        image: &str,
        token: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<CredentialProviderResponse, Error> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        self.sent
            .lock()
            .push((image.into(), token.into(), annotations.clone()));
        if let Some(d) = self.delay {
            tokio::time::sleep(d).await;
        }
        if self.fail {
            return Err(Error::DecodeResponse);
        }
        Ok(CredentialProviderResponse {
            cache_key_type: self.key_type.ok_or_else(|| "Forever".to_string()),
            cache_duration: self.duration,
            auth: BTreeMap::from([(
                parse_registry(image).to_string(),
                AuthConfig {
                    username: format!("user{n}"),
                    password: if self.echo_token {
                        token.into()
                    } else {
                        "pw".into()
                    },
                },
            )]),
        })
    }
}

const MIN: Nanos = 60_000_000_000;

fn provider(plugin: Arc<FakePlugin>, default_ttl: Nanos) -> PluginProvider {
    PluginProvider::new(
        "fake",
        vec!["*.registry.io".into(), "registry.io:5000".into()],
        default_ttl,
        plugin,
        None,
    )
}

fn user(c: &DockerConfig) -> Option<&str> {
    c.values().next().map(|e| e.username.as_str())
}

#[test]
fn match_images_as_upstream_urls_match_str() {
    let p = provider(Arc::default(), 0);
    for (image, want) in [
        ("foo.registry.io/app", true),
        ("foo.registry.io:443/app", false),
        ("a.b.registry.io/app", false),
        ("registry.io/app", false),
        ("registry.io:5000/app", true),
        ("registry.io:5001/app", false),
        ("other.io/app", false),
    ] {
        assert_eq!(p.is_image_allowed(image), want, "{image}");
    }
    let with_path = PluginProvider::new(
        "p",
        vec!["reg.io/team".into(), "*.*.example.com".into()],
        0,
        Arc::new(FakePlugin::default()),
        None,
    );
    assert!(with_path.is_image_allowed("reg.io/team/app"));
    assert!(!with_path.is_image_allowed("reg.io/other/app"));
    assert!(with_path.is_image_allowed("a.b.example.com/x"));
    assert!(!with_path.is_image_allowed("b.example.com/x"));
}

#[tokio::test(start_paused = true)]
async fn unmatched_images_never_run_the_plugin() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Image),
        ..Default::default()
    });
    let p = provider(plugin.clone(), MIN);
    assert!(
        p.provide("other.io/app", &PullPod::default())
            .await
            .is_empty()
    );
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn image_key_caches_per_image_for_the_default_duration() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Image),
        ..Default::default()
    });
    let p = provider(plugin.clone(), MIN);
    let pod = PullPod::default();
    assert_eq!(
        user(&p.provide("a.registry.io/one", &pod).await),
        Some("user1")
    );
    assert_eq!(
        user(&p.provide("a.registry.io/one", &pod).await),
        Some("user1")
    );
    // Another image of the same registry is another key.
    assert_eq!(
        user(&p.provide("a.registry.io/two", &pod).await),
        Some("user2")
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(
        user(&p.provide("a.registry.io/one", &pod).await),
        Some("user3")
    );
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn registry_and_global_keys_serve_other_images_for_the_response_s_duration() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Registry),
        duration: Some(5 * MIN),
        ..Default::default()
    });
    let p = provider(plugin.clone(), MIN);
    let pod = PullPod::default();
    p.provide("a.registry.io/one", &pod).await;
    // The response's five minutes, not the default one.
    tokio::time::advance(Duration::from_secs(120)).await;
    assert_eq!(
        user(&p.provide("a.registry.io/two", &pod).await),
        Some("user1")
    );
    assert_eq!(
        user(&p.provide("b.registry.io/two", &pod).await),
        Some("user2")
    );
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 2);

    let global = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Global),
        ..Default::default()
    });
    let g = provider(global.clone(), MIN);
    g.provide("a.registry.io/one", &pod).await;
    g.provide("b.registry.io/two", &pod).await;
    g.provide("registry.io:5000/three", &pod).await;
    assert_eq!(global.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn zero_durations_and_bad_answers_are_not_cached() {
    let pod = PullPod::default();
    // The response says 0: never cached, whatever the default.
    let zero = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Global),
        duration: Some(0),
        ..Default::default()
    });
    let p = provider(zero.clone(), MIN);
    p.provide("a.registry.io/x", &pod).await;
    p.provide("a.registry.io/x", &pod).await;
    assert_eq!(zero.runs.load(Ordering::SeqCst), 2);
    // No duration and a default of 0: not cached either.
    let none = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Global),
        ..Default::default()
    });
    let p = provider(none.clone(), 0);
    p.provide("a.registry.io/x", &pod).await;
    p.provide("a.registry.io/x", &pod).await;
    assert_eq!(none.runs.load(Ordering::SeqCst), 2);
    // An invalid cacheKeyType or a failed run gives nothing.
    let bad = Arc::new(FakePlugin::default());
    assert!(
        provider(bad, MIN)
            .provide("a.registry.io/x", &pod)
            .await
            .is_empty()
    );
    let failing = Arc::new(FakePlugin {
        fail: true,
        ..Default::default()
    });
    assert!(
        provider(failing, MIN)
            .provide("a.registry.io/x", &pod)
            .await
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_asks_for_one_image_run_the_plugin_once() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Image),
        duration: Some(0),
        delay: Some(Duration::from_secs(2)),
        ..Default::default()
    });
    let p = Arc::new(provider(plugin.clone(), 0));
    let asks: Vec<_> = (0..4)
        .map(|i| {
            let p = p.clone();
            let image = if i < 3 {
                "a.registry.io/same"
            } else {
                "a.registry.io/other"
            };
            tokio::spawn(async move { p.provide(image, &PullPod::default()).await })
        })
        .collect();
    let mut users = Vec::new();
    for a in asks {
        users.push(user(&a.await.expect("task")).map(str::to_string));
    }
    // Three asks for the same image shared one run; the other image had its own.
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 2);
    assert_eq!(users[0], users[1]);
    assert_eq!(users[1], users[2]);
    assert_ne!(users[0], users[3]);
    // The flight is over: the next ask runs the plugin again (nothing cached).
    p.provide("a.registry.io/same", &PullPod::default()).await;
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 3);
}

/// Service accounts with annotations, and tokens named after the pod.
struct FakeTokens;

#[async_trait::async_trait]
impl ServiceAccountTokens for FakeTokens {
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ServiceAccountData, TokenSourceError> {
        if name == "missing" {
            return Err("serviceaccount \"missing\" not found".into());
        }
        let mut annotations = BTreeMap::from([("other".to_string(), "x".to_string())]);
        if name != "plain" {
            annotations.insert("example.com/role".into(), format!("{namespace}-{name}"));
        }
        Ok(ServiceAccountData {
            uid: format!("uid-{name}"),
            annotations,
        })
    }

    async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
        pod_name: &str,
        _pod_uid: &str,
    ) -> Result<String, TokenSourceError> {
        Ok(format!(
            "{audience}:{namespace}/{service_account}:{pod_name}"
        ))
    }
}

fn token_provider(
    plugin: Arc<FakePlugin>,
    require: bool,
    tokens: Option<Arc<dyn ServiceAccountTokens>>,
) -> PluginProvider {
    let attrs = TokenAttributes {
        service_account_token_audience: "registry.io".into(),
        require_service_account: Some(require),
        required_service_account_annotation_keys: if require {
            vec!["example.com/role".into()]
        } else {
            vec![]
        },
        optional_service_account_annotation_keys: vec!["example.com/absent".into()],
        cache_type: "ServiceAccount".into(),
    };
    let mode = ServiceAccountMode::new(Some(&attrs), true, tokens);
    assert!(mode.is_some());
    PluginProvider::new("sa", vec!["*.registry.io".into()], MIN, plugin, mode)
}

fn pod(sa: &str, name: &str) -> PullPod {
    PullPod {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        service_account_name: sa.into(),
    }
}

#[tokio::test(start_paused = true)]
async fn token_mode_sends_the_pod_s_token_and_caches_per_service_account() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Registry),
        ..Default::default()
    });
    let p = token_provider(plugin.clone(), true, Some(Arc::new(FakeTokens)));
    assert_eq!(
        user(&p.provide("a.registry.io/x", &pod("builder", "p1")).await),
        Some("user1")
    );
    assert_eq!(
        plugin.sent.lock()[0],
        (
            "a.registry.io/x".to_string(),
            "registry.io:ns/builder:p1".to_string(),
            BTreeMap::from([("example.com/role".to_string(), "ns-builder".to_string())]),
        )
    );
    // Another pod of the same service account: the cached answer.
    assert_eq!(
        user(&p.provide("a.registry.io/y", &pod("builder", "p2")).await),
        Some("user1")
    );
    // Another service account: its own run.
    assert_eq!(
        user(&p.provide("a.registry.io/x", &pod("deployer", "p3")).await),
        Some("user2")
    );
    // No service account when one is required, a missing required
    // annotation, an unreadable service account: no run, no credentials.
    for sa in ["", "plain", "missing"] {
        assert!(
            p.provide("a.registry.io/x", &pod(sa, "p4"))
                .await
                .is_empty(),
            "{sa:?}"
        );
    }
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn token_mode_without_a_token_source_runs_only_for_pods_without_a_service_account() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Image),
        ..Default::default()
    });
    let p = token_provider(plugin.clone(), false, None);
    assert!(
        p.provide("a.registry.io/x", &pod("builder", "p1"))
            .await
            .is_empty()
    );
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 0);
    // A pod without a service account, where the config allows it: no token.
    assert_eq!(
        user(&p.provide("a.registry.io/x", &pod("", "p2")).await),
        Some("user1")
    );
    assert_eq!(plugin.sent.lock()[0].1, "");
    // The gate off: no token mode at all.
    let attrs = TokenAttributes {
        service_account_token_audience: "a".into(),
        ..Default::default()
    };
    assert!(ServiceAccountMode::new(Some(&attrs), false, None).is_none());
}

/// Never answers.
struct HangingTokens;

#[async_trait::async_trait]
impl ServiceAccountTokens for HangingTokens {
    async fn service_account(
        &self,
        _: &str,
        _: &str,
    ) -> Result<ServiceAccountData, TokenSourceError> {
        std::future::pending().await
    }

    async fn token(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<String, TokenSourceError> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_source_that_hangs_gives_no_credentials_after_its_deadline() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Image),
        ..Default::default()
    });
    let p = token_provider(plugin.clone(), false, Some(Arc::new(HangingTokens)));
    let started = tokio::time::Instant::now();
    assert!(
        p.provide("a.registry.io/x", &pod("builder", "p1"))
            .await
            .is_empty()
    );
    assert_eq!(
        started.elapsed(),
        crate::serviceaccount::TOKEN_SOURCE_DEADLINE
    );
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn the_token_echoed_as_the_password_is_refused_unless_cached_by_token() {
    let plugin = Arc::new(FakePlugin {
        key_type: Some(CacheKeyType::Registry),
        echo_token: true,
        ..Default::default()
    });
    let p = token_provider(plugin.clone(), true, Some(Arc::new(FakeTokens)));
    assert!(
        p.provide("a.registry.io/x", &pod("builder", "p1"))
            .await
            .is_empty()
    );
    assert_eq!(plugin.runs.load(Ordering::SeqCst), 1);
    let attrs = TokenAttributes {
        service_account_token_audience: "registry.io".into(),
        cache_type: "Token".into(),
        ..Default::default()
    };
    let mode = ServiceAccountMode::new(Some(&attrs), true, Some(Arc::new(FakeTokens)));
    let p = PluginProvider::new("sa", vec!["*.registry.io".into()], MIN, plugin, mode);
    let got = p.provide("a.registry.io/x", &pod("builder", "p1")).await;
    assert_eq!(
        got.values().next().map(|e| e.password.as_str()),
        Some("registry.io:ns/builder:p1")
    );
}
