//! Upstream's configMap specs on one joined kubelet:
//! `test/e2e/common/storage/configmap_volume.go` (the configMap volume) and
//! `test/e2e/common/node/configmap.go` (configMaps in the environment).
//! Same pods, busybox for agnhost (see `conformance::MOUNTTEST`).

use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

fn new_config_map() -> [(&'static str, &'static str); 3] {
    [
        ("data-1", "value-1"),
        ("data-2", "value-2"),
        ("data-3", "value-3"),
    ]
}

/// `createConfigMapVolumeMounttestPod`: an agnhost pod (empty pod security
/// context, grace 0) mounting configMap `cm` read-only at `path`, restartPolicy Never.
fn mounttest_pod(volume: &str, cm: &str, path: &str, args: &[&str]) -> Value {
    json!({
        "spec": {
            "volumes": [{"name": volume, "configMap": {"name": cm}}],
            "containers": [mounttest("agnhost-container", args, json!([mount(volume, path, true)]))],
            "securityContext": {},
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
        }
    })
}

/// `doConfigMapE2EWithoutMappings`.
async fn without_mappings(
    s: &Suite,
    spec: &str,
    short: &str,
    as_user: bool,
    default_mode: Option<i32>,
) {
    s.config_map(NS, short, &new_config_map(), &[]).await;
    let mut pod = mounttest_pod(
        "configmap-volume",
        short,
        "/etc/configmap-volume",
        &[
            "--file_content=/etc/configmap-volume/data-1",
            "--file_mode=/etc/configmap-volume/data-1",
        ],
    );
    pod["spec"]["terminationGracePeriodSeconds"] = json!(1);
    if as_user {
        pod["spec"]["securityContext"]["runAsUser"] = json!(1000);
    }
    if let Some(m) = default_mode {
        pod["spec"]["volumes"][0]["configMap"]["defaultMode"] = json!(m);
    }
    s.pod(spec, short, pod).await;
}

/// `doConfigMapE2EWithMappings`.
async fn with_mappings(s: &Suite, spec: &str, short: &str, as_user: bool, item_mode: Option<i32>) {
    s.config_map(NS, short, &new_config_map(), &[]).await;
    let mut pod = mounttest_pod(
        "configmap-volume",
        short,
        "/etc/configmap-volume",
        &[
            "--file_content=/etc/configmap-volume/path/to/data-2",
            "--file_mode=/etc/configmap-volume/path/to/data-2",
        ],
    );
    pod["spec"]["terminationGracePeriodSeconds"] = json!(1);
    pod["spec"]["volumes"][0]["configMap"]["items"] =
        json!([{"key": "data-2", "path": "path/to/data-2"}]);
    if as_user {
        pod["spec"]["securityContext"]["runAsUser"] = json!(1000);
    }
    if let Some(m) = item_mode {
        pod["spec"]["volumes"][0]["configMap"]["items"][0]["mode"] = json!(m);
    }
    s.pod(spec, short, pod).await;
}

const DEFAULT: &str = "should be consumable from pods in volume";
const DEFAULT_MODE: &str =
    "should be consumable from pods in volume with defaultMode set [LinuxOnly]";
const NON_ROOT: &str = "should be consumable from pods in volume as non-root";
const MAPPINGS: &str = "should be consumable from pods in volume with mappings";
const ITEM_MODE: &str =
    "should be consumable from pods in volume with mappings and Item mode set [LinuxOnly]";
const MAPPINGS_NON_ROOT: &str =
    "should be consumable from pods in volume with mappings as non-root";
const MULTIPLE: &str = "should be consumable in multiple volumes in the same pod";
const ENV_VAR: &str = "ConfigMap should be consumable via environment variable";
const ENV_FROM: &str = "ConfigMap should be consumable via the environment";

/// Specs whose pod runs to completion (`TestContainerOutput`).
async fn to_completion(s: &Suite) {
    without_mappings(s, DEFAULT, "cm-default", false, None).await;
    without_mappings(s, DEFAULT_MODE, "cm-default-mode", false, Some(0o400)).await;
    without_mappings(s, NON_ROOT, "cm-non-root", true, None).await;
    with_mappings(s, MAPPINGS, "cm-map", false, None).await;
    with_mappings(s, ITEM_MODE, "cm-map-mode", false, Some(0o400)).await;
    with_mappings(s, MAPPINGS_NON_ROOT, "cm-map-non-root", true, None).await;

    s.config_map(NS, "cm-multi", &new_config_map(), &[]).await;
    s.pod(
        MULTIPLE,
        "cm-multi",
        json!({"spec": {
            "volumes": [
                {"name": "configmap-volume", "configMap": {"name": "cm-multi"}},
                {"name": "configmap-volume-2", "configMap": {"name": "cm-multi"}},
            ],
            "containers": [mounttest("configmap-volume-test", &["--file_content=/etc/configmap-volume/data-1"], json!([
                mount("configmap-volume", "/etc/configmap-volume", true),
                mount("configmap-volume-2", "/etc/configmap-volume-2", true),
            ]))],
            "restartPolicy": "Never",
        }}),
    )
    .await;

    // test/e2e/common/node/configmap.go
    s.config_map(NS, "cm-env", &new_config_map(), &[]).await;
    let mut c = busybox("env-test", &["env"]);
    c["env"] = json!([{"name": "CONFIG_DATA_1", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "data-1"}}}]);
    s.pod(
        ENV_VAR,
        "cm-env-var",
        json!({"spec": {"containers": [c], "restartPolicy": "Never"}}),
    )
    .await;
    let mut c = busybox("env-test", &["env"]);
    c["envFrom"] = json!([
        {"configMapRef": {"name": "cm-env"}},
        {"prefix": "p-", "configMapRef": {"name": "cm-env"}},
    ]);
    s.pod(
        ENV_FROM,
        "cm-env-from",
        json!({"spec": {"containers": [c], "restartPolicy": "Never"}}),
    )
    .await;

    let pods = [
        "cm-default",
        "cm-default-mode",
        "cm-non-root",
        "cm-map",
        "cm-map-mode",
        "cm-map-non-root",
        "cm-multi",
        "cm-env-var",
        "cm-env-from",
    ];
    s.wait_all(&pods, POD_TIMEOUT, terminal).await;

    let data1 = "/etc/configmap-volume/data-1";
    let content2 =
        || Want::has("content of file \"/etc/configmap-volume/path/to/data-2\": value-2");
    let data2 = "/etc/configmap-volume/path/to/data-2";
    let c = "agnhost-container";
    s.expect_output(
        DEFAULT,
        "cm-default",
        c,
        &[Want::has(content1_str()), file_mode(data1, "-rw-r--r--")],
    );
    s.expect_output(
        DEFAULT_MODE,
        "cm-default-mode",
        c,
        &[Want::has(content1_str()), file_mode(data1, "-r--------")],
    );
    s.expect_output(
        NON_ROOT,
        "cm-non-root",
        c,
        &[Want::has(content1_str()), file_mode(data1, "-rw-r--r--")],
    );
    s.expect_output(
        MAPPINGS,
        "cm-map",
        c,
        &[content2(), file_mode(data2, "-rw-r--r--")],
    );
    s.expect_output(
        ITEM_MODE,
        "cm-map-mode",
        c,
        &[content2(), file_mode(data2, "-r--------")],
    );
    s.expect_output(
        MAPPINGS_NON_ROOT,
        "cm-map-non-root",
        c,
        &[content2(), file_mode(data2, "-rw-r--r--")],
    );
    s.expect_output(
        MULTIPLE,
        "cm-multi",
        "configmap-volume-test",
        &[Want::has(content1_str())],
    );
    s.expect_output(
        ENV_VAR,
        "cm-env-var",
        "env-test",
        &[Want::has("CONFIG_DATA_1=value-1")],
    );
    s.expect_output(
        ENV_FROM,
        "cm-env-from",
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

fn content1_str() -> &'static str {
    "content of file \"/etc/configmap-volume/data-1\": value-1"
}

const UPDATES: &str = "updates should be reflected in volume";

async fn updates(s: &Suite) {
    s.config_map(NS, "cm-upd", &[("data-1", "value-1")], &[])
        .await;
    s.pod(
        UPDATES,
        "cm-upd",
        mounttest_pod(
            "configmap-volume",
            "cm-upd",
            "/etc/configmap-volume",
            &[
                "--break_on_expected_content=false",
                "--retry_time=120",
                "--file_content_in_loop=/etc/configmap-volume/data-1",
            ],
        ),
    )
    .await;
    if !s.wait_running(UPDATES, "cm-upd", POD_TIMEOUT).await {
        return;
    }
    let c = "agnhost-container";
    if !s
        .eventually_log(UPDATES, "cm-upd", c, Want::has("value-1"), UPDATE_TIMEOUT)
        .await
    {
        return;
    }
    s.update_config_map(NS, "cm-upd", &[("data-1", "value-2")])
        .await;
    s.eventually_log(UPDATES, "cm-upd", c, Want::has("value-2"), UPDATE_TIMEOUT)
        .await;
}

const BINARY: &str = "binary data should be reflected in volume";

async fn binary(s: &Suite) {
    s.config_map(
        NS,
        "cm-bin",
        &[("data-1", "value-1")],
        &[("dump.bin", &[0xde, 0xca, 0xfe, 0xba, 0xd0, 0xfe, 0xff])],
    )
    .await;
    let mut pod = mounttest_pod(
        "configmap-volume",
        "cm-bin",
        "/etc/configmap-volume",
        &[
            "--break_on_expected_content=false",
            "--retry_time=120",
            "--file_content_in_loop=/etc/configmap-volume/data-1",
        ],
    );
    let mut hex = busybox(
        "configmap-volume-binary-test",
        &["hexdump", "-C", "/etc/configmap-volume/dump.bin"],
    );
    hex["volumeMounts"] = json!([mount("configmap-volume", "/etc/configmap-volume", true)]);
    pod["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .push(hex);
    s.pod(BINARY, "cm-bin", pod).await;
    if !s.wait_running(BINARY, "cm-bin", POD_TIMEOUT).await {
        return;
    }
    s.eventually_log(
        BINARY,
        "cm-bin",
        "agnhost-container",
        Want::has("value-1"),
        UPDATE_TIMEOUT,
    )
    .await;
    s.eventually_log(
        BINARY,
        "cm-bin",
        "configmap-volume-binary-test",
        Want::has("de ca fe ba d0 fe ff"),
        UPDATE_TIMEOUT,
    )
    .await;
}

const OPTIONAL: &str = "optional updates should be reflected in volume";

/// Three optional configMap volumes: one deleted, one updated, one created later.
async fn optional_updates(s: &Suite) {
    s.optional_updates(OptionalUpdates {
        spec: OPTIONAL,
        short: "cm-opt",
        kind: Kind::ConfigMap,
        projected: false,
        base: "/etc/configmap-volumes",
        objects: ["cm-test-opt-del", "cm-test-opt-upd", "cm-test-opt-create"],
        volumes: ["deletecm-volume", "updatecm-volume", "createcm-volume"],
        containers: [
            "delcm-volume-test",
            "updcm-volume-test",
            "createcm-volume-test",
        ],
    })
    .await;
}

const MISSING: &str =
    "Should fail non-optional pod creation due to configMap object does not exist [Slow]";
const MISSING_KEY: &str = "Should fail non-optional pod creation due to the key in the configMap object does not exist [Slow]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_volume_and_env_specs() {
    let s = Suite::start().await;
    s.config_map(NS, "cm-test-opt-create-key", &new_config_map(), &[])
        .await;
    tokio::join!(
        to_completion(&s),
        updates(&s),
        binary(&s),
        optional_updates(&s),
        s.non_optional(NonOptional {
            spec: MISSING,
            short: "cm-missing",
            kind: Kind::ConfigMap,
            object: "cm-test-opt-create-missing",
            mount_dir: "/etc/configmap-volumes",
            items: None,
            want: "\"cm-test-opt-create-missing\" not found",
        }),
        s.non_optional(NonOptional {
            spec: MISSING_KEY,
            short: "cm-missing-key",
            kind: Kind::ConfigMap,
            object: "cm-test-opt-create-key",
            mount_dir: "/etc/configmap-volumes",
            items: Some(json!([{"key": "data-4", "path": "path/to/data-4"}])),
            want: "configmap references non-existent config key: data-4",
        }),
    );
    // Consistently Pending: still so after every other spec ran.
    s.still_pending(MISSING, "cm-missing");
    s.still_pending(MISSING_KEY, "cm-missing-key");
    s.finish("volumes_configmap").await;
}
