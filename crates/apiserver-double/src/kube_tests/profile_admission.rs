//! Version profiles on writes: NodeRestriction's mirror pod rules, the
//! ServiceAccount token volume, and fields a 1.19 codec drops.

use k8s_openapi::api::core::v1::{Node, Pod, Secret, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Cluster, api_error, create_pod, from};
use crate::Options;
use crate::profile::Profile;

async fn start(profile: Profile, admission: bool) -> Cluster {
    Cluster::start_with(Options {
        profile,
        service_account_admission: admission,
        ..Options::default()
    })
    .await
}

fn mirror(name: &str, owner_uid: Option<&str>) -> Pod {
    let mut p = json!({"metadata": {"name": name,
        "annotations": {"kubernetes.io/config.mirror": "hash"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}});
    if let Some(uid) = owner_uid {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Node",
            "name": "n1", "uid": uid, "controller": true}]);
    }
    from(p)
}

#[tokio::test]
async fn mirror_pods_need_a_node_owner_after_1_19() {
    let c = start(Profile::V1_19, false).await;
    let n1 = c.node("n1").await;
    Api::<Pod>::namespaced(n1, "default")
        .create(&PostParams::default(), &mirror("m", None))
        .await
        .expect("1.19 takes a mirror pod without an owner");

    let c = start(Profile::V1_35, false).await;
    let n1 = c.node("n1").await;
    let pods = Api::<Pod>::namespaced(n1.clone(), "default");
    let (code, msg) = api_error(
        pods.create(&PostParams::default(), &mirror("m", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "pods \"m\" is forbidden: node \"n1\" can only create pods with an owner reference set to itself"
        )
    );
    let node = Api::<Node>::all(n1)
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "n1"}})),
        )
        .await
        .expect("node");
    let uid = node.metadata.uid.expect("uid");
    let (code, msg) = api_error(
        pods.create(&PostParams::default(), &mirror("m", Some("wrong")))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            format!("pods \"m\" is forbidden: node n1 UID mismatch: expected wrong got {uid}")
                .as_str()
        )
    );
    pods.create(&PostParams::default(), &mirror("m", Some(&uid)))
        .await
        .expect("a mirror pod owned by its node");
}

#[tokio::test]
async fn service_account_volumes_follow_the_release() {
    let c = start(Profile::V1_19, true).await;
    let admin = c.admin().await;
    let pod = create_pod(&admin, "apps", "p", "n1", json!({})).await;
    let spec = pod.spec.expect("spec");
    let vol = &spec.volumes.expect("volumes")[0];
    assert!(vol.name.starts_with("default-token-"), "{}", vol.name);
    let secret_name = vol
        .secret
        .as_ref()
        .and_then(|s| s.secret_name.clone())
        .expect("a secret volume");
    assert_eq!(secret_name, vol.name);
    assert!(vol.projected.is_none());
    let mounts = spec.containers[0].volume_mounts.clone().expect("mounts");
    assert_eq!(
        (mounts[0].name.as_str(), mounts[0].mount_path.as_str()),
        (vol.name.as_str(), crate::admission::API_TOKEN_MOUNT_PATH)
    );
    // The token controller's Secret, readable by the node running the pod.
    let secret = Api::<Secret>::namespaced(c.node("n1").await, "apps")
        .get(&secret_name)
        .await
        .expect("token secret");
    assert_eq!(
        secret.type_.as_deref(),
        Some("kubernetes.io/service-account-token")
    );
    let data = secret.data.expect("data");
    for k in ["token", "ca.crt", "namespace"] {
        assert!(data.contains_key(k), "{k}");
    }
    let sa = Api::<ServiceAccount>::namespaced(admin.clone(), "apps")
        .get("default")
        .await
        .expect("sa");
    assert_eq!(
        sa.secrets.expect("secrets")[0].name.as_deref(),
        Some(secret_name.as_str())
    );
    // A second pod shares the Secret.
    let again = create_pod(&admin, "apps", "q", "n1", json!({})).await;
    assert_eq!(
        again.spec.expect("spec").volumes.expect("v")[0].name,
        secret_name
    );

    let c = start(Profile::V1_35, true).await;
    let admin = c.admin().await;
    let pod = create_pod(&admin, "apps", "p", "n1", json!({})).await;
    let vol = &pod.spec.expect("spec").volumes.expect("volumes")[0];
    assert!(vol.name.starts_with("kube-api-access-"), "{}", vol.name);
    assert!(vol.projected.is_some());
    let tokens = Api::<Secret>::namespaced(admin, "apps")
        .list(&ListParams::default().fields("type=kubernetes.io/service-account-token"))
        .await
        .expect("secrets");
    assert!(tokens.items.is_empty(), "no legacy token secrets in 1.35");
}

#[tokio::test]
async fn a_1_19_codec_drops_sidecars_and_host_ips() {
    for (profile, kept) in [(Profile::V1_19, false), (Profile::V1_35, true)] {
        let c = start(profile, false).await;
        let admin = c.admin().await;
        let pod = create_pod(
            &admin,
            "default",
            "p",
            "n1",
            json!({"initContainers": [{"name": "side", "image": "busybox", "restartPolicy": "Always"}]}),
        )
        .await;
        let init = &pod.spec.expect("spec").init_containers.expect("init")[0];
        assert_eq!(init.restart_policy.is_some(), kept, "{profile}");
        let pods = Api::<Pod>::namespaced(c.node("n1").await, "default");
        let patched = pods
            .patch_status(
                "p",
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"hostIP": "10.0.0.1",
                    "hostIPs": [{"ip": "10.0.0.1"}]}})),
            )
            .await
            .expect("status patch");
        let status = patched.status.expect("status");
        assert_eq!(status.host_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(status.host_ips.is_some(), kept, "{profile}");
        let stored = c.api.get("pods", "default", "p").expect("stored");
        assert_eq!(stored["status"].get("hostIPs").is_some(), kept, "{profile}");
    }
}

#[tokio::test]
async fn every_request_is_recorded_with_its_query_keys() {
    let c = start(Profile::V1_35, false).await;
    let n1 = c.node("n1").await;
    Api::<Pod>::all(n1)
        .list(&ListParams::default().fields("spec.nodeName=n1").limit(5))
        .await
        .expect("list");
    let seen = c
        .api
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/pods")
        .expect("recorded");
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.user.as_deref(), Some("system:node:n1"));
    let mut keys = seen.query_keys();
    keys.sort();
    assert_eq!(keys, vec!["fieldSelector", "limit"]);
}
