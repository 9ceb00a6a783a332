//! Upstream's "Container Runtime" specs (`test/e2e/common/node/runtime.go`)
//! on one joined kubelet: restart policies and the status they lead to
//! (restart count, phase, ready, state), termination messages (file, logs,
//! FallbackToLogsOnError, non-root at a custom path) and image pulls against
//! the local registries (`localhost:5000` without auth, `localhost:5001`
//! with htpasswd auth, see `deploy/setup-runtime.sh`).

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// Upstream's `ContainerStatusRetryTimeout` is 5 minutes; the restart
/// back-off (10 s then 20 s) makes two restarts take about 30 s here.
const STATUS_TIMEOUT: Duration = Duration::from_secs(120);

const EXPECTED_STATUS: &str = "blackbox test when starting a container that exits should run with the expected status [NodeConformance]";
const TM_PATH: &str = "blackbox test on terminated container should report termination message if TerminationMessagePath is set [NodeConformance]";
const TM_NON_ROOT: &str = "blackbox test on terminated container should report termination message if TerminationMessagePath is set as non-root user and at a non-default path [NodeConformance]";
const TM_FALLBACK: &str = "blackbox test on terminated container should report termination message from log output if TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance]";
const TM_EMPTY: &str = "blackbox test on terminated container should report termination message as empty when pod succeeds and TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance]";
const TM_FILE: &str = "blackbox test on terminated container should report termination message from file when pod succeeds and TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance]";
const PULL_INVALID: &str = "blackbox test when running a container with a new image should not be able to pull image from invalid registry [NodeConformance]";
const PULL_OK: &str = "blackbox test when running a container with a new image should be able to pull image [NodeConformance]";
const PULL_NO_SECRET: &str = "blackbox test when running a container with a new image should not be able to pull from private registry without secret [NodeConformance]";
const PULL_SECRET: &str = "blackbox test when running a container with a new image should be able to pull from private registry with secret [NodeConformance]";

/// The authenticated registry (upstream's `AuthenticatedAlpine`).
const PRIVATE: &str = "localhost:5001/private/busybox:1.35";
/// An image no registry has (upstream's `InvalidRegistryImage` names a host
/// that does not resolve; without network a missing repository on the local
/// registry fails the pull the same way).
const MISSING: &str = "localhost:5000/invalid/alpine:3.1";

/// `ConformanceContainer.Create`: one container, the restart policy, volumes.
fn conformance_pod(container: Value, restart: &str, volumes: Value) -> Value {
    let mut p =
        json!({"metadata": {}, "spec": {"containers": [container], "restartPolicy": restart}});
    if !volumes.is_null() {
        p["spec"]["volumes"] = volumes;
    }
    p
}

/// The status of the pod's only container.
fn status(s: &Suite, short: &str) -> Value {
    s.api_pod(short)
        .map(|p| p["status"]["containerStatuses"][0].clone())
        .unwrap_or(Value::Null)
}

/// Upstream's `GetContainerState`.
fn state(st: &Value) -> &'static str {
    if !st["state"]["running"].is_null() {
        "Running"
    } else if !st["state"]["terminated"].is_null() {
        "Terminated"
    } else if !st["state"]["waiting"].is_null() {
        "Waiting"
    } else {
        "Unknown"
    }
}

/// Polls until `ok` holds (upstream's `Eventually`), or fails the spec.
async fn eventually(
    s: &Suite,
    spec: &str,
    short: &str,
    what: &str,
    ok: impl Fn(&Suite) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + STATUS_TIMEOUT;
    loop {
        if ok(s) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            s.fail(
                spec,
                format!(
                    "pod {short}: {what} not reached within {STATUS_TIMEOUT:?}; phase {:?}; {}",
                    s.phase(short),
                    s.describe(short)
                ),
            );
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// "should run with the expected status": fails at the first run, succeeds
/// at the second, then runs forever, under each restart policy.
async fn expected_status(s: &Suite) {
    let script = "\nf=/restart-count/restartCount\ncount=$(echo 'hello' >> $f ; wc -l $f | awk {'print $1'})\nif [ $count -eq 1 ]; then\n\texit 1\nfi\nif [ $count -eq 2 ]; then\n\texit 0\nfi\nwhile true; do sleep 1; done\n";
    let volumes = json!([{"name": "restart-count", "emptyDir": {"medium": "Memory"}}]);
    let cases = [
        ("terminate-cmd-rpa", "Always", "Running", "Running", 2, true),
        (
            "terminate-cmd-rpof",
            "OnFailure",
            "Succeeded",
            "Terminated",
            1,
            false,
        ),
        (
            "terminate-cmd-rpn",
            "Never",
            "Failed",
            "Terminated",
            0,
            false,
        ),
    ];
    for (name, restart, ..) in cases {
        let c = json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script],
            "volumeMounts": [{"name": "restart-count", "mountPath": "/restart-count"}]});
        s.pod(
            EXPECTED_STATUS,
            name,
            conformance_pod(c, restart, volumes.clone()),
        )
        .await;
    }
    let checks = cases.map(|(name, _, phase, want_state, restarts, ready)| async move {
        let spec = EXPECTED_STATUS;
        let ok = eventually(s, spec, name, &format!("RestartCount {restarts}"), |s| {
            status(s, name)["restartCount"] == restarts
        })
        .await
            && eventually(s, spec, name, &format!("phase {phase}"), |s| {
                s.phase(name) == phase
            })
            .await;
        if !ok {
            return;
        }
        let st = status(s, name);
        if st["ready"].as_bool() != Some(ready) {
            s.fail(
                spec,
                format!("{name}: ready {} (want {ready})", st["ready"]),
            );
        }
        if state(&st) != want_state {
            s.fail(
                spec,
                format!("{name}: state {} (want {want_state}): {st}", state(&st)),
            );
        }
    });
    futures::future::join_all(checks).await;
}

/// `matchTerminationMessage`: the pod reaches `phase`, its container is
/// terminated with `message`.
async fn termination_message(
    s: &Suite,
    spec: &str,
    short: &str,
    container: Value,
    phase: &str,
    message: &str,
) {
    let mut c = container;
    c["name"] = json!("termination-message-container");
    c["image"] = json!(BUSYBOX);
    c["imagePullPolicy"] = json!("IfNotPresent");
    c["command"] = json!(["/bin/sh", "-c"]);
    if !s
        .pod(spec, short, conformance_pod(c, "Never", Value::Null))
        .await
    {
        return;
    }
    if !eventually(s, spec, short, &format!("phase {phase}"), |s| {
        s.phase(short) == phase
    })
    .await
    {
        return;
    }
    let st = status(s, short);
    if state(&st) != "Terminated" {
        s.fail(
            spec,
            format!("{short}: state {} (want Terminated)", state(&st)),
        );
        return;
    }
    let got = st["state"]["terminated"]["message"].as_str().unwrap_or("");
    if got != message {
        s.fail(
            spec,
            format!("{short}: termination message {got:?}, want {message:?}"),
        );
    }
}

async fn termination_messages(s: &Suite) {
    tokio::join!(
        termination_message(
            s,
            TM_PATH,
            "tm-path",
            json!({"args": ["/bin/echo -n DONE > /dev/termination-log"],
                "terminationMessagePath": "/dev/termination-log",
                "securityContext": {"runAsUser": 0}}),
            "Succeeded",
            "DONE",
        ),
        termination_message(
            s,
            TM_NON_ROOT,
            "tm-non-root",
            json!({"args": ["/bin/echo -n DONE > /dev/termination-custom-log"],
                "terminationMessagePath": "/dev/termination-custom-log",
                "securityContext": {"runAsUser": 10000}}),
            "Succeeded",
            "DONE",
        ),
        termination_message(
            s,
            TM_FALLBACK,
            "tm-fallback",
            json!({"args": ["/bin/echo -n DONE; /bin/false"],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "FallbackToLogsOnError"}),
            "Failed",
            "DONE",
        ),
        termination_message(
            s,
            TM_EMPTY,
            "tm-empty",
            json!({"args": ["/bin/echo -n DONE; /bin/true"],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "FallbackToLogsOnError"}),
            "Succeeded",
            "",
        ),
        termination_message(
            s,
            TM_FILE,
            "tm-file",
            json!({"args": ["/bin/echo -n OK > /dev/termination-log; /bin/echo DONE; /bin/true"],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "FallbackToLogsOnError"}),
            "Succeeded",
            "OK",
        ),
    );
}

/// `imagePullTest`: pulled `Always`; a failing pull leaves the container
/// waiting in `ErrImagePull` or `ImagePullBackOff` and the pod Pending, a
/// good one runs.
async fn image_pull(
    s: &Suite,
    spec: &str,
    short: &str,
    image: &str,
    secret: Option<&str>,
    fails: bool,
) {
    let c = json!({"name": "image-pull-test", "image": image, "imagePullPolicy": "Always",
        "command": ["/bin/sh", "-c", "while true; do sleep 1; done"]});
    let mut p = conformance_pod(c, "Never", Value::Null);
    if let Some(secret) = secret {
        p["spec"]["imagePullSecrets"] = json!([{"name": secret}]);
    }
    if !s.pod(spec, short, p).await {
        return;
    }
    let want_phase = if fails { "Pending" } else { "Running" };
    eventually(
        s,
        spec,
        short,
        "the expected container state and phase",
        |s| {
            let st = status(s, short);
            let state_ok = if fails {
                matches!(
                    st["state"]["waiting"]["reason"].as_str(),
                    Some("ErrImagePull" | "ImagePullBackOff")
                )
            } else {
                !st["state"]["running"].is_null()
            };
            state_ok && s.phase(short) == want_phase
        },
    )
    .await;
}

async fn image_pulls(s: &Suite) {
    // A `kubernetes.io/dockerconfigjson` secret with the private registry's credentials.
    let doc = json!({"auths": {"localhost:5001": {"auth": base64_auth("kubelet-test", "kubelet-test-pull-secret")}}});
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("image-pull-secret".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(
            [(
                ".dockerconfigjson".to_string(),
                ByteString(doc.to_string().into_bytes()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(s.j.admin.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create pull secret");
    tokio::join!(
        image_pull(s, PULL_INVALID, "pull-invalid", MISSING, None, true),
        image_pull(s, PULL_OK, "pull-ok", BUSYBOX, None, false),
        image_pull(s, PULL_NO_SECRET, "pull-no-secret", PRIVATE, None, true),
        image_pull(
            s,
            PULL_SECRET,
            "pull-secret",
            PRIVATE,
            Some("image-pull-secret"),
            false
        ),
    );
}

fn base64_auth(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_runtime_specs() {
    let s = Suite::start().await;
    tokio::join!(
        expected_status(&s),
        termination_messages(&s),
        image_pulls(&s)
    );
    s.finish("container_runtime").await;
}
