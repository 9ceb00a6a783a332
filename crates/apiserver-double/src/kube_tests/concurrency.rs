//! Writes racing each other, as upstream's `GuaranteedUpdate` resolves them:
//! a patch computed from an object that was deleted meanwhile gets a 404 and
//! never brings it back; one computed from an older version is computed again.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_status_patch_racing_the_deletion_of_a_finished_pod_never_brings_it_back() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    let pods = Api::<Pod>::namespaced(admin.clone(), "default");
    for round in 0..20 {
        let name = format!("race-{round}");
        create_pod(&admin, "default", &name, "n1", json!({})).await;
        pods.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .expect("finished");
        // The kubelet keeps patching the status while an admin deletes the
        // finished pod (deleted at once, as upstream: it is not running).
        let patchers: Vec<_> = (0..8)
            .map(|i| {
                let pods = pods.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let body = json!({"status": {"message": format!("m{i}")}});
                    let _ = pods
                        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(body))
                        .await;
                })
            })
            .collect();
        pods.delete(&name, &DeleteParams::default().grace_period(1))
            .await
            .expect("delete");
        for p in patchers {
            p.await.expect("patcher");
        }
        assert!(
            c.api.get("pods", "default", &name).is_none(),
            "round {round}: a status patch brought back a deleted pod"
        );
    }
}
