//! The end of a conformance suite (upstream's framework `AfterEach`): the
//! suite's pods deleted and confirmed by the kubelet, nothing left mounted,
//! and every failed spec reported.

use super::*;

impl Suite {
    /// Where a pod the kubelet did not let go of stands, so that a teardown
    /// failure names the stage it stopped at: the API object, the kubelet's
    /// status and whether it saw the pod terminated (deletion confirmation),
    /// and what is still mounted under its directory (volume tear-down).
    fn explain_left(&self, name: &str) -> String {
        let api = self.j.api.get("pods", NS, name);
        let uid = api
            .as_ref()
            .and_then(|p| p["metadata"]["uid"].as_str())
            .unwrap_or_default()
            .to_string();
        let api_phase = crate::cluster::phase(api.as_ref())
            .unwrap_or("-")
            .to_string();
        let deleting = api
            .as_ref()
            .is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null());
        let status = &self.j.node.handle().status;
        let kubelet_phase = status
            .get_pod_status(&uid)
            .and_then(|s| s.phase)
            .unwrap_or_else(|| "-".into());
        let mounted = mounts_under(&self.j.node.root_dir().join("pods").join(&uid));
        format!(
            "{name} ({uid}): api phase {api_phase}, deletionTimestamp set: {deleting}; kubelet phase {kubelet_phase}, \
             terminated: {}; mounted under its directory: {mounted:?}",
            status.is_terminated(&uid)
        )
    }

    /// Deletes every pod the suite created (grace 1 s, so the kubelet stops
    /// them and confirms), waits (bounded) for the objects to go, checks that
    /// nothing of the kubelet's stays mounted (upstream confirms a deletion
    /// only once the pod's volumes are torn down), stops the kubelet and
    /// fails with every failed spec.
    pub async fn finish(self, file: &str) {
        let pods = self.pods.lock().clone();
        let api = Api::<Pod>::namespaced(self.j.admin.clone(), NS);
        for p in &pods {
            match api
                .delete(p, &DeleteParams::default().grace_period(1))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => self.fail("teardown", format!("deleting pod {p}: {e}")),
                Ok(_) => {}
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let left = loop {
            let left: Vec<&String> = pods
                .iter()
                .filter(|p| self.j.api.get("pods", NS, p).is_some())
                .collect();
            if left.is_empty() || tokio::time::Instant::now() >= deadline {
                break left.into_iter().cloned().collect::<Vec<_>>();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        if !left.is_empty() {
            let why: Vec<String> = left.iter().map(|p| self.explain_left(p)).collect();
            self.fail(
                "teardown",
                format!(
                    "pods not deleted by the kubelet within 60s: {left:?}\n  {}",
                    why.join("\n  ")
                ),
            );
        }
        let root = self.j.node.root_dir();
        let mounted = mounts_under(&root);
        if left.is_empty() && !mounted.is_empty() {
            // Still a failure; say whether the teardown came later or never.
            let later = tokio::time::Instant::now() + Duration::from_secs(15);
            while tokio::time::Instant::now() < later && !mounts_under(&root).is_empty() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let then = if mounts_under(&root).is_empty() {
                "unmounted later"
            } else {
                "still mounted 15s later"
            };
            self.fail(
                "teardown",
                format!("volumes mounted when the kubelet confirmed the pods' deletion ({then}): {mounted:?}"),
            );
        }
        let failures = self.failures.lock().clone();
        // Unmounts what is left under the node's directory.
        self.j.cleanup().await;
        for p in &pods {
            remove_pod_logs(p);
        }
        assert!(
            failures.is_empty(),
            "{file}: {} failure(s):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

fn remove_pod_logs(pod: &str) {
    let prefix = format!("{NS}_{pod}_");
    if let Ok(rd) = std::fs::read_dir(crate::pod_logs_dir()) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
