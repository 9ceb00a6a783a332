//! Upstream's secret specs on one joined kubelet:
//! `test/e2e/common/storage/secrets_volume.go` (the secret volume) and
//! `test/e2e/common/node/secrets.go` (secrets in the environment).
//! Same pods, busybox for agnhost (see `conformance::MOUNTTEST`).

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use kubelet_rs_integration::conformance::*;
use serde_json::json;

/// `secretForTest`'s data.
const SECRET_DATA: [(&str, &[u8]); 3] = [
    ("data-1", b"value-1\n"),
    ("data-2", b"value-2\n"),
    ("data-3", b"value-3\n"),
];

/// `doSecretE2EWithoutMapping`.
async fn without_mapping(
    s: &Suite,
    spec: &str,
    short: &str,
    secret: &str,
    mode: Option<i32>,
    fs_group: Option<i64>,
    uid: Option<i64>,
) {
    s.secret(NS, secret, &SECRET_DATA).await;
    let mut pod = json!({"spec": {
        "volumes": [{"name": "secret-volume", "secret": {"secretName": secret}}],
        "containers": [mounttest("secret-volume-test",
            &["--file_content=/etc/secret-volume/data-1", "--file_mode=/etc/secret-volume/data-1"],
            json!([mount("secret-volume", "/etc/secret-volume", false)]))],
        "restartPolicy": "Never",
    }});
    if let Some(m) = mode {
        pod["spec"]["volumes"][0]["secret"]["defaultMode"] = json!(m);
    }
    if fs_group.is_some() || uid.is_some() {
        pod["spec"]["securityContext"] = json!({"fsGroup": fs_group, "runAsUser": uid});
    }
    s.pod(spec, short, pod).await;
}

/// `doSecretE2EWithMapping`.
async fn with_mapping(s: &Suite, spec: &str, short: &str, mode: Option<i32>) {
    s.secret(NS, short, &SECRET_DATA).await;
    let mut pod = json!({"spec": {
        "volumes": [{"name": "secret-volume", "secret": {"secretName": short,
            "items": [{"key": "data-1", "path": "new-path-data-1"}]}}],
        "containers": [mounttest("secret-volume-test",
            &["--file_content=/etc/secret-volume/new-path-data-1", "--file_mode=/etc/secret-volume/new-path-data-1"],
            json!([mount("secret-volume", "/etc/secret-volume", false)]))],
        "restartPolicy": "Never",
    }});
    if let Some(m) = mode {
        pod["spec"]["volumes"][0]["secret"]["items"][0]["mode"] = json!(m);
    }
    s.pod(spec, short, pod).await;
}

const DEFAULT: &str = "should be consumable from pods in volume";
const DEFAULT_MODE: &str =
    "should be consumable from pods in volume with defaultMode set [LinuxOnly]";
const FS_GROUP: &str = "should be consumable from pods in volume as non-root with defaultMode and fsGroup set [LinuxOnly]";
const MAPPINGS: &str = "should be consumable from pods in volume with mappings";
const ITEM_MODE: &str =
    "should be consumable from pods in volume with mappings and Item Mode set [LinuxOnly]";
const OTHER_NS: &str = "should be able to mount in a volume regardless of a different secret existing with same name in different namespace";
const MULTIPLE: &str = "should be consumable in multiple volumes in a pod";
const ENV_VAR: &str = "Secrets should be consumable from pods in env vars";
const ENV_FROM: &str = "Secrets should be consumable via the environment";

async fn to_completion(s: &Suite) {
    without_mapping(
        s,
        DEFAULT,
        "s-default",
        "secret-test-default",
        None,
        None,
        None,
    )
    .await;
    without_mapping(
        s,
        DEFAULT_MODE,
        "s-default-mode",
        "secret-test-mode",
        Some(0o400),
        None,
        None,
    )
    .await;
    without_mapping(
        s,
        FS_GROUP,
        "s-fsgroup",
        "secret-test-fsgroup",
        Some(0o440),
        Some(1001),
        Some(1000),
    )
    .await;
    with_mapping(s, MAPPINGS, "s-map", None).await;
    with_mapping(s, ITEM_MODE, "s-map-mode", Some(0o400)).await;

    // The same secret name in another namespace, with other data.
    let ns2 = format!("secret-namespace-{}", s.j.node.name);
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(ns2.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    if let Err(e) = Api::<Namespace>::all(s.j.admin.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        s.fail(OTHER_NS, format!("creating namespace {ns2}: {e}"));
    }
    s.secret(
        &ns2,
        "secret-test-other-ns",
        &[(
            "this_should_not_match_content_of_other_secret",
            b"similarly_this_should_not_match_content_of_other_secret\n",
        )],
    )
    .await;
    without_mapping(
        s,
        OTHER_NS,
        "s-other-ns",
        "secret-test-other-ns",
        None,
        None,
        None,
    )
    .await;

    s.secret(NS, "secret-test-multi", &SECRET_DATA).await;
    s.pod(
        MULTIPLE,
        "s-multi",
        json!({"spec": {
            "volumes": [
                {"name": "secret-volume", "secret": {"secretName": "secret-test-multi"}},
                {"name": "secret-volume-2", "secret": {"secretName": "secret-test-multi"}},
            ],
            "containers": [mounttest("secret-volume-test",
                &["--file_content=/etc/secret-volume/data-1", "--file_mode=/etc/secret-volume/data-1"],
                json!([mount("secret-volume", "/etc/secret-volume", true), mount("secret-volume-2", "/etc/secret-volume-2", true)]))],
            "restartPolicy": "Never",
        }}),
    )
    .await;

    // test/e2e/common/node/secrets.go
    s.secret(NS, "secret-test-env", &SECRET_DATA).await;
    let mut c = busybox("secret-env-test", &["env"]);
    c["env"] = json!([{"name": "SECRET_DATA", "valueFrom": {"secretKeyRef": {"name": "secret-test-env", "key": "data-1"}}}]);
    s.pod(
        ENV_VAR,
        "s-env-var",
        json!({"spec": {"containers": [c], "restartPolicy": "Never"}}),
    )
    .await;
    let mut c = busybox("env-test", &["env"]);
    c["envFrom"] = json!([
        {"secretRef": {"name": "secret-test-env"}},
        {"prefix": "p-", "secretRef": {"name": "secret-test-env"}},
    ]);
    s.pod(
        ENV_FROM,
        "s-env-from",
        json!({"spec": {"containers": [c], "restartPolicy": "Never"}}),
    )
    .await;

    let pods = [
        "s-default",
        "s-default-mode",
        "s-fsgroup",
        "s-map",
        "s-map-mode",
        "s-other-ns",
        "s-multi",
        "s-env-var",
        "s-env-from",
    ];
    s.wait_all(&pods, POD_TIMEOUT, terminal).await;

    let c = "secret-volume-test";
    let d1 = "/etc/secret-volume/data-1";
    let content1 = || Want::has("content of file \"/etc/secret-volume/data-1\": value-1");
    let m1 = "/etc/secret-volume/new-path-data-1";
    let content_m = || Want::has("content of file \"/etc/secret-volume/new-path-data-1\": value-1");
    s.expect_output(
        DEFAULT,
        "s-default",
        c,
        &[content1(), file_mode(d1, "-rw-r--r--")],
    );
    s.expect_output(
        DEFAULT_MODE,
        "s-default-mode",
        c,
        &[content1(), file_mode(d1, "-r--------")],
    );
    s.expect_output(
        FS_GROUP,
        "s-fsgroup",
        c,
        &[content1(), file_mode(d1, "-r--r-----")],
    );
    s.expect_output(
        MAPPINGS,
        "s-map",
        c,
        &[content_m(), file_mode(m1, "-rw-r--r--")],
    );
    s.expect_output(
        ITEM_MODE,
        "s-map-mode",
        c,
        &[content_m(), file_mode(m1, "-r--------")],
    );
    s.expect_output(
        OTHER_NS,
        "s-other-ns",
        c,
        &[content1(), file_mode(d1, "-rw-r--r--")],
    );
    s.expect_output(
        MULTIPLE,
        "s-multi",
        c,
        &[content1(), file_mode(d1, "-rw-r--r--")],
    );
    // "value-1\n" in the secret: env prints it with its newline.
    s.expect_output(
        ENV_VAR,
        "s-env-var",
        "secret-env-test",
        &[Want::has("SECRET_DATA=value-1")],
    );
    s.expect_output(
        ENV_FROM,
        "s-env-from",
        "env-test",
        &[
            "data-1=value-1",
            "data-2=value-2",
            "data-3=value-3",
            "p-data-1=value-1",
            "p-data-2=value-2",
            "p-data-3=value-3",
        ]
        .map(Want::has),
    );
}

const OPTIONAL: &str = "optional updates should be reflected in volume";

/// Three optional secret volumes: one deleted, one updated, one created later.
async fn optional_updates(s: &Suite) {
    s.optional_updates(OptionalUpdates {
        spec: OPTIONAL,
        short: "s-opt",
        kind: Kind::Secret,
        projected: false,
        base: "/etc/secret-volumes",
        objects: ["s-test-opt-del", "s-test-opt-upd", "s-test-opt-create"],
        volumes: ["deletes-volume", "updates-volume", "creates-volume"],
        containers: [
            "dels-volume-test",
            "upds-volume-test",
            "creates-volume-test",
        ],
    })
    .await;
}

const MISSING: &str =
    "Should fail non-optional pod creation due to secret object does not exist [Slow]";
const MISSING_KEY: &str = "Should fail non-optional pod creation due to the key in the secret object does not exist [Slow]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_volume_and_env_specs() {
    let s = Suite::start().await;
    s.secret(NS, "s-test-opt-create-key", &SECRET_DATA).await;
    tokio::join!(
        to_completion(&s),
        optional_updates(&s),
        s.non_optional(NonOptional {
            spec: MISSING,
            short: "s-missing",
            kind: Kind::Secret,
            object: "s-test-opt-create-missing",
            mount_dir: "/etc/secret-volumes",
            items: None,
            want: "\"s-test-opt-create-missing\" not found",
        }),
        s.non_optional(NonOptional {
            spec: MISSING_KEY,
            short: "s-missing-key",
            kind: Kind::Secret,
            object: "s-test-opt-create-key",
            mount_dir: "/etc/secret-volumes",
            items: Some(json!([{"key": "data_4", "path": "value-4\n"}])),
            want: "references non-existent secret key: data_4",
        }),
    );
    s.still_pending(MISSING, "s-missing");
    s.still_pending(MISSING_KEY, "s-missing-key");
    s.finish("volumes_secret").await;
}
