//! The pod-resources API (upstream `test/e2e_node/podresources_test.go`) on
//! real containerd through the apiserver double: with a stub device plugin
//! advertising two devices of `example.com/resource`, a pod holding one and
//! a pod holding none, `List` on `<root-dir>/pod-resources/kubelet.sock`
//! reports both pods with their containers and the one device,
//! `GetAllocatableResources` both devices, and `Get` one pod (a missing pod
//! is an error naming it, as upstream); after a kubelet restart the pod
//! still lists its device, from the device manager's checkpoint.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use apiserver_double::Options;
use kubelet_devicemanager::stub::{self, Stub, StubConfig};
use kubelet_devicemanager::v1beta1::ContainerAllocateResponse;
use kubelet_podresources::pb::{
    AllocatableResourcesRequest, ContainerDevices, GetPodResourcesRequest, ListPodResourcesRequest,
    PodResources,
};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::{Joined, phase, sleeper};
use serde_json::json;

#[path = "pod_resources_e2e.rs"]
mod pod_resources_e2e;

const RESOURCE: &str = "example.com/resource";
const T: Duration = Duration::from_secs(90);

fn allocate(ids: &[String]) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: BTreeMap::from([("STUB_DEVICES".to_string(), ids.join(","))]),
        ..Default::default()
    }
}

/// `(resource, device id)` of each device entry.
fn flat(devs: &[ContainerDevices]) -> Vec<(String, String)> {
    let mut out: Vec<_> = devs
        .iter()
        .flat_map(|d| {
            d.device_ids
                .iter()
                .map(|id| (d.resource_name.clone(), id.clone()))
        })
        .collect();
    out.sort();
    out
}

fn find<'a>(list: &'a [PodResources], name: &str) -> &'a PodResources {
    list.iter()
        .find(|p| p.name == name && p.namespace == "default")
        .unwrap_or_else(|| panic!("{name} not listed: {list:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_get_and_allocatable_report_the_devices_pods_hold() {
    let mut j = Joined::start_with(Options::default(), |f, _| {
        f.node_status_update_frequency = Some("1s".into());
    })
    .await;
    let root = j.node.root_dir();
    let dir = root.join("device-plugins");
    let plugin = Stub::start(
        &dir.join("stub.sock"),
        vec![stub::device("dev-1", true), stub::device("dev-2", true)],
        StubConfig {
            allocate: Arc::new(allocate),
            ..StubConfig::default()
        },
    )
    .expect("stub device plugin");
    plugin
        .register_v1beta1(&dir.join("kubelet.sock"), RESOURCE)
        .await
        .expect("registered");

    j.create_pod(
        "pr-dev",
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "sleep 3600"],
                "resources": {"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}}}]
        }),
    )
    .await;
    j.create_pod("pr-plain", sleeper("sleep 3600")).await;
    for name in ["pr-dev", "pr-plain"] {
        j.wait_api(name, T, "Running", |p| phase(p) == Some("Running"))
            .await;
    }
    let held = plugin.calls().allocate;
    assert_eq!(held.len(), 1, "one Allocate: {held:?}");
    let id = held[0][0].clone();

    let socket = kubelet_podresources::socket_path(&root);
    let mut client = kubelet_podresources::v1_client(&socket, Duration::from_secs(10))
        .await
        .expect("the pod-resources socket answers");

    let list = client
        .list(ListPodResourcesRequest {})
        .await
        .expect("List")
        .into_inner()
        .pod_resources;
    let dev = find(&list, &j.pod_name("pr-dev"));
    assert_eq!(dev.containers.len(), 1, "{dev:#?}");
    assert_eq!(dev.containers[0].name, "main");
    assert_eq!(
        flat(&dev.containers[0].devices),
        vec![(RESOURCE.to_string(), id.clone())]
    );
    let plain = find(&list, &j.pod_name("pr-plain"));
    assert_eq!(plain.containers.len(), 1, "{plain:#?}");
    assert!(plain.containers[0].devices.is_empty(), "{plain:#?}");

    let allocatable = client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources")
        .into_inner();
    assert_eq!(
        flat(&allocatable.devices),
        vec![
            (RESOURCE.to_string(), "dev-1".to_string()),
            (RESOURCE.to_string(), "dev-2".to_string()),
        ]
    );

    let got = client
        .get(GetPodResourcesRequest {
            pod_name: j.pod_name("pr-dev"),
            pod_namespace: "default".into(),
        })
        .await
        .expect("Get")
        .into_inner()
        .pod_resources
        .expect("the pod");
    assert_eq!(&got, dev);

    let missing = client
        .get(GetPodResourcesRequest {
            pod_name: "no-such-pod".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("no such pod");
    assert_eq!(
        missing.message(),
        "pod no-such-pod in namespace default not found"
    );

    // After a kubelet restart, before the plugin registers again, the
    // devices come from the checkpoint.
    j.node.restart().await;
    plugin.stop().await;
    let deadline = tokio::time::Instant::now() + T;
    let again = loop {
        let list = match kubelet_podresources::v1_client(&socket, Duration::from_secs(5)).await {
            Ok(mut c) => c.list(ListPodResourcesRequest {}).await.ok(),
            Err(_) => None,
        };
        if let Some(list) = list.map(|l| l.into_inner().pod_resources)
            && list.iter().any(|p| p.name == j.pod_name("pr-dev"))
        {
            break list;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pr-dev not listed after the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let dev = find(&again, &j.pod_name("pr-dev"));
    assert_eq!(
        flat(&dev.containers[0].devices),
        vec![(RESOURCE.to_string(), id.clone())]
    );
    // A topology-unaware plugin's devices carry no topology (upstream
    // "should return proper podresources the same as before the restart").
    assert!(
        dev.containers[0]
            .devices
            .iter()
            .all(|d| d.topology.is_none()),
        "{dev:#?}"
    );
    j.cleanup().await;
}
