//! Upstream's pod-resources node e2e specs (`test/e2e_node/podresources_test.go`
//! "POD Resources", and `device_plugin_test.go` "Can schedule a pod that
//! requires a device") on real containerd, with the stub device plugin
//! (topology unaware, like upstream's sample plugin) in place of SR-IOV
//! devices. kubelet-rs has no CPU or memory manager: where upstream's pods ask
//! for exclusive CPUs, these ask for a device or for nothing, and CPU ids and
//! memory are checked to be absent (upstream's `none` policy answer).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use kubelet_devicemanager::stub::{self, Stub, StubConfig};
use kubelet_podresources::pb::pod_resources_lister_client::PodResourcesListerClient;
use kubelet_podresources::pb::{
    AllocatableResourcesRequest, ContainerResources, GetPodResourcesRequest,
    ListPodResourcesRequest, PodResources,
};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::{Joined, phase, sleeper};
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::{RESOURCE, T, allocate};

/// A container of a test pod: its name, the devices it asks for, and for
/// an init container whether it is restartable (upstream `initContainerDesc`).
#[derive(Clone, Copy)]
struct Cnt {
    name: &'static str,
    devices: u32,
    restartable: bool,
}

/// A test pod (upstream `podDesc`): one app container, maybe init containers.
#[derive(Clone)]
struct Desc {
    pod: &'static str,
    cnt: Cnt,
    init: Vec<Cnt>,
}

fn app(pod: &'static str, cnt: &'static str, devices: u32) -> Desc {
    Desc {
        pod,
        cnt: Cnt {
            name: cnt,
            devices,
            restartable: false,
        },
        init: Vec::new(),
    }
}

fn container(c: Cnt, cmd: &str) -> Value {
    let mut v = json!({"name": c.name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", cmd]});
    if c.devices > 0 {
        let n = c.devices.to_string();
        v["resources"] = json!({"requests": {RESOURCE: n}, "limits": {RESOURCE: n}});
    }
    v
}

/// Upstream `makePodResourcesTestPod`: `RestartPolicy: Never`, the app
/// container sleeps a day, a regular init container a moment, a restartable
/// one a day.
fn pod_spec(d: &Desc) -> Value {
    let init: Vec<Value> = d
        .init
        .iter()
        .map(|c| {
            let mut v = container(*c, if c.restartable { "sleep 1d" } else { "sleep 1" });
            if c.restartable {
                v["restartPolicy"] = json!("Always");
            }
            v
        })
        .collect();
    json!({
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
        "initContainers": init,
        "containers": [container(d.cnt, "sleep 1d")],
    })
}

async fn client(root: &Path) -> PodResourcesListerClient<Channel> {
    kubelet_podresources::v1_client(
        &kubelet_podresources::socket_path(root),
        Duration::from_secs(10),
    )
    .await
    .expect("the pod-resources socket answers")
}

/// Starts the pods and waits for each to run (upstream `createPodsForTest`).
async fn create(j: &Joined, descs: &[Desc]) {
    for d in descs {
        j.create_pod(d.pod, pod_spec(d)).await;
    }
    for d in descs {
        j.wait_api(d.pod, T, "Running", |p| phase(p) == Some("Running"))
            .await;
    }
}

/// Deletes the pods and waits until neither the API nor `List` has them
/// (upstream `deletePodsForTest` / `deletePod`).
async fn delete(j: &Joined, names: &[&str]) {
    let api = Api::<Pod>::namespaced(j.admin.clone(), "default");
    for n in names {
        api.delete(&j.pod_name(n), &DeleteParams::default())
            .await
            .expect("delete pod");
    }
    for n in names {
        j.wait_api(n, T, "deleted", |p| p.is_none()).await;
    }
    let full: Vec<String> = names.iter().map(|n| j.pod_name(n)).collect();
    let mut c = client(&j.node.root_dir()).await;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let l = list(&mut c).await;
        if !l.iter().any(|p| full.contains(&p.name)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "deleted pods still listed: {l:#?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn list(c: &mut PodResourcesListerClient<Channel>) -> Vec<PodResources> {
    c.list(ListPodResourcesRequest {})
        .await
        .expect("List")
        .into_inner()
        .pod_resources
}

fn check_container(pod: &str, c: &ContainerResources, want: Cnt) -> Result<(), String> {
    if want.devices > 0 {
        let d = c
            .devices
            .iter()
            .find(|d| d.resource_name == RESOURCE)
            .ok_or_else(|| format!("pod {pod} container {}: no {RESOURCE}", c.name))?;
        if d.device_ids.len() != want.devices as usize {
            return Err(format!(
                "pod {pod} container {}: expected {} devices, got {:?}",
                c.name, want.devices, d.device_ids
            ));
        }
        // The stub is topology unaware: no topology is reported.
        if d.topology.is_some() {
            return Err(format!("pod {pod} container {}: topology {d:?}", c.name));
        }
    } else if !c.devices.is_empty() {
        return Err(format!(
            "pod {pod} container {}: expected no resources, got {:?}",
            c.name, c.devices
        ));
    }
    if !c.cpu_ids.is_empty() || !c.memory.is_empty() {
        return Err(format!(
            "pod {pod} container {}: CPUs or memory without managers: {c:?}",
            c.name
        ));
    }
    Ok(())
}

/// Upstream `matchPodDescWithResources`: every described pod and container
/// with its devices; a regular init container is not reported, a
/// restartable one is.
fn matches(j: &Joined, want: &[Desc], found: &[PodResources]) -> Result<(), String> {
    for d in want {
        let full = j.pod_name(d.pod);
        let p = found
            .iter()
            .find(|p| p.name == full && p.namespace == "default")
            .ok_or_else(|| format!("no pod resources for pod {}", d.pod))?;
        let by_name = |n: &str| p.containers.iter().find(|c| c.name == n);
        let c = by_name(d.cnt.name)
            .ok_or_else(|| format!("no container resources for {}/{}", d.pod, d.cnt.name))?;
        check_container(d.pod, c, d.cnt)?;
        for ic in &d.init {
            match (ic.restartable, by_name(ic.name)) {
                (false, Some(_)) => {
                    return Err(format!(
                        "pod {} regular init container {} should not be reported",
                        d.pod, ic.name
                    ));
                }
                (false, None) => {}
                (true, None) => {
                    return Err(format!("no container resources for {}/{}", d.pod, ic.name));
                }
                (true, Some(c)) => check_container(d.pod, c, *ic)?,
            }
        }
        let expected = 1 + d.init.iter().filter(|c| c.restartable).count();
        if p.containers.len() != expected {
            return Err(format!("pod {}: containers {:?}", d.pod, p.containers));
        }
    }
    Ok(())
}

/// Upstream `expectPodResources`: `List` matches within a minute.
async fn expect_listed(j: &Joined, c: &mut PodResourcesListerClient<Channel>, want: &[Desc]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = list(c).await;
        match matches(j, want, &found) {
            Ok(()) => return,
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e}: {found:#?}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn start_plugin(root: &Path) -> Stub {
    Stub::start(
        &root.join("device-plugins/stub.sock"),
        vec![stub::device("dev-1", true), stub::device("dev-2", true)],
        StubConfig {
            allocate: Arc::new(allocate),
            ..StubConfig::default()
        },
    )
    .expect("stub device plugin")
}

async fn wait_allocatable(j: &Joined, want: &str) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let n = j.api.get("nodes", "", &j.node.name);
        let got = n
            .as_ref()
            .map(|n| n["status"]["allocatable"][RESOURCE].clone());
        if got.as_ref().is_some_and(|v| v == want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{RESOURCE} allocatable {got:?}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// "without SRIOV devices": `GetAllocatableResources` with CPU manager
/// `none` (no CPUs, no devices); then, with the stub registered, the
/// `podresourcesListTests` steps (no pods; pods without resources; a subset
/// with devices; pods with devices created and deleted between calls; init
/// containers), `podresourcesGetTests`, and the topology-unaware plugin's
/// allocatable devices without topology.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_get_and_allocatable_follow_pods_with_and_without_devices() {
    let j = Joined::start_with(Options::default(), |f, _| {
        f.node_status_update_frequency = Some("1s".into());
    })
    .await;
    let root = j.node.root_dir();
    let mut c = client(&root).await;

    // CPU manager None policy, no device plugin: nothing allocatable.
    let a = c
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources")
        .into_inner();
    assert!(
        a.devices.is_empty() && a.cpu_ids.is_empty() && a.memory.is_empty(),
        "{a:?}"
    );
    // No pods present: List is empty, Get fails.
    assert!(list(&mut c).await.is_empty());
    let e = c
        .get(GetPodResourcesRequest {
            pod_name: "test".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("no such pod");
    assert_eq!(e.message(), "pod test in namespace default not found");

    let plugin = start_plugin(&root);
    plugin
        .register_v1beta1(&root.join("device-plugins/kubelet.sock"), RESOURCE)
        .await
        .expect("registered");
    wait_allocatable(&j, "2").await;
    let a = c
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources")
        .into_inner();
    assert!(!a.devices.is_empty(), "{a:?}");
    for d in &a.devices {
        assert_eq!(d.resource_name, RESOURCE);
        assert!(!d.device_ids.is_empty());
        assert!(d.topology.is_none(), "topology unaware: {d:?}");
    }
    assert!(a.cpu_ids.is_empty(), "{a:?}");

    // Only pods which don't require resources; Get of one of them.
    let step = [app("pr-a0", "cnt-00", 0), app("pr-a1", "cnt-00", 0)];
    create(&j, &step).await;
    expect_listed(&j, &mut c, &step).await;
    let got = c
        .get(GetPodResourcesRequest {
            pod_name: j.pod_name("pr-a0"),
            pod_namespace: "default".into(),
        })
        .await
        .expect("Get")
        .into_inner()
        .pod_resources
        .expect("the pod");
    matches(&j, &step[..1], &[got]).expect("Get answers as List");
    delete(&j, &["pr-a0", "pr-a1"]).await;

    // Only a subset of pods require resources.
    let step = [
        app("pr-b0", "cnt-00", 0),
        app("pr-b1", "cnt-00", 1),
        app("pr-b2", "cnt-00", 0),
        app("pr-b3", "cnt-00", 1),
    ];
    create(&j, &step).await;
    expect_listed(&j, &mut c, &step).await;
    delete(&j, &["pr-b0", "pr-b1", "pr-b2", "pr-b3"]).await;

    // Creating pods which require resources between calls.
    let mut step = vec![
        app("pr-c0", "cnt-00", 0),
        app("pr-c1", "cnt-00", 1),
        app("pr-c2", "cnt-00", 0),
    ];
    create(&j, &step).await;
    expect_listed(&j, &mut c, &step).await;
    let extra = app("pr-c3", "cnt-00", 1);
    create(&j, std::slice::from_ref(&extra)).await;
    step.push(extra);
    expect_listed(&j, &mut c, &step).await;
    delete(&j, &["pr-c0", "pr-c1", "pr-c2", "pr-c3"]).await;

    // Deleting pods which require resources between calls.
    let step = vec![
        app("pr-d0", "cnt-00", 0),
        app("pr-d1", "cnt-00", 1),
        app("pr-d2", "cnt-00", 0),
        app("pr-d3", "cnt-00", 1),
    ];
    create(&j, &step).await;
    expect_listed(&j, &mut c, &step).await;
    delete(&j, &["pr-d1"]).await;
    let rest: Vec<Desc> = step.into_iter().filter(|d| d.pod != "pr-d1").collect();
    expect_listed(&j, &mut c, &rest).await;
    delete(&j, &["pr-d0", "pr-d2", "pr-d3"]).await;

    // Init containers: a regular one is not reported, a restartable one is.
    let init = |name, restartable| Cnt {
        name,
        devices: 1,
        restartable,
    };
    // Restartable ones (sidecars) exist from 1.28: an older apiserver drops
    // an init container's restartPolicy (upstream runs the step only with
    // SidecarContainers).
    let sidecars = j.api.profile().at_least(28);
    let mut step = vec![Desc {
        init: vec![init("init-00", false)],
        ..app("pr-e0", "regular-00", 0)
    }];
    if sidecars {
        step.push(Desc {
            init: vec![init("restartable-init-00", true)],
            ..app("pr-e1", "regular-00", 0)
        });
    }
    create(&j, &step).await;
    expect_listed(&j, &mut c, &step).await;
    let last = step.last().expect("a pod");
    let got = c
        .get(GetPodResourcesRequest {
            pod_name: j.pod_name(last.pod),
            pod_namespace: "default".into(),
        })
        .await
        .expect("Get")
        .into_inner()
        .pod_resources
        .expect("the pod");
    matches(&j, std::slice::from_ref(last), &[got]).expect("Get answers as List");
    let names: Vec<&str> = step.iter().map(|d| d.pod).collect();
    delete(&j, &names).await;
    plugin.stop().await;
    j.cleanup().await;
}

/// `device_plugin_test.go` "Can schedule a pod that requires a device": both
/// the v1alpha1 and the v1 `List` show two pods (a plain pod stands for
/// upstream's plugin pod) and the pod's one container with one device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1alpha1_and_v1_list_the_pod_that_requires_a_device() {
    let j = Joined::start_with(Options::default(), |f, _| {
        f.node_status_update_frequency = Some("1s".into());
    })
    .await;
    let root = j.node.root_dir();
    let plugin = start_plugin(&root);
    plugin
        .register_v1beta1(&root.join("device-plugins/kubelet.sock"), RESOURCE)
        .await
        .expect("registered");
    wait_allocatable(&j, "2").await;
    j.create_pod("pr-plugin", sleeper("sleep 3600")).await;
    let d = app("pr-dev", "pr-dev", 1);
    j.create_pod(d.pod, pod_spec(&d)).await;
    for n in ["pr-plugin", "pr-dev"] {
        j.wait_api(n, T, "Running", |p| phase(p) == Some("Running"))
            .await;
    }
    let full = j.pod_name("pr-dev");

    let socket = kubelet_podresources::socket_path(&root);
    let mut alpha = kubelet_podresources::v1alpha1_client(&socket, Duration::from_secs(10))
        .await
        .expect("v1alpha1 client");
    let old = alpha
        .list(kubelet_podresources::pb_v1alpha1::ListPodResourcesRequest {})
        .await
        .expect("v1alpha1 List")
        .into_inner()
        .pod_resources;
    assert_eq!(old.len(), 2, "{old:#?}");
    let ours = old
        .iter()
        .find(|p| p.name == full)
        .expect("listed by v1alpha1");
    assert_eq!(ours.namespace, "default");
    assert_eq!(ours.containers.len(), 1);
    assert_eq!(ours.containers[0].name, "pr-dev");
    assert_eq!(ours.containers[0].devices.len(), 1);
    assert_eq!(ours.containers[0].devices[0].resource_name, RESOURCE);
    assert_eq!(ours.containers[0].devices[0].device_ids.len(), 1);

    let new = list(&mut client(&root).await).await;
    assert_eq!(new.len(), 2, "{new:#?}");
    let ours1 = new.iter().find(|p| p.name == full).expect("listed by v1");
    assert_eq!(ours1.namespace, "default");
    assert_eq!(ours1.containers.len(), 1);
    assert_eq!(ours1.containers[0].name, "pr-dev");
    assert_eq!(ours1.containers[0].devices.len(), 1);
    assert_eq!(ours1.containers[0].devices[0].resource_name, RESOURCE);
    assert_eq!(
        ours1.containers[0].devices[0].device_ids, ours.containers[0].devices[0].device_ids,
        "both versions report the same device"
    );
    plugin.stop().await;
    j.cleanup().await;
}

/// "when querying /metrics: should report the values for the podresources
/// metrics" and "with the builtin rate limit values: should hit throttling
/// when calling podresources List in a tight loop".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_calls_and_a_tight_loop_hits_the_rate_limit() {
    let j = Joined::start(Options::default()).await;
    let root = j.node.root_dir();
    let mut c = client(&root).await;
    c.list(ListPodResourcesRequest {}).await.expect("List");
    c.get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources");
    let d = app("pr-m1", "cnt-01", 0);
    create(&j, std::slice::from_ref(&d)).await;
    expect_listed(&j, &mut c, std::slice::from_ref(&d)).await;
    let got = c
        .get(GetPodResourcesRequest {
            pod_name: j.pod_name("pr-m1"),
            pod_namespace: "default".into(),
        })
        .await
        .expect("Get")
        .into_inner()
        .pod_resources
        .expect("the pod");
    assert_eq!(got.containers.len(), 1);
    assert!(got.containers[0].devices.is_empty());
    delete(&j, &["pr-m1"]).await;

    let addr = j.node.handle().server_addr.expect("the kubelet serves");
    let api = NodeApiClient::new(addr, &j.node.serving_ca(), &j.node.name, Credentials::None)
        .expect("node API client");
    let text = api.get("/metrics").await.expect("/metrics").text();
    let families = kubelet_rs_integration::prom_text::parse(&text).expect("metrics text");
    for name in [
        "kubelet_pod_resources_endpoint_requests_total",
        "kubelet_pod_resources_endpoint_requests_list",
        "kubelet_pod_resources_endpoint_requests_get_allocatable",
        "kubelet_pod_resources_endpoint_requests_get",
    ] {
        let v1 = families.get(name).and_then(|f| {
            f.samples
                .iter()
                .find(|s| s.labels.get("server_api_version").map(String::as_str) == Some("v1"))
        });
        assert!(
            v1.is_some_and(|s| s.value >= 1.0),
            "{name}: {:?}",
            families.get(name)
        );
    }

    // Twice the QPS in a tight loop: the first call passes, some are refused.
    let tries = kubelet_podresources::DEFAULT_QPS * 2;
    let mut results = Vec::new();
    for _ in 0..tries {
        results.push(c.list(ListPodResourcesRequest {}).await);
    }
    assert!(results[0].is_ok(), "{:?}", results[0]);
    let limited = results[1..]
        .iter()
        .filter(|r| {
            r.as_ref().is_err_and(|e| {
                e.code() == tonic::Code::ResourceExhausted
                    && e.message() == "rejected by rate limit"
            })
        })
        .count();
    assert!(limited > 0, "never hit the rate limit in {tries} calls");
    j.cleanup().await;
}

/// "with disabled KubeletPodResourcesGet feature gate: should return the
/// expected error with the feature gate disabled"; `List` still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_fails_with_its_feature_gate_disabled() {
    let j = Joined::start_with(Options::default(), |f, _| {
        f.feature_gates = Some("KubeletPodResourcesGet=false".into());
    })
    .await;
    let mut c = client(&j.node.root_dir()).await;
    let e = c
        .get(GetPodResourcesRequest {
            pod_name: "test".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("Get is disabled");
    assert_eq!(e.message(), "PodResources API Get method disabled");
    c.list(ListPodResourcesRequest {}).await.expect("List");
    j.cleanup().await;
}
