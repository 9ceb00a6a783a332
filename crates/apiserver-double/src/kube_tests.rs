//! The double seen through kube-rs, as the kubelet sees it: published
//! objects, TokenRequest, `metadata.name` watches and the Node authorizer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume, Pod, Secret, Service, ServiceAccount,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Error};
use serde_json::{Value, json};

use crate::{ApiServer, Options};

struct Cluster {
    api: ApiServer,
    dir: std::path::PathBuf,
}

impl Cluster {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = ApiServer::start(Options::default()).await.expect("double");
        let dir = std::env::temp_dir().join(format!("apiserver-double-{}", crate::rest::new_uid()));
        std::fs::create_dir_all(&dir).expect("dir");
        Self { api, dir }
    }

    async fn client(&self, path: &std::path::Path) -> Client {
        let kc = Kubeconfig::read_from(path).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("config");
        Client::try_from(config).expect("client")
    }

    async fn admin(&self) -> Client {
        let p = self.dir.join("admin.conf");
        self.api.write_admin_kubeconfig(&p).expect("admin");
        self.client(&p).await
    }

    async fn node(&self, node: &str) -> Client {
        let p = self.dir.join(format!("{node}.conf"));
        let user = format!("system:node:{node}");
        self.api
            .write_cert_kubeconfig(&p, &user, &["system:nodes"])
            .expect("node");
        self.client(&p).await
    }

    async fn bearer(&self, token: &str) -> Client {
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

fn from<T: k8s_openapi::serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

fn api_error(e: Error) -> (u16, String) {
    match e {
        Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

async fn create_pod(admin: &Client, ns: &str, name: &str, node: &str, spec: Value) -> Pod {
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

fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("payload");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("b64")).expect("claims")
}

/// Checks the ES256 signature with the double's public key.
fn verify(api: &ApiServer, token: &str) -> bool {
    use rcgen::PublicKeyData;
    let (input, sig) = token.rsplit_once('.').expect("signed");
    let raw = URL_SAFE_NO_PAD.decode(sig).expect("b64");
    let int = |b: &[u8]| {
        let b = &b[b.iter().position(|x| *x != 0).unwrap_or(b.len() - 1)..];
        let mut v = vec![0x02];
        if b[0] & 0x80 != 0 {
            v.extend([u8::try_from(b.len() + 1).expect("len"), 0]);
        } else {
            v.push(u8::try_from(b.len()).expect("len"));
        }
        v.extend(b);
        v
    };
    let mut body = int(&raw[..32]);
    body.extend(int(&raw[32..]));
    let mut der = vec![0x30, u8::try_from(body.len()).expect("len")];
    der.extend(body);
    let provider = rustls::crypto::ring::default_provider();
    let alg = provider
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(s, _)| *s == rustls::SignatureScheme::ECDSA_NISTP256_SHA256)
        .expect("p256")
        .1[0];
    alg.verify_signature(api.shared.signer.key.der_bytes(), input.as_bytes(), &der)
        .is_ok()
}

fn token_request(
    audiences: Option<Vec<&str>>,
    seconds: Option<i64>,
    pod: Option<&Pod>,
) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences
                .map(|a| a.iter().map(|s| s.to_string()).collect())
                .unwrap_or_default(),
            expiration_seconds: seconds,
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: p.metadata.name.clone(),
                uid: p.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn token_requests_issue_signed_bound_tokens() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    let pod = create_pod(&admin, "default", "p", "n1", json!({})).await;
    let sas = Api::<ServiceAccount>::namespaced(admin.clone(), "default");
    let sa = sas.get("default").await.expect("sa");
    let before = jiff::Timestamp::now().as_second();
    let tr = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(Some(vec!["vault"]), Some(600), Some(&pod)),
        )
        .await
        .expect("token");
    let status = tr.status.expect("status");
    assert!(verify(&c.api, &status.token), "signature checks out");
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(status.token.split('.').next().expect("header"))
            .expect("b64"),
    )
    .expect("header");
    assert_eq!(
        header,
        json!({"alg": "ES256", "kid": c.api.service_account_key_id()})
    );
    let cl = claims(&status.token);
    assert_eq!(cl["iss"], json!(crate::DEFAULT_ISSUER));
    assert_eq!(cl["sub"], json!("system:serviceaccount:default:default"));
    assert_eq!(cl["aud"], json!(["vault"]));
    let (iat, exp) = (
        cl["iat"].as_i64().expect("iat"),
        cl["exp"].as_i64().expect("exp"),
    );
    assert_eq!(exp - iat, 600);
    assert_eq!(cl["nbf"], cl["iat"]);
    assert!(iat >= before);
    assert_eq!(status.expiration_timestamp.0.as_second(), exp);
    assert_eq!(
        cl["kubernetes.io"],
        json!({"namespace": "default",
            "serviceaccount": {"name": "default", "uid": sa.metadata.uid},
            "pod": {"name": "p", "uid": pod.metadata.uid}})
    );

    // Defaults: one hour, the API audience.
    let tr = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, None, None),
        )
        .await
        .expect("token");
    assert_eq!(tr.spec.expiration_seconds, Some(3600));
    let token = tr.status.expect("status").token;
    let cl = claims(&token);
    assert_eq!(
        cl["exp"].as_i64().expect("exp") - cl["iat"].as_i64().expect("iat"),
        3600
    );
    assert_eq!(cl["aud"], json!([crate::DEFAULT_ISSUER]));
    assert!(cl["kubernetes.io"].get("pod").is_none());

    // The token authenticates the service account.
    let review = Api::<TokenReview>::all(admin.clone())
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.clone()),
                    audiences: None,
                },
                ..Default::default()
            },
        )
        .await
        .expect("review");
    let st = serde_json::to_value(review.status.expect("status")).expect("json");
    assert_eq!(st["authenticated"], json!(true));
    assert_eq!(
        st["user"]["username"],
        json!("system:serviceaccount:default:default")
    );
    assert_eq!(
        st["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );
    let (code, msg) = api_error(
        Api::<Secret>::namespaced(c.bearer(&token).await, "default")
            .get("x")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403, "authenticated, not authorized: {msg}");
    assert!(
        msg.contains("User \"system:serviceaccount:default:default\""),
        "{msg}"
    );

    // Too short, unknown service account, a pod that is not the bound one.
    let (code, msg) = api_error(
        sas.create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, Some(599), None),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            422,
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
        )
    );
    let (code, msg) = api_error(
        sas.create_token_request(
            "nobody",
            &PostParams::default(),
            &token_request(None, None, None),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (404, "serviceaccounts \"nobody\" not found")
    );
    let mut stale = pod.clone();
    stale.metadata.uid = Some("0000".into());
    let (code, _) = api_error(
        sas.create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, None, Some(&stale)),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 409);
    // Once the bound pod is gone, its tokens no longer authenticate.
    let bound = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, None, Some(&pod)),
        )
        .await
        .expect("token")
        .status
        .expect("status")
        .token;
    assert!(c.api.review_token(&bound, &[]).is_some());
    Api::<Pod>::namespaced(admin.clone(), "default")
        .delete("p", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    assert!(c.api.review_token(&bound, &[]).is_none());
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
            {"name": "api", "projected": {"sources": [{"configMap": {"name": "kube-root-ca.crt"}}]}}]}),
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
}
