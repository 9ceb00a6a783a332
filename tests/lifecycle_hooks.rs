//! Upstream's `[NodeConformance]` specs of `test/e2e/common/node/lifecycle_hook.go`
//! ("Container Lifecycle Hook when create a pod with lifecycle hook") on one
//! joined kubelet. Upstream's hook target is an agnhost `netexec` pod whose log
//! shows `GET /echo?msg=...`; here a busybox `nc` server prints each request
//! line to the container's log the same way. Same hook pods, same deletion
//! (grace 15 s), same assertions on the handler's log.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// Upstream's `postStartWaitTimeout` and `preStopWaitTimeout`.
const HOOK_WAIT: Duration = Duration::from_secs(120);

/// `pod-handle-http-request`: answers every request on 8080 and prints its
/// request line to the container log (as netexec logs `GET /echo?msg=...`).
/// The script reads the headers before answering, so the client never sees a
/// reset. No `$(...)`: the kubelet expands `$(VAR)` in commands.
fn handler_pod() -> Value {
    let script = r#"printf '%s\n' '#!/bin/sh' 'read -r l; echo "$l" > /proc/1/fd/1' 'while read -r h; do case "$h" in ?|"") break;; esac; done' 'printf "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"' > /tmp/h.sh && chmod +x /tmp/h.sh && exec nc -ll -p 8080 -e /tmp/h.sh"#;
    json!({"spec": {"containers": [{
        "name": "container-handle-http-request", "image": BUSYBOX,
        "command": ["sh", "-c", script],
        "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]}})
}

/// Upstream `getPodWithHook`: one container named after the pod; busybox
/// stops at SIGTERM as agnhost does.
fn pod_with_hook(name: &str, lifecycle: Value) -> Value {
    json!({"spec": {"containers": [{
        "name": name, "image": BUSYBOX,
        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
        "lifecycle": lifecycle}]}})
}

/// Waits until the handler's log shows `want`.
async fn handler_saw(s: &Suite, handler: &str, want: &str) -> bool {
    let deadline = tokio::time::Instant::now() + HOOK_WAIT;
    loop {
        if s.log(handler, "container-handle-http-request")
            .is_some_and(|l| l.contains(want))
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Upstream `testPodWithHook` with its `BeforeEach`: the handler pod runs,
/// the hook pod is created from `make(handler_ip)` and runs, the postStart
/// request arrives, the hook pod is deleted with grace 15 s and is gone, the
/// preStop request arrives.
async fn test_pod_with_hook(s: &Suite, spec: &str, short: &str, make: impl Fn(&str) -> Value) {
    let handler = format!("{short}-handler");
    if !s.pod(spec, &handler, handler_pod()).await
        || !s.wait_running(spec, &handler, POD_TIMEOUT).await
    {
        return;
    }
    let Some(ip) = s
        .api_pod(&handler)
        .and_then(|p| p["status"]["podIP"].as_str().map(String::from))
    else {
        s.fail(spec, "handler pod has no IP");
        return;
    };
    let pod = make(&ip);
    let post_start = pod["spec"]["containers"][0]["lifecycle"]["postStart"].is_object();
    let pre_stop = pod["spec"]["containers"][0]["lifecycle"]["preStop"].is_object();
    if !s.pod(spec, short, pod).await || !s.wait_running(spec, short, POD_TIMEOUT).await {
        return;
    }
    if post_start && !handler_saw(s, &handler, "GET /echo?msg=poststart").await {
        s.fail(spec, "the postStart hook's request did not arrive");
        return;
    }
    let name = s.name(short);
    if let Err(e) = Api::<Pod>::namespaced(s.j.admin.clone(), NS)
        .delete(&name, &DeleteParams::default().grace_period(15))
        .await
    {
        s.fail(spec, format!("delete: {e}"));
        return;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while s.api_pod(short).is_some() {
        if tokio::time::Instant::now() >= deadline {
            s.fail(spec, "pod with the hook not deleted within 60s");
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if pre_stop && !handler_saw(s, &handler, "GET /echo?msg=prestop").await {
        s.fail(spec, "the preStop hook's request did not arrive");
    }
}

/// The exec hooks: upstream curls the handler; busybox has wget.
fn exec_hook(ip: &str, msg: &str) -> Value {
    json!({"exec": {"command": ["sh", "-c", format!("wget -q -O- http://{ip}:8080/echo?msg={msg}")]}})
}

fn http_hook(ip: &str, msg: &str) -> Value {
    json!({"httpGet": {"path": format!("/echo?msg={msg}"), "host": ip, "port": 8080}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_lifecycle_hook_when_create_a_pod_with_lifecycle_hook() {
    let s = Suite::start().await;
    tokio::join!(
        test_pod_with_hook(
            &s,
            "should execute poststart exec hook properly",
            "poststart-exec",
            |ip| pod_with_hook(
                "pod-with-poststart-exec-hook",
                json!({"postStart": exec_hook(ip, "poststart")})
            ),
        ),
        test_pod_with_hook(
            &s,
            "should execute prestop exec hook properly",
            "prestop-exec",
            |ip| pod_with_hook(
                "pod-with-prestop-exec-hook",
                json!({"preStop": exec_hook(ip, "prestop")})
            ),
        ),
        test_pod_with_hook(
            &s,
            "should execute poststart http hook properly",
            "poststart-http",
            |ip| pod_with_hook(
                "pod-with-poststart-http-hook",
                json!({"postStart": http_hook(ip, "poststart")})
            ),
        ),
        test_pod_with_hook(
            &s,
            "should execute prestop http hook properly",
            "prestop-http",
            |ip| pod_with_hook(
                "pod-with-prestop-http-hook",
                json!({"preStop": http_hook(ip, "prestop")})
            ),
        ),
    );
    s.finish("lifecycle_hooks").await;
}
