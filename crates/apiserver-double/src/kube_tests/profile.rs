//! Version profiles seen through kube-rs: what a 1.19 and a 1.35 apiserver
//! accept and refuse (`crate::profile`).

use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use super::{Cluster, api_error, create_pod};
use crate::Options;
use crate::profile::Profile;

async fn start(profile: Profile) -> Cluster {
    Cluster::start_with(Options {
        profile,
        ..Options::default()
    })
    .await
}

/// A raw GET as `client`: status code and body text.
async fn raw_get(client: &kube::Client, path: &str) -> (u16, String) {
    let req = http::Request::get(path).body(Vec::new()).expect("request");
    match client.request_text(req).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{path}: {e}"),
    }
}

#[tokio::test]
async fn the_services_watch_selector_is_refused_before_1_31() {
    let lp = ListParams::default().fields("spec.clusterIP!=None");
    let c = start(Profile::V1_35).await;
    let n1 = c.node("n1").await;
    let all = Api::<Service>::all(n1.clone())
        .list(&lp)
        .await
        .expect("1.35 knows spec.clusterIP");
    assert!(
        all.items
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some("kubernetes"))
    );
    let (code, msg) = api_error(
        Api::<Service>::all(n1)
            .list(&ListParams::default().fields("spec.ports=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (400, "field label not supported: spec.ports")
    );

    let c = start(Profile::V1_19).await;
    let n1 = c.node("n1").await;
    let (code, msg) = api_error(Api::<Service>::all(n1.clone()).list(&lp).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            400,
            "\"spec.clusterIP\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )
    );
    // A watch is refused the same way.
    let watched = Api::<Service>::all(n1)
        .watch(
            &kube::api::WatchParams::default().fields("spec.clusterIP!=None"),
            "0",
        )
        .await;
    let Err(e) = watched else {
        panic!("a 1.19 watch with spec.clusterIP must fail")
    };
    assert_eq!(api_error(e).0, 400);
}

#[tokio::test]
async fn pod_field_selectors_follow_the_release() {
    let host_network = ListParams::default().fields("spec.hostNetwork=true");
    let c = start(Profile::V1_19).await;
    let admin = c.admin().await;
    let (code, msg) = api_error(
        Api::<Pod>::all(admin.clone())
            .list(&host_network)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (400, "field label not supported: spec.hostNetwork")
    );
    let (code, msg) = api_error(
        Api::<Pod>::all(admin.clone())
            .list(&ListParams::default().fields("spec.nodeName in (n1)"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            400,
            "invalid selector: 'spec.nodeName in (n1)'; can't understand 'spec.nodeName in (n1)'"
        )
    );
    Api::<Pod>::all(admin.clone())
        .list(&ListParams::default().fields("spec.nodeName=n1,status.phase!=Failed"))
        .await
        .expect("known pod labels");
    Api::<Secret>::namespaced(admin, "default")
        .list(&ListParams::default().fields("type=Opaque"))
        .await
        .expect("secrets know type");

    let c = start(Profile::V1_35).await;
    Api::<Pod>::all(c.admin().await)
        .list(&host_network)
        .await
        .expect("1.35 knows spec.hostNetwork");
}

#[tokio::test]
async fn node_k8s_io_versions_follow_the_release() {
    let c = start(Profile::V1_19).await;
    let admin = c.admin().await;
    let (code, msg) = api_error(
        Api::<RuntimeClass>::all(admin.clone())
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    // 1.19's handler chain ends in Go's plain-text NotFound.
    assert_eq!((code, msg.as_str()), (404, "404 page not found"));
    let (code, _) = raw_get(&admin, "/apis/node.k8s.io/v1beta1/runtimeclasses").await;
    assert_eq!(code, 200);
    let (code, _) = raw_get(&admin, "/apis/node.k8s.io/v1").await;
    assert_eq!(code, 404);
    let (_, doc) = raw_get(&admin, "/apis").await;
    let groups: Value = serde_json::from_str(&doc).expect("APIGroupList");
    let node = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["name"] == "node.k8s.io")
        .expect("node.k8s.io");
    assert_eq!(node["preferredVersion"]["version"], "v1beta1");

    let c = start(Profile::V1_35).await;
    let admin = c.admin().await;
    Api::<RuntimeClass>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("node.k8s.io/v1");
    let (code, msg) = raw_get(&admin, "/apis/node.k8s.io/v1beta1/runtimeclasses/x").await;
    assert_eq!(
        (code, msg.as_str()),
        (404, "the server could not find the requested resource")
    );
}

#[tokio::test]
async fn discovery_and_version_name_the_release() {
    for (profile, minor, token) in [(Profile::V1_19, "19", false), (Profile::V1_35, "35", true)] {
        let c = start(profile).await;
        let admin = c.admin().await;
        let v = admin.apiserver_version().await.expect("/version");
        assert_eq!((v.major.as_str(), v.minor.as_str()), ("1", minor));
        assert_eq!(v.git_version, profile.git_version());
        let core = admin.list_core_api_resources("v1").await.expect("/api/v1");
        let names: Vec<&str> = core.resources.iter().map(|r| r.name.as_str()).collect();
        assert!(names.contains(&"pods/status"), "{names:?}");
        assert_eq!(
            names.contains(&"serviceaccounts/token"),
            token,
            "{profile}: {names:?}"
        );
        assert_eq!(
            names.contains(&"pods/ephemeralcontainers"),
            token,
            "{profile}: {names:?}"
        );
        let (code, _) = raw_get(
            &admin,
            "/api/v1/namespaces/default/pods/nosuch/ephemeralcontainers",
        )
        .await;
        assert_eq!(code, 404);
    }
}

#[tokio::test]
async fn a_node_reads_all_pods_and_nodes_only_before_1_32() {
    let mine = ListParams::default().fields("spec.nodeName=n1");
    let c = start(Profile::V1_35).await;
    let admin = c.admin().await;
    create_pod(&admin, "default", "other", "n2", json!({})).await;
    create_pod(&admin, "default", "own", "n1", json!({})).await;
    let n1 = c.node("n1").await;
    let pods = Api::<Pod>::all(n1.clone());
    let (code, msg) = api_error(pods.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "pods is forbidden: User \"system:node:n1\" cannot list resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector"
        )
    );
    assert_eq!(pods.list(&mine).await.expect("own pods").items.len(), 1);
    let in_ns = Api::<Pod>::namespaced(n1.clone(), "default");
    in_ns.get("own").await.expect("a pod bound to the node");
    let (code, msg) = api_error(in_ns.get("other").await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "pods \"other\" is forbidden: User \"system:node:n1\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
        )
    );
    let nodes = Api::<Node>::all(n1.clone());
    let (code, msg) = api_error(nodes.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "nodes is forbidden: User \"system:node:n1\" cannot list resource \"nodes\" in API group \"\" at the cluster scope: node 'n1' cannot read all nodes, only its own Node object"
        )
    );
    let (code, msg) = api_error(nodes.get("n2").await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            403,
            "nodes \"n2\" is forbidden: User \"system:node:n1\" cannot get resource \"nodes\" in API group \"\" at the cluster scope: node 'n1' cannot read 'n2', only its own Node object"
        )
    );
    let own = nodes
        .list(&ListParams::default().fields("metadata.name=n1"))
        .await
        .expect("its own node by name");
    assert!(own.items.is_empty(), "not registered yet");

    let c = start(Profile::V1_19).await;
    let admin = c.admin().await;
    create_pod(&admin, "default", "other", "n2", json!({})).await;
    let n1 = c.node("n1").await;
    let all = Api::<Pod>::all(n1.clone())
        .list(&ListParams::default())
        .await
        .expect("1.19 NodeRules: list any pod");
    assert_eq!(all.items.len(), 1);
    Api::<Pod>::namespaced(n1.clone(), "default")
        .get("other")
        .await
        .expect("1.19: get any pod");
    Api::<Node>::all(n1)
        .list(&ListParams::default())
        .await
        .expect("1.19: list nodes");
}

#[tokio::test]
async fn nodes_read_their_pods_service_accounts_only_from_1_34() {
    for (profile, allowed) in [(Profile::V1_19, false), (Profile::V1_35, true)] {
        let c = start(profile).await;
        let admin = c.admin().await;
        create_pod(
            &admin,
            "default",
            "p",
            "n1",
            json!({"serviceAccountName": "default"}),
        )
        .await;
        let n1 = c.node("n1").await;
        let got = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(n1, "default")
            .get("default")
            .await;
        match (allowed, got) {
            (true, Ok(_)) => {}
            (false, Err(e)) => assert_eq!(api_error(e).0, 403, "{profile:?}"),
            (_, other) => panic!("{profile:?}: {other:?}"),
        }
    }
}
