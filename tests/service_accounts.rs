//! Upstream's service account token specs (`test/e2e/auth/service_accounts.go`)
//! on one joined kubelet: the API access volume the ServiceAccount admission
//! plugin adds (token, `kube-root-ca.crt`, namespace), and a projected
//! service account token with its file ownership and modes.
//!
//! The double runs the ServiceAccount admission plugin, as a real apiserver
//! does: pods are created as upstream's specs write them and get the
//! `kube-api-access-*` volume from it (1.21+), or the `default-token-*`
//! secret volume on the 1.19 profile.

use apiserver_double::Options;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

const MOUNT_TOKEN: &str = "should mount an API token into pods";

async fn mount_api_token(s: &Suite) {
    let sa = ServiceAccount {
        metadata: kube::api::ObjectMeta {
            name: Some("mount-test".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    if let Err(e) = Api::<ServiceAccount>::namespaced(s.j.admin.clone(), NS)
        .create(&PostParams::default(), &sa)
        .await
    {
        s.fail(
            MOUNT_TOKEN,
            format!("creating service account mount-test: {e}"),
        );
        return;
    }
    let pod = json!({"spec": {
        "serviceAccountName": "mount-test",
        "containers": [busybox("test", &["sleep", "100000"])],
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
    }});
    let short = "pod-service-account";
    if !s.pod(MOUNT_TOKEN, short, pod).await
        || !s.wait_running(MOUNT_TOKEN, short, POD_TIMEOUT).await
    {
        return;
    }
    let read = |f: &'static str| async move {
        match s
            .exec(short, "test", &["cat", &format!("{SA_DIR}/{f}")])
            .await
        {
            Ok((0, out, _)) => Some(out),
            other => {
                s.fail(MOUNT_TOKEN, format!("reading {SA_DIR}/{f}: {other:?}"));
                None
            }
        }
    };
    let (Some(token), Some(ca), Some(ns)) = (
        read("token").await,
        read("ca.crt").await,
        read("namespace").await,
    ) else {
        return;
    };
    match Api::<ConfigMap>::namespaced(s.j.admin.clone(), NS)
        .get("kube-root-ca.crt")
        .await
    {
        Ok(cm) => {
            let want = cm
                .data
                .unwrap_or_default()
                .get("ca.crt")
                .cloned()
                .unwrap_or_default();
            if ca != want {
                s.fail(
                    MOUNT_TOKEN,
                    format!("mounted ca.crt {ca:?} is not kube-root-ca.crt's {want:?}"),
                );
            }
        }
        Err(e) => s.fail(MOUNT_TOKEN, format!("getting kube-root-ca.crt: {e}")),
    }
    if ns != NS {
        s.fail(
            MOUNT_TOKEN,
            format!("mounted namespace {ns:?}, expected {NS:?}"),
        );
    }
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<TokenReview>::all(s.j.admin.clone())
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(r) => {
            let st = r.status.unwrap_or_default();
            let user = st.user.unwrap_or_default();
            let groups = user.groups.unwrap_or_default();
            let want_user = format!("system:serviceaccount:{NS}:mount-test");
            if st.authenticated != Some(true)
                || st.error.is_some_and(|e| !e.is_empty())
                || user.username.as_deref() != Some(&want_user)
            {
                s.fail(
                    MOUNT_TOKEN,
                    format!(
                        "token review: authenticated {:?}, user {:?}",
                        st.authenticated, user.username
                    ),
                );
            }
            for g in [
                "system:authenticated",
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{NS}"),
            ] {
                if !groups.iter().any(|x| x == g) {
                    s.fail(
                        MOUNT_TOKEN,
                        format!("token review: group {g} missing from {groups:?}"),
                    );
                }
            }
        }
        Err(e) => s.fail(MOUNT_TOKEN, format!("token review: {e}")),
    }
}

/// Upstream's token regexp: `[A-Za-z0-9-_=]+\.[A-Za-z0-9-_=]+\.?[A-Za-z0-9-_.+/=]*`.
fn token_line(l: &str) -> bool {
    let Some(t) = l.strip_prefix("content of file \"/test-volume/token\": ") else {
        return false;
    };
    let seg = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_=".contains(c))
    };
    let mut parts = t.splitn(3, '.');
    let (a, b) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let b_ok = {
        // the second segment may run into the optional third without a dot
        let end = b
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_=".contains(c)))
            .unwrap_or(b.len());
        end > 0
    };
    seg(a) && b_ok
}

const PROJECTED: &str = "should mount projected service account token";
const OWNERSHIP: &str = "should set ownership and permission when RunAsUser or FsGroup is present [LinuxOnly] [NodeFeature:FSGroup]";

/// `NewAgnhostPod` with a projected service account token (1 h) at /test-volume.
fn token_pod(args: &[&str], security: Value) -> Value {
    json!({"spec": {
        "volumes": [{"name": "test-volume", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        ]}}],
        "containers": [mounttest("agnhost-container", args, json!([mount("test-volume", "/test-volume", true)]))],
        "securityContext": security,
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
    }})
}

async fn projected_tokens(s: &Suite) {
    let t = "/test-volume/token";
    s.pod(
        PROJECTED,
        "sa-projected",
        token_pod(&[&format!("--file_content={t}")], json!({})),
    )
    .await;
    // (runAsUser, fsGroup) -> (perms, uid, gid)
    let cases = [
        ("sa-owner-uid", Some(1000), None, "-rw-------", 1000, 0),
        ("sa-owner-gid", None, Some(10000), "-rw-r-----", 0, 10000),
        (
            "sa-owner-both",
            Some(1000),
            Some(10000),
            "-rw-r-----",
            1000,
            10000,
        ),
        ("sa-owner-none", None, None, "-rw-r--r--", 0, 0),
    ];
    for (short, uid, gid, _, _, _) in &cases {
        let sc = json!({"runAsUser": uid, "fsGroup": gid});
        s.pod(
            OWNERSHIP,
            short,
            token_pod(
                &[
                    &format!("--file_perm={t}"),
                    &format!("--file_owner={t}"),
                    &format!("--file_content={t}"),
                ],
                sc,
            ),
        )
        .await;
    }
    let mut names = vec!["sa-projected"];
    names.extend(cases.iter().map(|c| c.0));
    s.wait_all(&names, POD_TIMEOUT, terminal).await;
    let token = || {
        Want::Line(
            "content of file \"/test-volume/token\": <JWT>".into(),
            token_line,
        )
    };
    s.expect_output(PROJECTED, "sa-projected", "agnhost-container", &[token()]);
    for (short, _, _, perm, uid, gid) in &cases {
        s.expect_output(
            OWNERSHIP,
            short,
            "agnhost-container",
            &[
                Want::has(format!("perms of file \"{t}\": {perm}")),
                token(),
                Want::has(format!("owner UID of \"{t}\": {uid}")),
                Want::has(format!("owner GID of \"{t}\": {gid}")),
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_token_specs() {
    let s = Suite::start_with(Options {
        service_account_admission: true,
        ..Options::default()
    })
    .await;
    if s.j.api.profile().at_least(20) {
        tokio::join!(mount_api_token(&s), projected_tokens(&s));
    } else {
        // Only from 1.20: a default 1.19 apiserver (kubeadm adds the
        // service-account issuer flags from 1.20) serves no TokenRequest, so
        // a projected serviceAccountToken cannot be had there, from any
        // kubelet; the API token comes from the token Secret instead.
        eprintln!(
            "service_accounts: {PROJECTED:?} does not apply to a 1.19 apiserver (no TokenRequest); \
             {MOUNT_TOKEN:?} runs with the secret-based token volume"
        );
        mount_api_token(&s).await;
    }
    s.finish("service_accounts").await;
}

#[test]
fn token_regexp() {
    assert!(token_line(
        "content of file \"/test-volume/token\": eyJhbGciOi.eyJhdWQiOls.sig-_+/="
    ));
    assert!(!token_line("content of file \"/test-volume/token\": "));
    assert!(!token_line("content of file \"/test-volume/token\": nodot"));
}
