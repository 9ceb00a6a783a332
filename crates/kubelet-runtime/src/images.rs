//! Image pulls by policy with per-image backoff (upstream
//! `pkg/kubelet/images/image_manager.go` `EnsureImageExists`). Pulls are
//! serialized, as upstream's default `serializeImagePulls: true`. A pull
//! tries each credential the pod's image pull secrets and the node's keyring
//! hold for the image's registry, then what the image credential provider
//! plugins answer for it (upstream `getPullCredentials`: pull secrets, then
//! the node keyring and the plugins), in order, and goes anonymous when none
//! matches (upstream `kuberuntime_image.go` `PullImage`). Credentials are
//! resolved before a pull waits its turn, as upstream resolves them before
//! the puller, so a slow plugin never holds up the node's other pulls.

use std::sync::Arc;

use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use std::time::SystemTime;

use cri::ImageService;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kubelet_types::pod;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::backoff::Backoff;
use crate::credentialprovider::{
    self as creds, BasicDockerKeyring, DockerKeyring, ExternalCredentialProviders, LateKeyring,
    PullPod, UnionDockerKeyring,
};
use crate::{Error, Result};

/// One image to pull and what to pull it with.
struct Pull<'a> {
    image: &'a str,
    /// The normalized repository, to look credentials up with.
    repo: &'a str,
    pull_secrets: &'a [Secret],
    /// Who the image is for (plugins in service-account token mode).
    pod: PullPod,
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
    /// The image credential provider plugins, asked after the node's keyring.
    pub(crate) providers: Option<Arc<dyn ExternalCredentialProviders>>,
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
            providers: None,
        }
    }

    /// Asks `providers` (the registered image credential provider plugins)
    /// for credentials on each pull, after the pod's pull secrets.
    #[must_use]
    pub fn with_credential_providers(
        mut self,
        providers: Option<Arc<dyn ExternalCredentialProviders>>,
    ) -> Self {
        self.providers = providers;
        self
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
            r = self.pull(p, c, Pull { image, repo: &repo, pull_secrets, pod: pull_pod(p) }, policy, &key, now) => r,
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
        // Credentials are resolved before the pull takes its turn (upstream
        // resolves them before handing the pull to the puller), so a plugin
        // or token request that hangs holds up this pull only.
        let credentials = self.credentials(&pull).await;
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
        let pulled = match credentials {
            Ok(candidates) => self.pull_with_credentials(&pull, &candidates).await,
            Err(e) => Err(e),
        };
        match pulled {
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

    /// Every credential the pod's pull secrets, the node's keyring and the
    /// plugins hold for the image's repository, most specific first.
    async fn credentials(
        &self,
        pull: &Pull<'_>,
    ) -> std::result::Result<Vec<creds::AuthConfig>, PullError> {
        let plugins = LateKeyring::new();
        let node: Arc<dyn DockerKeyring> = match &self.providers {
            Some(_) => Arc::new(UnionDockerKeyring(vec![
                self.keyring.clone(),
                plugins.clone(),
            ])),
            None => self.keyring.clone(),
        };
        let keyring =
            creds::make_docker_keyring(pull.pull_secrets, node).map_err(PullError::Keyring)?;
        if let Some(providers) = &self.providers {
            plugins.fill(&providers.provide(pull.repo, &pull.pod).await);
        }
        Ok(keyring.lookup(pull.repo))
    }

    /// Pulls with each of `candidates` in turn until one works; anonymously
    /// when there is none.
    async fn pull_with_credentials(
        &self,
        pull: &Pull<'_>,
        candidates: &[creds::AuthConfig],
    ) -> std::result::Result<String, PullError> {
        if candidates.is_empty() {
            debug!(image = pull.image, "Pulling image without credentials");
            return self
                .images
                .pull_image(pull.image, None, None)
                .await
                .map_err(|e| PullError::Cri(vec![e]));
        }
        let mut errs = Vec::new();
        for auth in candidates {
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

/// The pod's identity as a credential provider plugin may need it.
fn pull_pod(p: &Pod) -> PullPod {
    PullPod {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        service_account_name: p
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
#[path = "images_tests.rs"]
mod tests;
