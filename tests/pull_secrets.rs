//! Image pull secrets on real containerd, against the registry with basic
//! auth that `deploy/setup-runtime.sh` runs on 127.0.0.1:5001 (containerd
//! reaches it as `localhost:5001`, plain http): the credentials a
//! `kubernetes.io/dockerconfigjson` secret holds, found by the keyring, let
//! the runtime pull the private image; no or wrong credentials do not. Then
//! the same through a kubelet joined to the apiserver double: a pod naming
//! the secret in `imagePullSecrets` runs, one without it gets `ErrImagePull`.

use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

use apiserver_double::Options;
use base64::Engine;
use cri::{ImageService, RemoteRuntime};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use kubelet_rs_integration::cluster::{Joined, phase};
use kubelet_rs_integration::require_runtime;
use kubelet_runtime::credentialprovider::{
    self, BasicDockerKeyring, DockerKeyring, make_docker_keyring,
};
use serde_json::{Value, json};

/// The image behind the test credentials.
const PRIVATE: &str = "localhost:5001/private/busybox:1.35";
/// The registry's test user and password (fixed in `deploy/setup-runtime.sh`).
const USER: &str = "kubelet-test";
const PASSWORD: &str = "kubelet-test-pull-secret";

/// A `kubernetes.io/dockerconfigjson` secret for the private registry.
fn pull_secret(name: &str, user: &str, password: &str) -> Secret {
    let auth = format!("{user}:{password}");
    let doc = json!({"auths": {"localhost:5001": {
        "auth": base64::engine::general_purpose::STANDARD.encode(auth),
        "email": "kubelet-test@example.com",
    }}});
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": ByteString(doc.to_string().into_bytes())},
    }))
    .expect("secret")
}

/// The machine-wide lock the harness's kubelets hold: the private image is
/// removed and pulled here, which a kubelet test must not see half done.
fn lock() -> File {
    kubelet_rs_integration::lane::lock()
}

async fn remove(rt: &RemoteRuntime) {
    rt.remove_image(PRIVATE).await.expect("remove image");
    assert!(
        rt.image_status(PRIVATE).await.expect("status").is_none(),
        "{PRIVATE} removed"
    );
}

#[tokio::test]
async fn the_runtime_pulls_the_private_image_only_with_the_secret_s_credentials() {
    let rt = require_runtime().await;
    let _lock = tokio::task::spawn_blocking(lock).await.expect("lock task");
    remove(&rt).await;

    // No credentials: the registry refuses.
    let e = rt
        .pull_image(PRIVATE, None, None)
        .await
        .expect_err("anonymous pull of a private image");
    assert!(
        e.message().contains("401") || e.message().contains("authoriz"),
        "refused for want of credentials: {e}"
    );
    assert!(rt.image_status(PRIVATE).await.expect("status").is_none());

    // What the keyring makes of the secrets, as the kubelet asks it.
    let repo = credentialprovider::repo_to_pull(PRIVATE).expect("image name");
    assert_eq!(repo, "localhost:5001/private/busybox");
    let node: Arc<dyn DockerKeyring> = Arc::new(BasicDockerKeyring::default());
    let secrets = [
        pull_secret("stale", USER, "not-the-password"),
        pull_secret("good", USER, PASSWORD),
    ];
    let candidates = make_docker_keyring(&secrets, node)
        .expect("keyring")
        .lookup(&repo);
    assert_eq!(candidates.len(), 2, "both secrets match the registry");

    // Wrong credentials: refused too.
    let wrong: cri::pb::AuthConfig = (&candidates[0]).into();
    assert_eq!(wrong.password, "not-the-password");
    rt.pull_image(PRIVATE, Some(wrong), None)
        .await
        .expect_err("pull with a wrong password");

    // The right ones: pulled.
    let right: cri::pb::AuthConfig = (&candidates[1]).into();
    assert_eq!(
        (right.username.as_str(), right.password.as_str()),
        (USER, PASSWORD)
    );
    let image_ref = rt
        .pull_image(PRIVATE, Some(right), None)
        .await
        .expect("pull with the secret's credentials");
    let img = rt
        .image_status(PRIVATE)
        .await
        .expect("status")
        .expect("the private image is on the node");
    assert_eq!(img.id, image_ref);
    remove(&rt).await;
}

/// The waiting reason of the pod's only container in the apiserver.
fn waiting_reason(p: Option<&Value>) -> Option<&str> {
    p?["status"]["containerStatuses"][0]["state"]["waiting"]["reason"].as_str()
}

#[tokio::test]
async fn a_pod_with_image_pull_secrets_runs_and_one_without_fails_to_pull() {
    let j = Joined::start(Options::default()).await;
    // The kubelet holds the machine lock: the image is pulled fresh.
    remove(&j.node.runtime).await;
    Api::<Secret>::namespaced(j.admin.clone(), "default")
        .create(
            &PostParams::default(),
            &pull_secret("private-registry", USER, PASSWORD),
        )
        .await
        .expect("create secret");
    let spec = |secrets: Value| {
        json!({
            "terminationGracePeriodSeconds": 2,
            "imagePullSecrets": secrets,
            "containers": [{"name": "main", "image": PRIVATE, "imagePullPolicy": "Always",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}],
        })
    };

    j.create_pod("anonymous", spec(json!([]))).await;
    let p = j
        .wait_api(
            "anonymous",
            Duration::from_secs(60),
            "failing to pull",
            |p| matches!(waiting_reason(p), Some("ErrImagePull" | "ImagePullBackOff")),
        )
        .await;
    assert_eq!(phase(p.as_ref()), Some("Pending"));

    j.create_pod("authorized", spec(json!([{"name": "private-registry"}])))
        .await;
    j.wait_api("authorized", Duration::from_secs(60), "Running", |p| {
        phase(p) == Some("Running")
    })
    .await;
    // The pod without the secret still cannot pull, though the image is now
    // on the node: it is pulled `Always`, with its own (no) credentials.
    let p = j.api_pod("anonymous");
    assert!(
        matches!(
            waiting_reason(p.as_ref()),
            Some("ErrImagePull" | "ImagePullBackOff")
        ),
        "{p:?}"
    );
    j.cleanup().await;
    let rt = require_runtime().await;
    let _lock = tokio::task::spawn_blocking(lock).await.expect("lock task");
    remove(&rt).await;
}
