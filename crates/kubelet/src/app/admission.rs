//! Building pod admission (upstream `NewMainKubelet`'s admit handlers and
//! `initialNode`): the node admission checks against, the sysctl allowlist
//! from `allowedUnsafeSysctls`, and whether the host has AppArmor.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_config::{KubeletConfig, SettingValue};
use kubelet_types::events::Recorder;
use tokio::sync::watch;

use crate::AppError;
use crate::lifecycle::{NodeCache, PodAdmitter, sysctl};

/// Upstream `initialNode`: the default labels, `--node-labels`,
/// `--register-with-taints` and allocatable.
pub(super) fn initial_node(cfg: &KubeletConfig, allocatable: &BTreeMap<String, Quantity>) -> Node {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", cfg.node_name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", arch),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", arch),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    labels.extend(cfg.node_labels.clone());
    let mut node = Node::default();
    node.metadata.name = Some(cfg.node_name.clone());
    node.metadata.labels = Some(labels);
    node.spec = Some(NodeSpec {
        taints: (!cfg.register_with_taints.is_empty()).then(|| {
            cfg.register_with_taints
                .iter()
                .map(|t| k8s_openapi::api::core::v1::Taint {
                    key: t.key.clone(),
                    value: (!t.value.is_empty()).then(|| t.value.clone()),
                    effect: t.effect.clone(),
                    time_added: None,
                })
                .collect()
        }),
        ..Default::default()
    });
    node.status = Some(NodeStatus {
        allocatable: Some(allocatable.clone()),
        capacity: Some(allocatable.clone()),
        ..Default::default()
    });
    node
}

/// The running kernel's (major, minor), for the safe sysctls.
fn kernel_version() -> (u32, u32) {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The sysctl allowlist; a non-namespaced `allowedUnsafeSysctls` entry
/// stops the kubelet at start, as upstream.
pub(super) fn allowlist(cfg: &KubeletConfig) -> Result<sysctl::Allowlist, AppError> {
    let unsafe_sysctls = match cfg.settings.get("allowedUnsafeSysctls") {
        Some(SettingValue::List(l)) => l.clone(),
        _ => vec![],
    };
    Ok(sysctl::Allowlist::new(kernel_version(), &unsafe_sysctls)?)
}

/// The pod admitter, reading the Node from `latest` once registered.
pub(super) fn admitter(
    cfg: &KubeletConfig,
    allocatable: &BTreeMap<String, Quantity>,
    latest: Option<watch::Receiver<Option<Node>>>,
    (allowlist, apparmor_enabled): (sysctl::Allowlist, bool),
    recorder: Arc<dyn Recorder>,
) -> PodAdmitter {
    PodAdmitter::new(
        Arc::new(NodeCache::new(initial_node(cfg, allocatable), latest)),
        allowlist,
        apparmor_enabled,
        recorder,
    )
}
