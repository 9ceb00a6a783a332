//! Image credential provider plugins (upstream `pkg/credentialprovider/plugin`)
//! on real containerd: a kubelet started with
//! `--image-credential-provider-config` and
//! `--image-credential-provider-bin-dir` runs the plugin script of
//! `tests/fixtures/credential-provider` for an image of the registry with
//! basic auth that `deploy/setup-runtime.sh` runs on 127.0.0.1:5001
//! (containerd reaches it as `localhost:5001`), and pulls with what it
//! answers; a pod has no image pull secrets (static pods cannot). While the
//! plugin answers with a wrong password the pull fails with `ErrImagePull`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use apiserver_double::Options;
use cri::ImageService;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubelet_rs_integration::cluster::Joined;
use kubelet_rs_integration::{Node, is_running, pod_yaml, waiting_reason};

/// The image behind the test credentials.
const PRIVATE: &str = "localhost:5001/private/busybox:1.35";
/// The plugin's name, its binary's name in the bin dir.
const PLUGIN: &str = "test-registry-creds";

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/credential-provider")
        .join(PLUGIN)
}

/// The bin dir with the plugin, and a config naming it for `localhost:5001`.
fn install(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    install_with(dir, "")
}

/// [`install`] with `extra` appended to the provider's entry (indented as
/// its fields).
fn install_with(dir: &Path, extra: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::fs::copy(fixture(), bin.join(PLUGIN)).expect("copy plugin");
    std::fs::set_permissions(bin.join(PLUGIN), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let config = dir.join("credential-provider-config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\n\
             kind: CredentialProviderConfig\n\
             providers:\n\
             - name: {PLUGIN}\n  \
               matchImages: [\"localhost:5001\", \"*.registry.invalid\"]\n  \
               defaultCacheDuration: 10s\n  \
               apiVersion: credentialprovider.kubelet.k8s.io/v1\n  \
               args: [get-credentials]\n  \
               env:\n  \
               - name: CREDS_REQUESTS\n    value: {requests}\n  \
               - name: CREDS_DENY\n    value: {deny}\n{extra}",
            requests = dir.join("requests").display(),
            deny = dir.join("deny").display(),
        ),
    )
    .expect("config");
    (config, bin)
}

/// The requests the plugin was sent, in order.
fn requests(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("requests"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("request json"))
        .collect()
}

async fn remove_private_image(node: &Node) {
    node.runtime
        .remove_image(PRIVATE)
        .await
        .expect("remove image");
    assert!(
        node.runtime
            .image_status(PRIVATE)
            .await
            .expect("status")
            .is_none(),
        "{PRIVATE} removed"
    );
}

#[tokio::test]
async fn a_pod_pulls_a_private_image_with_the_credentials_a_plugin_supplies() {
    let dir = tempfile::tempdir().expect("tmp");
    let (config, bin) = install(dir.path());
    std::fs::write(dir.path().join("deny"), "").expect("deny");
    let node = Node::start(|f| {
        f.image_credential_provider_config = Some(config.clone());
        f.image_credential_provider_bin_dir = Some(bin.clone());
    })
    .await;
    // The kubelet holds the machine lock: the image is pulled fresh.
    remove_private_image(&node).await;
    let run = "trap 'exit 0' TERM; while true; do sleep 1; done";

    // The plugin answers with a wrong password: the registry refuses.
    node.write_manifest("denied.yaml", &pod_yaml("denied", "Never", PRIVATE, run));
    node.wait_status("denied", Duration::from_secs(60), "failing to pull", |s| {
        matches!(
            waiting_reason(s, "c").as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        )
    })
    .await
    .expect("denied");
    node.remove_manifest("denied.yaml");
    let asked = requests(dir.path());
    assert!(!asked.is_empty(), "the plugin was run");
    // The request as upstream sends it: the repository without the tag.
    assert_eq!(
        asked[0],
        serde_json::json!({
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "kind": "CredentialProviderRequest",
            "image": "localhost:5001/private/busybox",
        })
    );

    // The right credentials: the pod runs, without image pull secrets.
    std::fs::remove_file(dir.path().join("deny")).expect("allow");
    node.write_manifest("allowed.yaml", &pod_yaml("allowed", "Never", PRIVATE, run));
    node.wait_status("allowed", Duration::from_secs(60), "running", |s| {
        is_running(s, "c")
    })
    .await
    .expect("allowed");
    assert!(
        node.runtime
            .image_status(PRIVATE)
            .await
            .expect("status")
            .is_some(),
        "pulled"
    );
    node.cleanup().await;
}

/// The double with the RBAC an operator applies for the plugin's audience:
/// from 1.33 NodeRestriction lets a node request tokens only for audiences
/// its pods use or RBAC grants it (`request-serviceaccounts-token-audience`).
fn audience_rbac() -> Options {
    Options {
        access_rules: vec![apiserver_double::review::AccessRule::new(
            apiserver_double::review::Subject::Group("system:nodes".into()),
            &["request-serviceaccounts-token-audience"],
            &["registry.test"],
        )],
        ..Options::default()
    }
}

/// Service-account token mode (KEP-4412, `tokenAttributes`): the plugin is
/// sent a token for the pod's service account with the configured audience,
/// bound to the pod, and the annotations the config names. From 1.34 the
/// Node authorizer lets the kubelet read its pods' service accounts; an
/// older apiserver refuses, so the plugin is never run and the pull fails
/// as upstream's would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_in_token_mode_is_sent_a_token_for_the_pods_service_account() {
    let dir = tempfile::tempdir().expect("tmp");
    let (config, bin) = install_with(
        dir.path(),
        "  tokenAttributes:\n    \
           serviceAccountTokenAudience: registry.test\n    \
           requireServiceAccount: true\n    \
           cacheType: ServiceAccount\n    \
           optionalServiceAccountAnnotationKeys: [\"example.com/role\"]\n",
    );
    let j = Joined::start_with(audience_rbac(), |f, _| {
        f.image_credential_provider_config = Some(config.clone());
        f.image_credential_provider_bin_dir = Some(bin.clone());
    })
    .await;
    remove_private_image(&j.node).await;
    Api::<ServiceAccount>::namespaced(j.admin.clone(), "default")
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"example.com/role": "puller"}}
            })),
        )
        .await
        .expect("annotate the service account");
    j.create_pod(
        "tok",
        serde_json::json!({
            "serviceAccountName": "default",
            "containers": [{"name": "c", "image": PRIVATE, "command": ["sleep", "3600"]}],
        }),
    )
    .await;
    let waiting = |p: Option<&serde_json::Value>| {
        p.and_then(|p| p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"].as_str())
            .map(str::to_string)
    };
    if j.api.profile().at_least(34) {
        let p = j
            .wait_api("tok", Duration::from_secs(60), "running", |p| {
                p.is_some_and(|p| {
                    p["status"]["containerStatuses"][0]["state"]["running"].is_object()
                })
            })
            .await
            .expect("pod");
        let asked = requests(dir.path());
        let r = asked.last().expect("the plugin was run");
        let token = r["serviceAccountToken"].as_str().unwrap_or_default();
        assert!(!token.is_empty(), "a token was sent: {r}");
        assert_eq!(
            r["serviceAccountAnnotations"],
            serde_json::json!({"example.com/role": "puller"}),
            "{r}"
        );
        assert_eq!(r["image"], "localhost:5001/private/busybox", "{r}");
        // The token is bound to the pod, for the configured audience.
        let review = j
            .api
            .review_token(token, &["registry.test".to_string()])
            .expect("the double issued it for the audience");
        assert_eq!(review.service_account, "default");
        assert_eq!(
            review.pod.as_ref().map(|(_, uid)| uid.as_str()),
            p["metadata"]["uid"].as_str()
        );
    } else {
        j.wait_api("tok", Duration::from_secs(60), "failing to pull", |p| {
            matches!(
                waiting(p).as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        })
        .await;
        assert!(
            requests(dir.path()).is_empty(),
            "the plugin is not run without the service account"
        );
    }
    j.cleanup().await;
}

/// `cacheType: Token`: an answer is cached for the token it was given, and
/// the kubelet's token manager hands out the same token for the same pod
/// until it needs a refresh, so two pulls of one pod (two containers of the
/// image with `imagePullPolicy: Always`) run the plugin once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_cache_type_answers_a_pods_second_pull_from_the_cache() {
    if !apiserver_double::profile::Profile::from_env_or_default().at_least(34) {
        // The Node authorizer refuses the service account read before 1.34:
        // the plugin is never run (see the test above).
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (config, bin) = install_with(
        dir.path(),
        "  tokenAttributes:\n    \
           serviceAccountTokenAudience: registry.test\n    \
           requireServiceAccount: true\n    \
           cacheType: Token\n",
    );
    let j = Joined::start_with(audience_rbac(), |f, _| {
        f.image_credential_provider_config = Some(config.clone());
        f.image_credential_provider_bin_dir = Some(bin.clone());
    })
    .await;
    remove_private_image(&j.node).await;
    let container = |name: &str| {
        serde_json::json!({
            "name": name, "image": PRIVATE, "imagePullPolicy": "Always",
            "command": ["sleep", "3600"],
        })
    };
    j.create_pod(
        "tok-cache",
        serde_json::json!({
            "serviceAccountName": "default",
            "containers": [container("a"), container("b")],
        }),
    )
    .await;
    j.wait_api("tok-cache", Duration::from_secs(90), "running", |p| {
        p.is_some_and(|p| {
            (0..2).all(|i| p["status"]["containerStatuses"][i]["state"]["running"].is_object())
        })
    })
    .await
    .expect("pod");
    let asked = requests(dir.path());
    assert_eq!(asked.len(), 1, "one plugin run for both pulls: {asked:?}");
    assert!(
        asked[0]["serviceAccountToken"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{}",
        asked[0]
    );
    j.cleanup().await;
}
