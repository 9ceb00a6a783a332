//! Upstream's downward API specs on one joined kubelet:
//! `test/e2e/common/storage/downwardapi_volume.go` (the downwardAPI
//! volume), `projected_downwardapi.go` (the same through a projected volume)
//! and `test/e2e/common/node/downwardapi.go` (the downward API in env vars).
//! Same pods, busybox for agnhost (see `conformance::MOUNTTEST`).

use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

/// `downwardAPIVolumeBasePod`'s items (resource fields of "client-container").
fn base_items() -> Value {
    let res = |path: &str, r: &str| json!({"path": path, "resourceFieldRef": {"containerName": "client-container", "resource": r}});
    json!([
        {"path": "podname", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
        res("cpu_limit", "limits.cpu"),
        res("cpu_request", "requests.cpu"),
        res("memory_limit", "limits.memory"),
        res("memory_request", "requests.memory"),
    ])
}

/// The pod with the "podinfo" volume (a downwardAPI volume, or a projected
/// volume with one downwardAPI source) and `container`.
fn base_pod(
    projected: bool,
    items: Value,
    container: Value,
    labels: Value,
    annotations: Value,
) -> Value {
    let volume = if projected {
        json!({"name": "podinfo", "projected": {"sources": [{"downwardAPI": {"items": items}}]}})
    } else {
        json!({"name": "podinfo", "downwardAPI": {"items": items}})
    };
    json!({
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": {"volumes": [volume], "containers": [container], "restartPolicy": "Never"},
    })
}

fn client(args: &[&str], read_only: Option<bool>) -> Value {
    let mut m = json!({"name": "podinfo", "mountPath": "/etc/podinfo"});
    if let Some(ro) = read_only {
        m["readOnly"] = json!(ro);
    }
    mounttest("client-container", args, json!([m]))
}

/// `downwardAPIVolumePodForSimpleTest`.
fn simple_pod(projected: bool, file: &str) -> Value {
    base_pod(
        projected,
        base_items(),
        client(&[&format!("--file_content={file}")], Some(false)),
        json!(null),
        json!(null),
    )
}

/// `downwardAPIVolumePodForModeTest`.
fn mode_pod(projected: bool, item_mode: Option<i32>, default_mode: Option<i32>) -> Value {
    let mut items = base_items();
    if let Some(m) = item_mode {
        items[0]["mode"] = json!(m);
    }
    let mut p = base_pod(
        projected,
        items,
        client(&["--file_mode=/etc/podinfo/podname"], None),
        json!(null),
        json!(null),
    );
    if let Some(m) = default_mode {
        if projected {
            p["spec"]["volumes"][0]["projected"]["defaultMode"] = json!(m);
        } else {
            p["spec"]["volumes"][0]["downwardAPI"]["defaultMode"] = json!(m);
        }
    }
    p
}

/// `downwardAPIVolumeForContainerResources` (requests 250m/32Mi, limits 1250m/64Mi)
/// or, without resources, `downwardAPIVolumeForDefaultContainerResources`.
fn resources_pod(projected: bool, file: &str, resources: bool) -> Value {
    let mut c = client(
        &[&format!("--file_content={file}")],
        if resources { Some(false) } else { None },
    );
    if resources {
        c["resources"] = json!({"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"cpu": "1250m", "memory": "64Mi"}});
    }
    base_pod(projected, base_items(), c, json!(null), json!(null))
}

/// `downwardAPIVolumePodForUpdateTest`: the labels or annotations file read in a loop.
fn update_pod(projected: bool, labels: Value, annotations: Value, file: &str) -> Value {
    let mut items = base_items();
    let arr = items.as_array_mut().expect("items");
    if labels.as_object().is_some_and(|m| !m.is_empty()) {
        arr.push(json!({"path": "labels", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels"}}));
    }
    if annotations.as_object().is_some_and(|m| !m.is_empty()) {
        arr.push(json!({"path": "annotations", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations"}}));
    }
    let c = client(
        &[
            "--break_on_expected_content=false",
            "--retry_time=120",
            &format!("--file_content_in_loop={file}"),
        ],
        Some(false),
    );
    base_pod(projected, items, c, labels, annotations)
}

/// A log line `content of file "/etc/podinfo/<file>": <n>` with n starting with 1-9
/// (upstream matches the regexp `[1-9]` anywhere in the log; this checks the value).
fn positive() -> Want {
    Want::Line(
        "content of file \"/etc/podinfo/...\": [1-9]...".into(),
        |l| {
            l.starts_with("content of file \"/etc/podinfo/")
                && l.split_once("\": ")
                    .is_some_and(|(_, v)| v.starts_with(|c: char| ('1'..='9').contains(&c)))
        },
    )
}

async fn volume_specs(s: &Suite, projected: bool) {
    let (k, p) = if projected {
        ("Projected downwardAPI ", "pd")
    } else {
        ("Downward API volume ", "d")
    };
    let spec = |t: &str| format!("{k}{t}");
    let short = |t: &str| format!("{p}-{t}");
    let cases: Vec<(String, String, Value, Vec<Want>)> = vec![
        (
            spec("should provide podname only"),
            short("podname"),
            simple_pod(projected, "/etc/podinfo/podname"),
            vec![Want::has(format!("{}\n", s.name(&short("podname"))))],
        ),
        (
            spec("should set DefaultMode on files [LinuxOnly]"),
            short("default-mode"),
            mode_pod(projected, None, Some(0o400)),
            vec![Want::has(
                "mode of file \"/etc/podinfo/podname\": -r--------",
            )],
        ),
        (
            spec("should set mode on item file [LinuxOnly]"),
            short("item-mode"),
            mode_pod(projected, Some(0o400), None),
            vec![Want::has(
                "mode of file \"/etc/podinfo/podname\": -r--------",
            )],
        ),
        (
            spec("should provide container's cpu limit"),
            short("cpu-limit"),
            resources_pod(projected, "/etc/podinfo/cpu_limit", true),
            vec![Want::has("2\n")],
        ),
        (
            spec("should provide container's memory limit"),
            short("memory-limit"),
            resources_pod(projected, "/etc/podinfo/memory_limit", true),
            vec![Want::has("67108864\n")],
        ),
        (
            spec("should provide container's cpu request"),
            short("cpu-request"),
            resources_pod(projected, "/etc/podinfo/cpu_request", true),
            vec![Want::has("1\n")],
        ),
        (
            spec("should provide container's memory request"),
            short("memory-request"),
            resources_pod(projected, "/etc/podinfo/memory_request", true),
            vec![Want::has("33554432\n")],
        ),
        (
            spec(
                "should provide node allocatable (cpu) as default cpu limit if the limit is not set",
            ),
            short("default-cpu"),
            resources_pod(projected, "/etc/podinfo/cpu_limit", false),
            vec![positive()],
        ),
        (
            spec(
                "should provide node allocatable (memory) as default memory limit if the limit is not set",
            ),
            short("default-memory"),
            resources_pod(projected, "/etc/podinfo/memory_limit", false),
            vec![positive()],
        ),
    ];
    for (spec, short, pod, _) in &cases {
        s.pod(spec, short, pod.clone()).await;
    }
    let names: Vec<&str> = cases.iter().map(|c| c.1.as_str()).collect();
    s.wait_all(&names, POD_TIMEOUT, terminal).await;
    for (spec, short, _, wants) in &cases {
        s.expect_output(spec, short, "client-container", wants);
    }
}

async fn update_specs(s: &Suite, projected: bool, labels: bool) {
    let (k, p) = if projected {
        ("Projected downwardAPI ", "pd")
    } else {
        ("Downward API volume ", "d")
    };
    let (spec, short, pod, first, patch, second) = if labels {
        (
            format!("{k}should update labels on modification"),
            format!("{p}-labelsupdate"),
            update_pod(
                projected,
                json!({"key1": "value1", "key2": "value2"}),
                json!({}),
                "/etc/podinfo/labels",
            ),
            "key1=\"value1\"\n",
            json!({"metadata": {"labels": {"key3": "value3"}}}),
            "key3=\"value3\"\n",
        )
    } else {
        (
            format!("{k}should update annotations on modification"),
            format!("{p}-annotationupdate"),
            update_pod(
                projected,
                json!({}),
                json!({"builder": "bar"}),
                "/etc/podinfo/annotations",
            ),
            "builder=\"bar\"\n",
            json!({"metadata": {"annotations": {"builder": "foo"}}}),
            "builder=\"foo\"\n",
        )
    };
    if !s.pod(&spec, &short, pod).await || !s.wait_running(&spec, &short, POD_TIMEOUT).await {
        return;
    }
    if !s
        .eventually_log(
            &spec,
            &short,
            "client-container",
            Want::has(first),
            UPDATE_TIMEOUT,
        )
        .await
    {
        return;
    }
    s.patch_pod(&short, patch).await;
    s.eventually_log(
        &spec,
        &short,
        "client-container",
        Want::has(second),
        UPDATE_TIMEOUT,
    )
    .await;
}

fn ip_line(var: &'static str) -> Want {
    Want::Line(
        format!("{var}=<IPv4 or IPv6 address>"),
        match var {
            "POD_IP" => |l| {
                l.strip_prefix("POD_IP=")
                    .is_some_and(|v| v.parse::<std::net::IpAddr>().is_ok())
            },
            _ => |l| {
                l.strip_prefix("HOST_IP=")
                    .is_some_and(|v| v.parse::<std::net::IpAddr>().is_ok())
            },
        },
    )
}

/// `test/e2e/common/node/downwardapi.go`.
async fn env_specs(s: &Suite) {
    let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}});
    let res = |name: &str, r: &str| json!({"name": name, "valueFrom": {"resourceFieldRef": {"resource": r}}});
    // testDownwardAPI: requests 250m/32Mi, limits 1250m/64Mi.
    let dapi = |short: &str, env: Value| {
        let mut c = busybox("dapi-container", &["env"]);
        c["resources"] = json!({"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"cpu": "1250m", "memory": "64Mi"}});
        c["env"] = env;
        json!({"metadata": {"labels": {"name": s.name(short)}}, "spec": {"containers": [c], "restartPolicy": "Never"}})
    };
    const NAME_IP: &str =
        "Downward API should provide pod name, namespace and IP address as env vars";
    const HOST_IP: &str = "Downward API should provide host IP as an env var";
    const HOST_NET: &str = "Downward API should provide host IP and pod IP as an env var if pod uses host network [LinuxOnly]";
    const LIMITS: &str = "Downward API should provide container's limits.cpu/memory and requests.cpu/memory as env vars";
    const DEFAULTS: &str =
        "Downward API should provide default limits.cpu/memory from node allocatable";
    const UID: &str = "Downward API should provide pod UID as env vars";
    s.pod(
        NAME_IP,
        "dapi-name-ip",
        dapi(
            "dapi-name-ip",
            json!([
                field("POD_NAME", "metadata.name"),
                field("POD_NAMESPACE", "metadata.namespace"),
                field("POD_IP", "status.podIP")
            ]),
        ),
    )
    .await;
    s.pod(
        HOST_IP,
        "dapi-host-ip",
        dapi("dapi-host-ip", json!([field("HOST_IP", "status.hostIP")])),
    )
    .await;
    let mut c = busybox(
        "dapi-container",
        &[
            "sh",
            "-c",
            r#"[[ "${HOST_IP:?}" == "${POD_IP:?}" ]] && echo 'OK' || echo "HOST_IP: '${HOST_IP}' != POD_IP: '${POD_IP}'""#,
        ],
    );
    c["env"] = json!([
        field("HOST_IP", "status.hostIP"),
        field("POD_IP", "status.podIP")
    ]);
    s.pod(
        HOST_NET,
        "dapi-host-net",
        json!({"metadata": {"labels": {"name": s.name("dapi-host-net")}},
            "spec": {"containers": [c], "hostNetwork": true, "restartPolicy": "Never"}}),
    )
    .await;
    s.pod(
        LIMITS,
        "dapi-limits",
        dapi(
            "dapi-limits",
            json!([
                res("CPU_LIMIT", "limits.cpu"),
                res("MEMORY_LIMIT", "limits.memory"),
                res("CPU_REQUEST", "requests.cpu"),
                res("MEMORY_REQUEST", "requests.memory")
            ]),
        ),
    )
    .await;
    let mut c = busybox("dapi-container", &["env"]);
    c["env"] = json!([
        res("CPU_LIMIT", "limits.cpu"),
        res("MEMORY_LIMIT", "limits.memory")
    ]);
    s.pod(
        DEFAULTS,
        "dapi-defaults",
        json!({"metadata": {"labels": {"name": s.name("dapi-defaults")}}, "spec": {"containers": [c], "restartPolicy": "Never"}}),
    )
    .await;
    s.pod(
        UID,
        "dapi-uid",
        dapi("dapi-uid", json!([field("POD_UID", "metadata.uid")])),
    )
    .await;

    let pods = [
        "dapi-name-ip",
        "dapi-host-ip",
        "dapi-host-net",
        "dapi-limits",
        "dapi-defaults",
        "dapi-uid",
    ];
    s.wait_all(&pods, POD_TIMEOUT, terminal).await;
    let c = "dapi-container";
    s.expect_output(
        NAME_IP,
        "dapi-name-ip",
        c,
        &[
            Want::has(format!("POD_NAME={}", s.name("dapi-name-ip"))),
            Want::has(format!("POD_NAMESPACE={NS}")),
            ip_line("POD_IP"),
        ],
    );
    s.expect_output(HOST_IP, "dapi-host-ip", c, &[ip_line("HOST_IP")]);
    s.expect_output(HOST_NET, "dapi-host-net", c, &[Want::has("OK")]);
    s.expect_output(
        LIMITS,
        "dapi-limits",
        c,
        &[
            "CPU_LIMIT=2",
            "MEMORY_LIMIT=67108864",
            "CPU_REQUEST=1",
            "MEMORY_REQUEST=33554432",
        ]
        .map(Want::has),
    );
    s.expect_output(
        DEFAULTS,
        "dapi-defaults",
        c,
        &[
            Want::Line("CPU_LIMIT=[1-9]".into(), |l| {
                l.strip_prefix("CPU_LIMIT=")
                    .is_some_and(|v| v.starts_with(|c: char| ('1'..='9').contains(&c)))
            }),
            Want::Line("MEMORY_LIMIT=[1-9]".into(), |l| {
                l.strip_prefix("MEMORY_LIMIT=")
                    .is_some_and(|v| v.starts_with(|c: char| ('1'..='9').contains(&c)))
            }),
        ],
    );
    s.expect_output(
        UID,
        "dapi-uid",
        c,
        &[Want::Line(
            "POD_UID=[a-z0-9]{8}-[a-z0-9]{4}-[a-z0-9]{4}-[a-z0-9]{4}-[a-z0-9]{12}".into(),
            |l| {
                l.strip_prefix("POD_UID=").is_some_and(|v| {
                    let parts: Vec<&str> = v.split('-').collect();
                    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
                        && v.chars()
                            .all(|c| c == '-' || c.is_ascii_digit() || c.is_ascii_lowercase())
                })
            },
        )],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downward_api_volume_projected_and_env_specs() {
    let s = Suite::start().await;
    tokio::join!(
        volume_specs(&s, false),
        volume_specs(&s, true),
        update_specs(&s, false, true),
        update_specs(&s, false, false),
        update_specs(&s, true, true),
        update_specs(&s, true, false),
        env_specs(&s),
    );
    s.finish("volumes_downwardapi").await;
}
