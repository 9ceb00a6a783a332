//! Pod admission (upstream `pkg/kubelet/lifecycle`: the admit handlers
//! `NewMainKubelet` installs, in their order: the eviction manager's
//! (`kubelet-eviction::Pressure::admit`), the sysctl allowlist, the
//! predicate handler (`predicate.go`: OS label and field, the
//! `SupplementalGroupsPolicy` the runtime must honour, pod-level resources,
//! then `generalFilter`), AppArmor; and `Kubelet.rejectPod`). Between the
//! sysctls and the predicates, the container manager's resource allocator
//! ([`ResourceAllocator`]: device plugins) reserves the pod's devices, and
//! the predicates see allocatable raised to the devices it holds (upstream
//! `UpdatePluginResources`). A rejected pod is
//! `Failed` with the handler's reason and `Pod was rejected: <message>`, gets
//! a Warning event with the reason, and never starts.

pub mod predicate;
pub mod sysctl;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kubelet_types::events::{EventType, Recorder, pod_ref};
use tokio::sync::watch;

/// Why a pod was not admitted: (reason, message), upstream strings.
pub type Rejection = (String, String);

/// The container manager's resource allocation at admission (upstream
/// `GetAllocateResourcesPodAdmitHandler` and `UpdatePluginResources`).
pub trait ResourceAllocator: Send + Sync {
    /// Reserves the pod's devices, or says why not (upstream
    /// `UnexpectedAdmissionError`).
    fn allocate(&self, p: &Pod) -> Result<(), Rejection>;

    /// Raises `allocatable` so a pod holding devices passes the resource
    /// predicate while their plugin is away (upstream
    /// `sanitizeNodeAllocatable`).
    fn update_plugin_resources(
        &self,
        p: &Pod,
        allocatable: &mut std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    );
}

/// The node as admission sees it (upstream `getNodeAnyWay`): the Node the
/// apiserver last returned, else the one the kubelet would register.
#[derive(Debug)]
pub struct NodeCache {
    initial: Node,
    latest: Option<watch::Receiver<Option<Node>>>,
}

impl NodeCache {
    /// The node the kubelet builds itself (labels, taints, allocatable),
    /// replaced by what `latest` carries once the apiserver returned the Node.
    pub fn new(initial: Node, latest: Option<watch::Receiver<Option<Node>>>) -> Self {
        Self { initial, latest }
    }

    /// The current node.
    pub fn get(&self) -> Node {
        self.latest
            .as_ref()
            .and_then(|rx| rx.borrow().clone())
            .unwrap_or_else(|| self.initial.clone())
    }
}

/// Admits or rejects new pods.
pub struct PodAdmitter {
    node: Arc<NodeCache>,
    sysctls: sysctl::Allowlist,
    apparmor_enabled: bool,
    recorder: Arc<dyn Recorder>,
    pressure: Option<kubelet_eviction::Pressure>,
    /// Whether the node is shutting down (upstream's shutdown manager is
    /// the last admit handler).
    shutdown: Option<Arc<crate::runtime_state::RuntimeState>>,
    /// Device allocation (upstream's resource allocator admit handler).
    allocator: Option<Arc<dyn ResourceAllocator>>,
    /// The runtime's features (upstream reads them from the Node's
    /// `status.features`, which the kubelet sets from the same answer).
    runtime: Option<Arc<crate::runtime_features::RuntimeFeatures>>,
}

fn apparmor_required(p: &Pod) -> bool {
    const PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
    let annotated = p
        .metadata
        .annotations
        .iter()
        .flatten()
        .any(|(k, v)| k.starts_with(PREFIX) && v != "unconfined");
    let confined = |t: Option<&str>| t.is_some_and(|t| t != "Unconfined");
    let spec = p.spec.as_ref();
    let pod_field = confined(
        spec.and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.app_armor_profile.as_ref())
            .map(|a| a.type_.as_str()),
    );
    let container_field = kubelet_types::pod::containers(p)
        .iter()
        .chain(kubelet_types::pod::init_containers(p))
        .any(|c| {
            confined(
                c.security_context
                    .as_ref()
                    .and_then(|s| s.app_armor_profile.as_ref())
                    .map(|a| a.type_.as_str()),
            )
        });
    annotated || pod_field || container_field
}

impl PodAdmitter {
    /// An admitter reading the node from `node`.
    pub fn new(
        node: Arc<NodeCache>,
        sysctls: sysctl::Allowlist,
        apparmor_enabled: bool,
        recorder: Arc<dyn Recorder>,
    ) -> Self {
        Self {
            node,
            sysctls,
            apparmor_enabled,
            recorder,
            pressure: None,
            shutdown: None,
            allocator: None,
            runtime: None,
        }
    }

    /// Reads what the runtime can do from `features` (without it, nothing:
    /// as a runtime that reported no features).
    #[must_use]
    pub fn with_runtime_features(
        mut self,
        features: Arc<crate::runtime_features::RuntimeFeatures>,
    ) -> Self {
        self.runtime = Some(features);
        self
    }

    /// Allocates the pod's devices after the sysctl check and before the
    /// predicates, as upstream's handler order has it.
    #[must_use]
    pub fn with_allocator(mut self, allocator: Arc<dyn ResourceAllocator>) -> Self {
        self.allocator = Some(allocator);
        self
    }

    /// Refuses every pod while the node shuts down (upstream
    /// `nodeshutdown.managerImpl.Admit`, the last handler).
    #[must_use]
    pub fn with_shutdown(mut self, state: Arc<crate::runtime_state::RuntimeState>) -> Self {
        self.shutdown = Some(state);
        self
    }

    /// Refuses pods under resource pressure first, as upstream's eviction
    /// admit handler does.
    #[must_use]
    pub fn with_pressure(mut self, pressure: kubelet_eviction::Pressure) -> Self {
        self.pressure = Some(pressure);
        self
    }

    /// Resolves once what admission reads of the runtime is known: upstream's
    /// `syncLoop` handles no pod before the runtime has answered ready once
    /// (`runtimeErrors`), so that, say, a `SupplementalGroupsPolicy: Strict`
    /// pod is never refused only because the runtime had not answered yet.
    pub async fn runtime_known(&self) {
        if let Some(r) = &self.runtime {
            r.known().await;
        }
    }

    /// Upstream `canAdmitPod`: the first handler that refuses decides.
    /// `others` are the active pods already admitted.
    pub fn admit(&self, p: &Pod, others: &[&Pod]) -> Result<(), Rejection> {
        // Upstream admits no pod the apiserver already reports finished (one
        // seen again after a restart), and counts none among the others
        // (`filterOutInactivePods` reads the pod's own phase too).
        if api_phase_terminal(p) {
            return Ok(());
        }
        let active: Vec<&Pod> = others
            .iter()
            .copied()
            .filter(|o| !api_phase_terminal(o))
            .collect();
        let others = active.as_slice();
        if let Some(pressure) = &self.pressure {
            pressure.admit(p)?;
        }
        self.sysctls.admit(p)?;
        if let Some(a) = &self.allocator {
            a.allocate(p)?;
        }
        let mut node = self.node.get();
        let node_os = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/os"))
            .filter(|os| *os == "linux")
            .map_or("linux", String::as_str);
        let pod_os_label = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/os"));
        if pod_os_label.is_some_and(|os| os != node_os) {
            return Err((
                "PodOSSelectorNodeLabelDoesNotMatch".into(),
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                    .into(),
            ));
        }
        let pod_os = p
            .spec
            .as_ref()
            .and_then(|s| s.os.as_ref())
            .map(|o| o.name.as_str());
        if pod_os.is_some_and(|os| os != "linux") {
            return Err((
                "PodOSNotSupported".into(),
                "Failed to admit pod as the OS field doesn't match node OS".into(),
            ));
        }
        if strict_supplemental_groups(p)
            && !self
                .runtime
                .as_ref()
                .is_some_and(|r| r.supplemental_groups_policy())
        {
            return Err((
                "SupplementalGroupsPolicyNotSupported".into(),
                "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
            ));
        }
        if pod_level_resources_set(p) {
            return Err((
                "PodLevelResourcesNotSupported".into(),
                "PodLevelResources feature gate is disabled: kubelet-rs does not enforce \
                 pod-level resources (spec.resources) yet"
                    .into(),
            ));
        }
        if let Some(a) = &self.allocator
            && let Some(status) = node.status.as_mut()
        {
            a.update_plugin_resources(p, status.allocatable.get_or_insert_with(Default::default));
        }
        if let Some(first) = predicate::general_filter(p, others, &node).first() {
            return Err(first.reason_and_message());
        }
        if !self.apparmor_enabled && apparmor_required(p) {
            return Err((
                "AppArmor".into(),
                "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
            ));
        }
        if self
            .shutdown
            .as_ref()
            .is_some_and(|s| s.shutdown_status().is_some())
        {
            return Err((
                kubelet_nodeshutdown::NOT_ADMITTED_REASON.into(),
                kubelet_nodeshutdown::NOT_ADMITTED_MESSAGE.into(),
            ));
        }
        Ok(())
    }

    /// Upstream `rejectPod`: the Warning event and the pod's failed status.
    pub fn reject(&self, p: &Pod, r: &Rejection) -> PodStatus {
        self.recorder
            .event(&pod_ref(p, None), EventType::Warning, &r.0, r.1.clone());
        rejected_status(p, r)
    }
}

/// `securityContext.supplementalGroupsPolicy: Strict` (upstream
/// `rejectPodAdmissionBasedOnSupplementalGroupsPolicy`): the runtime must
/// leave out the groups of the image's `/etc/group`, or the pod must not run.
fn strict_supplemental_groups(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.supplemental_groups_policy.as_deref())
        == Some("Strict")
}

/// Upstream `IsPodLevelResourcesSet`: `spec.resources` requests or limits
/// of a resource pod-level resources cover (CPU, memory, hugepages).
fn pod_level_resources_set(p: &Pod) -> bool {
    let Some(r) = p.spec.as_ref().and_then(|s| s.resources.as_ref()) else {
        return false;
    };
    r.requests
        .iter()
        .chain(r.limits.iter())
        .flat_map(|m| m.keys())
        .any(|k| k == "cpu" || k == "memory" || k.starts_with("hugepages-"))
}

/// Whether the pod object itself reports `Succeeded` or `Failed`.
pub fn api_phase_terminal(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .and_then(|ph| ph.parse::<kubelet_types::PodPhase>().ok())
        .is_some_and(kubelet_types::PodPhase::is_terminal)
}

/// The status a rejected pod gets (upstream `rejectPod`).
pub fn rejected_status(p: &Pod, (reason, message): &Rejection) -> PodStatus {
    PodStatus {
        phase: Some(kubelet_types::PodPhase::Failed.as_str().to_string()),
        reason: Some(reason.clone()),
        message: Some(format!("Pod was rejected: {message}")),
        qos_class: Some(kubelet_types::qos::pod_qos(p).as_str().to_string()),
        ..Default::default()
    }
}

/// Whether the host has AppArmor enabled (upstream `apparmor.IsEnabled`).
pub async fn apparmor_enabled() -> bool {
    tokio::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .await
        .is_ok_and(|s| s.trim_start().starts_with('Y'))
}

#[cfg(test)]
mod tests;
