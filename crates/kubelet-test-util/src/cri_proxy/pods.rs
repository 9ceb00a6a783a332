//! What the CRI proxy knows about pods: which sandbox a call is about, and
//! each sandbox's metadata and labels, learnt from the CRI traffic it
//! forwards (`RunPodSandbox`, `ListPodSandbox`, `PodSandboxStatus`,
//! `CreateContainer`, `ListContainers`), so a rule naming a pod by label
//! catches `ContainerStatus(<one of its containers>)`.

use std::collections::HashMap;

use cri::pb;
use parking_lot::Mutex;

use super::rules::PodSelector;

/// What one call names: a sandbox, a container, or (for `RunPodSandbox`,
/// before the sandbox has an ID) the pod's config.
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// Sandbox ID named by the call.
    pub sandbox: Option<String>,
    /// Container ID named by the call.
    pub container: Option<String>,
    /// Sandbox facts carried by the call itself.
    pub facts: Option<SandboxFacts>,
}

impl Target {
    pub(super) fn sandbox(id: &str) -> Self {
        Self {
            sandbox: (!id.is_empty()).then(|| id.to_string()),
            ..Self::default()
        }
    }

    pub(super) fn container(id: &str) -> Self {
        Self {
            container: (!id.is_empty()).then(|| id.to_string()),
            ..Self::default()
        }
    }

    pub(super) fn config(config: Option<&pb::PodSandboxConfig>) -> Self {
        Self {
            facts: config.map(|c| SandboxFacts::new(c.metadata.as_ref(), &c.labels)),
            ..Self::default()
        }
    }
}

/// A sandbox's metadata and labels.
#[derive(Clone, Debug, Default)]
pub struct SandboxFacts {
    name: String,
    namespace: String,
    uid: String,
    labels: HashMap<String, String>,
}

impl SandboxFacts {
    fn new(meta: Option<&pb::PodSandboxMetadata>, labels: &HashMap<String, String>) -> Self {
        let meta = meta.cloned().unwrap_or_default();
        Self {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            labels: labels.clone(),
        }
    }

    fn matches(&self, sel: &PodSelector) -> bool {
        match sel {
            PodSelector::Label(k, v) => self.labels.get(k) == Some(v),
            PodSelector::Name { namespace, name } => {
                &self.namespace == namespace && &self.name == name
            }
            PodSelector::Uid(uid) => &self.uid == uid,
            PodSelector::Sandbox(_) | PodSelector::Container(_) => false,
        }
    }
}

/// Sandbox facts and container → sandbox links seen so far.
#[derive(Default)]
pub struct PodIndex {
    sandboxes: Mutex<HashMap<String, SandboxFacts>>,
    containers: Mutex<HashMap<String, String>>,
}

impl PodIndex {
    /// Whether a call about `target` is about the pod `sel` names.
    pub(super) fn matches(&self, sel: &PodSelector, target: &Target) -> bool {
        let sandbox = target.sandbox.clone().or_else(|| {
            let c = target.container.as_ref()?;
            self.containers.lock().get(c).cloned()
        });
        match sel {
            PodSelector::Container(id) => target.container.as_ref() == Some(id),
            PodSelector::Sandbox(id) => sandbox.as_ref() == Some(id),
            _ => {
                if let Some(f) = &target.facts {
                    return f.matches(sel);
                }
                sandbox
                    .and_then(|s| self.sandboxes.lock().get(&s).map(|f| f.matches(sel)))
                    .unwrap_or(false)
            }
        }
    }

    fn sandbox(
        &self,
        id: &str,
        meta: Option<&pb::PodSandboxMetadata>,
        labels: &HashMap<String, String>,
    ) {
        if !id.is_empty() {
            self.sandboxes
                .lock()
                .insert(id.to_string(), SandboxFacts::new(meta, labels));
        }
    }

    fn container(&self, id: &str, sandbox: &str) {
        if !id.is_empty() && !sandbox.is_empty() {
            self.containers
                .lock()
                .insert(id.to_string(), sandbox.to_string());
        }
    }
}

/// Learning from a forwarded request and its answer.
pub(super) trait Learn<Resp> {
    /// Records what `self` and `resp` tell about pods.
    fn learn(&self, _resp: &Resp, _pods: &PodIndex) {}
}

impl Learn<pb::RunPodSandboxResponse> for pb::RunPodSandboxRequest {
    fn learn(&self, resp: &pb::RunPodSandboxResponse, pods: &PodIndex) {
        if let Some(c) = &self.config {
            pods.sandbox(&resp.pod_sandbox_id, c.metadata.as_ref(), &c.labels);
        }
    }
}

impl Learn<pb::ListPodSandboxResponse> for pb::ListPodSandboxRequest {
    fn learn(&self, resp: &pb::ListPodSandboxResponse, pods: &PodIndex) {
        for s in &resp.items {
            pods.sandbox(&s.id, s.metadata.as_ref(), &s.labels);
        }
    }
}

impl Learn<pb::PodSandboxStatusResponse> for pb::PodSandboxStatusRequest {
    fn learn(&self, resp: &pb::PodSandboxStatusResponse, pods: &PodIndex) {
        if let Some(s) = &resp.status {
            pods.sandbox(&s.id, s.metadata.as_ref(), &s.labels);
        }
    }
}

impl Learn<pb::CreateContainerResponse> for pb::CreateContainerRequest {
    fn learn(&self, resp: &pb::CreateContainerResponse, pods: &PodIndex) {
        pods.container(&resp.container_id, &self.pod_sandbox_id);
        if let Some(c) = &self.sandbox_config {
            let known = pods.sandboxes.lock().contains_key(&self.pod_sandbox_id);
            if !known {
                pods.sandbox(&self.pod_sandbox_id, c.metadata.as_ref(), &c.labels);
            }
        }
    }
}

impl Learn<pb::ListContainersResponse> for pb::ListContainersRequest {
    fn learn(&self, resp: &pb::ListContainersResponse, pods: &PodIndex) {
        for c in &resp.containers {
            pods.container(&c.id, &c.pod_sandbox_id);
        }
    }
}
