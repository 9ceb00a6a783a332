//! The merger's pod store (upstream `config.go` `podStorage.merge` and
//! `checkAndUpdatePod`): per source, the pods by UID, and the rule that turns
//! a new snapshot into incremental updates.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::{PodOperation, PodUpdate, Source, labels, pod};
use tracing::warn;

/// Pods per source, keyed by UID.
#[derive(Debug, Default)]
pub struct PodStorage {
    pods: HashMap<Source, HashMap<String, Arc<Pod>>>,
}

/// Spec, labels, annotations and deletion fields: what makes an UPDATE (upstream `podsDifferSemantically`).
fn differ_semantically(a: &Pod, b: &Pod) -> bool {
    a.spec != b.spec
        || a.metadata.labels != b.metadata.labels
        || a.metadata.annotations != b.metadata.annotations
        || a.metadata.deletion_timestamp != b.metadata.deletion_timestamp
        || a.metadata.deletion_grace_period_seconds != b.metadata.deletion_grace_period_seconds
}

impl PodStorage {
    /// Every pod of every source.
    pub fn all_pods(&self) -> Vec<Arc<Pod>> {
        self.pods
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// Merges a source's complete snapshot and returns the resulting updates,
    /// in upstream order: REMOVE, ADD, UPDATE, DELETE, RECONCILE. `now` is the
    /// `kubernetes.io/config.seen` value for pods seen for the first time.
    pub fn merge(&mut self, source: Source, snapshot: Vec<Pod>, now: &str) -> Vec<PodUpdate> {
        let old = self.pods.remove(&source).unwrap_or_default();
        let mut new: HashMap<String, Arc<Pod>> = HashMap::new();
        let (mut adds, mut updates, mut deletes, mut reconciles) = (vec![], vec![], vec![], vec![]);
        let mut names = HashSet::new();
        for mut p in snapshot {
            let uid = pod::uid(&p).to_string();
            if uid.is_empty() {
                warn!(pod = %pod::describe(&p), %source, "Pod has no UID; ignoring it");
                continue;
            }
            if !names.insert(pod::full_name(&p)) || new.contains_key(&uid) {
                warn!(pod = %pod::describe(&p), %source, "Pod has a duplicate full name or UID in its source; ignoring it");
                continue;
            }
            let ann = p.metadata.annotations.get_or_insert_with(Default::default);
            ann.insert(labels::CONFIG_SOURCE.into(), source.as_str().into());
            match old.get(&uid) {
                None => {
                    ann.entry(labels::CONFIG_SEEN.into())
                        .or_insert_with(|| now.to_string());
                    let p = Arc::new(p);
                    adds.push(p.clone());
                    new.insert(uid, p);
                }
                Some(existing) => {
                    if let Some(seen) = existing
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(labels::CONFIG_SEEN))
                    {
                        ann.insert(labels::CONFIG_SEEN.into(), seen.clone());
                    }
                    if !differ_semantically(existing, &p) {
                        if existing.status != p.status {
                            let p = Arc::new(p);
                            reconciles.push(p.clone());
                            new.insert(uid, p);
                        } else {
                            new.insert(uid, existing.clone());
                        }
                        continue;
                    }
                    let graceful = p.metadata.deletion_timestamp.is_some();
                    let p = Arc::new(p);
                    if graceful {
                        deletes.push(p.clone());
                    } else {
                        updates.push(p.clone());
                    }
                    new.insert(uid, p);
                }
            }
        }
        let removes: Vec<Arc<Pod>> = old
            .iter()
            .filter(|(uid, _)| !new.contains_key(*uid))
            .map(|(_, p)| p.clone())
            .collect();
        self.pods.insert(source, new);
        [
            (PodOperation::Remove, removes),
            (PodOperation::Add, adds),
            (PodOperation::Update, updates),
            (PodOperation::Delete, deletes),
            (PodOperation::Reconcile, reconciles),
        ]
        .into_iter()
        .filter(|(_, pods)| !pods.is_empty())
        .map(|(op, pods)| PodUpdate { op, source, pods })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn p(name: &str, uid: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .expect("pod")
    }

    fn ops(u: &[PodUpdate]) -> Vec<(PodOperation, Vec<String>)> {
        u.iter()
            .map(|u| {
                let mut names: Vec<String> =
                    u.pods.iter().map(|p| pod::name(p).to_string()).collect();
                names.sort();
                (u.op, names)
            })
            .collect()
    }

    #[test]
    fn add_update_reconcile_delete_remove() {
        let mut s = PodStorage::default();
        let u = s.merge(
            Source::File,
            vec![p("a", "1", "i:1"), p("b", "2", "i:1")],
            "t0",
        );
        assert_eq!(
            ops(&u),
            vec![(PodOperation::Add, vec!["a".into(), "b".into()])]
        );
        let seen = u[0].pods[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::CONFIG_SEEN).cloned());
        assert_eq!(seen.as_deref(), Some("t0"));

        // Same snapshot again: nothing.
        assert!(
            s.merge(
                Source::File,
                vec![p("a", "1", "i:1"), p("b", "2", "i:1")],
                "t1"
            )
            .is_empty()
        );

        // Spec change: UPDATE, first-seen time kept.
        let u = s.merge(
            Source::File,
            vec![p("a", "1", "i:2"), p("b", "2", "i:1")],
            "t2",
        );
        assert_eq!(ops(&u), vec![(PodOperation::Update, vec!["a".into()])]);
        let seen = u[0].pods[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::CONFIG_SEEN).cloned());
        assert_eq!(seen.as_deref(), Some("t0"));

        // Status-only change: RECONCILE.
        let mut b = p("b", "2", "i:1");
        b.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let u = s.merge(Source::File, vec![p("a", "1", "i:2"), b.clone()], "t3");
        assert_eq!(ops(&u), vec![(PodOperation::Reconcile, vec!["b".into()])]);

        // deletionTimestamp: DELETE.
        let mut a = p("a", "1", "i:2");
        a.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let u = s.merge(Source::File, vec![a, b.clone()], "t4");
        assert_eq!(ops(&u), vec![(PodOperation::Delete, vec!["a".into()])]);

        // Gone from the snapshot: REMOVE; a new UID in its place: ADD.
        let u = s.merge(Source::File, vec![b, p("c", "3", "i:1")], "t5");
        assert_eq!(
            ops(&u),
            vec![
                (PodOperation::Remove, vec!["a".into()]),
                (PodOperation::Add, vec!["c".into()])
            ]
        );
    }

    #[test]
    fn a_source_set_replaces_only_its_own_pods() {
        let mut s = PodStorage::default();
        s.merge(Source::File, vec![p("a", "1", "i:1")], "t");
        s.merge(Source::Http, vec![p("h", "9", "i:1")], "t");
        let u = s.merge(Source::Http, vec![], "t");
        assert_eq!(ops(&u), vec![(PodOperation::Remove, vec!["h".into()])]);
        assert_eq!(s.all_pods().len(), 1);
        assert_eq!(u[0].source, Source::Http);
        let src = s.all_pods()[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::CONFIG_SOURCE).cloned());
        assert_eq!(src.as_deref(), Some("file"));
    }

    #[test]
    fn duplicates_in_a_source_are_ignored() {
        let mut s = PodStorage::default();
        let u = s.merge(
            Source::File,
            vec![p("a", "1", "i:1"), p("a", "2", "i:1")],
            "t",
        );
        assert_eq!(ops(&u), vec![(PodOperation::Add, vec!["a".into()])]);
    }

    #[tokio::test]
    async fn merger_task_marks_sources_seen() {
        let stop = tokio_util::sync::CancellationToken::new();
        let (tx, mut rx, ready) = crate::spawn_merger(
            &tokio_util::task::TaskTracker::new(),
            &[Source::File, Source::Http],
            stop.clone(),
        );
        assert!(!ready.all_ready());
        tx.send(crate::SourceUpdate {
            source: Source::File,
            pods: vec![p("a", "1", "i:1")],
        })
        .await
        .expect("send");
        let u = rx.recv().await.expect("update");
        assert_eq!(u.op, PodOperation::Add);
        assert!(!ready.all_ready(), "http not seen yet");
        tx.send(crate::SourceUpdate {
            source: Source::Http,
            pods: vec![],
        })
        .await
        .expect("send");
        for _ in 0..50 {
            if ready.all_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(ready.all_ready());
        stop.cancel();
    }
}
