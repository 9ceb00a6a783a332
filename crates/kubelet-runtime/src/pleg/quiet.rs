//! The quiet relist (issue 21): when the runtime lists exactly the sandboxes
//! and containers, in exactly the states, of the previous relist (upstream's
//! `generateEvents` would find no event), the relist keeps its record as it
//! is instead of rebuilding it, so an idle node allocates nothing per pod
//! each second.

use std::collections::HashMap;

use cri::pb;
use kubelet_types::labels as l;

use super::{RuntimePod, sandbox_state};
use crate::pod_status::ContainerState;

/// Whether `sandboxes` and `containers` are what `pods` records: the same
/// IDs under the same pod UIDs, in the same states, and nothing more.
pub(super) fn unchanged(
    pods: &HashMap<String, RuntimePod>,
    sandboxes: &[pb::PodSandbox],
    containers: &[pb::Container],
) -> bool {
    let recorded: usize = pods.values().map(|p| p.states.len()).sum();
    let same = |uid: Option<&String>, id: &str, state: ContainerState| {
        // Objects without a pod UID are not recorded: they change nothing.
        uid.is_none_or(|uid| {
            pods.get(uid)
                .and_then(|p| p.states.get(id))
                .is_some_and(|s| *s == state)
        })
    };
    let mut seen = 0usize;
    for s in sandboxes {
        let uid = s.labels.get(l::POD_UID);
        if !same(uid, &s.id, sandbox_state(s)) {
            return false;
        }
        seen += usize::from(uid.is_some());
    }
    for c in containers {
        let uid = c.labels.get(l::POD_UID);
        if !same(uid, &c.id, ContainerState::from_cri(c.state)) {
            return false;
        }
        seen += usize::from(uid.is_some());
    }
    // Equal counts with every listed one recorded: nothing recorded is gone.
    seen == recorded
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use cri::fake::FakeRuntime;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::manager::KubeRuntimeManager;
    use crate::pleg::GenericPleg;
    use crate::runtime_config::RuntimeConfig;

    #[tokio::test]
    async fn a_relist_with_the_same_answer_keeps_its_record_and_a_change_still_counts() {
        let fake = FakeRuntime::new();
        let m = Arc::new(KubeRuntimeManager::new(
            Arc::new(fake.clone()),
            Arc::new(fake.clone()),
            RuntimeConfig::default(),
        ));
        let (p, mut rx) = GenericPleg::new(m, 4, Duration::from_secs(2), TaskTracker::new());
        let (_sb, ids) = fake.add_running_pod("u1", "pod-u1", 1);
        assert_eq!(p.relist().await.expect("relist"), 1);
        let first = p.runtime_pods();
        assert_eq!(first["u1"].states.len(), 2);
        // Wait out the inspection, so no pod is dirty or in flight.
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("event");
        while !p.state.lock().in_flight.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Quiet: no pod with events, the very same record (not a rebuilt one).
        assert_eq!(p.relist().await.expect("relist"), 0);
        assert!(
            Arc::ptr_eq(&first, &p.runtime_pods()),
            "rebuilt on a quiet relist"
        );

        // The container exits: an event, and a new record.
        let c = ids.first().expect("container").clone();
        fake.exit_container(&c, 0);
        assert_eq!(p.relist().await.expect("relist"), 1);
        let after = p.runtime_pods();
        assert!(!Arc::ptr_eq(&first, &after));
        assert_eq!(after["u1"].states[&c], ContainerState::Exited);
    }

    #[test]
    fn a_gone_or_new_object_is_a_change() {
        let mut states = HashMap::new();
        states.insert("s1".to_string(), ContainerState::Running);
        let mut pods = HashMap::new();
        pods.insert(
            "u1".to_string(),
            RuntimePod {
                name: "p".into(),
                namespace: "ns".into(),
                states,
            },
        );
        let sandbox = |id: &str, uid: Option<&str>| pb::PodSandbox {
            id: id.into(),
            state: pb::PodSandboxState::SandboxReady as i32,
            labels: uid
                .map(|u| [(l::POD_UID.to_string(), u.to_string())].into())
                .unwrap_or_default(),
            ..Default::default()
        };
        assert!(unchanged(&pods, &[sandbox("s1", Some("u1"))], &[]));
        // Not a pod's: ignored, as the relist ignores it.
        assert!(unchanged(
            &pods,
            &[sandbox("s1", Some("u1")), sandbox("x", None)],
            &[]
        ));
        assert!(!unchanged(&pods, &[], &[]), "gone");
        assert!(
            !unchanged(
                &pods,
                &[sandbox("s1", Some("u1")), sandbox("s2", Some("u2"))],
                &[]
            ),
            "new"
        );
        let mut not_ready = sandbox("s1", Some("u1"));
        not_ready.state = pb::PodSandboxState::SandboxNotready as i32;
        assert!(!unchanged(&pods, &[not_ready], &[]), "state");
    }
}
