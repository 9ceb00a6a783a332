//! The `pods/ephemeralcontainers` subresource through kube-rs, as
//! `kubectl debug` and upstream's e2e framework use it: GET, strategic
//! PATCH and PUT, with upstream's strategy (only ephemeral containers
//! change, none removed or changed) and the pod's generation.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Cluster, api_error, create_pod};

const EC: &str = "ephemeralcontainers";

#[tokio::test]
async fn ephemeral_containers_are_added_through_the_subresource_only() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    let pods = Api::<Pod>::namespaced(admin.clone(), "default");
    let p = create_pod(&admin, "default", "target", "n1", json!({})).await;
    assert_eq!(p.metadata.generation, Some(1));

    // A strategic merge patch adds one (upstream AddEphemeralContainerSync);
    // what else the body says about the pod is dropped.
    let patch = json!({"spec": {"activeDeadlineSeconds": 5, "ephemeralContainers": [
        {"name": "debugger", "image": "busybox", "command": ["sh"], "stdin": true, "tty": true,
         "targetContainerName": "c"}]}});
    let p = pods
        .patch_subresource(
            EC,
            "target",
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
        .expect("patch ephemeralcontainers");
    let spec = p.spec.clone().expect("spec");
    assert_eq!(spec.active_deadline_seconds, None);
    let ecs = spec.ephemeral_containers.expect("ephemeral containers");
    assert_eq!(ecs.len(), 1);
    // The double's own defaults, as for any container.
    assert_eq!(ecs[0].image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        ecs[0].termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(p.metadata.generation, Some(2));

    // GET on the subresource returns the pod.
    let got = pods.get_subresource(EC, "target").await.expect("get");
    assert_eq!(
        got.spec
            .and_then(|s| s.ephemeral_containers)
            .map(|e| e.len()),
        Some(1)
    );

    // PUT with a stale resourceVersion conflicts (RetryOnConflict retries).
    let mut stale = p.clone();
    stale.metadata.resource_version = Some("1".into());
    let (code, _) = api_error(
        pods.replace_subresource(EC, "target", &PostParams::default(), &stale)
            .await
            .expect_err("stale"),
    );
    assert_eq!(code, 409);

    // PUT appends a second one (upstream UpdateEphemeralContainers).
    let mut two: serde_json::Value = serde_json::to_value(&p).expect("json");
    two["spec"]["ephemeralContainers"]
        .as_array_mut()
        .expect("list")
        .push(json!({"name": "debugger2", "image": "agnhost:2.40",
            "imagePullPolicy": "IfNotPresent", "terminationMessagePolicy": "File"}));
    let p = pods
        .replace_subresource(EC, "target", &PostParams::default(), &two)
        .await
        .expect("put ephemeralcontainers");
    let names: Vec<String> = p
        .spec
        .clone()
        .and_then(|s| s.ephemeral_containers)
        .into_iter()
        .flatten()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["debugger", "debugger2"]);
    assert_eq!(p.metadata.generation, Some(3));

    // Removing or changing one is forbidden.
    let mut fewer = serde_json::to_value(&p).expect("json");
    fewer["spec"]["ephemeralContainers"] = json!([two["spec"]["ephemeralContainers"][1].clone()]);
    let (code, msg) = api_error(
        pods.replace_subresource(EC, "target", &PostParams::default(), &fewer)
            .await
            .expect_err("removal"),
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("existing ephemeral containers \"debugger\" may not be removed"),
        "{msg}"
    );

    // Invalid ones are refused with upstream's field errors.
    let bad = json!({"spec": {"ephemeralContainers": [{"name": "c", "image": "busybox",
        "ports": [{"containerPort": 80}]}]}});
    let (code, msg) = api_error(
        pods.patch_subresource(
            EC,
            "target",
            &PatchParams::default(),
            &Patch::Strategic(bad),
        )
        .await
        .expect_err("invalid"),
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec.ephemeralContainers[2].name: Duplicate value: \"c\""),
        "{msg}"
    );
    assert!(
        msg.contains(
            "spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container"
        ),
        "{msg}"
    );

    // The pod itself may not change them.
    let via_pod = json!({"spec": {"ephemeralContainers": [{"name": "other", "image": "busybox"}]}});
    let (code, msg) = api_error(
        pods.patch(
            "target",
            &PatchParams::default(),
            &Patch::Strategic(via_pod),
        )
        .await
        .expect_err("main resource"),
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec: Forbidden: pod updates may not change fields"),
        "{msg}"
    );

    // Metadata changes leave the generation alone.
    let p = pods
        .patch(
            "target",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("label");
    assert_eq!(p.metadata.generation, Some(3));
}
