//! Upstream's variable expansion specs (`test/e2e/common/node/expansion.go`)
//! on one joined kubelet: `$(VAR)` in env values, command and args, and
//! `subPathExpr` (including the `[Slow]` ones, which need one node only).

use std::time::Duration;

use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// `newPod`: "dapi-container" (busybox) with `command`, env and mounts.
fn new_pod(
    s: &Suite,
    short: &str,
    command: Value,
    env: Value,
    mounts: Value,
    volumes: Value,
) -> Value {
    let mut c = json!({"name": "dapi-container", "image": kubelet_rs_integration::BUSYBOX,
        "imagePullPolicy": "IfNotPresent", "env": env});
    if !command.is_null() {
        c["command"] = command;
    }
    if !mounts.is_null() {
        c["volumeMounts"] = mounts;
    }
    let mut p = json!({
        "metadata": {"labels": {"name": s.name(short)}},
        "spec": {"containers": [c], "restartPolicy": "Never"},
    });
    if !volumes.is_null() {
        p["spec"]["volumes"] = volumes;
    }
    p
}

fn workdir() -> Value {
    json!([{"name": "workdir1", "emptyDir": {}}])
}

const COMPOSE: &str = "should allow composing env vars into new env vars";
const COMMAND: &str = "should allow substituting values in a container's command";
const ARGS: &str = "should allow substituting values in a container's args";
const SUBPATH: &str = "should allow substituting values in a volume subpath";

async fn to_completion(s: &Suite) {
    s.pod(
        COMPOSE,
        "var-compose",
        new_pod(
            s,
            "var-compose",
            json!(["sh", "-c", "env"]),
            json!([
                {"name": "FOO", "value": "foo-value"},
                {"name": "BAR", "value": "bar-value"},
                {"name": "FOOBAR", "value": "$(FOO);;$(BAR)"},
            ]),
            Value::Null,
            Value::Null,
        ),
    )
    .await;
    let test_var = json!([{"name": "TEST_VAR", "value": "test-value"}]);
    s.pod(
        COMMAND,
        "var-command",
        new_pod(
            s,
            "var-command",
            json!(["sh", "-c", "TEST_VAR=wrong echo \"$(TEST_VAR)\""]),
            test_var.clone(),
            Value::Null,
            Value::Null,
        ),
    )
    .await;
    let mut p = new_pod(
        s,
        "var-args",
        json!(["sh", "-c"]),
        test_var,
        Value::Null,
        Value::Null,
    );
    p["spec"]["containers"][0]["args"] = json!(["TEST_VAR=wrong echo \"$(TEST_VAR)\""]);
    s.pod(ARGS, "var-args", p).await;
    // The subpath is the pod's name (POD_NAME's value is set to it).
    let name = s.name("var-subpath");
    s.pod(
        SUBPATH,
        "var-subpath",
        new_pod(
            s,
            "var-subpath",
            json!(["sh", "-c", format!("test -d /testcontainer/{name};echo $?")]),
            json!([{"name": "POD_NAME", "value": name}]),
            json!([
                {"name": "workdir1", "mountPath": "/logscontainer", "subPathExpr": "$(POD_NAME)"},
                {"name": "workdir1", "mountPath": "/testcontainer"},
            ]),
            workdir(),
        ),
    )
    .await;
    let pods = ["var-compose", "var-command", "var-args", "var-subpath"];
    s.wait_all(&pods, POD_TIMEOUT, terminal).await;
    let c = "dapi-container";
    s.expect_output(
        COMPOSE,
        "var-compose",
        c,
        &[
            "FOO=foo-value",
            "BAR=bar-value",
            "FOOBAR=foo-value;;bar-value",
        ]
        .map(Want::has),
    );
    s.expect_output(COMMAND, "var-command", c, &[Want::has("test-value")]);
    s.expect_output(ARGS, "var-args", c, &[Want::has("test-value")]);
    s.expect_output(SUBPATH, "var-subpath", c, &[Want::has("0")]);
}

/// `testPodFailSubpath`: the container waits with CreateContainerConfigError.
async fn fail_subpath(s: &Suite, spec: &str, short: &str, value: &str) {
    let pod = new_pod(
        s,
        short,
        Value::Null,
        json!([{"name": "POD_NAME", "value": value}]),
        json!([{"name": "workdir1", "mountPath": "/logscontainer", "subPathExpr": "$(POD_NAME)"}]),
        workdir(),
    );
    if !s.pod(spec, short, pod).await {
        return;
    }
    wait_config_error(s, spec, short).await;
}

/// Waits for container 0 to be waiting with reason CreateContainerConfigError
/// (upstream's `WaitForPodContainerToFail(..., "CreateContainerConfigError", PodStartShortTimeout)`).
async fn wait_config_error(s: &Suite, spec: &str, short: &str) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let reason = s.api_pod(short).and_then(|p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                .as_str()
                .map(String::from)
        });
        if reason.as_deref() == Some("CreateContainerConfigError") {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            s.fail(spec, format!("pod {short}: container not waiting with CreateContainerConfigError; phase {:?}; {}", s.phase(short), s.describe(short)));
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn annotated_pod(s: &Suite, short: &str, annotations: Value) -> Value {
    let mut p = new_pod(
        s,
        short,
        json!(["sh", "-c", "tail -f /dev/null"]),
        json!([
            {"name": "POD_NAME", "value": "foo"},
            {"name": "ANNOTATION", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations['mysubpath']"}}},
        ]),
        json!([
            {"name": "workdir1", "mountPath": "/subpath_mount", "subPathExpr": "$(ANNOTATION)/$(POD_NAME)"},
            {"name": "workdir1", "mountPath": "/volume_mount"},
        ]),
        workdir(),
    );
    p["metadata"]["annotations"] = annotations;
    p
}

const FAILED_THEN_FIXED: &str = "should verify that a failing subpath expansion can be modified during the lifecycle of a container [Slow]";

async fn failed_then_fixed(s: &Suite) {
    let short = "var-fix";
    if !s
        .pod(
            FAILED_THEN_FIXED,
            short,
            annotated_pod(s, short, json!({"notmysubpath": "mypath"})),
        )
        .await
    {
        return;
    }
    // Upstream: not Running within PodStartShortTimeout. Here: the container
    // fails to be configured (the subpath expands to the absolute "/foo").
    if !wait_config_error(s, FAILED_THEN_FIXED, short).await {
        return;
    }
    if s.phase(short) == "Running" {
        s.fail(
            FAILED_THEN_FIXED,
            "pod Running before its annotation exists",
        );
    }
    s.patch_pod(
        short,
        json!({"metadata": {"annotations": {"mysubpath": "mypath"}}}),
    )
    .await;
    s.wait_running(FAILED_THEN_FIXED, short, Duration::from_secs(60))
        .await;
}

const WRITES: &str = "should succeed in writing subpaths in container [Slow]";

async fn subpath_writes(s: &Suite) {
    let short = "var-writes";
    if !s
        .pod(
            WRITES,
            short,
            annotated_pod(s, short, json!({"mysubpath": "mypath"})),
        )
        .await
        || !s.wait_running(WRITES, short, POD_TIMEOUT).await
    {
        return;
    }
    let c = "dapi-container";
    match s
        .exec(
            short,
            c,
            &["/bin/sh", "-c", "touch /volume_mount/mypath/foo/test.log"],
        )
        .await
    {
        Ok((0, _, _)) => {}
        other => {
            s.fail(
                WRITES,
                format!("expected to be able to write to subpath: {other:?}"),
            );
            return;
        }
    }
    match s
        .exec(
            short,
            c,
            &["/bin/sh", "-c", "test -f /subpath_mount/test.log"],
        )
        .await
    {
        Ok((0, _, _)) => {}
        other => {
            s.fail(
                WRITES,
                format!("expected to be able to verify file: {other:?}"),
            );
            return;
        }
    }
    let before = s.container_id(short, c);
    s.patch_pod(
        short,
        json!({"metadata": {"annotations": {"mysubpath": "mynewpath"}}}),
    )
    .await;
    // The running container keeps its mounts: after the kubelet has seen the
    // change (a pause, not a timing assertion) the pod is still Running with
    // the same container.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if s.wait_running(WRITES, short, Duration::from_secs(30)).await
        && s.container_id(short, c) != before
    {
        s.fail(
            WRITES,
            format!(
                "the container was replaced after the annotation changed: {}",
                s.describe(short)
            ),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variable_expansion_specs() {
    let s = Suite::start().await;
    tokio::join!(
        to_completion(&s),
        fail_subpath(
            &s,
            "should fail substituting values in a volume subpath with backticks [Slow]",
            "var-backticks",
            ".."
        ),
        fail_subpath(
            &s,
            "should fail substituting values in a volume subpath with absolute path [Slow]",
            "var-absolute",
            "/tmp"
        ),
        failed_then_fixed(&s),
        subpath_writes(&s),
    );
    s.finish("env_expansion").await;
}
