//! Upstream's `[NodeConformance]` specs of `test/e2e/common/node/init_container.go`
//! ("InitContainer [NodeConformance]") on one joined kubelet, with busybox
//! `true`/`false`/`sleep` for upstream's busybox and pause images; same pods,
//! same status assertions. Plus a sidecar spec (init containers with
//! `restartPolicy: Always`, upstream 1.29+): start order, restart after exit,
//! and app-first, reverse-order shutdown when the app finishes, seen through
//! a log the containers append to on a shared emptyDir.

use std::time::Duration;

use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

fn ctr(name: &str, cmd: &[&str]) -> Value {
    json!({"name": name, "image": BUSYBOX, "command": cmd})
}

fn pod(policy: &str, inits: Vec<Value>, apps: Vec<Value>) -> Value {
    json!({"metadata": {"labels": {"name": "foo"}},
           "spec": {"restartPolicy": policy, "initContainers": inits, "containers": apps,
                    "terminationGracePeriodSeconds": 2}})
}

/// Waits (bounded) until `pred` holds for the stored pod.
async fn wait_pod(
    s: &Suite,
    short: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let p = s.api_pod(short);
        if p.as_ref().is_some_and(&pred) {
            return p;
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn initialized(p: &Value) -> Option<&Value> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Initialized")
}

/// Every init container terminated with exit 0 and ready; Initialized True.
fn check_inits_done(s: &Suite, spec: &str, p: &Value) {
    if initialized(p).map(|c| c["status"].clone()) != Some(json!("True")) {
        s.fail(spec, format!("Initialized not True: {:?}", initialized(p)));
    }
    let inits = p["status"]["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if inits.len() != 2 {
        s.fail(spec, format!("{} init container statuses", inits.len()));
    }
    for st in inits {
        if st["ready"] != json!(true) || st["state"]["terminated"]["exitCode"] != json!(0) {
            s.fail(spec, format!("init container not ready/terminated 0: {st}"));
        }
    }
}

/// While initialization fails, the app container waits with `PodInitializing`.
fn app_waits(s: &Suite, spec: &str, p: &Value) {
    let app = &p["status"]["containerStatuses"][0];
    if !app.is_null() && app["state"]["waiting"]["reason"] != json!("PodInitializing") {
        s.fail(spec, format!("app container out of PodInitializing: {app}"));
    }
}

/// `should invoke init containers on a RestartNever pod`.
async fn restart_never(s: &Suite) {
    let spec = "should invoke init containers on a RestartNever pod";
    let p = pod(
        "Never",
        vec![ctr("init1", &["/bin/true"]), ctr("init2", &["/bin/true"])],
        vec![ctr("run1", &["/bin/true"])],
    );
    if !s.pod(spec, "init-never", p).await {
        return;
    }
    let Some(p) = wait_pod(s, "init-never", POD_TIMEOUT, |p| {
        p["status"]["phase"] == "Succeeded"
    })
    .await
    else {
        return s.fail(spec, format!("not Succeeded: {}", s.describe("init-never")));
    };
    check_inits_done(s, spec, &p);
}

/// `should invoke init containers on a RestartAlways pod`.
async fn restart_always(s: &Suite) {
    let spec = "should invoke init containers on a RestartAlways pod";
    let p = pod(
        "Always",
        vec![ctr("init1", &["/bin/true"]), ctr("init2", &["/bin/true"])],
        vec![ctr("run1", &["sleep", "3600"])],
    );
    if !s.pod(spec, "init-always", p).await
        || !s.wait_running(spec, "init-always", POD_TIMEOUT).await
    {
        return;
    }
    let p = s.api_pod("init-always").unwrap_or_default();
    check_inits_done(s, spec, &p);
}

/// `should not start app containers if init containers fail on a RestartAlways pod`:
/// init1 fails and is restarted (three times, as upstream waits for), init2
/// and the app never start, the pod stays Pending and not initialized.
async fn failing_init_always(s: &Suite) {
    let spec = "should not start app containers if init containers fail on a RestartAlways pod";
    let p = pod(
        "Always",
        vec![ctr("init1", &["/bin/false"]), ctr("init2", &["/bin/true"])],
        vec![ctr("run1", &["sleep", "3600"])],
    );
    if !s.pod(spec, "init-fail-always", p).await {
        return;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let p = loop {
        let p = s.api_pod("init-fail-always").unwrap_or_default();
        app_waits(s, spec, &p);
        let init2 = &p["status"]["initContainerStatuses"][1];
        if !init2.is_null() && init2["state"]["waiting"].is_null() {
            s.fail(
                spec,
                format!("second init container out of waiting: {init2}"),
            );
        }
        if p["status"]["initContainerStatuses"][0]["restartCount"]
            .as_i64()
            .unwrap_or(0)
            >= 3
        {
            break p;
        }
        if tokio::time::Instant::now() >= deadline {
            return s.fail(
                spec,
                format!(
                    "init1 not restarted 3 times: {}",
                    s.describe("init-fail-always")
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    if p["status"]["phase"] != "Pending" {
        s.fail(spec, format!("phase {}", p["status"]["phase"]));
    }
    let c = initialized(&p).cloned().unwrap_or_default();
    if c["status"] != "False"
        || c["reason"] != "ContainersNotInitialized"
        || c["message"] != "containers with incomplete status: [init1 init2]"
    {
        s.fail(spec, format!("Initialized condition: {c}"));
    }
    if p["status"]["initContainerStatuses"]
        .as_array()
        .map(Vec::len)
        != Some(2)
    {
        s.fail(spec, "not 2 init container statuses");
    }
}

/// `should not start app containers and fail the pod if init containers fail on a RestartNever pod`.
async fn failing_init_never(s: &Suite) {
    let spec = "should not start app containers and fail the pod if init containers fail on a RestartNever pod";
    let p = pod(
        "Never",
        vec![ctr("init1", &["/bin/true"]), ctr("init2", &["/bin/false"])],
        vec![ctr("run1", &["/bin/true"])],
    );
    if !s.pod(spec, "init-fail-never", p).await {
        return;
    }
    let deadline = tokio::time::Instant::now() + POD_TIMEOUT;
    let p = loop {
        let p = s.api_pod("init-fail-never").unwrap_or_default();
        app_waits(s, spec, &p);
        if p["status"]["phase"] == "Failed" {
            break p;
        }
        if tokio::time::Instant::now() >= deadline {
            return s.fail(
                spec,
                format!("not Failed: {}", s.describe("init-fail-never")),
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let c = initialized(&p).cloned().unwrap_or_default();
    if c["status"] != "False"
        || c["reason"] != "ContainersNotInitialized"
        || c["message"] != "containers with incomplete status: [init2]"
    {
        s.fail(spec, format!("Initialized condition: {c}"));
    }
    let inits = p["status"]["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if inits.len() != 2 {
        return s.fail(spec, "not 2 init container statuses");
    }
    if inits[0]["state"]["terminated"]["exitCode"] != json!(0) {
        s.fail(spec, format!("init1: {}", inits[0]));
    }
    if inits[1]["state"]["terminated"]["exitCode"]
        .as_i64()
        .unwrap_or(0)
        == 0
    {
        s.fail(spec, format!("init2 did not fail: {}", inits[1]));
    }
}

/// A container that appends `start <name>` to the shared log, `stop <name>`
/// when SIGTERM stops it, exits 1 once `/d/crash-<name>` appears and 0 (with
/// `exit <name>`) once `/d/done-<name>` appears.
fn logging(name: &str, restart_always: bool) -> Value {
    let script = format!(
        "echo start {name} >> /d/log; trap 'echo stop {name} >> /d/log; exit 0' TERM; \
         while true; do if [ -f /d/crash-{name} ]; then rm /d/crash-{name}; exit 1; fi; \
         if [ -f /d/done-{name} ]; then echo exit {name} >> /d/log; exit 0; fi; sleep 0.2; done"
    );
    let mut c = json!({"name": name, "image": BUSYBOX, "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "d", "mountPath": "/d"}]});
    if restart_always {
        c["restartPolicy"] = json!("Always");
    }
    c
}

/// Sidecars sc1 and sc2 around the regular init container init1, app `app`,
/// all logging to `dir` on the host (a hostPath, so the log outlives the pod).
fn sidecar_pod(policy: &str, dir: &std::path::Path) -> Value {
    let init1 = json!({"name": "init1", "image": BUSYBOX,
        "command": ["sh", "-c", "echo start init1 >> /d/log"],
        "volumeMounts": [{"name": "d", "mountPath": "/d"}]});
    let mut p = pod(
        policy,
        vec![logging("sc1", true), init1, logging("sc2", true)],
        vec![logging("app", false)],
    );
    p["spec"]["volumes"] = json!([{"name": "d", "hostPath": {"path": dir, "type": "Directory"}}]);
    p["spec"]["terminationGracePeriodSeconds"] = json!(10);
    p
}

/// Waits (bounded) until the log in `dir` has `last`, and returns its lines.
async fn log_until(dir: &std::path::Path, last: &str) -> Vec<String> {
    let read = || std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    let deadline = tokio::time::Instant::now() + POD_TIMEOUT;
    while !read().lines().any(|l| l == last) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    read().lines().map(String::from).collect()
}

/// Sidecars (KEP-753) start in order around the regular init container, a
/// sidecar that exits is restarted, and on deletion the app stops first,
/// then sc2, then sc1.
async fn sidecars_start_restart_and_stop_in_order(s: &Suite) {
    let spec = "sidecar containers start in order, restart after exit, stop after the app in reverse order";
    let dir = tempfile::tempdir().expect("tmp");
    if !s
        .pod(spec, "sidecars", sidecar_pod("Always", dir.path()))
        .await
    {
        return;
    }
    let app_running =
        |p: &Value| p["status"]["containerStatuses"][0]["state"]["running"].is_object();
    if wait_pod(s, "sidecars", POD_TIMEOUT, app_running)
        .await
        .is_none()
    {
        return s.fail(spec, format!("app not running: {}", s.describe("sidecars")));
    }
    if let Err(e) = std::fs::write(dir.path().join("crash-sc1"), "") {
        return s.fail(spec, format!("write: {e}"));
    }
    // The restart shows as a second `start sc1` (bounded wait).
    let deadline = tokio::time::Instant::now() + POD_TIMEOUT;
    while std::fs::read_to_string(dir.path().join("log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == "start sc1")
        .count()
        < 2
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if let Err(e) = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(s.j.admin.clone(), NS)
        .delete(
            &s.name("sidecars"),
            &kube::api::DeleteParams::default().grace_period(10),
        )
        .await
    {
        return s.fail(spec, format!("delete: {e}"));
    }
    let lines = log_until(dir.path(), "stop sc1").await;
    let want = [
        "start sc1",
        "start init1",
        "start sc2",
        "start app",
        "start sc1",
        "stop app",
        "stop sc2",
        "stop sc1",
    ];
    if lines != want {
        s.fail(spec, format!("log {lines:?}, want {want:?}"));
    }
}

/// Sidecars do not keep a restartPolicy Never pod alive: once the app
/// finished, sc2 then sc1 are stopped and the pod Succeeds.
async fn sidecars_do_not_keep_a_never_pod_alive(s: &Suite) {
    let spec = "sidecar containers do not keep a restartPolicy Never pod alive";
    let dir = tempfile::tempdir().expect("tmp");
    if !s
        .pod(spec, "sidecars-never", sidecar_pod("Never", dir.path()))
        .await
    {
        return;
    }
    let app_running =
        |p: &Value| p["status"]["containerStatuses"][0]["state"]["running"].is_object();
    if wait_pod(s, "sidecars-never", POD_TIMEOUT, app_running)
        .await
        .is_none()
    {
        return s.fail(
            spec,
            format!("app not running: {}", s.describe("sidecars-never")),
        );
    }
    if let Err(e) = std::fs::write(dir.path().join("done-app"), "") {
        return s.fail(spec, format!("write: {e}"));
    }
    let lines = log_until(dir.path(), "stop sc1").await;
    let want = [
        "start sc1",
        "start init1",
        "start sc2",
        "start app",
        "exit app",
        "stop sc2",
        "stop sc1",
    ];
    if lines != want {
        s.fail(spec, format!("log {lines:?}, want {want:?}"));
    }
    let done = |p: &Value| p["status"]["phase"] == "Succeeded";
    if wait_pod(s, "sidecars-never", POD_TIMEOUT, done)
        .await
        .is_none()
    {
        s.fail(
            spec,
            format!("not Succeeded: {}", s.describe("sidecars-never")),
        );
    }
}

/// The four `InitContainer [NodeConformance]` specs.
///
/// Ignored until status generation (`crates/kubelet/src/status/generate.rs`)
/// reports completed init containers `ready: true` and keeps `Initialized`
/// False (`ContainersNotInitialized`) on a pod Failed by its init container,
/// as upstream; the runtime side passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_container_node_conformance() {
    let s = Suite::start().await;
    tokio::join!(
        restart_never(&s),
        restart_always(&s),
        failing_init_always(&s),
        failing_init_never(&s),
    );
    s.finish("init_containers").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_containers() {
    let s = Suite::start().await;
    if !s.j.api.profile().at_least(28) {
        // Only from 1.28: an older apiserver drops an init container's
        // restartPolicy, so no pod there has a sidecar.
        eprintln!(
            "init_containers: sidecar containers do not apply to a {} apiserver (restartPolicy dropped)",
            s.j.api.profile()
        );
        s.finish("init_containers sidecars").await;
        return;
    }
    tokio::join!(
        sidecars_start_restart_and_stop_in_order(&s),
        sidecars_do_not_keep_a_never_pod_alive(&s),
    );
    s.finish("init_containers sidecars").await;
}
