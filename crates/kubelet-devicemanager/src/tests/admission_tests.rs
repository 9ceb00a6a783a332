//! The pod under admission (upstream `pendingAdmissionPod`): the kubelet
//! adds a pod to its pod manager only after admitting it, so while its
//! containers are allocated one by one the pod is not among the active pods,
//! and freeing the devices of inactive pods must leave it alone. Also: a
//! device that turns unhealthy while the plugin picks its preferred
//! allocation is not handed out.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::DeviceManager;
use crate::stub::{Stub, StubConfig, device};
use crate::v1beta1::DevicePluginOptions;

use super::manager_tests::{FakePods, RES, container, pod, started, wait_capacity};

async fn plugin_with(dir: &std::path::Path, m: &DeviceManager, devices: &[&str]) -> Stub {
    let p = Stub::start(
        &dir.join("device-plugins").join("fake.sock"),
        devices.iter().map(|d| device(d, true)).collect(),
        StubConfig::default(),
    )
    .expect("stub");
    p.register(&m.socket_path(), RES, "v1beta1")
        .await
        .expect("register");
    let n = devices.len() as i64;
    wait_capacity(m, n, n).await;
    p
}

fn ids(m: &DeviceManager, uid: &str, c: &str) -> Vec<String> {
    m.get_devices(uid, c)
        .get(RES)
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_two_container_pod_keeps_both_devices_while_it_is_admitted() {
    let dir = tempfile::tempdir().expect("tmp");
    // Sources ready, no pod active yet: the pod being admitted is not listed.
    let pods: Arc<FakePods> = FakePods::ready_with(&[]);
    let (m, _) = started(dir.path(), pods.clone()).await;
    let _p = plugin_with(dir.path(), &m, &["dev-a", "dev-b"]).await;
    let p1 = pod("p1", vec![], vec![container("a", 1), container("b", 1)]);
    m.admit_pod(&p1).await.expect("admitted");
    assert_eq!(
        ids(&m, "p1", "a").len(),
        1,
        "first container keeps its device"
    );
    assert_eq!(ids(&m, "p1", "b").len(), 1);
    assert_ne!(ids(&m, "p1", "a"), ids(&m, "p1", "b"));
    assert_eq!(m.allocated_device_counts()[RES], 2);
    // Freeing inactive pods right after admission (before the kubelet added
    // the pod to its pod manager) still leaves it alone.
    m.update_allocated_devices();
    assert!(m.has_pod("p1"));
    // The kubelet adds the admitted pod to its pod manager; both devices are
    // taken: the next pod is refused, not handed one twice.
    pods.uids.lock().insert("p1".into());
    let p2 = pod("p2", vec![], vec![container("c", 1)]);
    let e = m.admit_pod(&p2).await.expect_err("no device left");
    assert!(
        e.message
            .contains("requested number of devices unavailable"),
        "{}",
        e.message
    );
    m.stop();
}

#[tokio::test]
async fn the_app_container_reuses_the_init_containers_device_on_a_one_device_node() {
    let dir = tempfile::tempdir().expect("tmp");
    let pods: Arc<FakePods> = FakePods::ready_with(&[]);
    let (m, _) = started(dir.path(), pods).await;
    let _p = plugin_with(dir.path(), &m, &["dev-a"]).await;
    let p1 = pod("p1", vec![container("init", 1)], vec![container("app", 1)]);
    m.admit_pod(&p1).await.expect("admitted");
    assert_eq!(ids(&m, "p1", "init"), vec!["dev-a".to_string()]);
    assert_eq!(ids(&m, "p1", "app"), vec!["dev-a".to_string()]);
    assert_eq!(m.allocated_device_counts()[RES], 1);
    m.stop();
}

#[tokio::test]
async fn the_previous_pod_under_admission_loses_its_devices_once_another_is_admitted() {
    let dir = tempfile::tempdir().expect("tmp");
    let pods: Arc<FakePods> = FakePods::ready_with(&[]);
    let (m, _) = started(dir.path(), pods).await;
    let _p = plugin_with(dir.path(), &m, &["dev-a"]).await;
    // p1 is admitted but never becomes active (say, deleted at once).
    m.admit_pod(&pod("p1", vec![], vec![container("c", 1)]))
        .await
        .expect("p1");
    m.admit_pod(&pod("p2", vec![], vec![container("c", 1)]))
        .await
        .expect("p1's device is freed for p2");
    assert!(!m.has_pod("p1"));
    assert_eq!(ids(&m, "p2", "c"), vec!["dev-a".to_string()]);
    m.stop();
}

#[tokio::test]
async fn a_device_turning_unhealthy_during_get_preferred_allocation_is_not_allocated() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&["p1"])).await;
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (e, r) = (entered.clone(), release.clone());
    let p = Stub::start(
        &dir.path().join("device-plugins").join("fake.sock"),
        vec![device("dev-a", true), device("dev-b", true)],
        StubConfig {
            options: DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            },
            preferred: vec!["dev-a".into()],
            preferred_hook: Some(Arc::new(move || {
                let (e, r) = (e.clone(), r.clone());
                Box::pin(async move {
                    e.notify_one();
                    r.notified().await;
                })
            })),
            ..StubConfig::default()
        },
    )
    .expect("stub");
    p.register(&m.socket_path(), RES, "v1beta1")
        .await
        .expect("register");
    wait_capacity(&m, 2, 2).await;
    let alloc = {
        let m = m.clone();
        tokio::spawn(async move {
            let p1 = pod("p1", vec![], vec![container("c", 1)]);
            m.allocate(&p1, &container("c", 1)).await
        })
    };
    entered.notified().await;
    // The preferred device goes bad while the kubelet waits for the answer.
    p.set_devices(vec![device("dev-a", false), device("dev-b", true)]);
    wait_capacity(&m, 2, 1).await;
    release.notify_one();
    alloc.await.expect("join").expect("allocate");
    assert_eq!(ids(&m, "p1", "c"), vec!["dev-b".to_string()]);
    m.stop();
}
