//! Kubernetes objects from outside: static pod manifests (upstream
//! `pkg/kubelet/config/common.go` decoding for the file and URL sources),
//! watch events from the apiserver (`apimachinery` watch decoding of
//! Pods, Nodes, ConfigMaps and Secrets), the kubeconfig (`client-go`
//! `clientcmd`) and docker config JSON of image pull secrets
//! (`pkg/credentialprovider`), each followed by what the kubelet computes
//! from the decoded object.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kube::api::WatchEvent;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kubelet_podconfig::{parse_pod_document, parse_pods_document};
use kubelet_runtime::credentialprovider::config::{
    read_docker_config_file_from_bytes, read_docker_config_json_file_from_bytes,
};
use kubelet_runtime::credentialprovider::keyring::{BasicDockerKeyring, DockerKeyring};
use kubelet_runtime::credentialprovider::{make_docker_keyring, repo_to_pull};
use kubelet_runtime::expansion::expand;
use kubelet_types::Source;
use kubelet_types::defaults::{apply_api_defaults, validate};
use kubelet_types::fieldpath::{extract_field_path_as_string, extract_resource_value};
use kubelet_types::{pod, qos};

const NODE: &str = "fuzz-node";

/// A manifest as the file source (one Pod) and the URL source (a Pod or a
/// PodList) read it; every pod accepted is then used as the kubelet uses it.
///
/// Invariant: an accepted static pod has a UID, its node's name and the
/// `<name>-<node>` name.
pub fn manifest(data: &[u8]) {
    let text = super::text(data);
    let origin = "/etc/kubernetes/manifests/fuzz.yaml";
    if let Ok(p) = parse_pod_document(&text, Source::File, origin, NODE) {
        check_static(&p);
        use_pod(p);
    }
    let url = "http://127.0.0.1/manifests";
    for p in parse_pods_document(&text, Source::Http, url, NODE).unwrap_or_default() {
        check_static(&p);
        use_pod(p);
    }
}

fn check_static(p: &Pod) {
    assert!(!pod::uid(p).is_empty(), "static pod without a UID");
    assert!(
        pod::name(p).ends_with(&format!("-{NODE}")),
        "static pod name {:?}",
        pod::name(p)
    );
    let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
    assert_eq!(node, Some(NODE));
}

/// What the kubelet computes from any pod it is given: defaults, the
/// validation the sources apply, the QoS class, container hashes, the grace
/// period, downward API field paths and `$(VAR)` expansion of env values,
/// commands and args.
fn use_pod(mut p: Pod) {
    apply_api_defaults(&mut p);
    let _ = validate(&p);
    let _ = (qos::pod_qos(&p), qos::compute_pod_qos(&p));
    let _ = (
        pod::full_name(&p),
        pod::format_pod(&p),
        pod::grace_period(&p),
    );
    let _ = (pod::restart_policy(&p), pod::is_static(&p));
    let allocatable: BTreeMap<String, ApiQuantity> = [("cpu", "2"), ("memory", "4Gi")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ApiQuantity(v.to_string())))
        .collect();
    let containers = pod::init_containers(&p).iter().chain(pod::containers(&p));
    for c in containers {
        let _ = pod::container_hash(c);
        let _ = pod::image_pull_policy(c);
        let _ = repo_to_pull(c.image.as_deref().unwrap_or(""));
        let mut vars = HashMap::new();
        for e in c.env.iter().flatten() {
            let from = e.value_from.as_ref();
            let field = from.and_then(|v| v.field_ref.as_ref());
            let resource = from.and_then(|v| v.resource_field_ref.as_ref());
            let value = match (field, resource) {
                (Some(f), _) => extract_field_path_as_string(&p, &f.field_path).unwrap_or_default(),
                (None, Some(r)) => {
                    extract_resource_value(r, &p, c, &allocatable).unwrap_or_default()
                }
                (None, None) => expand(e.value.as_deref().unwrap_or(""), &vars),
            };
            vars.insert(e.name.clone(), value);
        }
        for s in c.command.iter().chain(c.args.iter()).flatten() {
            let _ = expand(s, &vars);
        }
    }
}

/// A watch stream's body: one JSON event per line, decoded as Pods (then
/// used as the kubelet uses them), Nodes, ConfigMaps and Secrets (image
/// pull secrets made into a keyring).
pub fn watch_event(data: &[u8]) {
    for line in data.split(|&b| b == b'\n') {
        if let Ok(WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p)) =
            serde_json::from_slice::<WatchEvent<Pod>>(line)
        {
            use_pod(p);
        }
        let _ = serde_json::from_slice::<WatchEvent<Node>>(line);
        let _ = serde_json::from_slice::<WatchEvent<ConfigMap>>(line);
        if let Ok(WatchEvent::Added(s) | WatchEvent::Modified(s)) =
            serde_json::from_slice::<WatchEvent<Secret>>(line)
        {
            let empty: Arc<dyn DockerKeyring> = Arc::new(BasicDockerKeyring::default());
            if let Ok(k) = make_docker_keyring(&[s], empty) {
                let _ = k.lookup("registry.example/app:1");
            }
        }
    }
}

/// A kubeconfig (`--kubeconfig`, `--bootstrap-kubeconfig`), parsed and made
/// into a client configuration as the kubelet's client does. References to
/// files and exec plugins are dropped first: the target fuzzes the parser,
/// not the file system.
pub fn kubeconfig(data: &[u8]) {
    let text = super::text(data);
    let Ok(mut kc) = Kubeconfig::from_yaml(&text) else {
        return;
    };
    for c in kc.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        c.certificate_authority = None;
    }
    for a in kc
        .auth_infos
        .iter_mut()
        .filter_map(|a| a.auth_info.as_mut())
    {
        a.client_certificate = None;
        a.client_key = None;
        a.token_file = None;
        a.exec = None;
        a.auth_provider = None;
    }
    let options = KubeConfigOptions::default();
    let _ = futures::executor::block_on(Config::from_custom_kubeconfig(kc, &options));
}

/// Docker config JSON: the first line is an image, the rest a document read
/// both as `.dockerconfigjson` and as legacy `.dockercfg`; the image is
/// looked up in the keyring made of what parsed.
pub fn docker_config(data: &[u8]) {
    let (image, doc) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let image = String::from_utf8_lossy(image);
    let mut keyring = BasicDockerKeyring::default();
    if let Ok(c) = read_docker_config_json_file_from_bytes(doc) {
        keyring.add(&c);
    }
    if let Ok(c) = read_docker_config_file_from_bytes(doc) {
        keyring.add(&c);
    }
    let _ = keyring.lookup(&image);
    let _ = repo_to_pull(&image);
}
