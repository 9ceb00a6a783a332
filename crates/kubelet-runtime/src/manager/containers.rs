//! Starting and stopping containers (upstream `kuberuntime_container.go`
//! `startContainer`, `killContainer`): crash-loop backoff, image pull,
//! create, start, and the events and waiting reasons of each step.

use std::time::{Duration, SystemTime};

use cri::pb;
use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};
use kubelet_metrics::StartPhase;
use kubelet_types::events::{EventType, pod_ref, reason};
use kubelet_types::pod;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::kill::Kill;
use super::{KubeRuntimeManager, SyncResult};
use crate::actions::KillReason;
use crate::container::{backoff_key, container_config};
use crate::ephemeral;
use crate::pod_status::{ContainerState, PodStatus};
use crate::sandbox::pod_logs_dir;
use crate::{Error, Result};

/// Upstream `ErrPostStartHook`: the waiting reason after a failed postStart hook.
const POST_START_HOOK_ERROR: &str = "PostStartHookError";

/// How long a postStart hook may run. Upstream gives it no deadline;
/// kubelet-rs bounds every outside call, generously.
const POST_START_TIMEOUT: Duration = Duration::from_secs(300);

impl KubeRuntimeManager {
    /// Upstream `ephemeralContainerStartSpec`: starts `ec` as the container
    /// it describes, in the PID namespace of its target container if it
    /// names one.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_ephemeral_container(
        &self,
        p: &Pod,
        ec: &EphemeralContainer,
        status: &PodStatus,
        target: (&str, &[String]),
        sandbox_cfg: &pb::PodSandboxConfig,
        now: SystemTime,
        result: &mut SyncResult,
    ) -> Result<()> {
        let c = ephemeral::as_container(ec);
        self.start_container(p, &c, Some(ec), status, target, sandbox_cfg, now, result)
            .await
    }

    /// Upstream `startContainer`: backoff, image, create, start, postStart.
    /// `ephemeral` is the ephemeral container `c` was made from, if any.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_container(
        &self,
        p: &Pod,
        c: &Container,
        ephemeral: Option<&EphemeralContainer>,
        status: &PodStatus,
        (sandbox_id, pod_ips): (&str, &[String]),
        sandbox_cfg: &pb::PodSandboxConfig,
        now: SystemTime,
        result: &mut SyncResult,
    ) -> Result<()> {
        let uid = pod::uid(p);
        let last = status.find_container(&c.name);
        if let Some(last) = last.filter(|s| s.state == ContainerState::Exited) {
            let key = backoff_key(p, c);
            let event = last.finished_at.unwrap_or(now);
            if let Some(left) = self.backoff.remaining_since(&key, event, now) {
                let window = self.backoff.get(&key).unwrap_or_default();
                let message = format!(
                    "back-off {:?} restarting failed container={} pod={}",
                    window,
                    c.name,
                    pod::describe(p)
                );
                debug!(container = %c.name, ?left, "Container in crash-loop backoff");
                self.set_reason(uid, &c.name, "CrashLoopBackOff", message.clone());
                self.recorder.event(
                    &pod_ref(p, Some(&c.name)),
                    EventType::Warning,
                    reason::BACK_OFF,
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name,
                        pod::describe(p)
                    ),
                );
                result.requeue(left);
                return Err(Error::Container {
                    reason: "CrashLoopBackOff",
                    message,
                    source: None,
                });
            }
            self.backoff.next(&key, event, now);
        }
        let step = Instant::now();
        // Upstream `getPullSecretsForPod`, read from the watch-based cache.
        let pull_secrets = match self.helper.get() {
            Some(h) => h.get_pull_secrets(p).await,
            None => vec![],
        };
        let image = self
            .images
            .ensure_image_exists(p, c, &pull_secrets, now)
            .await;
        if image.is_ok() {
            let d = step.elapsed();
            result.timings.image_pull += d;
            self.observe_phase(StartPhase::ImagePull, d);
        }
        let step = Instant::now();
        let image_ref = match image {
            Ok(r) => r,
            Err(e) => {
                if let Error::Container {
                    reason, message, ..
                } = &e
                {
                    self.set_reason(uid, &c.name, reason, message.clone());
                    self.recorder.event(
                        &pod_ref(p, Some(&c.name)),
                        EventType::Warning,
                        kubelet_types::events::reason::FAILED,
                        format!("Error: {reason}"),
                    );
                }
                return Err(e);
            }
        };
        // Upstream `verifyRunAsNonRoot` against the image's user, and
        // `fieldSeccompProfile`'s refusal of a nameless Localhost profile.
        let checked = match crate::security_context::check_seccomp(p, c) {
            Ok(()) => crate::security_context::check_non_root(&self.images, p, c, &image_ref)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        if let Err(message) = checked {
            self.set_reason(uid, &c.name, "CreateContainerConfigError", message.clone());
            self.recorder.event(
                &pod_ref(p, Some(&c.name)),
                EventType::Warning,
                reason::FAILED,
                format!("Error: {message}"),
            );
            return Err(Error::Container {
                reason: "CreateContainerConfigError",
                message,
                source: None,
            });
        }
        // Upstream `getTargetID`: the target must be running.
        let ns_target = match ephemeral.map(|ec| ephemeral::target_id(ec, status)) {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(id))) => Some(id),
            Some(Err(message)) => {
                self.set_reason(uid, &c.name, "CreateContainerConfigError", message.clone());
                self.recorder.event(
                    &pod_ref(p, Some(&c.name)),
                    EventType::Warning,
                    reason::FAILED,
                    format!("Error: {message}"),
                );
                return Err(Error::Container {
                    reason: "CreateContainerConfigError",
                    message,
                    source: None,
                });
            }
        };
        let restart_count = last.map_or(0, |s| s.restart_count + 1);
        self.prune_instances(status, &c.name).await;
        let log_dir = pod_logs_dir(&self.cfg.pod_logs_dir, p).join(&c.name);
        tokio::fs::create_dir_all(&log_dir)
            .await
            .map_err(|source| Error::Io {
                context: format!("create container log directory {}", log_dir.display()),
                source,
            })?;
        let opts = match self.helper.get() {
            Some(h) => match h.generate_run_container_options(p, c, pod_ips).await {
                Ok(o) => Some(o),
                Err(e) => {
                    // Upstream `ErrCreateContainerConfig`: the container waits
                    // with the reason and the message, and the pod is retried.
                    let message = e.message.clone();
                    self.set_reason(uid, &c.name, "CreateContainerConfigError", message.clone());
                    self.recorder.event(
                        &pod_ref(p, Some(&c.name)),
                        EventType::Warning,
                        reason::FAILED,
                        format!("Error: {message}"),
                    );
                    return Err(Error::Container {
                        reason: "CreateContainerConfigError",
                        message,
                        source: None,
                    });
                }
            },
            None => None,
        };
        let mut cfg = container_config(&self.cfg, p, c, restart_count, &image_ref, opts);
        if let Some(t) = &ns_target {
            ephemeral::apply_target(&mut cfg, t);
        }
        match crate::termination::prepare(&self.cfg.root_dir, p, c, restart_count).await {
            Ok(Some(m)) => cfg.mounts.push(m),
            Ok(None) => {}
            Err(source) => {
                return Err(Error::Io {
                    context: "create termination message file".into(),
                    source,
                });
            }
        }
        let id = match self
            .runtime
            .create_container(sandbox_id, cfg, sandbox_cfg.clone())
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let message = e.message();
                self.set_reason(uid, &c.name, "CreateContainerError", message.clone());
                self.recorder.event(
                    &pod_ref(p, Some(&c.name)),
                    EventType::Warning,
                    reason::FAILED,
                    format!("Error: {message}"),
                );
                return Err(Error::Container {
                    reason: "CreateContainerError",
                    message,
                    source: Some(e),
                });
            }
        };
        let d = step.elapsed();
        result.timings.container_create += d;
        self.observe_phase(StartPhase::ContainerCreate, d);
        self.recorder.event(
            &pod_ref(p, Some(&c.name)),
            EventType::Normal,
            reason::CREATED,
            format!("Created container: {}", c.name),
        );
        let step = Instant::now();
        if let Err(e) = self.runtime.start_container(&id).await {
            let message = e.message();
            self.set_reason(uid, &c.name, "RunContainerError", message.clone());
            self.recorder.event(
                &pod_ref(p, Some(&c.name)),
                EventType::Warning,
                reason::FAILED,
                format!("Error: {message}"),
            );
            return Err(Error::Container {
                reason: "RunContainerError",
                message,
                source: Some(e),
            });
        }
        let d = step.elapsed();
        result.timings.container_start += d;
        self.observe_phase(StartPhase::ContainerStart, d);
        self.clear_reason(uid, &c.name);
        result.started += 1;
        info!(container = %c.name, container.id = %id, restart_count, "Started container");
        self.recorder.event(
            &pod_ref(p, Some(&c.name)),
            EventType::Normal,
            reason::STARTED,
            format!("Started container {}", c.name),
        );
        self.run_post_start(p, c, &id, pod_ips).await
    }

    /// Upstream `startContainer` step 4: runs the postStart hook; when it
    /// fails, records `FailedPostStartHook`, kills the container and leaves
    /// the reason `PostStartHookError` with the hook's message.
    async fn run_post_start(
        &self,
        p: &Pod,
        c: &Container,
        id: &str,
        pod_ips: &[String],
    ) -> Result<()> {
        let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return Ok(());
        };
        let failure = match self
            .runner
            .run(id, p, c, hook, pod_ips, POST_START_TIMEOUT)
            .await
        {
            Ok(fallback) => {
                self.record_http_fallback(&pod_ref(p, None), fallback);
                return Ok(());
            }
            Err(f) => f,
        };
        warn!(container = %c.name, container.id = %id, error = %failure, "Failed to execute PostStartHook");
        // No message in the event: it could leak secrets (as upstream).
        self.recorder.event(
            &pod_ref(p, Some(&c.name)),
            EventType::Warning,
            reason::FAILED_POST_START_HOOK,
            "PostStartHook failed".into(),
        );
        let status = PodStatus {
            uid: pod::uid(p).to_string(),
            name: pod::name(p).to_string(),
            namespace: pod::namespace(p).to_string(),
            ips: pod_ips.to_vec(),
            ..Default::default()
        };
        let kill = Kill {
            pod: Some(p),
            id,
            name: &c.name,
            message: "FailedPostStartHook".into(),
            reason: KillReason::FailedPostStartHook,
            grace: None,
            grace_override: None,
        };
        if let Err(e) = self.kill_container(kill, &status, None).await {
            warn!(container = %c.name, error = %e, "Failed to kill container after its postStart hook failed");
        }
        self.set_reason(
            pod::uid(p),
            &c.name,
            POST_START_HOOK_ERROR,
            failure.message.clone(),
        );
        Err(Error::Container {
            reason: POST_START_HOOK_ERROR,
            message: failure.message,
            source: None,
        })
    }

    pub(super) async fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        match self.runtime.stop_container(id, grace).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
