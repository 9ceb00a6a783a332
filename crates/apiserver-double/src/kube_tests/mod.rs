//! The double seen through kube-rs, as the kubelet sees it: published
//! objects, TokenRequest, `metadata.name` watches and the Node authorizer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod concurrency;
mod ephemeral;
mod node;
mod profile;
mod profile_admission;
mod pvc_status;
mod storage;
mod token;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Error};
use serde_json::{Value, json};

use crate::{ApiServer, Options};

pub(super) struct Cluster {
    pub(super) api: ApiServer,
    dir: std::path::PathBuf,
}

impl Cluster {
    /// A 1.35 double, whatever `KUBELET_RS_APISERVER_PROFILE` says: these
    /// tests check the newest release's behaviour (TokenRequest, the Node
    /// authorizer's selectors, ephemeral containers); the 1.19 profile has
    /// its own (`profile`, `profile_admission`).
    pub(super) async fn start() -> Self {
        Self::start_with(Options {
            profile: crate::profile::Profile::V1_35,
            ..Options::default()
        })
        .await
    }

    pub(super) async fn start_with(options: Options) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = ApiServer::start(options).await.expect("double");
        let dir = std::env::temp_dir().join(format!("apiserver-double-{}", crate::rest::new_uid()));
        std::fs::create_dir_all(&dir).expect("dir");
        Self { api, dir }
    }

    pub(super) async fn client(&self, path: &std::path::Path) -> Client {
        let kc = Kubeconfig::read_from(path).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("config");
        Client::try_from(config).expect("client")
    }

    pub(super) async fn admin(&self) -> Client {
        let p = self.dir.join("admin.conf");
        self.api.write_admin_kubeconfig(&p).expect("admin");
        self.client(&p).await
    }

    pub(super) async fn node(&self, node: &str) -> Client {
        let p = self.dir.join(format!("{node}.conf"));
        let user = format!("system:node:{node}");
        self.api
            .write_cert_kubeconfig(&p, &user, &["system:nodes"])
            .expect("node");
        self.client(&p).await
    }

    pub(super) async fn bearer(&self, token: &str) -> Client {
        let p = self.dir.join("token.conf");
        self.api.write_token_kubeconfig(&p, token).expect("token");
        self.client(&p).await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn from<T: k8s_openapi::serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

pub(super) fn api_error(e: Error) -> (u16, String) {
    match e {
        Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

pub(super) async fn create_pod(
    admin: &Client,
    ns: &str,
    name: &str,
    node: &str,
    spec: Value,
) -> Pod {
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": name}, "spec": spec})),
        )
        .await
        .expect("pod")
}

#[tokio::test]
async fn the_cluster_publishes_the_kubernetes_service_and_the_root_ca() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    let svc = Api::<Service>::namespaced(admin.clone(), "default")
        .get("kubernetes")
        .await
        .expect("kubernetes service");
    let v = serde_json::to_value(&svc).expect("json");
    assert_eq!(v["spec"]["clusterIP"], json!("10.96.0.1"));
    assert_eq!(
        v["spec"]["ports"],
        json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": c.api.port()}])
    );
    for ns in ["default", "kube-system"] {
        let cm = Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .get("kube-root-ca.crt")
            .await
            .expect("root ca");
        assert_eq!(cm.data.expect("data")["ca.crt"], c.api.ca_pem());
        Api::<ServiceAccount>::namespaced(admin.clone(), ns)
            .get("default")
            .await
            .expect("default service account");
    }
    // A namespace created later, or implied by a pod created in it, gets them too.
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "team"}})),
        )
        .await
        .expect("namespace");
    create_pod(&admin, "implied", "p", "n1", json!({})).await;
    for ns in ["team", "implied"] {
        let cm = Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .get("kube-root-ca.crt")
            .await
            .expect("root ca in a new namespace");
        assert_eq!(cm.data.expect("data")["ca.crt"], c.api.ca_pem());
        Api::<ServiceAccount>::namespaced(admin.clone(), ns)
            .get("default")
            .await
            .expect("default service account in a new namespace");
    }
    // The publisher puts back what is deleted.
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), "team");
    cms.delete("kube-root-ca.crt", &Default::default())
        .await
        .expect("delete");
    cms.get("kube-root-ca.crt").await.expect("published again");

    // Services get a ClusterIP from the service CIDR and TCP ports.
    let svcs = Api::<Service>::namespaced(admin.clone(), "team");
    let s = svcs
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})),
        )
        .await
        .expect("service");
    let v = serde_json::to_value(&s).expect("json");
    let ip: std::net::Ipv4Addr = v["spec"]["clusterIP"]
        .as_str()
        .expect("ip")
        .parse()
        .expect("ip");
    // In 10.96.0.0/12, and not the kubernetes Service's address.
    assert_eq!(
        u32::from(ip) >> 20,
        u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) >> 20
    );
    assert_ne!(ip, crate::strategy::KUBERNETES_SERVICE_IP);
    assert_eq!(v["spec"]["ports"][0]["protocol"], json!("TCP"));
    let err = svcs
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "dup"}, "spec": {"clusterIP": ip.to_string(), "ports": [{"port": 80}]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 422);

    // Secrets: stringData is written into data, type defaults to Opaque.
    let s = Api::<Secret>::namespaced(admin.clone(), "team")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "s"}, "stringData": {"k": "v"}})),
        )
        .await
        .expect("secret");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    assert_eq!(s.data.expect("data")["k"].0, b"v");
    assert!(s.string_data.is_none());
}

#[tokio::test]
async fn a_metadata_name_watch_sees_only_its_object() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), "default");
    for n in ["a", "b"] {
        cms.create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": n}, "data": {"k": "0"}})),
        )
        .await
        .expect("cm");
    }
    let list = cms
        .list(&ListParams::default().fields("metadata.name=a"))
        .await
        .expect("list");
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("a"));
    let rv = list.metadata.resource_version.expect("rv");
    let mut events = cms
        .watch(
            &WatchParams::default().fields("metadata.name=a").timeout(30),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();
    let set = |v: &str| Patch::Merge(json!({"data": {"k": v}}));
    cms.patch("b", &PatchParams::default(), &set("1"))
        .await
        .expect("patch b");
    cms.patch("a", &PatchParams::default(), &set("2"))
        .await
        .expect("patch a");
    match events.try_next().await.expect("event").expect("open") {
        WatchEvent::Modified(cm) => {
            assert_eq!(cm.metadata.name.as_deref(), Some("a"));
            assert_eq!(cm.data.expect("data")["k"], "2");
        }
        other => panic!("want MODIFIED a, got {other:?}"),
    }
    cms.delete("b", &Default::default())
        .await
        .expect("delete b");
    cms.delete("a", &Default::default())
        .await
        .expect("delete a");
    match events.try_next().await.expect("event").expect("open") {
        WatchEvent::Deleted(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("a")),
        other => panic!("want DELETED a, got {other:?}"),
    }
    // An object created after the watch started is ADDED.
    let mut events = cms
        .watch(
            &WatchParams::default().fields("metadata.name=c").timeout(30),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();
    cms.create(
        &PostParams::default(),
        &from(json!({"metadata": {"name": "c"}})),
    )
    .await
    .expect("cm c");
    match events.try_next().await.expect("event").expect("open") {
        WatchEvent::Added(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("c")),
        other => panic!("want ADDED c, got {other:?}"),
    }
    // Cluster-scoped kinds and metadata.namespace select too.
    let ns = Api::<Namespace>::all(admin.clone())
        .list(&ListParams::default().fields("metadata.name=kube-system"))
        .await
        .expect("namespaces");
    assert_eq!(ns.items.len(), 1);
    let sas = Api::<ServiceAccount>::all(admin.clone())
        .list(&ListParams::default().fields("metadata.namespace=kube-public"))
        .await
        .expect("service accounts");
    assert_eq!(sas.items.len(), 1);
}
