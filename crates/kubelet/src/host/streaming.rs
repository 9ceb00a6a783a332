//! Upstream `Kubelet.GetExec`, `GetAttach`, `GetPortForward` and
//! `RunInContainer` (`kubelet_pods.go`, with `findContainer` and the
//! runtime manager's `GetExec`/`GetAttach`/`GetPortForward`/`RunInContainer`):
//! the container is found in the runtime's view of running containers by
//! the pod's full name (upstream `Pods.FindPod(podFullName, podUID)` with
//! the full name set), and, when the path names a UID, by that UID as well
//! (a mirror pod's UID is translated to its static pod's), so a UID never
//! selects a pod other than the named one; port-forward uses the pod's
//! newest sandbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cri::pb;
use k8s_openapi::api::core::v1::Pod;
use kubelet_server::streaming::{HostError, StreamOptions, StreamingHost};
use kubelet_types::labels;

use super::KubeletHost;

/// `RunInContainer` passes no command timeout (upstream: 0); the CRI call
/// keeps the client's per-call deadline.
const RUN_TIMEOUT: Duration = Duration::ZERO;

fn meta(pod: &Pod) -> (&str, &str, &str) {
    (
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or(""),
    )
}

impl KubeletHost {
    /// Upstream `podManager.TranslatePodUID`: a mirror pod's UID becomes its
    /// static pod's; any other UID stays.
    fn translate_pod_uid(&self, uid: &str) -> String {
        let mirror = self
            .pods
            .get_mirror_pods()
            .into_iter()
            .find(|m| m.metadata.uid.as_deref() == Some(uid));
        let Some(m) = mirror else {
            return uid.to_string();
        };
        self.pods
            .get_pods()
            .into_iter()
            .find(|p| {
                p.metadata.name == m.metadata.name && p.metadata.namespace == m.metadata.namespace
            })
            .and_then(|p| p.metadata.uid.clone())
            .unwrap_or_else(|| uid.to_string())
    }

    /// Upstream `findContainer`: the running container `container` of the
    /// named pod; a UID, when given, must be that pod's too.
    async fn find_container(
        &self,
        pod: &Pod,
        pod_uid: &str,
        container: &str,
    ) -> Result<String, HostError> {
        let (name, namespace, _) = meta(pod);
        let mut selector = HashMap::from([
            (labels::POD_NAME.to_string(), name.to_string()),
            (labels::POD_NAMESPACE.to_string(), namespace.to_string()),
        ]);
        if !pod_uid.is_empty() {
            selector.insert(labels::POD_UID.to_string(), self.translate_pod_uid(pod_uid));
        }
        selector.insert(labels::CONTAINER_NAME.to_string(), container.to_string());
        let found = self
            .manager
            .runtime()
            .list_containers(Some(pb::ContainerFilter {
                state: Some(pb::ContainerStateValue {
                    state: pb::ContainerState::ContainerRunning as i32,
                }),
                label_selector: selector,
                ..Default::default()
            }))
            .await?;
        found
            .into_iter()
            .max_by_key(|c| c.created_at)
            .map(|c| c.id)
            .ok_or_else(|| HostError::ContainerNotFound(container.to_string()))
    }
}

#[async_trait::async_trait]
impl StreamingHost for KubeletHost {
    fn get_pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        kubelet_server::HostInterface::get_pod_by_name(self, namespace, name)
    }

    fn translate_pod_uid(&self, uid: &str) -> String {
        KubeletHost::translate_pod_uid(self, uid)
    }

    async fn get_exec(
        &self,
        pod: &Pod,
        pod_uid: &str,
        container: &str,
        cmd: Vec<String>,
        opts: StreamOptions,
    ) -> Result<String, HostError> {
        let container_id = self.find_container(pod, pod_uid, container).await?;
        let resp = self
            .remote
            .exec(pb::ExecRequest {
                container_id,
                cmd,
                tty: opts.tty,
                stdin: opts.stdin,
                stdout: opts.stdout,
                stderr: opts.stderr,
            })
            .await?;
        Ok(resp.url)
    }

    async fn get_attach(
        &self,
        pod: &Pod,
        pod_uid: &str,
        container: &str,
        opts: StreamOptions,
    ) -> Result<String, HostError> {
        let container_id = self.find_container(pod, pod_uid, container).await?;
        let resp = self
            .remote
            .attach(pb::AttachRequest {
                container_id,
                stdin: opts.stdin,
                tty: opts.tty,
                stdout: opts.stdout,
                stderr: opts.stderr,
            })
            .await?;
        Ok(resp.url)
    }

    async fn get_port_forward(&self, pod: &Pod, ports: Vec<i32>) -> Result<String, HostError> {
        let (name, namespace, uid) = meta(pod);
        let uid = self.translate_pod_uid(uid);
        let rt = self.manager.runtime();
        let by_uid = HashMap::from([(labels::POD_UID.to_string(), uid.clone())]);
        let mut sandboxes = rt
            .list_pod_sandbox(Some(pb::PodSandboxFilter {
                label_selector: by_uid.clone(),
                ..Default::default()
            }))
            .await?;
        // Upstream first requires the pod among the running pods (a ready
        // sandbox or a running container).
        let ready = sandboxes
            .iter()
            .any(|s| s.state == pb::PodSandboxState::SandboxReady as i32);
        if !ready {
            let running = rt
                .list_containers(Some(pb::ContainerFilter {
                    state: Some(pb::ContainerStateValue {
                        state: pb::ContainerState::ContainerRunning as i32,
                    }),
                    label_selector: by_uid,
                    ..Default::default()
                }))
                .await?;
            if running.is_empty() {
                return Err(HostError::PodNotFound(format!("{name}_{namespace}")));
            }
        }
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let Some(sandbox) = sandboxes.into_iter().next() else {
            return Err(HostError::NoSandbox(format!("{name}_{namespace}({uid})")));
        };
        let resp = self
            .remote
            .port_forward(pb::PortForwardRequest {
                pod_sandbox_id: sandbox.id,
                port: ports,
            })
            .await?;
        Ok(resp.url)
    }

    async fn run_in_container(
        &self,
        pod: &Pod,
        pod_uid: &str,
        container: &str,
        cmd: Vec<String>,
    ) -> Result<Vec<u8>, HostError> {
        let id = self.find_container(pod, pod_uid, container).await?;
        let resp = self
            .manager
            .runtime()
            .exec_sync(&id, cmd.clone(), RUN_TIMEOUT)
            .await?;
        if resp.exit_code != 0 {
            return Err(HostError::ExitCode {
                cmd: cmd.join(" "),
                code: resp.exit_code,
                stderr: String::from_utf8_lossy(&resp.stderr).into_owned(),
            });
        }
        let mut out = resp.stdout;
        out.extend_from_slice(&resp.stderr);
        Ok(out)
    }
}
