//! Upstream `GetRunningPods`: the pods the runtime runs, read straight from
//! CRI (ready sandboxes and running containers), as bare `v1.Pod`s naming
//! their containers (`kubecontainer.Pod.ToAPIPod`).

use std::collections::BTreeMap;

use cri::RuntimeService;
use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubelet_server::ServerError;
use kubelet_types::labels;

/// The running pods, ordered by namespace and name.
pub(super) async fn running_pods(rt: &dyn RuntimeService) -> Result<Vec<Pod>, ServerError> {
    let sandboxes = rt
        .list_pod_sandbox(Some(pb::PodSandboxFilter {
            state: Some(pb::PodSandboxStateValue {
                state: pb::PodSandboxState::SandboxReady as i32,
            }),
            ..Default::default()
        }))
        .await?;
    let containers = rt
        .list_containers(Some(pb::ContainerFilter {
            state: Some(pb::ContainerStateValue {
                state: pb::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        }))
        .await?;
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    let label = |l: &std::collections::HashMap<String, String>, k: &str| l.get(k).cloned();
    for s in &sandboxes {
        let Some(uid) = label(&s.labels, labels::POD_UID) else {
            continue;
        };
        pods.entry(uid.clone()).or_insert_with(|| Pod {
            metadata: ObjectMeta {
                name: label(&s.labels, labels::POD_NAME),
                namespace: label(&s.labels, labels::POD_NAMESPACE),
                uid: Some(uid),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        });
    }
    for c in &containers {
        let Some(uid) = label(&c.labels, labels::POD_UID) else {
            continue;
        };
        let pod = pods.entry(uid.clone()).or_insert_with(|| Pod {
            metadata: ObjectMeta {
                name: label(&c.labels, labels::POD_NAME),
                namespace: label(&c.labels, labels::POD_NAMESPACE),
                uid: Some(uid),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        });
        let name = label(&c.labels, labels::CONTAINER_NAME).unwrap_or_default();
        let image = c.image.as_ref().map(|i| i.image.clone());
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers.push(Container {
                name,
                image,
                ..Default::default()
            });
        }
    }
    let mut out: Vec<Pod> = pods.into_values().collect();
    out.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    for p in &mut out {
        if let Some(spec) = p.spec.as_mut() {
            spec.containers.sort_by(|a, b| a.name.cmp(&b.name));
        }
    }
    Ok(out)
}
