//! Upstream's projected volume specs on one joined kubelet:
//! `test/e2e/common/storage/projected_configmap.go`, `projected_secret.go`
//! and `projected_combined.go` (the downwardAPI projection's specs are in
//! `volumes_downwardapi.rs`, beside the downwardAPI volume's).
//! Same pods, busybox for agnhost (see `conformance::MOUNTTEST`).

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

const CM_DATA: [(&str, &str); 3] = [
    ("data-1", "value-1"),
    ("data-2", "value-2"),
    ("data-3", "value-3"),
];
const SECRET_DATA: [(&str, &[u8]); 3] = [
    ("data-1", b"value-1\n"),
    ("data-2", b"value-2\n"),
    ("data-3", b"value-3\n"),
];

fn projected(sources: Value) -> Value {
    json!({"sources": sources})
}

/// `createProjectedConfigMapMounttestPod`: NewAgnhostPod (empty pod security
/// context, grace 0) with a projected configMap volume mounted read-only.
fn cm_pod(volume: &str, cm: &str, path: &str, args: &[&str]) -> Value {
    json!({"spec": {
        "volumes": [{"name": volume, "projected": projected(json!([{"configMap": {"name": cm}}]))}],
        "containers": [mounttest("agnhost-container", args, json!([mount(volume, path, true)]))],
        "securityContext": {},
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
    }})
}

const VOL: &str = "/etc/projected-configmap-volume";

/// `doProjectedConfigMapE2EWithoutMappings`.
async fn cm_without_mappings(s: &Suite, spec: &str, short: &str, as_user: bool, mode: Option<i32>) {
    s.config_map(NS, short, &CM_DATA, &[]).await;
    let mut pod = cm_pod(
        "projected-configmap-volume",
        short,
        VOL,
        &[
            &format!("--file_content={VOL}/data-1"),
            &format!("--file_mode={VOL}/data-1"),
        ],
    );
    if as_user {
        pod["spec"]["securityContext"]["runAsUser"] = json!(1000);
    }
    if let Some(m) = mode {
        pod["spec"]["volumes"][0]["projected"]["defaultMode"] = json!(m);
    }
    s.pod(spec, short, pod).await;
}

/// `doProjectedConfigMapE2EWithMappings` (the "item mode" is the projected defaultMode).
async fn cm_with_mappings(s: &Suite, spec: &str, short: &str, as_user: bool, mode: Option<i32>) {
    s.config_map(NS, short, &CM_DATA, &[]).await;
    let mut pod = cm_pod(
        "projected-configmap-volume",
        short,
        VOL,
        &[
            &format!("--file_content={VOL}/path/to/data-2"),
            &format!("--file_mode={VOL}/path/to/data-2"),
        ],
    );
    pod["spec"]["volumes"][0]["projected"]["sources"][0]["configMap"]["items"] =
        json!([{"key": "data-2", "path": "path/to/data-2"}]);
    if as_user {
        pod["spec"]["securityContext"]["runAsUser"] = json!(1000);
    }
    if let Some(m) = mode {
        pod["spec"]["volumes"][0]["projected"]["defaultMode"] = json!(m);
    }
    s.pod(spec, short, pod).await;
}

const SVOL: &str = "/etc/projected-secret-volume";

/// `doProjectedSecretE2EWithoutMapping`.
async fn secret_without_mapping(
    s: &Suite,
    spec: &str,
    short: &str,
    secret: &str,
    mode: Option<i32>,
    ids: Option<(i64, i64)>,
) {
    s.secret(NS, secret, &SECRET_DATA).await;
    let mut pod = json!({"spec": {
        "volumes": [{"name": "projected-secret-volume", "projected": projected(json!([{"secret": {"name": secret}}]))}],
        "containers": [mounttest("projected-secret-volume-test",
            &[&format!("--file_content={SVOL}/data-1"), &format!("--file_mode={SVOL}/data-1")],
            json!([mount("projected-secret-volume", SVOL, false)]))],
        "restartPolicy": "Never",
    }});
    if let Some(m) = mode {
        pod["spec"]["volumes"][0]["projected"]["defaultMode"] = json!(m);
    }
    if let Some((fs_group, uid)) = ids {
        pod["spec"]["securityContext"] = json!({"fsGroup": fs_group, "runAsUser": uid});
    }
    s.pod(spec, short, pod).await;
}

/// `doProjectedSecretE2EWithMapping`.
async fn secret_with_mapping(s: &Suite, spec: &str, short: &str, mode: Option<i32>) {
    s.secret(NS, short, &SECRET_DATA).await;
    let mut pod = json!({"spec": {
        "volumes": [{"name": "projected-secret-volume", "projected": projected(json!([{"secret": {"name": short,
            "items": [{"key": "data-1", "path": "new-path-data-1"}]}}]))}],
        "containers": [mounttest("projected-secret-volume-test",
            &[&format!("--file_content={SVOL}/new-path-data-1"), &format!("--file_mode={SVOL}/new-path-data-1")],
            json!([mount("projected-secret-volume", SVOL, false)]))],
        "restartPolicy": "Never",
    }});
    if let Some(m) = mode {
        pod["spec"]["volumes"][0]["projected"]["defaultMode"] = json!(m);
    }
    s.pod(spec, short, pod).await;
}

const CM_DEFAULT: &str = "Projected configMap should be consumable from pods in volume";
const CM_DEFAULT_MODE: &str =
    "Projected configMap should be consumable from pods in volume with defaultMode set [LinuxOnly]";
const CM_NON_ROOT: &str =
    "Projected configMap should be consumable from pods in volume as non-root";
const CM_MAP: &str = "Projected configMap should be consumable from pods in volume with mappings";
const CM_MAP_MODE: &str = "Projected configMap should be consumable from pods in volume with mappings and Item mode set [LinuxOnly]";
const CM_MAP_NON_ROOT: &str =
    "Projected configMap should be consumable from pods in volume with mappings as non-root";
const CM_MULTI: &str =
    "Projected configMap should be consumable in multiple volumes in the same pod";
const S_DEFAULT: &str = "Projected secret should be consumable from pods in volume";
const S_DEFAULT_MODE: &str =
    "Projected secret should be consumable from pods in volume with defaultMode set [LinuxOnly]";
const S_FS_GROUP: &str = "Projected secret should be consumable from pods in volume as non-root with defaultMode and fsGroup set [LinuxOnly]";
const S_MAP: &str = "Projected secret should be consumable from pods in volume with mappings";
const S_MAP_MODE: &str = "Projected secret should be consumable from pods in volume with mappings and Item Mode set [LinuxOnly]";
const S_OTHER_NS: &str = "Projected secret should be able to mount in a volume regardless of a different secret existing with same name in different namespace";
const S_MULTI: &str = "Projected secret should be consumable in multiple volumes in a pod";
const ALL: &str =
    "Projected combined should project all components that make up the projection API [Projection]";

async fn to_completion(s: &Suite) {
    cm_without_mappings(s, CM_DEFAULT, "pcm-default", false, None).await;
    cm_without_mappings(s, CM_DEFAULT_MODE, "pcm-default-mode", false, Some(0o400)).await;
    cm_without_mappings(s, CM_NON_ROOT, "pcm-non-root", true, None).await;
    cm_with_mappings(s, CM_MAP, "pcm-map", false, None).await;
    cm_with_mappings(s, CM_MAP_MODE, "pcm-map-mode", false, Some(0o400)).await;
    cm_with_mappings(s, CM_MAP_NON_ROOT, "pcm-map-non-root", true, None).await;
    s.config_map(NS, "pcm-multi", &CM_DATA, &[]).await;
    let vol = |n: &str| json!({"name": n, "projected": projected(json!([{"configMap": {"name": "pcm-multi"}}]))});
    s.pod(
        CM_MULTI,
        "pcm-multi",
        json!({"spec": {
            "volumes": [vol("projected-configmap-volume"), vol("projected-configmap-volume-2")],
            "containers": [mounttest("projected-configmap-volume-test", &[&format!("--file_content={VOL}/data-1")], json!([
                mount("projected-configmap-volume", VOL, true),
                mount("projected-configmap-volume-2", "/etc/projected-configmap-volume-2", true),
            ]))],
            "restartPolicy": "Never",
        }}),
    )
    .await;

    secret_without_mapping(
        s,
        S_DEFAULT,
        "ps-default",
        "projected-secret-test-default",
        None,
        None,
    )
    .await;
    secret_without_mapping(
        s,
        S_DEFAULT_MODE,
        "ps-default-mode",
        "projected-secret-test-mode",
        Some(0o400),
        None,
    )
    .await;
    secret_without_mapping(
        s,
        S_FS_GROUP,
        "ps-fsgroup",
        "projected-secret-test-fsgroup",
        Some(0o440),
        Some((1001, 1000)),
    )
    .await;
    secret_with_mapping(s, S_MAP, "ps-map", None).await;
    secret_with_mapping(s, S_MAP_MODE, "ps-map-mode", Some(0o400)).await;
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
        s.fail(S_OTHER_NS, format!("creating namespace {ns2}: {e}"));
    }
    s.secret(
        &ns2,
        "projected-secret-test-other-ns",
        &[(
            "this_should_not_match_content_of_other_secret",
            b"similarly_this_should_not_match_content_of_other_secret\n",
        )],
    )
    .await;
    secret_without_mapping(
        s,
        S_OTHER_NS,
        "ps-other-ns",
        "projected-secret-test-other-ns",
        None,
        None,
    )
    .await;
    s.secret(NS, "projected-secret-test-multi", &SECRET_DATA)
        .await;
    let vol = |n: &str| json!({"name": n, "projected": projected(json!([{"secret": {"name": "projected-secret-test-multi"}}]))});
    s.pod(
        S_MULTI,
        "ps-multi",
        json!({"spec": {
            "volumes": [vol("projected-secret-volume"), vol("projected-secret-volume-2")],
            "containers": [mounttest("secret-volume-test",
                &[&format!("--file_content={SVOL}/data-1"), &format!("--file_mode={SVOL}/data-1")],
                json!([mount("projected-secret-volume", SVOL, true), mount("projected-secret-volume-2", "/etc/projected-secret-volume-2", true)]))],
            "restartPolicy": "Never",
        }}),
    )
    .await;

    // projected_combined.go
    s.config_map(
        NS,
        "configmap-projected-all-test-volume",
        &[("configmap-data", "configmap-value-1")],
        &[],
    )
    .await;
    s.secret(
        NS,
        "secret-projected-all-test-volume",
        &[("secret-data", b"secret-value-1")],
    )
    .await;
    let mut c = busybox(
        "projected-all-volume-test",
        &[
            "sh",
            "-c",
            "cat /all/podname && cat /all/secret-data && cat /all/configmap-data",
        ],
    );
    c["volumeMounts"] = json!([mount("podinfo", "/all", false)]);
    s.pod(
        ALL,
        "projected-volume",
        json!({"spec": {
            "volumes": [{"name": "podinfo", "projected": projected(json!([
                {"downwardAPI": {"items": [{"path": "podname", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}]}},
                {"secret": {"name": "secret-projected-all-test-volume"}},
                {"configMap": {"name": "configmap-projected-all-test-volume"}},
            ]))}],
            "containers": [c],
            "restartPolicy": "Never",
        }}),
    )
    .await;

    let pods = [
        "pcm-default",
        "pcm-default-mode",
        "pcm-non-root",
        "pcm-map",
        "pcm-map-mode",
        "pcm-map-non-root",
        "pcm-multi",
        "ps-default",
        "ps-default-mode",
        "ps-fsgroup",
        "ps-map",
        "ps-map-mode",
        "ps-other-ns",
        "ps-multi",
        "projected-volume",
    ];
    s.wait_all(&pods, POD_TIMEOUT, terminal).await;

    let c = "agnhost-container";
    let d1 = format!("{VOL}/data-1");
    let content1 = || Want::has(format!("content of file \"{VOL}/data-1\": value-1"));
    let d2 = format!("{VOL}/path/to/data-2");
    let content2 = || Want::has(format!("content of file \"{VOL}/path/to/data-2\": value-2"));
    s.expect_output(
        CM_DEFAULT,
        "pcm-default",
        c,
        &[content1(), file_mode(&d1, "-rw-r--r--")],
    );
    s.expect_output(
        CM_DEFAULT_MODE,
        "pcm-default-mode",
        c,
        &[content1(), file_mode(&d1, "-r--------")],
    );
    s.expect_output(
        CM_NON_ROOT,
        "pcm-non-root",
        c,
        &[content1(), file_mode(&d1, "-rw-r--r--")],
    );
    s.expect_output(
        CM_MAP,
        "pcm-map",
        c,
        &[content2(), file_mode(&d2, "-rw-r--r--")],
    );
    s.expect_output(
        CM_MAP_MODE,
        "pcm-map-mode",
        c,
        &[content2(), file_mode(&d2, "-r--------")],
    );
    s.expect_output(
        CM_MAP_NON_ROOT,
        "pcm-map-non-root",
        c,
        &[content2(), file_mode(&d2, "-rw-r--r--")],
    );
    s.expect_output(
        CM_MULTI,
        "pcm-multi",
        "projected-configmap-volume-test",
        &[content1()],
    );

    let c = "projected-secret-volume-test";
    let s1 = format!("{SVOL}/data-1");
    let scontent = || Want::has(format!("content of file \"{SVOL}/data-1\": value-1"));
    let sm = format!("{SVOL}/new-path-data-1");
    let smcontent = || {
        Want::has(format!(
            "content of file \"{SVOL}/new-path-data-1\": value-1"
        ))
    };
    s.expect_output(
        S_DEFAULT,
        "ps-default",
        c,
        &[scontent(), file_mode(&s1, "-rw-r--r--")],
    );
    s.expect_output(
        S_DEFAULT_MODE,
        "ps-default-mode",
        c,
        &[scontent(), file_mode(&s1, "-r--------")],
    );
    s.expect_output(
        S_FS_GROUP,
        "ps-fsgroup",
        c,
        &[scontent(), file_mode(&s1, "-r--r-----")],
    );
    s.expect_output(
        S_MAP,
        "ps-map",
        c,
        &[smcontent(), file_mode(&sm, "-rw-r--r--")],
    );
    s.expect_output(
        S_MAP_MODE,
        "ps-map-mode",
        c,
        &[smcontent(), file_mode(&sm, "-r--------")],
    );
    s.expect_output(
        S_OTHER_NS,
        "ps-other-ns",
        c,
        &[scontent(), file_mode(&s1, "-rw-r--r--")],
    );
    s.expect_output(
        S_MULTI,
        "ps-multi",
        "secret-volume-test",
        &[scontent(), file_mode(&s1, "-rw-r--r--")],
    );

    s.expect_output(
        ALL,
        "projected-volume",
        "projected-all-volume-test",
        &[
            Want::has(s.name("projected-volume")),
            Want::has("secret-value-1"),
            Want::has("configmap-value-1"),
        ],
    );
}

const CM_UPDATES: &str = "Projected configMap updates should be reflected in volume";

async fn cm_updates(s: &Suite) {
    s.config_map(
        NS,
        "projected-configmap-test-upd",
        &[("data-1", "value-1")],
        &[],
    )
    .await;
    s.pod(
        CM_UPDATES,
        "pcm-upd",
        cm_pod(
            "projected-configmap-volume",
            "projected-configmap-test-upd",
            VOL,
            &[
                "--break_on_expected_content=false",
                "--retry_time=120",
                &format!("--file_content_in_loop={VOL}/data-1"),
            ],
        ),
    )
    .await;
    if !s.wait_running(CM_UPDATES, "pcm-upd", POD_TIMEOUT).await {
        return;
    }
    let c = "agnhost-container";
    if !s
        .eventually_log(
            CM_UPDATES,
            "pcm-upd",
            c,
            Want::has("value-1"),
            UPDATE_TIMEOUT,
        )
        .await
    {
        return;
    }
    s.update_config_map(NS, "projected-configmap-test-upd", &[("data-1", "value-2")])
        .await;
    s.eventually_log(
        CM_UPDATES,
        "pcm-upd",
        c,
        Want::has("value-2"),
        UPDATE_TIMEOUT,
    )
    .await;
}

/// The "optional updates should be reflected in volume" specs of both files.
async fn optional_updates(s: &Suite, secret: bool) {
    let c = if secret {
        OptionalUpdates {
            spec: "Projected secret optional updates should be reflected in volume",
            short: "ps-opt",
            kind: Kind::Secret,
            projected: true,
            base: "/etc/projected-secret-volumes",
            objects: ["ps-test-opt-del", "ps-test-opt-upd", "ps-test-opt-create"],
            volumes: ["deletes-volume", "updates-volume", "creates-volume"],
            containers: [
                "dels-volume-test",
                "upds-volume-test",
                "creates-volume-test",
            ],
        }
    } else {
        OptionalUpdates {
            spec: "Projected configMap optional updates should be reflected in volume",
            short: "pcm-opt",
            kind: Kind::ConfigMap,
            projected: true,
            base: "/etc/projected-configmap-volumes",
            objects: [
                "pcm-test-opt-del",
                "pcm-test-opt-upd",
                "pcm-test-opt-create",
            ],
            volumes: ["deletecm-volume", "updatecm-volume", "createcm-volume"],
            containers: [
                "delcm-volume-test",
                "updcm-volume-test",
                "createcm-volume-test",
            ],
        }
    };
    s.optional_updates(c).await;
}

const PCM_MISSING: &str = "Projected configMap Should fail non-optional pod creation due to configMap object does not exist [Slow]";
const PCM_MISSING_KEY: &str = "Projected configMap Should fail non-optional pod creation due to the key in the configMap object does not exist [Slow]";
const PS_MISSING: &str = "Projected secret Should fail non-optional pod creation due to secret object does not exist [Slow]";
const PS_MISSING_KEY: &str = "Projected secret Should fail non-optional pod creation due to the key in the secret object does not exist [Slow]";

/// The `[Slow]` failure specs of both files: upstream reuses the plain
/// configMap/secret volume pods (`createNonOptionalConfigMapPod`, ...).
async fn non_optional(s: &Suite) {
    s.config_map(NS, "pcm-test-opt-create-key", &CM_DATA, &[])
        .await;
    s.secret(NS, "ps-test-opt-create-key", &SECRET_DATA).await;
    tokio::join!(
        s.non_optional(NonOptional {
            spec: PCM_MISSING,
            short: "pcm-missing",
            kind: Kind::ConfigMap,
            object: "pcm-test-opt-create-missing",
            mount_dir: "/etc/projected-configmap-volumes",
            items: None,
            want: "\"pcm-test-opt-create-missing\" not found",
        }),
        s.non_optional(NonOptional {
            spec: PCM_MISSING_KEY,
            short: "pcm-missing-key",
            kind: Kind::ConfigMap,
            object: "pcm-test-opt-create-key",
            mount_dir: "/etc/configmap-volumes",
            items: Some(json!([{"key": "data-4", "path": "path/to/data-4"}])),
            want: "configmap references non-existent config key: data-4",
        }),
        s.non_optional(NonOptional {
            spec: PS_MISSING,
            short: "ps-missing",
            kind: Kind::Secret,
            object: "ps-test-opt-create-missing",
            mount_dir: "/etc/projected-secret-volumes",
            items: None,
            want: "\"ps-test-opt-create-missing\" not found",
        }),
        s.non_optional(NonOptional {
            spec: PS_MISSING_KEY,
            short: "ps-missing-key",
            kind: Kind::Secret,
            object: "ps-test-opt-create-key",
            mount_dir: "/etc/secret-volumes",
            items: Some(json!([{"key": "data_4", "path": "value-4\n"}])),
            want: "references non-existent secret key: data_4",
        }),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projected_volume_specs() {
    let s = Suite::start().await;
    tokio::join!(
        to_completion(&s),
        cm_updates(&s),
        optional_updates(&s, false),
        optional_updates(&s, true),
        non_optional(&s)
    );
    // Consistently Pending: still so after every other spec ran.
    s.still_pending(PCM_MISSING, "pcm-missing");
    s.still_pending(PCM_MISSING_KEY, "pcm-missing-key");
    s.still_pending(PS_MISSING, "ps-missing");
    s.still_pending(PS_MISSING_KEY, "ps-missing-key");
    s.finish("volumes_projected").await;
}
