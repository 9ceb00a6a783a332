//! An upstream 1.31+ kubelet's writing of a pod into CRI, from its rules
//! (`pkg/kubelet/kuberuntime/labels.go`, `kuberuntime_sandbox.go`,
//! `kuberuntime_container.go`, `pkg/kubelet/container/helpers.go`
//! `HashContainer`), written here independently of kubelet-rs' own code so
//! the swap test can hold one against the other.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, bail};
use cri::{ImageService, RemoteRuntime, RuntimeService, pb};
use kubelet_rs_integration::{BUSYBOX, lane, pod_logs_dir};
use serde_json::{Value, json};

// === upstream's container hashes, written here from the rules ===

/// FNV-32a over go-spew's `%#v` of a `[]byte` (upstream `DeepHashObject`):
/// `([]uint8)[b0 b1 ...]`, each byte in decimal.
pub fn spew_fnv32a(bytes: &[u8]) -> u32 {
    let text = format!(
        "([]uint8)[{}]",
        bytes
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// A JSON string as Go's `encoding/json` writes it (HTML characters escaped).
pub fn go_string(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(ch)))
            }
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Upstream 1.31+ `HashContainer`: `json.Marshal(map[string]string{"name",
/// "image"})` (keys sorted), hashed, in lowercase hex without padding.
pub fn hash_1_31(name: &str, image: &str) -> String {
    let json = format!(
        "{{\"image\":{},\"name\":{}}}",
        go_string(image),
        go_string(name)
    );
    format!("{:x}", spew_fnv32a(json.as_bytes()))
}

/// Upstream before 1.31: the same hash of `json.Marshal(container)`, every
/// set field in Go's struct order (`resources` always, as `{}` when empty).
pub fn hash_pre_1_31(c: &Value) -> anyhow::Result<String> {
    const ORDER: [&str; 12] = [
        "name",
        "image",
        "command",
        "args",
        "workingDir",
        "ports",
        "resources",
        "volumeMounts",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "imagePullPolicy",
        "tty",
    ];
    let obj = c.as_object().context("container is an object")?;
    if let Some(k) = obj.keys().find(|k| !ORDER.contains(&k.as_str())) {
        bail!("pre-1.31 hash: field {k} not encoded here");
    }
    let mut parts = vec![];
    for k in ORDER {
        let v = match (k, obj.get(k)) {
            ("resources", None) => "{}".to_string(),
            ("resources", Some(r)) if r.as_object().is_some_and(|o| o.is_empty()) => "{}".into(),
            ("ports" | "volumeMounts" | "resources", Some(v)) => {
                bail!("pre-1.31 hash: {k}={v} not encoded here")
            }
            (_, None) => continue,
            (_, Some(Value::String(s))) => go_string(s),
            (_, Some(Value::Array(a))) => {
                let items: Vec<String> =
                    a.iter().filter_map(Value::as_str).map(go_string).collect();
                format!("[{}]", items.join(","))
            }
            (_, Some(v)) => v.to_string(),
        };
        parts.push(format!("{}:{v}", go_string(k)));
    }
    let json = format!("{{{}}}", parts.join(","));
    Ok(format!("{:x}", spew_fnv32a(json.as_bytes())))
}

/// Upstream's own vectors (`pkg/kubelet/container/helpers_test.go`
/// `TestHashContainer`): 0x8e45cbd0 from 1.31, 0x3c42280f before.
#[test]
fn upstream_hash_vectors() {
    assert_eq!(hash_1_31("test_container", "foo/image:v1"), "8e45cbd0");
    let pre = br#"{"name":"test_container","image":"foo/image:v1","args":["/bin/sh","-c","echo abc"],"ports":[{"containerPort":8001}],"resources":{}}"#;
    assert_eq!(spew_fnv32a(pre), 0x3c42_280f);
    // The encoder above gives the same bytes for a container it can encode.
    let c = json!({"name": "test_container", "image": "foo/image:v1",
        "args": ["/bin/sh", "-c", "echo abc"]});
    let want = br#"{"name":"test_container","image":"foo/image:v1","args":["/bin/sh","-c","echo abc"],"resources":{}}"#;
    assert_eq!(
        hash_pre_1_31(&c).expect("hash"),
        format!("{:x}", spew_fnv32a(want))
    );
    assert_eq!(go_string("a<b&\"c"), r#""a\u003cb\u0026\"c""#);
}

// === what an upstream 1.31+ kubelet writes for a pod ===

pub fn str_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

pub fn meta(p: &Value, k: &str) -> String {
    p["metadata"][k].as_str().unwrap_or_default().to_string()
}

/// Upstream `newPodLabels`: the pod's labels, then name, namespace and UID.
pub fn upstream_sandbox_labels(p: &Value) -> BTreeMap<String, String> {
    let mut out = str_map(&p["metadata"]["labels"]);
    out.insert("io.kubernetes.pod.name".into(), meta(p, "name"));
    out.insert("io.kubernetes.pod.namespace".into(), meta(p, "namespace"));
    out.insert("io.kubernetes.pod.uid".into(), meta(p, "uid"));
    out
}

/// Upstream `newPodAnnotations`: the pod's annotations as the kubelet holds
/// them, with the two its config layer adds (`kubernetes.io/config.source`,
/// `kubernetes.io/config.seen`, `pkg/kubelet/config/config.go`).
pub fn upstream_sandbox_annotations(p: &Value, seen: &str) -> BTreeMap<String, String> {
    let mut out = str_map(&p["metadata"]["annotations"]);
    out.insert("kubernetes.io/config.source".into(), "api".into());
    out.insert("kubernetes.io/config.seen".into(), seen.into());
    out
}

/// Upstream `newContainerLabels`.
pub fn upstream_container_labels(p: &Value, c: &Value) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("io.kubernetes.pod.name".into(), meta(p, "name")),
        ("io.kubernetes.pod.namespace".into(), meta(p, "namespace")),
        ("io.kubernetes.pod.uid".into(), meta(p, "uid")),
        (
            "io.kubernetes.container.name".into(),
            c["name"].as_str().unwrap_or_default().into(),
        ),
    ])
}

/// Upstream 1.31+ `newContainerAnnotations` for a pod that is not being
/// deleted and containers without a preStop hook (so without
/// `io.kubernetes.pod.deletionGracePeriod` and
/// `io.kubernetes.container.preStopHandler`); `hash` is the value of
/// `io.kubernetes.container.hash`. `io.kubernetes.container.ports` is
/// compared as JSON (Go writes the fields in struct order).
pub fn upstream_container_annotations(
    p: &Value,
    c: &Value,
    hash: &str,
) -> BTreeMap<String, String> {
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    let mut out = BTreeMap::from([
        ("io.kubernetes.container.hash".into(), hash.to_string()),
        ("io.kubernetes.container.restartCount".into(), "0".into()),
        (
            "io.kubernetes.container.terminationMessagePath".into(),
            s("terminationMessagePath"),
        ),
        (
            "io.kubernetes.container.terminationMessagePolicy".into(),
            s("terminationMessagePolicy"),
        ),
    ]);
    if let Some(g) = p["spec"]["terminationGracePeriodSeconds"].as_i64() {
        out.insert(
            "io.kubernetes.pod.terminationGracePeriod".into(),
            g.to_string(),
        );
    }
    if let Some(ports) = c["ports"].as_array().filter(|a| !a.is_empty()) {
        out.insert(
            "io.kubernetes.container.ports".into(),
            json!(ports).to_string(),
        );
    }
    out
}

/// The node's resolver as upstream passes it when no cluster DNS is set
/// (`dns.Configurer.GetPodDNS` falling back to the host's resolv.conf).
pub fn host_dns() -> pb::DnsConfig {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let mut d = pb::DnsConfig::default();
    for line in text.lines().map(str::trim) {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => d.servers.extend(f.next().map(String::from)),
            Some("search") => d.searches = f.map(String::from).collect(),
            Some("options") => d.options = f.map(String::from).collect(),
            _ => {}
        }
    }
    d
}

/// The pod's log directory (`/var/log/pods/<ns>_<name>_<uid>` under the
/// lane's `podLogsDir`).
pub fn log_dir(p: &Value) -> std::path::PathBuf {
    pod_logs_dir().join(format!(
        "{}_{}_{}",
        meta(p, "namespace"),
        meta(p, "name"),
        meta(p, "uid")
    ))
}

/// Upstream `generatePodSandboxConfig` for a BestEffort pod on the pod
/// network without host ports, under the cgroupfs driver with cgroups per
/// QoS (the test machine's containerd: cgroupfs): the pod cgroup is
/// `<cgroupRoot>/kubepods/besteffort/pod<uid>`.
pub fn upstream_sandbox_config(p: &Value, seen: &str) -> pb::PodSandboxConfig {
    let root = lane::lane().cgroup_root.unwrap_or("").trim_end_matches('/');
    let pod_ns = pb::NamespaceOption {
        network: pb::NamespaceMode::Pod as i32,
        pid: pb::NamespaceMode::Container as i32,
        ipc: pb::NamespaceMode::Pod as i32,
        ..Default::default()
    };
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: meta(p, "name"),
            uid: meta(p, "uid"),
            namespace: meta(p, "namespace"),
            attempt: 0,
        }),
        hostname: meta(p, "name"),
        log_directory: log_dir(p).to_string_lossy().into_owned(),
        dns_config: Some(host_dns()),
        port_mappings: vec![],
        labels: upstream_sandbox_labels(p).into_iter().collect(),
        annotations: upstream_sandbox_annotations(p, seen).into_iter().collect(),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: format!("{root}/kubepods/besteffort/pod{}", meta(p, "uid")),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(pod_ns),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// Upstream `generateContainerConfig` (the parts that tell a container's
/// identity; no volumes, no service environment), with `hash` as the
/// container hash annotation.
pub fn upstream_container_config(
    p: &Value,
    c: &Value,
    image_ref: &str,
    hash: &str,
) -> pb::ContainerConfig {
    let name = c["name"].as_str().unwrap_or_default().to_string();
    let strings = |k: &str| -> Vec<String> {
        c[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: name.clone(),
            attempt: 0,
        }),
        image: Some(pb::ImageSpec {
            image: image_ref.to_string(),
            user_specified_image: c["image"].as_str().unwrap_or_default().into(),
            ..Default::default()
        }),
        command: strings("command"),
        args: strings("args"),
        labels: upstream_container_labels(p, c).into_iter().collect(),
        annotations: upstream_container_annotations(p, c, hash)
            .into_iter()
            .collect(),
        log_path: format!("{name}/0.log"),
        ..Default::default()
    }
}

/// Plays an upstream kubelet: pulls the image if needed, runs the sandbox and
/// starts each container, the `pre_1_31` ones with the whole-container hash.
/// Returns the sandbox ID and the container IDs by name.
pub async fn start_as_upstream(
    rt: &RemoteRuntime,
    p: &Value,
    pre_1_31: &[&str],
) -> anyhow::Result<(String, HashMap<String, String>)> {
    let image_ref = match rt.image_status(BUSYBOX).await? {
        Some(i) => i.id,
        None => rt.pull_image(BUSYBOX, None, None).await?,
    };
    let seen = jiff::Timestamp::now().to_string();
    let sandbox = upstream_sandbox_config(p, &seen);
    std::fs::create_dir_all(log_dir(p))?;
    let sandbox_id = rt.run_pod_sandbox(sandbox.clone(), "").await?;
    let mut ids = HashMap::new();
    for c in p["spec"]["containers"].as_array().context("containers")? {
        let name = c["name"].as_str().context("name")?;
        let hash = if pre_1_31.contains(&name) {
            hash_pre_1_31(c)?
        } else {
            hash_1_31(name, c["image"].as_str().unwrap_or_default())
        };
        std::fs::create_dir_all(log_dir(p).join(name))?;
        let cfg = upstream_container_config(p, c, &image_ref, &hash);
        let id = rt
            .create_container(&sandbox_id, cfg, sandbox.clone())
            .await?;
        rt.start_container(&id).await?;
        ids.insert(name.to_string(), id);
    }
    Ok((sandbox_id, ids))
}
