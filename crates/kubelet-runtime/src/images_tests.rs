//! Tests of the image pull path (`images.rs`).
#[tokio::test(start_paused = true)]
async fn shutdown_cancels_a_pull_in_flight() {
    let fake = FakeRuntime::new();
    fake.hang_pull("reg/huge:1");
    let mut m = ImageManager::new(Arc::new(fake.clone()));
    let stop = CancellationToken::new();
    m.shutdown = stop.clone();
    let m = Arc::new(m);
    let p = pod_with("reg/huge:1", None);
    let pull = tokio::spawn({
        let m = m.clone();
        async move {
            let c = &pod::containers(&p)[0];
            m.ensure_image_exists(&p, c, &[], UNIX_EPOCH).await
        }
    });
    // No deadline of ours: an hour later the pull is still going.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!pull.is_finished());
    assert_eq!(fake.call_count("PullImage"), 1);
    stop.cancel();
    let r = tokio::time::timeout(Duration::from_secs(1), pull)
        .await
        .expect("the pull returns at once")
        .expect("task");
    assert!(
        matches!(r, Err(Error::Shutdown { op: "PullImage" })),
        "{r:?}"
    );
    // A cancelled pull is no failure: the image does not back off.
    let p2 = pod_with("reg/huge:1", None);
    let c = &pod::containers(&p2)[0];
    let e = m.ensure_image_exists(&p2, c, &[], UNIX_EPOCH).await;
    assert!(matches!(e, Err(Error::Shutdown { .. })), "{e:?}");
}

use super::*;
use cri::fake::FakeRuntime;
use std::time::{Duration, UNIX_EPOCH};

fn pod_with(image: &str, policy: Option<&str>) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"containers": [{"name": "c", "image": image, "imagePullPolicy": policy}]}
    }))
    .expect("pod")
}

/// Keeps every event's reason and message.
#[derive(Default)]
struct Events(parking_lot::Mutex<Vec<(String, String)>>);

impl Recorder for Events {
    fn event(
        &self,
        _: &k8s_openapi::api::core::v1::ObjectReference,
        _: EventType,
        reason: &str,
        message: String,
    ) {
        self.0.lock().push((reason.to_string(), message));
    }
}

fn pull_secret(name: &str, registry: &str, user: &str, password: &str) -> Secret {
    let doc = serde_json::json!({"auths": {registry: {"username": user, "password": password}}});
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": k8s_openapi::ByteString(doc.to_string().into_bytes())},
    }))
    .expect("secret")
}

fn basic(user: &str, password: &str) -> cri::pb::AuthConfig {
    cri::pb::AuthConfig {
        username: user.into(),
        password: password.into(),
        ..Default::default()
    }
}

const PRIVATE: &str = "localhost:5001/private/app:1";

#[tokio::test]
async fn pull_tries_each_matching_credential_in_order() {
    let fake = FakeRuntime::new();
    fake.require_auth(PRIVATE, basic("right", "pw"));
    let m = ImageManager::new(Arc::new(fake.clone()));
    let p = pod_with(PRIVATE, None);
    let c = &pod::containers(&p)[0];
    let secrets = [
        pull_secret("other", "quay.io", "nobody", "x"),
        pull_secret("stale", "localhost:5001", "wrong", "old"),
        pull_secret("good", "http://localhost:5001/private", "right", "pw"),
    ];
    let id = m
        .ensure_image_exists(&p, c, &secrets, UNIX_EPOCH)
        .await
        .expect("pulled with the more specific credential");
    assert_eq!(id, format!("sha256:{PRIVATE}"));
    // The more specific location first; the other registry's never.
    assert_eq!(
        fake.pulls(),
        [(PRIVATE.to_string(), Some(basic("right", "pw"))),]
    );
}

#[tokio::test]
async fn failed_credentials_then_error_image_pull() {
    let fake = FakeRuntime::new();
    fake.require_auth(PRIVATE, basic("right", "pw"));
    let mut m = ImageManager::new(Arc::new(fake.clone()));
    let events = Arc::new(Events::default());
    m.recorder = events.clone();
    let p = pod_with(PRIVATE, None);
    let c = &pod::containers(&p)[0];
    let secrets = [
        pull_secret("a", "localhost:5001", "wrong", "1"),
        pull_secret("b", "localhost:5001", "wrong", "2"),
    ];
    let e = m
        .ensure_image_exists(&p, c, &secrets, UNIX_EPOCH)
        .await
        .expect_err("no credential works");
    assert_eq!(e.reason(), "ErrImagePull");
    // Both tried, in the secrets' order; no anonymous attempt after them.
    assert_eq!(
        fake.pulls(),
        [
            (PRIVATE.to_string(), Some(basic("wrong", "1"))),
            (PRIVATE.to_string(), Some(basic("wrong", "2"))),
        ]
    );
    // The same runtime message twice is reported once.
    let (reason, message) = events.0.lock().last().cloned().expect("event");
    assert_eq!(reason, "Failed");
    assert_eq!(
        message,
        format!(
            "Failed to pull image \"{PRIVATE}\": failed to pull and unpack image \"{PRIVATE}\": \
             failed to resolve reference \"{PRIVATE}\": unexpected status from HEAD request: 401 Unauthorized"
        )
    );
    // Backoff as for any failed pull.
    let e = m
        .ensure_image_exists(&p, c, &secrets, UNIX_EPOCH + Duration::from_secs(1))
        .await
        .expect_err("backoff");
    assert_eq!(e.reason(), "ImagePullBackOff");
}

#[tokio::test]
async fn no_matching_credential_pulls_anonymously() {
    let fake = FakeRuntime::new();
    fake.require_auth(PRIVATE, basic("right", "pw"));
    let m = ImageManager::new(Arc::new(fake.clone()));
    let p = pod_with(PRIVATE, None);
    let c = &pod::containers(&p)[0];
    let secrets = [pull_secret("hub", "https://index.docker.io/v1/", "u", "p")];
    let e = m
        .ensure_image_exists(&p, c, &secrets, UNIX_EPOCH)
        .await
        .expect_err("private");
    assert_eq!(e.reason(), "ErrImagePull");
    assert_eq!(fake.pulls(), [(PRIVATE.to_string(), None)]);
    // Docker Hub credentials serve an unqualified name.
    let p = pod_with("busybox:1.35", None);
    let c = &pod::containers(&p)[0];
    m.ensure_image_exists(&p, c, &secrets, UNIX_EPOCH)
        .await
        .expect("pulled");
    assert_eq!(
        fake.pulls()[1],
        ("busybox:1.35".to_string(), Some(basic("u", "p")))
    );
}

#[tokio::test]
async fn malformed_secret_or_image_name_fails_without_pulling() {
    let fake = FakeRuntime::new();
    let m = ImageManager::new(Arc::new(fake.clone()));
    let p = pod_with(PRIVATE, None);
    let c = &pod::containers(&p)[0];
    let mut bad = pull_secret("bad", "localhost:5001", "u", "p");
    bad.data = Some(
        [(
            ".dockerconfigjson".to_string(),
            k8s_openapi::ByteString(b"{not json".to_vec()),
        )]
        .into(),
    );
    let e = m
        .ensure_image_exists(&p, c, &[bad], UNIX_EPOCH)
        .await
        .expect_err("malformed secret");
    assert_eq!(e.reason(), "ErrImagePull");
    assert!(
        e.to_string()
            .contains("error occurred while trying to unmarshal json"),
        "{e}"
    );
    let p = pod_with("reg.io/Upper:1", None);
    let c = &pod::containers(&p)[0];
    let e = m
        .ensure_image_exists(&p, c, &[], UNIX_EPOCH)
        .await
        .expect_err("invalid name");
    assert_eq!(e.reason(), "InvalidImageName");
    assert!(fake.pulls().is_empty());
}

#[tokio::test]
async fn pull_policies_and_backoff() {
    let fake = FakeRuntime::new();
    let m = ImageManager::new(Arc::new(fake.clone()));
    let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);

    // IfNotPresent pulls once, then uses what is there.
    let p = pod_with("reg/a:1", None);
    let c = &pod::containers(&p)[0];
    assert!(m.ensure_image_exists(&p, c, &[], t0).await.is_ok());
    assert!(m.ensure_image_exists(&p, c, &[], t0).await.is_ok());
    assert_eq!(fake.call_count("PullImage"), 1);

    // Always pulls every time.
    let p = pod_with("reg/a:1", Some("Always"));
    let c = &pod::containers(&p)[0];
    assert!(m.ensure_image_exists(&p, c, &[], t0).await.is_ok());
    assert_eq!(fake.call_count("PullImage"), 2);

    // Never with a missing image.
    let p = pod_with("reg/b:1", Some("Never"));
    let c = &pod::containers(&p)[0];
    let e = m
        .ensure_image_exists(&p, c, &[], t0)
        .await
        .expect_err("never");
    assert_eq!(e.reason(), "ErrImageNeverPull");

    // A failing pull: ErrImagePull, then ImagePullBackOff inside the window, then a retry.
    fake.set_image_missing("reg/missing:1");
    let p = pod_with("reg/missing:1", None);
    let c = &pod::containers(&p)[0];
    let e = m
        .ensure_image_exists(&p, c, &[], t0)
        .await
        .expect_err("missing");
    assert_eq!(e.reason(), "ErrImagePull");
    let e = m
        .ensure_image_exists(&p, c, &[], t0 + Duration::from_secs(5))
        .await
        .expect_err("backoff");
    assert_eq!(e.reason(), "ImagePullBackOff");
    let pulls = fake.call_count("PullImage");
    let e = m
        .ensure_image_exists(&p, c, &[], t0 + Duration::from_secs(11))
        .await
        .expect_err("retry");
    assert_eq!(e.reason(), "ErrImagePull");
    assert_eq!(fake.call_count("PullImage"), pulls + 1);
    // The window doubled: 20s from the second failure.
    let e = m
        .ensure_image_exists(&p, c, &[], t0 + Duration::from_secs(25))
        .await
        .expect_err("backoff 2");
    assert_eq!(e.reason(), "ImagePullBackOff");
}

/// Plugins that answer with fixed configs and remember what they were asked.
#[derive(Debug, Default)]
struct FakeProviders {
    answers: Vec<creds::DockerConfig>,
    asked: parking_lot::Mutex<Vec<(String, PullPod)>>,
}

#[async_trait::async_trait]
impl ExternalCredentialProviders for FakeProviders {
    async fn provide(&self, image: &str, pod: &PullPod) -> Vec<creds::DockerConfig> {
        self.asked.lock().push((image.to_string(), pod.clone()));
        self.answers.clone()
    }
}

fn docker_config(registry: &str, user: &str, password: &str) -> creds::DockerConfig {
    [(
        registry.to_string(),
        creds::DockerConfigEntry {
            username: user.into(),
            password: password.into(),
            ..Default::default()
        },
    )]
    .into()
}

#[tokio::test]
async fn plugin_credentials_come_after_the_pull_secrets_most_specific_first() {
    let fake = FakeRuntime::new();
    fake.require_auth(PRIVATE, basic("plugin-b", "pw"));
    let providers = Arc::new(FakeProviders {
        answers: vec![
            docker_config("localhost:5001", "plugin-a", "x"),
            docker_config("localhost:5001/private", "plugin-b", "pw"),
            docker_config("quay.io", "elsewhere", "x"),
        ],
        ..Default::default()
    });
    let m = ImageManager::new(Arc::new(fake.clone()))
        .with_credential_providers(Some(providers.clone()));
    let mut p = pod_with(PRIVATE, None);
    p.metadata.namespace = Some("ns".into());
    p.spec.as_mut().expect("spec").service_account_name = Some("puller".into());
    let c = &pod::containers(&p)[0];
    let secrets = [pull_secret("stale", "localhost:5001", "secret", "old")];
    m.ensure_image_exists(&p, c, &secrets, UNIX_EPOCH)
        .await
        .expect("pulled with a plugin's credentials");
    // The pull secret first; then the plugins' answers as one keyring: the
    // longer location of the second plugin before the first plugin's.
    assert_eq!(
        fake.pulls(),
        [
            (PRIVATE.to_string(), Some(basic("secret", "old"))),
            (PRIVATE.to_string(), Some(basic("plugin-b", "pw"))),
        ]
    );
    let asked = providers.asked.lock().clone();
    assert_eq!(
        asked,
        [(
            "localhost:5001/private/app".to_string(),
            PullPod {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
                service_account_name: "puller".into(),
            }
        )]
    );
}

#[tokio::test]
async fn plugins_are_not_asked_when_the_secrets_do_not_parse_or_nothing_is_pulled() {
    let fake = FakeRuntime::new();
    let providers = Arc::new(FakeProviders::default());
    let m = ImageManager::new(Arc::new(fake.clone()))
        .with_credential_providers(Some(providers.clone()));
    let p = pod_with(PRIVATE, None);
    let c = &pod::containers(&p)[0];
    let mut bad = pull_secret("bad", "localhost:5001", "u", "p");
    bad.data = Some(
        [(
            ".dockerconfigjson".to_string(),
            k8s_openapi::ByteString(b"[]".to_vec()),
        )]
        .into(),
    );
    let e = m
        .ensure_image_exists(&p, c, &[bad], UNIX_EPOCH)
        .await
        .expect_err("malformed secret");
    assert_eq!(e.reason(), "ErrImagePull");
    assert!(providers.asked.lock().is_empty());
    // No plugin answer matches: anonymous, once.
    let p = pod_with("reg/a:1", None);
    let c = &pod::containers(&p)[0];
    m.ensure_image_exists(&p, c, &[], UNIX_EPOCH)
        .await
        .expect("pulled");
    assert_eq!(fake.pulls(), [("reg/a:1".to_string(), None)]);
    assert_eq!(providers.asked.lock().len(), 1);
    // Present and IfNotPresent: no pull, no plugin.
    m.ensure_image_exists(&p, c, &[], UNIX_EPOCH)
        .await
        .expect("present");
    assert_eq!(providers.asked.lock().len(), 1);
}

/// Plugins that never answer for one repository and answer nothing for
/// the others.
#[derive(Debug)]
struct HangingProviders(&'static str);

#[async_trait::async_trait]
impl ExternalCredentialProviders for HangingProviders {
    async fn provide(&self, image: &str, _: &PullPod) -> Vec<creds::DockerConfig> {
        if image == self.0 {
            std::future::pending::<()>().await;
        }
        Vec::new()
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_plugin_holds_up_only_its_own_pull() {
    let fake = FakeRuntime::new();
    let m = Arc::new(
        ImageManager::new(Arc::new(fake.clone())).with_credential_providers(Some(Arc::new(
            HangingProviders("localhost:5001/private/app"),
        ))),
    );
    let stuck = tokio::spawn({
        let m = m.clone();
        async move {
            let p = pod_with(PRIVATE, None);
            let c = &pod::containers(&p)[0];
            m.ensure_image_exists(&p, c, &[], UNIX_EPOCH).await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!stuck.is_finished());
    // Another image pulls while the first still waits for its plugin.
    let p = pod_with("reg/other:1", None);
    let c = &pod::containers(&p)[0];
    tokio::time::timeout(
        Duration::from_secs(60),
        m.ensure_image_exists(&p, c, &[], UNIX_EPOCH),
    )
    .await
    .expect("not held up by the hung plugin")
    .expect("pulled");
    assert_eq!(fake.pulls(), [("reg/other:1".to_string(), None)]);
    assert!(!stuck.is_finished());
    stuck.abort();
}
