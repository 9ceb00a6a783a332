//! Upstream's "Docker Containers" specs
//! (`test/e2e/common/node/docker_containers.go`) on one joined kubelet: the
//! image's entrypoint and cmd apply unless the pod's command and args
//! override them. agnhost's `/agnhost` (ENTRYPOINT, CMD `pause`) is
//! emulated by `localhost:5000/agnhost-entrypoint:1.0`, which
//! `deploy/setup-runtime.sh` builds: `entrypoint-tester` prints its argv as
//! `[/agnhost entrypoint-tester ...]`, `pause` prints `Paused`; `/agnhost-2`
//! is the same program under another name.

use std::time::Duration;

use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// The agnhost stand-in built by `deploy/setup-runtime.sh`.
const AGNHOST: &str = "localhost:5000/agnhost-entrypoint:1.0";

const DEFAULTS: &str =
    "should use the image defaults if command and args are blank [NodeConformance]";
const ARGS: &str =
    "should be able to override the image's default arguments (docker cmd) [NodeConformance]";
const COMMAND: &str =
    "should be able to override the image's default command (docker entrypoint) [NodeConformance]";
const ALL: &str =
    "should be able to override the image's default command and arguments [NodeConformance]";

/// `entrypointTestPod`: an agnhost container with `args`, grace 1 s, never restarted.
fn entrypoint_test_pod(args: &[&str], command: Option<&[&str]>) -> Value {
    let mut c =
        json!({"name": "agnhost-container", "image": AGNHOST, "imagePullPolicy": "IfNotPresent"});
    if !args.is_empty() {
        c["args"] = json!(args);
    }
    if let Some(command) = command {
        c["command"] = json!(command);
    }
    json!({"metadata": {}, "spec": {"containers": [c], "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_containers_specs() {
    let s = Suite::start().await;
    let c = "agnhost-container";
    s.pod(DEFAULTS, "defaults", entrypoint_test_pod(&[], None))
        .await;
    s.pod(
        ARGS,
        "override-args",
        entrypoint_test_pod(&["entrypoint-tester", "override", "arguments"], None),
    )
    .await;
    s.pod(
        COMMAND,
        "override-command",
        entrypoint_test_pod(&["entrypoint-tester"], Some(&["/agnhost-2"])),
    )
    .await;
    s.pod(
        ALL,
        "override-all",
        entrypoint_test_pod(
            &["entrypoint-tester", "override", "arguments"],
            Some(&["/agnhost-2"]),
        ),
    )
    .await;
    // The image defaults ("/agnhost pause") run and print "Paused".
    if s.wait_running(DEFAULTS, "defaults", POD_TIMEOUT).await {
        s.eventually_log(
            DEFAULTS,
            "defaults",
            c,
            Want::has("Paused"),
            Duration::from_secs(30),
        )
        .await;
    }
    let done = ["override-args", "override-command", "override-all"];
    s.wait_all(&done, POD_TIMEOUT, terminal).await;
    s.expect_output(
        ARGS,
        "override-args",
        c,
        &[Want::has("[/agnhost entrypoint-tester override arguments]")],
    );
    s.expect_output(
        COMMAND,
        "override-command",
        c,
        &[Want::has("[/agnhost-2 entrypoint-tester]")],
    );
    s.expect_output(
        ALL,
        "override-all",
        c,
        &[Want::has(
            "[/agnhost-2 entrypoint-tester override arguments]",
        )],
    );
    s.finish("docker_containers").await;
}
