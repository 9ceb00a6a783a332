//! Upstream `Kubelet.GetKubeletContainerLogs` and `validateContainerLogStatus`:
//! which instance of a container to read (the current one, or with
//! `previous` the last terminated one), its log path from CRI
//! `ContainerStatus`, then `kubelet_runtime::logs::read_logs`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kubelet_runtime::logs::{ContainerRunning, LogOptions, read_logs};
use kubelet_server::logs::{ContainerLogsHost, LogSink, LogStreamer, LogsError, PodLogOptions};
use tokio_util::sync::CancellationToken;

use super::KubeletHost;

/// Upstream `NewLogOptions`: the runtime's options from the API's, at `now`.
fn runtime_options(o: &PodLogOptions, now: jiff::Timestamp) -> LogOptions {
    let mut since = o
        .since_seconds
        .and_then(|s| now.checked_sub(jiff::SignedDuration::from_secs(s)).ok());
    if let Some(t) = o.since_time
        && since.is_none_or(|s| t > s)
    {
        since = Some(t);
    }
    LogOptions {
        tail: o.tail_lines.and_then(|t| u64::try_from(t).ok()),
        bytes: o.limit_bytes.and_then(|b| u64::try_from(b).ok()),
        since,
        follow: o.follow,
        timestamps: o.timestamps,
    }
}

fn strip_runtime(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, id)| id)
}

/// Upstream `validateContainerLogStatus`: the container ID to read.
fn container_id_for_logs(
    statuses: &[ContainerStatus],
    pod: &str,
    container: &str,
    previous: bool,
) -> Result<String, LogsError> {
    let c = || container.to_string();
    let p = || pod.to_string();
    let Some(s) = statuses.iter().find(|s| s.name == container) else {
        return Err(LogsError::NotAvailable {
            container: c(),
            pod: p(),
        });
    };
    let state = s.state.as_ref();
    let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
    let last_id = last
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    if previous {
        return last_id.ok_or_else(|| LogsError::PreviousNotFound {
            container: c(),
            pod: p(),
        });
    }
    if state.and_then(|st| st.running.as_ref()).is_some() {
        return s.container_id.clone().ok_or_else(|| LogsError::NoLogsYet {
            container: c(),
            pod: p(),
        });
    }
    if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
        return match t.container_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => Ok(id),
            None => last_id.ok_or_else(|| LogsError::Terminated {
                container: c(),
                pod: p(),
            }),
        };
    }
    if last.is_some() {
        return last_id.ok_or_else(|| LogsError::Terminated {
            container: c(),
            pod: p(),
        });
    }
    if let Some(w) = state.and_then(|st| st.waiting.as_ref()) {
        let reason = match w.reason.as_deref().unwrap_or_default() {
            "ErrImagePull" => "image can't be pulled".to_string(),
            "ImagePullBackOff" => "trying and failing to pull image".to_string(),
            other => other.to_string(),
        };
        return Err(LogsError::Waiting {
            container: c(),
            pod: p(),
            reason,
        });
    }
    Err(LogsError::NoLogsYet {
        container: c(),
        pod: p(),
    })
}

/// `ContainerStatus` over the runtime manager's CRI client.
struct Runtime(Arc<dyn cri::RuntimeService>);

#[async_trait::async_trait]
impl ContainerRunning for Runtime {
    async fn is_running(&self, id: &str) -> Result<bool, cri::CriError> {
        self.0.as_ref().is_running(id).await
    }
}

#[async_trait::async_trait]
impl ContainerLogsHost for KubeletHost {
    fn get_pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        kubelet_server::HostInterface::get_pod_by_name(self, namespace, name)
    }

    async fn container_logs(
        &self,
        pod: &Pod,
        container: &str,
        opts: &PodLogOptions,
    ) -> Result<LogStreamer, LogsError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // The status manager's view, else the pod's own (upstream).
        let status = self
            .status
            .get_pod_status(&uid)
            .or_else(|| pod.status.clone())
            .unwrap_or_default();
        let statuses: Vec<ContainerStatus> = status
            .container_statuses
            .into_iter()
            .flatten()
            .chain(status.init_container_statuses.into_iter().flatten())
            .chain(status.ephemeral_container_statuses.into_iter().flatten())
            .collect();
        let id = container_id_for_logs(&statuses, &name, container, opts.previous)?;
        let id = strip_runtime(&id).to_string();
        let runtime = self.manager.runtime().clone();
        let path = runtime.container_status(&id).await?.log_path;
        let ropts = runtime_options(opts, jiff::Timestamp::now());
        Ok(Box::new(
            move |mut out: LogSink, stop: CancellationToken| {
                Box::pin(async move {
                    let running = Runtime(runtime);
                    read_logs(
                        std::path::Path::new(&path),
                        &id,
                        &ropts,
                        &running,
                        &mut out,
                        &stop,
                    )
                    .await
                    .map_err(|e| LogsError::Read(Box::new(e)))
                })
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(json: serde_json::Value) -> Vec<ContainerStatus> {
        vec![serde_json::from_value(json).expect("status")]
    }

    #[test]
    fn the_instance_read_is_upstreams_choice() {
        let running = status(serde_json::json!({
            "name": "c", "image": "", "imageID": "", "ready": true, "restartCount": 1,
            "containerID": "containerd://now",
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://before"}}
        }));
        assert_eq!(
            container_id_for_logs(&running, "p", "c", false).expect("current"),
            "containerd://now"
        );
        assert_eq!(
            container_id_for_logs(&running, "p", "c", true).expect("previous"),
            "containerd://before"
        );
        let fresh = status(serde_json::json!({
            "name": "c", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff"}}
        }));
        assert_eq!(
            container_id_for_logs(&fresh, "p", "c", true)
                .expect_err("none")
                .to_string(),
            "previous terminated container \"c\" in pod \"p\" not found"
        );
        assert_eq!(
            container_id_for_logs(&fresh, "p", "c", false)
                .expect_err("waiting")
                .to_string(),
            "container \"c\" in pod \"p\" is waiting to start: trying and failing to pull image"
        );
        assert_eq!(
            container_id_for_logs(&fresh, "p", "other", false)
                .expect_err("absent")
                .to_string(),
            "container \"other\" in pod \"p\" is not available"
        );
    }

    #[test]
    fn since_seconds_and_since_time_take_the_later() {
        let now: jiff::Timestamp = "2024-01-01T00:10:00Z".parse().expect("ts");
        let o = PodLogOptions {
            since_seconds: Some(60),
            tail_lines: Some(3),
            ..Default::default()
        };
        let r = runtime_options(&o, now);
        assert_eq!(r.since, Some("2024-01-01T00:09:00Z".parse().expect("ts")));
        assert_eq!(r.tail, Some(3));
        let o = PodLogOptions {
            since_time: Some("2024-01-01T00:05:00Z".parse().expect("ts")),
            ..Default::default()
        };
        assert_eq!(
            runtime_options(&o, now).since,
            Some("2024-01-01T00:05:00Z".parse().expect("ts"))
        );
    }
}
