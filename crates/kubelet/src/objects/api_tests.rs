//! Tokens, services, claims and volumes read by a node client from the
//! apiserver double (with its Node authorizer).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Service};
use kube::Api;
use kube::api::PostParams;
use kubelet_client::clock::SystemClock;
// Tokens need TokenRequest (not served by a default 1.19 apiserver) and the
// service lister test checks the 1.31+ selector (services_tests has 1.19):
// those tests pin 1.35.
use kubelet_test_util::{Cluster, Profile};
use kubelet_volume::host::TokenRequest;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ObjectError;
use super::pvc::PersistentVolumeGetter;
use super::services::ServiceLister;
use super::token::TokenManager;

const WAIT: Duration = Duration::from_secs(10);

async fn create<K>(api: Api<K>, obj: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create")
}

/// A pod bound to n1 using `claims`.
async fn bound_pod(c: &Cluster, name: &str, claims: &[&str]) -> Pod {
    let volumes: Vec<serde_json::Value> = claims
        .iter()
        .map(|cl| serde_json::json!({"name": cl, "persistentVolumeClaim": {"claimName": cl}}))
        .collect();
    create(
        Api::namespaced(c.admin().await, "default"),
        serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
                "volumes": volumes}
        }),
    )
    .await
}

/// Polls `f` until it holds.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let ok = tokio::time::timeout(WAIT, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "{what}");
}

#[tokio::test]
async fn a_pod_bound_token_is_requested_once_and_cached() {
    let c = Cluster::start_profile(Profile::V1_35, Default::default()).await;
    // A pod whose projected token is for `vault` (from 1.33 a node may
    // request only the audiences its pods use).
    let pod: Pod = create(
        Api::namespaced(c.admin().await, "default"),
        serde_json::json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "t", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "t", "audience": "vault"}}]}}]}
        }),
    )
    .await;
    let stop = CancellationToken::new();
    let m = TokenManager::new(
        Some(c.node_client("n1").await),
        Arc::new(SystemClock),
        &TaskTracker::new(),
        &stop,
    );
    let req = TokenRequest {
        namespace: "default".into(),
        service_account: "default".into(),
        audience: "vault".into(),
        expiration_seconds: 3600,
        pod_name: "p".into(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    };
    let token = m.get_service_account_token(&req).await.unwrap();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    assert_eq!(m.get_service_account_token(&req).await.unwrap(), token);
    let posts = c
        .api
        .requests()
        .iter()
        .filter(|r| {
            r.method == "POST"
                && r.path == "/api/v1/namespaces/default/serviceaccounts/default/token"
        })
        .count();
    assert_eq!(posts, 1, "the second read is served from the cache");
    stop.cancel();
}

#[tokio::test]
async fn the_service_lister_follows_every_namespace() {
    let c = Cluster::start_profile(Profile::V1_35, Default::default()).await;
    let stop = CancellationToken::new();
    let client = c.node_client("n1").await;
    let compat = super::services::Compat {
        discovery: kubelet_client::discovery::Discovery::new(client.clone()),
        metrics: None,
        events: None,
    };
    let l = ServiceLister::new(Some((client, compat)), &TaskTracker::new(), &stop);
    let names = |l: &ServiceLister| -> Vec<String> {
        l.services()
            .iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s.metadata.namespace.as_deref().unwrap_or(""),
                    s.metadata.name.as_deref().unwrap_or("")
                )
            })
            .collect()
    };
    eventually("the lister syncs", || l.has_synced()).await;
    assert!(!l.is_standalone());
    assert!(
        names(&l).contains(&"default/kubernetes".to_string()),
        "{:?}",
        names(&l)
    );
    // Watch events come in order: the headless one, first, is filtered.
    let _: Service = create(
        Api::namespaced(c.admin().await, "default"),
        serde_json::json!({
            "metadata": {"name": "headless", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
        }),
    )
    .await;
    let _: Service = create(
        Api::namespaced(c.admin().await, "kube-system"),
        serde_json::json!({
            "metadata": {"name": "dns", "namespace": "kube-system"},
            "spec": {"ports": [{"port": 53, "protocol": "UDP"}]}
        }),
    )
    .await;
    eventually("the new service is seen", || {
        names(&l).contains(&"kube-system/dns".to_string())
    })
    .await;
    assert!(
        !names(&l).contains(&"default/headless".to_string()),
        "headless services are not watched"
    );
    assert!(
        c.api
            .requests()
            .iter()
            .filter(|r| r.path == "/api/v1/services")
            .all(|r| r.query.contains("fieldSelector=spec.clusterIP%21%3DNone")),
        "{:?}",
        c.api
            .requests()
            .iter()
            .filter(|r| r.path == "/api/v1/services")
            .map(|r| r.query.clone())
            .collect::<Vec<_>>()
    );
    let admin: Api<Service> = Api::namespaced(c.admin().await, "kube-system");
    admin
        .delete("dns", &Default::default())
        .await
        .expect("delete");
    eventually("the deleted service is gone", || {
        !names(&l).contains(&"kube-system/dns".to_string())
    })
    .await;
    stop.cancel();
}

#[tokio::test]
async fn claims_and_their_volumes_are_read_by_name() {
    let c = Cluster::start(Default::default()).await;
    let _: PersistentVolume = create(
        Api::all(c.admin().await),
        serde_json::json!({
            "metadata": {"name": "pv1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/tmp/pv1"},
                "claimRef": {"namespace": "default", "name": "claim"}}
        }),
    )
    .await;
    let _: PersistentVolumeClaim = create(
        Api::namespaced(c.admin().await, "default"),
        serde_json::json!({
            "metadata": {"name": "claim", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv1",
                "resources": {"requests": {"storage": "1Gi"}}}
        }),
    )
    .await;
    bound_pod(&c, "p", &["claim", "missing"]).await;
    let g = PersistentVolumeGetter::new(Some(c.node_client("n1").await));
    let claim = g
        .get_persistent_volume_claim("default", "claim")
        .await
        .unwrap();
    let volume_name = claim.spec.and_then(|s| s.volume_name);
    assert_eq!(volume_name.as_deref(), Some("pv1"));
    let pv = g.get_persistent_volume("pv1").await.unwrap();
    assert_eq!(pv.metadata.name.as_deref(), Some("pv1"));

    let e = g
        .get_persistent_volume_claim("default", "missing")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ObjectError::NotFound { resource: "persistentvolumeclaims", name } if name == "missing"),
        "{e:?}"
    );
    // The Node authorizer hides volumes of no claim of the node; an admin
    // sees that it does not exist.
    let admin = PersistentVolumeGetter::new(Some(c.admin().await));
    let e = admin.get_persistent_volume("nope").await.unwrap_err();
    assert!(
        matches!(&e, ObjectError::NotFound { resource: "persistentvolumes", name } if name == "nope"),
        "{e:?}"
    );
}

#[tokio::test]
async fn removing_a_pod_drops_its_watches_and_tokens() {
    let c = Cluster::start_profile(Profile::V1_35, Default::default()).await;
    let pod: Pod = create(
        Api::namespaced(c.admin().await, "default"),
        serde_json::json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox",
                "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]}],
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [{"name": "t", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "t"}}]}}]}
        }),
    )
    .await;
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let o = super::Objects::new(
        Some(c.node_client("n1").await),
        Arc::new(SystemClock),
        &tasks,
        &stop,
    );
    o.register_pod(&pod);
    assert_eq!(o.config_maps.watched().len(), 1);
    assert_eq!(o.secrets.watched().len(), 1);
    let req = TokenRequest {
        namespace: "default".into(),
        service_account: "default".into(),
        audience: String::new(),
        expiration_seconds: 3600,
        pod_name: "p".into(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    };
    o.tokens.get_service_account_token(&req).await.unwrap();
    assert_eq!(o.tokens.len(), 1);
    o.unregister_pod(&pod);
    assert!(o.config_maps.watched().is_empty());
    assert!(o.secrets.watched().is_empty());
    assert!(o.tokens.is_empty());
    stop.cancel();
}
