//! The Node authorizer against pods bound to nodes.

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Secret, Service, ServiceAccount};
use kube::api::{Api, ListParams, PostParams, WatchParams};
use serde_json::json;

use super::token::{claims, token_request};
use super::{Cluster, api_error, create_pod, from};

#[tokio::test]
async fn the_node_authorizer_follows_pods_bound_to_the_node() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    for n in ["used", "unused"] {
        Api::<Secret>::namespaced(admin.clone(), "default")
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": n}})),
            )
            .await
            .expect("secret");
    }
    Api::<PersistentVolume>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(
                json!({"metadata": {"name": "pv1"}, "spec": {"capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/pv1"},
                "claimRef": {"namespace": "default", "name": "claim"}}}),
            ),
        )
        .await
        .expect("pv");
    let pod = create_pod(
        &admin,
        "default",
        "p",
        "n1",
        json!({"volumes": [
            {"name": "s", "secret": {"secretName": "used"}},
            {"name": "d", "persistentVolumeClaim": {"claimName": "claim"}},
            {"name": "api", "projected": {"sources": [{"configMap": {"name": "kube-root-ca.crt"}},
                {"serviceAccountToken": {"path": "token"}}]}}]}),
    )
    .await;
    let n1 = c.node("n1").await;
    let secrets = Api::<Secret>::namespaced(n1.clone(), "default");
    secrets.get("used").await.expect("referenced secret");
    let (code, msg) = api_error(secrets.get("unused").await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "secrets \"unused\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
        )
    );
    let (code, msg) = api_error(secrets.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "secrets is forbidden: User \"system:node:n1\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\": No Object name found"
        )
    );
    let one = secrets
        .list(&ListParams::default().fields("metadata.name=used"))
        .await
        .expect("list of a referenced secret");
    assert_eq!(one.items.len(), 1);
    let (code, _) = api_error(
        secrets
            .list(&ListParams::default().fields("metadata.name=unused"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    // Watches are authorized the same way.
    let rv = one.metadata.resource_version.expect("rv");
    let watched = WatchParams::default()
        .fields("metadata.name=used")
        .timeout(1);
    let _stream = secrets
        .watch(&watched, &rv)
        .await
        .expect("watch of a referenced secret");
    let unwatched = WatchParams::default()
        .fields("metadata.name=unused")
        .timeout(1);
    let (code, msg) = api_error(secrets.watch(&unwatched, &rv).await.err().expect("403"));
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "secrets \"unused\" is forbidden: User \"system:node:n1\" cannot watch resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
        )
    );
    Api::<ConfigMap>::namespaced(n1.clone(), "default")
        .get("kube-root-ca.crt")
        .await
        .expect("projected configmap");
    Api::<PersistentVolume>::all(n1.clone())
        .get("pv1")
        .await
        .expect("pv bound to a used claim");
    Api::<Service>::namespaced(n1.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("nodes read services");

    // Another node reaches nothing of this pod.
    let n2 = c.node("n2").await;
    let (code, _) = api_error(
        Api::<Secret>::namespaced(n2.clone(), "default")
            .get("used")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);

    // Tokens: only for the pod's service account, bound to a pod of the node.
    let sas = Api::<ServiceAccount>::namespaced(n1.clone(), "default");
    sas.create_token_request(
        "default",
        &PostParams::default(),
        &token_request(None, None, Some(&pod)),
    )
    .await
    .expect("token for its pod");
    // From 1.33 (ServiceAccountNodeAudienceRestriction) only for an audience
    // the pod uses.
    let other = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(Some(vec!["vault"]), None, Some(&pod)),
        )
        .await;
    if c.api.profile().at_least(33) {
        let (code, msg) = api_error(other.unwrap_err());
        assert_eq!(
            (code, msg.as_str()),
            (
                403,
                "serviceaccounts \"default\" is forbidden: audience \"vault\" not found in pod spec volume, system:node:n1 is not authorized to request tokens for this audience"
            )
        );
    } else {
        other.expect("any audience before 1.33");
    }
    let (code, msg) = api_error(
        sas.create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, None, None),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "serviceaccounts \"default\" is forbidden: node requested token not bound to a pod"
        )
    );
    let (code, _) = api_error(
        Api::<ServiceAccount>::namespaced(n2.clone(), "default")
            .create_token_request(
                "default",
                &PostParams::default(),
                &token_request(None, None, Some(&pod)),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);

    // Its pods' service accounts, read for credential provider plugins in
    // token mode (1.34+); another node's pods' are not.
    sas.get("default").await.expect("its pod's service account");
    let (code, _) = api_error(
        Api::<ServiceAccount>::namespaced(n2.clone(), "default")
            .get("default")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
}

#[tokio::test]
async fn admitted_pods_reach_their_api_access_objects() {
    let c = Cluster::start_with(crate::Options {
        service_account_admission: true,
        // The projected kube-api-access volume (1.21+); 1.19's secret-based
        // token volume is in `profile_admission`.
        profile: crate::profile::Profile::V1_35,
        ..crate::Options::default()
    })
    .await;
    let admin = c.admin().await;
    let pod = create_pod(&admin, "apps", "p", "n1", json!({})).await;
    let spec = pod.spec.clone().expect("spec");
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    let vol = &spec.volumes.expect("volumes")[0];
    assert!(vol.name.starts_with("kube-api-access-"), "{}", vol.name);
    let mounts = spec.containers[0].volume_mounts.clone().expect("mounts");
    assert_eq!(mounts[0].mount_path, crate::admission::API_TOKEN_MOUNT_PATH);
    let n1 = c.node("n1").await;
    Api::<ConfigMap>::namespaced(n1.clone(), "apps")
        .get("kube-root-ca.crt")
        .await
        .expect("the volume's configmap");
    let tr = Api::<ServiceAccount>::namespaced(n1.clone(), "apps")
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, Some(3607), Some(&pod)),
        )
        .await
        .expect("the volume's token");
    // The kubelet's 3607 seconds are extended to a year, with a warnafter.
    let status = tr.status.expect("status");
    let cl = claims(&status.token);
    let iat = cl["iat"].as_i64().expect("iat");
    assert_eq!(cl["exp"].as_i64().expect("exp") - iat, 365 * 86400);
    assert_eq!(
        cl["kubernetes.io"]["warnafter"]
            .as_i64()
            .expect("warnafter")
            - iat,
        3607
    );
    assert_eq!(status.expiration_timestamp.0.as_second() - iat, 3607);
    let (code, msg) = api_error(
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), "apps")
            .create(
                &PostParams::default(),
                &from(
                    json!({"metadata": {"name": "q"}, "spec": {"serviceAccountName": "robot",
                    "containers": [{"name": "c", "image": "busybox"}]}}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "pods \"q\" is forbidden: error looking up service account apps/robot: serviceaccount \"robot\" not found"
        )
    );
}
