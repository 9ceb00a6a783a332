//! The pod-resources API over its real socket, read by a tonic client as
//! monitoring agents do, against fake providers (as upstream's
//! `server_v1_test.go` and the e2e `podresources_test.go` assertions).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::pb::pod_resources_lister_client::PodResourcesListerClient;
use crate::pb::{
    AllocatableResourcesRequest, ContainerDevices, ContainerMemory, GetPodResourcesRequest,
    ListPodResourcesRequest, NumaNode, TopologyInfo,
};
use crate::{
    ApiMethod, CpusProvider, DevicesProvider, MemoryProvider, PodInfo, PodResourcesMetrics,
    PodResourcesProviders, PodResourcesServer, PodsProvider, RateLimit, bind, serve, socket_path,
};

struct FakePods(Vec<PodInfo>, Vec<PodInfo>);

impl PodsProvider for FakePods {
    fn pods(&self) -> Vec<PodInfo> {
        self.0.iter().chain(&self.1).cloned().collect()
    }
    fn active_pods(&self) -> Vec<PodInfo> {
        self.0.clone()
    }
    fn pod_by_name(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.0
            .iter()
            .chain(&self.1)
            .find(|p| p.namespace == namespace && p.name == name)
            .cloned()
    }
}

fn devices(resource: &str, ids: &[&str], numa: Option<i64>) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: numa.map(|id| TopologyInfo {
            nodes: vec![NumaNode { id }],
        }),
    }
}

#[derive(Default)]
struct FakeDevices {
    by_container: HashMap<(String, String), Vec<ContainerDevices>>,
    updates: AtomicUsize,
}

impl DevicesProvider for FakeDevices {
    fn update_allocated_devices(&self) {
        self.updates.fetch_add(1, Ordering::SeqCst);
    }
    fn devices(&self, pod_uid: &str, container: &str) -> Vec<ContainerDevices> {
        self.by_container
            .get(&(pod_uid.to_string(), container.to_string()))
            .cloned()
            .unwrap_or_default()
    }
    fn allocatable_devices(&self) -> Vec<ContainerDevices> {
        vec![devices("example.com/gpu", &["gpu0", "gpu1"], Some(0))]
    }
}

struct FakeCpus;

impl CpusProvider for FakeCpus {
    fn cpus(&self, pod_uid: &str, container: &str) -> Vec<i64> {
        if pod_uid == "uid-a" && container == "app" {
            vec![2, 3]
        } else {
            Vec::new()
        }
    }
    fn allocatable_cpus(&self) -> Vec<i64> {
        vec![1, 2, 3]
    }
}

struct FakeMemory;

impl MemoryProvider for FakeMemory {
    fn memory(&self, _: &str, _: &str) -> Vec<ContainerMemory> {
        Vec::new()
    }
    fn allocatable_memory(&self) -> Vec<ContainerMemory> {
        vec![ContainerMemory {
            memory_type: "memory".into(),
            size: 1 << 30,
            topology: None,
        }]
    }
}

#[derive(Default)]
struct FakeMetrics {
    counts: parking_lot::Mutex<Vec<(&'static str, ApiMethod)>>,
}

impl PodResourcesMetrics for FakeMetrics {
    fn request(&self, method: ApiMethod) {
        self.counts.lock().push(("request", method));
    }
    fn error(&self, method: ApiMethod) {
        self.counts.lock().push(("error", method));
    }
}

fn pod(uid: &str, ns: &str, name: &str, sidecars: &[&str], containers: &[&str]) -> PodInfo {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    PodInfo {
        uid: uid.into(),
        name: name.into(),
        namespace: ns.into(),
        sidecars: names(sidecars),
        containers: names(containers),
    }
}

async fn channel(socket: &Path) -> Channel {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .expect("connect to the pod-resources socket")
}

struct Served {
    client: PodResourcesListerClient<Channel>,
    channel: Channel,
    devices: Arc<FakeDevices>,
    metrics: Arc<FakeMetrics>,
    stop: CancellationToken,
    _tmp: tempfile::TempDir,
}

async fn start(limit: RateLimit) -> Served {
    start_with(limit, true).await
}

async fn start_with(limit: RateLimit, get_enabled: bool) -> Served {
    let tmp = tempfile::tempdir().expect("tempdir");
    let socket = socket_path(tmp.path());
    assert_eq!(socket, tmp.path().join("pod-resources/kubelet.sock"));
    // A socket left by an earlier kubelet is replaced.
    std::fs::create_dir_all(socket.parent().expect("dir")).expect("mkdir");
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("stale socket"));

    let mut by_container = HashMap::new();
    by_container.insert(
        ("uid-a".to_string(), "app".to_string()),
        vec![devices("example.com/gpu", &["gpu1"], Some(0))],
    );
    let devices = Arc::new(FakeDevices {
        by_container,
        ..FakeDevices::default()
    });
    let providers = PodResourcesProviders {
        pods: Arc::new(FakePods(
            vec![
                pod("uid-a", "default", "gpu-pod", &["sidecar"], &["app"]),
                pod("uid-b", "kube-system", "plain", &[], &["main"]),
            ],
            vec![pod("uid-c", "default", "finished", &[], &["done"])],
        )),
        devices: devices.clone(),
        cpus: Arc::new(FakeCpus),
        memory: Arc::new(FakeMemory),
    };
    let listener = bind(&socket).await.expect("bind");
    let stop = CancellationToken::new();
    let metrics = Arc::new(FakeMetrics::default());
    let server = PodResourcesServer::new(providers, limit)
        .with_metrics(metrics.clone())
        .with_get_enabled(get_enabled);
    tokio::spawn(serve(listener, server, stop.clone()));
    let channel = channel(&socket).await;
    Served {
        client: PodResourcesListerClient::new(channel.clone()),
        channel,
        devices,
        metrics,
        stop,
        _tmp: tmp,
    }
}

#[tokio::test]
async fn list_reports_active_pods_with_their_containers_devices() {
    let mut s = start(RateLimit::default()).await;
    let list = s
        .client
        .list(ListPodResourcesRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(s.devices.updates.load(Ordering::SeqCst), 1);
    let names: Vec<_> = list
        .pod_resources
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    assert_eq!(names, vec!["default/gpu-pod", "kube-system/plain"]);
    let gpu_pod = &list.pod_resources[0];
    let containers: Vec<_> = gpu_pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(containers, vec!["sidecar", "app"]);
    assert!(gpu_pod.containers[0].devices.is_empty());
    let app = &gpu_pod.containers[1];
    assert_eq!(
        app.devices,
        vec![devices("example.com/gpu", &["gpu1"], Some(0))]
    );
    assert_eq!(app.cpu_ids, vec![2, 3]);
    assert!(list.pod_resources[1].containers[0].devices.is_empty());
    s.stop.cancel();
}

#[tokio::test]
async fn get_reports_one_pod_and_a_missing_pod_with_upstreams_error() {
    let mut s = start(RateLimit::default()).await;
    let got = s
        .client
        .get(GetPodResourcesRequest {
            pod_name: "gpu-pod".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .pod_resources
        .expect("pod resources");
    assert_eq!(got.name, "gpu-pod");
    assert_eq!(got.containers[1].devices[0].device_ids, vec!["gpu1"]);

    // Get reads every pod the kubelet knows, not only active ones.
    let finished = s
        .client
        .get(GetPodResourcesRequest {
            pod_name: "finished".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect("get finished");
    assert!(finished.into_inner().pod_resources.is_some());

    let missing = s
        .client
        .get(GetPodResourcesRequest {
            pod_name: "gpu-pod".into(),
            pod_namespace: "other".into(),
        })
        .await
        .expect_err("missing pod");
    assert_eq!(missing.code(), tonic::Code::Unknown);
    assert_eq!(
        missing.message(),
        "pod gpu-pod in namespace other not found"
    );
    s.stop.cancel();
}

#[tokio::test]
async fn allocatable_resources_come_from_the_providers() {
    let mut s = start(RateLimit::default()).await;
    let alloc = s
        .client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("allocatable")
        .into_inner();
    assert_eq!(
        alloc.devices,
        vec![devices("example.com/gpu", &["gpu0", "gpu1"], Some(0))]
    );
    assert_eq!(alloc.cpu_ids, vec![1, 2, 3]);
    assert_eq!(alloc.memory.len(), 1);
    assert_eq!(alloc.memory[0].size, 1 << 30);
    s.stop.cancel();
}

#[tokio::test]
async fn requests_beyond_the_burst_are_rejected_by_the_rate_limit() {
    // No refill: the burst of 3 is all there is.
    let mut s = start(RateLimit::new(0, 3)).await;
    for _ in 0..3 {
        s.client
            .list(ListPodResourcesRequest {})
            .await
            .expect("within the burst");
    }
    let refused = s
        .client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect_err("beyond the burst");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(refused.message(), "rejected by rate limit");
    // The refused request never reached a handler.
    assert_eq!(
        *s.metrics.counts.lock(),
        vec![("request", ApiMethod::List); 3]
    );
    s.stop.cancel();
}

#[tokio::test]
async fn v1alpha1_lists_every_pod_with_regular_containers_only() {
    use crate::pb_v1alpha1::ListPodResourcesRequest as AlphaList;
    use crate::pb_v1alpha1::pod_resources_lister_client::PodResourcesListerClient as AlphaClient;

    let s = start(RateLimit::default()).await;
    let mut alpha = AlphaClient::new(s.channel.clone());
    let list = alpha
        .list(AlphaList {})
        .await
        .expect("v1alpha1 list")
        .into_inner();
    let names: Vec<_> = list.pod_resources.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["gpu-pod", "plain", "finished"]);
    let gpu_pod = &list.pod_resources[0];
    assert_eq!(gpu_pod.containers.len(), 1);
    assert_eq!(gpu_pod.containers[0].name, "app");
    assert_eq!(
        gpu_pod.containers[0].devices[0].resource_name,
        "example.com/gpu"
    );
    assert_eq!(gpu_pod.containers[0].devices[0].device_ids, vec!["gpu1"]);
    assert_eq!(
        *s.metrics.counts.lock(),
        vec![("request", ApiMethod::V1alpha1List)]
    );
    s.stop.cancel();
}

#[tokio::test]
async fn the_v1_and_v1alpha1_clients_dial_the_socket_and_a_missing_one_fails() {
    let s = start(RateLimit::default()).await;
    let socket = socket_path(s._tmp.path());
    let mut v1 = crate::v1_client(&socket, Duration::from_secs(5))
        .await
        .expect("v1 client");
    let v1_list = v1
        .list(ListPodResourcesRequest {})
        .await
        .expect("v1 list")
        .into_inner();
    assert_eq!(v1_list.pod_resources.len(), 2, "active pods only");
    let mut alpha = crate::v1alpha1_client(&socket, Duration::from_secs(5))
        .await
        .expect("v1alpha1 client");
    let alpha_list = alpha
        .list(crate::pb_v1alpha1::ListPodResourcesRequest {})
        .await
        .expect("v1alpha1 list")
        .into_inner();
    assert_eq!(alpha_list.pod_resources.len(), 3, "every pod");
    let missing = s._tmp.path().join("nothing.sock");
    let err = crate::v1alpha1_client(&missing, Duration::from_secs(1))
        .await
        .expect_err("no socket");
    assert!(matches!(err, crate::Error::Dial { .. }), "{err}");
    s.stop.cancel();
}

#[tokio::test]
async fn get_fails_with_upstreams_error_while_its_feature_gate_is_off() {
    let mut s = start_with(RateLimit::default(), false).await;
    let err = s
        .client
        .get(GetPodResourcesRequest {
            pod_name: "gpu-pod".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("Get is disabled");
    assert_eq!(err.code(), tonic::Code::Unknown);
    assert_eq!(err.message(), "PodResources API Get method disabled");
    assert_eq!(
        *s.metrics.counts.lock(),
        vec![("request", ApiMethod::Get), ("error", ApiMethod::Get)]
    );
    // List is not gated.
    s.client
        .list(ListPodResourcesRequest {})
        .await
        .expect("list");
    s.stop.cancel();
}
