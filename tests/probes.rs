//! Upstream's "Probing container" specs (`test/e2e/common/node/container_probe.go`)
//! on one joined kubelet, all pods at once.
//!
//! agnhost's servers are emulated with busybox: `test-webserver` is
//! `httpd` serving `/` on port 80; `liveness` is a `nc -ll` server on 8080
//! that answers `/healthz` with 200 for its first 10 seconds and 500 after,
//! and `/redirect?loc=<url>` with a 302 and Go's `http.Redirect` body.
//! Upstream observes "not restarted" for 4 minutes; here for 60 seconds
//! after the container started (four or more probe periods past the
//! initial delay), which a wrong restart would still fail.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// How long "never restarted" / "never ready" is watched after the container started.
const QUIET: Duration = Duration::from_secs(60);
/// How long an expected restart may take.
const RESTART: Duration = Duration::from_secs(120);

/// agnhost `liveness`: `/healthz` is fine for 10 s, then 500; `/redirect?loc=`.
const LIVENESS_SERVER: &str = r#"cat > /srv.sh <<'EOF'
#!/bin/sh
read -r method path proto
while read -r line; do case "$line" in ''|$(printf '\r')) break;; esac; done
age=$(( $(date +%s) - $(cat /start) ))
case "$path" in
/healthz)
  if [ "$age" -le 10 ]; then code="200 OK"; body="ok"; else code="500 Internal Server Error"; body="error: $age"; fi ;;
/redirect*)
  loc=$(busybox httpd -d "${path#*loc=}")
  body="<a href=\"$loc\">Found</a>."
  printf 'HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s\n' "$loc" "$(( ${#body} + 1 ))" "$body"
  exit 0 ;;
*) code="404 Not Found"; body="404 page not found" ;;
esac
printf 'HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' "$code" "${#body}" "$body"
EOF
chmod +x /srv.sh; date +%s > /start; exec nc -ll -p 8080 -e /srv.sh"#;

fn container(name: &str, cmd: &[&str]) -> Value {
    json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": cmd})
}

fn with_probes(mut c: Value, readiness: Value, liveness: Value, startup: Value) -> Value {
    for (k, v) in [
        ("readinessProbe", readiness),
        ("livenessProbe", liveness),
        ("startupProbe", startup),
    ] {
        if !v.is_null() {
            c[k] = v;
        }
    }
    c
}

/// `testWebServerPodSpec`: agnhost test-webserver on `port`.
fn web_pod(readiness: Value, liveness: Value, name: &str, port: u16) -> Value {
    let cmd =
        format!("mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p {port} -h /www");
    let mut c = with_probes(
        container(name, &["sh", "-c", &cmd]),
        readiness,
        liveness,
        Value::Null,
    );
    c["ports"] = json!([{"containerPort": port}]);
    json!({"metadata": {}, "spec": {"containers": [c]}})
}

/// `busyBoxPodSpec`.
fn busybox_pod(readiness: Value, liveness: Value, cmd: &[&str]) -> Value {
    let c = with_probes(container("busybox", cmd), readiness, liveness, Value::Null);
    json!({"metadata": {"labels": {"test": "liveness"}}, "spec": {"containers": [c]}})
}

/// `livenessPodSpec`: agnhost `liveness` as "agnhost-container".
fn liveness_pod(readiness: Value, liveness: Value) -> Value {
    let mut c = with_probes(
        container("agnhost-container", &["sh", "-c", LIVENESS_SERVER]),
        readiness,
        liveness,
        Value::Null,
    );
    c["ports"] = json!([{"containerPort": 8080}]);
    json!({"metadata": {"labels": {"test": "liveness"}}, "spec": {"containers": [c]}})
}

/// `startupPodSpec`.
fn startup_pod(startup: Value, readiness: Value, liveness: Value, cmd: &[&str]) -> Value {
    let c = with_probes(container("busybox", cmd), readiness, liveness, startup);
    json!({"metadata": {"labels": {"test": "startup"}}, "spec": {"containers": [c]}})
}

fn exec(cmd: &[&str]) -> Value {
    json!({"exec": {"command": cmd}})
}

fn http(path: &str, port: u16) -> Value {
    json!({"httpGet": {"path": path, "port": port}})
}

fn probe(handler: Value, extra: Value) -> Value {
    let mut p = handler;
    if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    p
}

fn statuses(p: &Value) -> Vec<Value> {
    ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| p["status"][*k].as_array().cloned().unwrap_or_default())
        .collect()
}

fn container_status(s: &Suite, short: &str, container: &str) -> Option<Value> {
    statuses(&s.api_pod(short)?)
        .into_iter()
        .find(|c| c["name"] == container)
}

fn restarts(s: &Suite, short: &str, container: &str) -> i64 {
    container_status(s, short, container)
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(0)
}

fn ready(s: &Suite, short: &str) -> bool {
    s.api_pod(short)
        .and_then(|p| p["status"]["conditions"].as_array().cloned())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Upstream `RunLivenessTest`: the container leaves Waiting, then its
/// restart count grows monotonically to `expect` (or stays put for [`QUIET`]).
async fn liveness(s: &Suite, spec: &str, short: &str, pod: Value, expect: i64, window: Duration) {
    if !s.pod(spec, short, pod).await {
        return;
    }
    let name = pod_container(s, short);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let st = container_status(s, short, &name).unwrap_or(Value::Null);
        if !st["state"]["running"].is_null() || !st["state"]["terminated"].is_null() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            s.fail(
                spec,
                format!("container never started; {}", s.describe(short)),
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let initial = restarts(s, short, &name);
    let mut last = initial;
    let deadline = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < deadline {
        let now = restarts(s, short, &name);
        if now < last {
            s.fail(spec, format!("restart count went from {last} to {now}"));
            return;
        }
        last = now;
        if expect > 0 && now - initial >= expect {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let observed = last - initial;
    if (expect == 0 && observed > 0) || observed < expect {
        s.fail(
            spec,
            format!(
                "expected number of restarts: {expect}, found restarts: {observed}; {}",
                s.describe(short)
            ),
        );
    }
}

fn pod_container(s: &Suite, short: &str) -> String {
    s.api_pod(short)
        .and_then(|p| {
            p["spec"]["containers"][0]["name"]
                .as_str()
                .map(String::from)
        })
        .unwrap_or_default()
}

/// Seconds since the epoch of an RFC 3339 time in the stored pod.
fn secs(v: &Value) -> Option<i64> {
    v.as_str()?
        .parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

async fn readiness_initial_delay(s: &Suite) {
    let spec = "with readiness probe should not be ready before initial delay and never restart";
    let pod = web_pod(
        probe(http("/", 80), json!({"initialDelaySeconds": 15})),
        Value::Null,
        "test-webserver",
        80,
    );
    if !s.pod(spec, "web-delay", pod).await {
        return;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !ready(s, "web-delay") {
        if tokio::time::Instant::now() >= deadline {
            return s.fail(spec, format!("never ready; {}", s.describe("web-delay")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let p = s.api_pod("web-delay").unwrap_or(Value::Null);
    let ready_at = p["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
        .and_then(|c| secs(&c["lastTransitionTime"]));
    let started_at = container_status(s, "web-delay", "test-webserver")
        .and_then(|c| secs(&c["state"]["running"]["startedAt"]));
    match (ready_at, started_at) {
        (Some(r), Some(st)) if r - st >= 15 => {}
        other => s.fail(
            spec,
            format!("Pod became ready before its 15s initial delay: (ready, started) = {other:?}"),
        ),
    }
    if restarts(s, "web-delay", "test-webserver") != 0 {
        s.fail(spec, "pod should have a restart count of 0");
    }
}

async fn readiness_failing(s: &Suite) {
    let spec = "with readiness probe that fails should never be ready and never restart";
    let pod = web_pod(
        probe(http("/", 81), json!({})),
        Value::Null,
        "test-webserver",
        80,
    );
    if !s.pod(spec, "web-fail", pod).await || !s.wait_running(spec, "web-fail", POD_TIMEOUT).await {
        return;
    }
    let deadline = tokio::time::Instant::now() + QUIET;
    while tokio::time::Instant::now() < deadline {
        if ready(s, "web-fail") {
            return s.fail(spec, "pod should not be ready");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let cs = container_status(s, "web-fail", "test-webserver").unwrap_or(Value::Null);
    if cs["ready"] != json!(false) || restarts(s, "web-fail", "test-webserver") != 0 {
        s.fail(
            spec,
            format!("container should be unready with 0 restarts: {cs}"),
        );
    }
}

async fn exec_timeouts(s: &Suite) {
    let spec =
        "should not be ready with an exec readiness probe timeout [MinimumKubeletVersion:1.20]";
    let pod = busybox_pod(
        probe(
            exec(&["/bin/sh", "-c", "sleep 10"]),
            json!({"initialDelaySeconds": 15, "timeoutSeconds": 1, "failureThreshold": 1}),
        ),
        Value::Null,
        &["/bin/sh", "-c", "sleep 600"],
    );
    if !s.pod(spec, "exec-ready-timeout", pod).await
        || !s
            .wait_running(spec, "exec-ready-timeout", POD_TIMEOUT)
            .await
    {
        return;
    }
    let deadline = tokio::time::Instant::now() + QUIET;
    while tokio::time::Instant::now() < deadline {
        if ready(s, "exec-ready-timeout") {
            return s.fail(spec, "expected to be not ready");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The Killing event of a liveness restart names the probe, as upstream's message.
fn killed_by(s: &Suite, short: &str, probe_kind: &str) -> bool {
    s.events(short).iter().any(|(t, r, m)| {
        t == "Normal"
            && r == "Killing"
            && m.contains(&format!("failed {probe_kind} probe, will be restarted"))
    })
}

async fn unhealthy_events(s: &Suite) {
    // Checked after the restart specs: each restart came with upstream's events.
    for (short, kind, event) in [
        ("exec-restart", "liveness", "Liveness probe failed: "),
        (
            "http-restart",
            "liveness",
            "Liveness probe failed: HTTP probe failed with statuscode: 500",
        ),
        ("startup-restart", "startup", "Startup probe failed: "),
    ] {
        let unhealthy = s
            .events(short)
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "Unhealthy" && m.starts_with(event));
        if !unhealthy || !killed_by(s, short, kind) {
            s.fail(
                "events of a probe restart",
                format!(
                    "{short}: want Unhealthy {event:?} and a Killing event; {:?}",
                    s.events(short)
                ),
            );
        }
    }
}

async fn restart_specs(s: &Suite) {
    let exec15 = |cmd: &[&str], extra: Value| {
        let mut base =
            json!({"initialDelaySeconds": 15, "timeoutSeconds": 5, "failureThreshold": 1});
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        probe(exec(cmd), base)
    };
    tokio::join!(
        liveness(
            s,
            "should be restarted with a exec \"cat /tmp/health\" liveness probe",
            "exec-restart",
            busybox_pod(
                Value::Null,
                exec15(&["cat", "/tmp/health"], json!({})),
                &[
                    "/bin/sh",
                    "-c",
                    "echo ok >/tmp/health; sleep 10; rm -rf /tmp/health; sleep 600"
                ],
            ),
            1,
            RESTART,
        ),
        liveness(
            s,
            "should *not* be restarted with a exec \"cat /tmp/health\" liveness probe",
            "exec-keep",
            busybox_pod(
                Value::Null,
                exec15(&["cat", "/tmp/health"], json!({})),
                &["/bin/sh", "-c", "echo ok >/tmp/health; sleep 600"],
            ),
            0,
            QUIET,
        ),
        liveness(
            s,
            "should be restarted with a /healthz http liveness probe",
            "http-restart",
            liveness_pod(
                Value::Null,
                probe(
                    http("/healthz", 8080),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 1})
                ),
            ),
            1,
            RESTART,
        ),
        liveness(
            s,
            "should *not* be restarted with a tcp:8080 liveness probe",
            "tcp-keep",
            liveness_pod(
                Value::Null,
                probe(
                    json!({"tcpSocket": {"port": 8080}}),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 1})
                ),
            ),
            0,
            QUIET,
        ),
        liveness(
            s,
            "should have monotonically increasing restart count",
            "http-monotonic",
            liveness_pod(
                Value::Null,
                probe(
                    http("/healthz", 8080),
                    json!({"initialDelaySeconds": 5, "failureThreshold": 1})
                ),
            ),
            5,
            Duration::from_secs(480),
        ),
        liveness(
            s,
            "should *not* be restarted with a /healthz http liveness probe",
            "web-keep",
            web_pod(
                Value::Null,
                probe(
                    http("/", 80),
                    json!({"initialDelaySeconds": 15, "timeoutSeconds": 5, "failureThreshold": 5})
                ),
                "test-webserver",
                80,
            ),
            0,
            QUIET,
        ),
        liveness(
            s,
            "should be restarted with an exec liveness probe with timeout [MinimumKubeletVersion:1.20]",
            "exec-timeout",
            busybox_pod(
                Value::Null,
                exec15(&["/bin/sh", "-c", "sleep 10"], json!({"timeoutSeconds": 1})),
                &["/bin/sh", "-c", "sleep 600"],
            ),
            1,
            RESTART,
        ),
        liveness(
            s,
            "should be restarted with a failing exec liveness probe that took longer than the timeout",
            "exec-slow-fail",
            busybox_pod(
                Value::Null,
                exec15(
                    &["/bin/sh", "-c", "sleep 10 & exit 1"],
                    json!({"timeoutSeconds": 1})
                ),
                &["/bin/sh", "-c", "sleep 600"],
            ),
            1,
            RESTART,
        ),
        liveness(
            s,
            "should be restarted with a local redirect http liveness probe",
            "redirect-local",
            liveness_pod(
                Value::Null,
                probe(
                    http("/redirect?loc=%2Fhealthz", 8080),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 1}),
                ),
            ),
            1,
            RESTART,
        ),
        non_local_redirect(s),
        startup_specs(s),
        probe_grace_specs(s),
    );
}

async fn non_local_redirect(s: &Suite) {
    let spec = "should *not* be restarted with a non-local redirect http liveness probe";
    liveness(
        s,
        spec,
        "redirect-remote",
        liveness_pod(
            Value::Null,
            probe(
                http("/redirect?loc=http%3A%2F%2F0.0.0.0%2F", 8080),
                json!({"initialDelaySeconds": 15, "failureThreshold": 1}),
            ),
        ),
        0,
        QUIET,
    )
    .await;
    let want = "Probe terminated redirects, Response body: <a href=\"http://0.0.0.0/\">Found</a>.";
    let warned = s
        .events("redirect-remote")
        .iter()
        .any(|(t, r, m)| t == "Warning" && r == "ProbeWarning" && m.contains(want));
    if !warned {
        s.fail(
            spec,
            format!(
                "no ProbeWarning event {want:?}: {:?}",
                s.events("redirect-remote")
            ),
        );
    }
}

async fn startup_specs(s: &Suite) {
    let sleep = ["/bin/sh", "-c", "sleep 600"];
    tokio::join!(
        liveness(
            s,
            "should be restarted startup probe fails",
            "startup-restart",
            startup_pod(
                probe(
                    exec(&["/bin/false"]),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 3})
                ),
                Value::Null,
                probe(
                    exec(&["/bin/true"]),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 1})
                ),
                &sleep,
            ),
            1,
            RESTART,
        ),
        liveness(
            s,
            "should *not* be restarted by liveness probe because startup probe delays it",
            "startup-delays",
            startup_pod(
                probe(
                    exec(&["/bin/false"]),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 60})
                ),
                Value::Null,
                probe(
                    exec(&["/bin/false"]),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 1})
                ),
                &sleep,
            ),
            0,
            QUIET,
        ),
        liveness(
            s,
            "should be restarted by liveness probe after startup probe enables it",
            "startup-enables",
            startup_pod(
                probe(
                    exec(&["cat", "/tmp/startup"]),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 60})
                ),
                Value::Null,
                probe(
                    exec(&["/bin/false"]),
                    json!({"initialDelaySeconds": 15, "failureThreshold": 1})
                ),
                &[
                    "/bin/sh",
                    "-c",
                    "sleep 10; echo ok >/tmp/startup; sleep 600"
                ],
            ),
            1,
            RESTART,
        ),
        ready_after_startup(s),
    );
}

async fn ready_after_startup(s: &Suite) {
    let spec = "should be ready immediately after startupProbe succeeds";
    let pod = startup_pod(
        probe(
            exec(&["/bin/cat", "/tmp/startup"]),
            json!({"initialDelaySeconds": 0, "failureThreshold": 120, "periodSeconds": 5}),
        ),
        probe(
            exec(&["/bin/cat", "/tmp/health"]),
            json!({"initialDelaySeconds": 0, "periodSeconds": 30}),
        ),
        Value::Null,
        &[
            "/bin/sh",
            "-c",
            "echo ok >/tmp/health; sleep 32; echo ok >/tmp/startup; sleep 600",
        ],
    );
    if !s.pod(spec, "startup-ready", pod).await
        || !s.wait_running(spec, "startup-ready", POD_TIMEOUT).await
    {
        return;
    }
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(120);
    while !ready(s, "startup-ready") {
        if tokio::time::Instant::now() >= deadline {
            return s.fail(
                spec,
                format!("never ready; {}", s.describe("startup-ready")),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Upstream: ready after the startup probe (32 s in), and within 25 s of it,
    // although the readiness period is 30 s: readiness is probed at once.
    let ready_in = started.elapsed();
    if ready_in < Duration::from_secs(30) || ready_in > Duration::from_secs(32 + 5 + 25) {
        s.fail(
            spec,
            format!("ready {ready_in:?} after the container started"),
        );
    }
}

async fn probe_grace_specs(s: &Suite) {
    let sleep = ["/bin/sh", "-c", "sleep 1000"];
    let mut live = busybox_pod(
        Value::Null,
        probe(
            http("/healthz", 8080),
            json!({"initialDelaySeconds": 10, "failureThreshold": 1, "terminationGracePeriodSeconds": 5}),
        ),
        &sleep,
    );
    live["spec"]["terminationGracePeriodSeconds"] = json!(500);
    let mut start = busybox_pod(
        Value::Null,
        probe(
            exec(&["/bin/true"]),
            json!({"initialDelaySeconds": 15, "failureThreshold": 1}),
        ),
        &sleep,
    );
    start["spec"]["terminationGracePeriodSeconds"] = json!(500);
    start["spec"]["containers"][0]["startupProbe"] = probe(
        exec(&["/bin/cat", "/tmp/startup"]),
        json!({"initialDelaySeconds": 10, "failureThreshold": 1, "terminationGracePeriodSeconds": 5}),
    );
    // 10 s delay + 10 s period + 5 s grace, far below the pod's 500 s.
    tokio::join!(
        liveness(
            s,
            "should override timeoutGracePeriodSeconds when LivenessProbe field is set",
            "grace-liveness",
            live,
            1,
            RESTART,
        ),
        liveness(
            s,
            "should override timeoutGracePeriodSeconds when StartupProbe field is set",
            "grace-startup",
            start,
            1,
            RESTART,
        ),
    );
}

/// "should mark readiness on pods to false [and disable liveness probes]
/// while pod is in progress of terminating".
async fn unready_while_terminating(s: &Suite, short: &str, with_liveness: bool) {
    let spec = if with_liveness {
        "should mark readiness on pods to false and disable liveness probes while pod is in progress of terminating"
    } else {
        "should mark readiness on pods to false while pod is in progress of terminating when a pod has a readiness probe"
    };
    let script = "_term() {\n  rm -f /tmp/ready\n  rm -f /tmp/liveness\n  sleep 20\n  exit 0\n}\ntrap _term TERM\ntouch /tmp/ready\ntouch /tmp/liveness\nwhile true; do\n  echo \"hello\"\n  sleep 10\ndone\n";
    let mut c = with_probes(
        container(short, &["/bin/sh", "-c", script]),
        probe(
            exec(&["cat", "/tmp/ready"]),
            json!({"failureThreshold": 1, "initialDelaySeconds": 5, "periodSeconds": 2}),
        ),
        if with_liveness {
            probe(
                exec(&["cat", "/tmp/liveness"]),
                json!({"failureThreshold": 1, "initialDelaySeconds": 5, "periodSeconds": 1}),
            )
        } else {
            Value::Null
        },
        Value::Null,
    );
    c["name"] = json!("probe-test");
    let pod =
        json!({"metadata": {}, "spec": {"terminationGracePeriodSeconds": 30, "containers": [c]}});
    if !s.pod(spec, short, pod).await {
        return;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !ready(s, short) {
        if tokio::time::Instant::now() >= deadline {
            return s.fail(spec, format!("never ready; {}", s.describe(short)));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let api = Api::<Pod>::namespaced(s.j.admin.clone(), NS);
    if let Err(e) = api.delete(&s.name(short), &DeleteParams::default()).await {
        return s.fail(spec, format!("delete: {e}"));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
    while ready(s, short) {
        if tokio::time::Instant::now() >= deadline || s.api_pod(short).is_none() {
            return s.fail(spec, "still ready while terminating");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if with_liveness {
        // The liveness file is gone too, but liveness probing stopped with the deletion.
        tokio::time::sleep(Duration::from_secs(10)).await;
        if s.events(short)
            .iter()
            .any(|(_, _, m)| m.contains("failed liveness probe"))
        {
            s.fail(spec, "should not see liveness probe failures");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probing_container_specs() {
    let s = Suite::start().await;
    tokio::join!(
        readiness_initial_delay(&s),
        readiness_failing(&s),
        exec_timeouts(&s),
        restart_specs(&s),
        unready_while_terminating(&s, "term-ready", false),
        unready_while_terminating(&s, "term-live", true),
    );
    unhealthy_events(&s).await;
    s.finish("probes").await;
}
