//! Image pulls by policy with per-image backoff (upstream
//! `pkg/kubelet/images/image_manager.go` `EnsureImageExists`). Pulls are
//! serialized, as upstream's default `serializeImagePulls: true`. A pull
//! tries each credential the pod's image pull secrets and the node's keyring
//! hold for the image's registry, in order, and goes anonymous when none
//! matches (upstream `kuberuntime_image.go` `PullImage`).

use std::sync::Arc;

use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use std::time::SystemTime;

use cri::ImageService;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kubelet_types::pod;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::backoff::Backoff;
use crate::credentialprovider::{self as creds, BasicDockerKeyring, DockerKeyring};
use crate::{Error, Result};

/// One image to pull and what to pull it with.
struct Pull<'a> {
    image: &'a str,
    /// The normalized repository, to look credentials up with.
    repo: &'a str,
    pull_secrets: &'a [Secret],
}

/// Why a pull failed: the pod's pull secrets are malformed, or every
/// attempt failed on the runtime.
#[derive(Debug, thiserror::Error)]
enum PullError {
    #[error("{0}")]
    Keyring(creds::Error),
    #[error("{}", aggregate(.0))]
    Cri(Vec<cri::CriError>),
}

/// Upstream's error aggregate: one message as is, several distinct ones as
/// `[a, b]`.
fn aggregate(errs: &[cri::CriError]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for m in errs.iter().map(cri::CriError::message) {
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    match seen.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Ensures images are present before containers are created.
pub struct ImageManager {
    images: Arc<dyn ImageService>,
    pub(crate) recorder: Arc<dyn Recorder>,
    backoff: Backoff,
    serialize: tokio::sync::Mutex<()>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) metrics: Option<Arc<kubelet_metrics::KubeletMetrics>>,
    /// The node's own credentials, tried after the pod's pull secrets.
    pub(crate) keyring: Arc<dyn DockerKeyring>,
}

fn err(reason: &'static str, message: String) -> Error {
    Error::Container {
        reason,
        message,
        source: None,
    }
}

fn cri_err(reason: &'static str, message: String, source: cri::CriError) -> Error {
    Error::Container {
        reason,
        message,
        source: Some(source),
    }
}

impl ImageManager {
    /// A manager pulling through `images`.
    pub fn new(images: Arc<dyn ImageService>) -> Self {
        Self {
            images,
            recorder: Arc::new(kubelet_types::events::NoopRecorder),
            backoff: Backoff::default(),
            serialize: tokio::sync::Mutex::new(()),
            shutdown: CancellationToken::new(),
            metrics: None,
            keyring: Arc::new(BasicDockerKeyring::default()),
        }
    }

    /// The user the image runs as (upstream `getImageUser`): its numeric
    /// `uid`, else its user name; an image naming neither runs as root (uid 0).
    pub async fn image_user(
        &self,
        image_ref: &str,
    ) -> std::result::Result<(Option<i64>, String), cri::CriError> {
        let img = self.images.image_status(image_ref).await?;
        Ok(match img {
            Some(cri::pb::Image { uid: Some(u), .. }) => (Some(u.value), String::new()),
            Some(i) if !i.username.is_empty() => (None, i.username),
            _ => (Some(0), String::new()),
        })
    }

    /// The image ID to run `c` with, pulling it first when the policy says
    /// so, with the credentials `pull_secrets` (the pod's image pull secrets)
    /// hold for its registry. Errors carry `InvalidImageName`,
    /// `ErrImageNeverPull`, `ImagePullBackOff` or `ErrImagePull`.
    pub async fn ensure_image_exists(
        &self,
        p: &Pod,
        c: &Container,
        pull_secrets: &[Secret],
        now: SystemTime,
    ) -> Result<String> {
        let image = c.image.as_deref().unwrap_or("").trim();
        if image.is_empty() || image.contains(char::is_whitespace) {
            return Err(err(
                "InvalidImageName",
                format!("Failed to apply default image tag {image:?}"),
            ));
        }
        let repo = creds::repo_to_pull(image).map_err(|e| {
            err(
                "InvalidImageName",
                format!("Failed to apply default image tag {image:?}: {e}"),
            )
        })?;
        let policy = pod::image_pull_policy(c);
        let obj = pod_ref(p, Some(&c.name));
        let event =
            |kind, reason: &str, message: String| self.recorder.event(&obj, kind, reason, message);
        let present = self.images.image_status(image).await.map_err(|e| {
            cri_err(
                "ImageInspectError",
                format!("Failed to inspect image {image:?}: {e}"),
                e,
            )
        })?;
        match (policy, present) {
            ("Never", None) => {
                event(
                    EventType::Warning,
                    "ErrImageNeverPull",
                    format!("Container image {image:?} is not present with pull policy of Never"),
                );
                return Err(err(
                    "ErrImageNeverPull",
                    format!("Container image {image:?} is not present with pull policy of Never"),
                ));
            }
            ("Never" | "IfNotPresent", Some(img)) => {
                debug!(image, "Container image already present on machine");
                event(
                    EventType::Normal,
                    reason::PULLED,
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(img.id);
            }
            _ => {}
        }
        let key = format!("{}_{}", pod::uid(p), image);
        if let Some(left) = self.backoff.remaining_since_update(&key, now) {
            debug!(image, ?left, "Image pull backing off");
            event(
                EventType::Normal,
                reason::BACK_OFF,
                format!("Back-off pulling image {image:?}"),
            );
            return Err(err(
                "ImagePullBackOff",
                format!("Back-off pulling image {image:?}"),
            ));
        }
        // A pull has no deadline of ours (upstream sets none); shutdown cancels
        // it, and dropping the pull cancels the call on the runtime.
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => {
                info!(image, "Image pull cancelled: shutting down");
                Err(Error::Shutdown { op: "PullImage" })
            }
            r = self.pull(p, c, Pull { image, repo: &repo, pull_secrets }, policy, &key, now) => r,
        }
    }

    async fn pull(
        &self,
        p: &Pod,
        c: &Container,
        pull: Pull<'_>,
        policy: &str,
        key: &str,
        now: SystemTime,
    ) -> Result<String> {
        let image = pull.image;
        let obj = pod_ref(p, Some(&c.name));
        let event =
            |kind, reason: &str, message: String| self.recorder.event(&obj, kind, reason, message);
        // Upstream's pull duration counts the wait in the puller's queue.
        let queued = tokio::time::Instant::now();
        let _turn = self.serialize.lock().await;
        // Another pod may have pulled it while this one waited its turn.
        if policy != "Always"
            && let Ok(Some(img)) = self.images.image_status(image).await
        {
            return Ok(img.id);
        }
        info!(image, "Pulling image");
        event(
            EventType::Normal,
            reason::PULLING,
            format!("Pulling image {image:?}"),
        );
        let started = tokio::time::Instant::now();
        match self.pull_with_credentials(&pull).await {
            Ok(image_ref) => {
                self.backoff.reset(key);
                info!(image, %image_ref, "Successfully pulled image");
                event(
                    EventType::Normal,
                    reason::PULLED,
                    format!(
                        "Successfully pulled image {image:?} in {:?}",
                        started.elapsed()
                    ),
                );
                if let Some(m) = &self.metrics {
                    // Upstream reads the size back from the runtime too (`GetImageSize`).
                    let size = match self.images.image_status(image).await {
                        Ok(Some(img)) => img.size,
                        _ => 0,
                    };
                    m.observe_image_pull(size, queued.elapsed());
                }
                Ok(image_ref)
            }
            Err(e) => {
                self.backoff.next(key, now, now);
                let detail = e.to_string();
                event(
                    EventType::Warning,
                    reason::FAILED,
                    format!("Failed to pull image {image:?}: {detail}"),
                );
                let message = format!("failed to pull image {image:?}: {detail}");
                Err(match e {
                    PullError::Cri(errs) => match errs.into_iter().last() {
                        Some(last) => cri_err("ErrImagePull", message, last),
                        None => err("ErrImagePull", message),
                    },
                    PullError::Keyring(_) => err("ErrImagePull", message),
                })
            }
        }
    }

    /// Pulls with each credential that matches the image's repository in
    /// turn until one works; anonymously when none matches.
    async fn pull_with_credentials(
        &self,
        pull: &Pull<'_>,
    ) -> std::result::Result<String, PullError> {
        let keyring = creds::make_docker_keyring(pull.pull_secrets, self.keyring.clone())
            .map_err(PullError::Keyring)?;
        let candidates = keyring.lookup(pull.repo);
        if candidates.is_empty() {
            debug!(image = pull.image, "Pulling image without credentials");
            return self
                .images
                .pull_image(pull.image, None, None)
                .await
                .map_err(|e| PullError::Cri(vec![e]));
        }
        let mut errs = Vec::new();
        for auth in &candidates {
            match self
                .images
                .pull_image(pull.image, Some(auth.into()), None)
                .await
            {
                Ok(image_ref) => return Ok(image_ref),
                Err(e) => errs.push(e),
            }
        }
        Err(PullError::Cri(errs))
    }

    /// Drops backoff entries that have been quiet for long.
    pub fn gc(&self, now: SystemTime) {
        self.backoff.gc(now);
    }
}

#[cfg(test)]
mod tests {
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
        let doc =
            serde_json::json!({"auths": {registry: {"username": user, "password": password}}});
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
}
