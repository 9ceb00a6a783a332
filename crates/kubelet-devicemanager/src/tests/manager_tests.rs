//! The device manager end to end over real sockets: registration,
//! ListAndWatch, capacity, allocation, preferred allocation, PreStartContainer,
//! the checkpoint across a restart, and the stop grace period.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kubelet_pluginmanager::{PluginHandler, PluginRegistration};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::checkpoint::CHECKPOINT_NAME;
use crate::stub::{Stub, StubConfig, device};
use crate::v1beta1::DevicePluginOptions;
use crate::{ActivePods, Capacity, Clock, DeviceManager, DeviceManagerConfig};

pub(super) const RES: &str = "example.com/dev";

#[derive(Default)]
pub(super) struct FakePods {
    pub(super) uids: Mutex<HashSet<String>>,
    ready: AtomicBool,
}

impl FakePods {
    pub(super) fn ready_with(uids: &[&str]) -> Arc<Self> {
        let p = Self::default();
        p.ready.store(true, Ordering::SeqCst);
        *p.uids.lock() = uids.iter().map(|s| s.to_string()).collect();
        Arc::new(p)
    }
}

impl ActivePods for FakePods {
    fn active_pod_uids(&self) -> HashSet<String> {
        self.uids.lock().clone()
    }
    fn sources_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

pub(super) struct FakeClock(Mutex<Instant>);

impl FakeClock {
    fn advance(&self, d: Duration) {
        let mut t = self.0.lock();
        *t += d;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        *self.0.lock()
    }
}

pub(super) fn container(name: &str, n: u32) -> Container {
    Container {
        name: name.into(),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                (RES.to_string(), ApiQuantity(n.to_string())),
                ("cpu".to_string(), ApiQuantity("100m".into())),
            ])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn pod(uid: &str, init: Vec<Container>, containers: Vec<Container>) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    p.metadata.name = Some(uid.into());
    p.spec = Some(PodSpec {
        init_containers: (!init.is_empty()).then_some(init),
        containers,
        ..Default::default()
    });
    p
}

fn config(dir: &Path) -> DeviceManagerConfig {
    let mut c = DeviceManagerConfig::new(dir);
    c.plugin_timeout = Duration::from_secs(5);
    c
}

pub(super) async fn started(dir: &Path, pods: Arc<FakePods>) -> (DeviceManager, Arc<FakeClock>) {
    let clock = Arc::new(FakeClock(Mutex::new(Instant::now())));
    let m = DeviceManager::with_clock(config(dir), clock.clone());
    m.start(pods, HashSet::new()).await.expect("start");
    (m, clock)
}

pub(super) async fn wait_capacity(m: &DeviceManager, cap: i64, alloc: i64) -> Capacity {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = m.get_capacity().await;
        if c.capacity.get(RES) == Some(&cap) && c.allocatable.get(RES) == Some(&alloc) {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "capacity never became {cap}/{alloc}: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn plugin(
    dir: &Path,
    name: &str,
    options: DevicePluginOptions,
    preferred: Vec<String>,
) -> Stub {
    Stub::start(
        &dir.join("device-plugins").join(name),
        vec![device("dev-a", true), device("dev-b", true)],
        StubConfig {
            options,
            preferred,
            ..StubConfig::default()
        },
    )
    .expect("stub")
}

async fn registered(
    dir: &Path,
    m: &DeviceManager,
    opts: DevicePluginOptions,
    preferred: Vec<String>,
) -> Stub {
    let p = plugin(dir, "fake.sock", opts, preferred).await;
    p.register(&m.socket_path(), RES, "v1beta1")
        .await
        .expect("register");
    wait_capacity(m, 2, 2).await;
    p
}

#[tokio::test]
async fn registration_and_list_and_watch_set_capacity_and_unhealthy_devices_leave_allocatable() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&[])).await;
    assert!(m.socket_path().exists(), "kubelet.sock served");
    let p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    assert_eq!(m.get_allocatable_devices()[RES].len(), 2);

    p.set_devices(vec![device("dev-a", true), device("dev-b", false)]);
    let c = wait_capacity(&m, 2, 1).await;
    assert!(c.deleted.is_empty());
    assert_eq!(
        m.get_allocatable_devices()[RES].keys().collect::<Vec<_>>(),
        vec!["dev-a"]
    );
    m.stop();
}

#[tokio::test]
async fn bad_registrations_get_upstreams_errors() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&[])).await;
    let p = plugin(
        dir.path(),
        "bad.sock",
        DevicePluginOptions::default(),
        vec![],
    )
    .await;
    let e = p
        .register(&m.socket_path(), RES, "v1alpha")
        .await
        .expect_err("version");
    assert_eq!(
        e.message(),
        r#"requested API version "v1alpha" is not supported by kubelet. Supported versions are ["v1beta1"]"#
    );
    let e = p
        .register(&m.socket_path(), "gpu", "v1beta1")
        .await
        .expect_err("name");
    assert_eq!(e.message(), r#"the ResourceName "gpu" is invalid"#);
    assert!(m.get_capacity().await.capacity.is_empty());
    m.stop();
}

#[tokio::test]
async fn allocation_gives_run_options_and_a_third_request_fails_with_upstreams_message() {
    let dir = tempfile::tempdir().expect("tmp");
    let pods = FakePods::ready_with(&["p1", "p2", "p3"]);
    let (m, _) = started(dir.path(), pods).await;
    let p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;

    let p1 = pod("p1", vec![], vec![container("c", 1)]);
    m.allocate(&p1, &container("c", 1))
        .await
        .expect("allocate p1");
    let opts = m
        .get_device_run_container_options(&p1, &container("c", 1))
        .await
        .expect("options")
        .expect("p1 holds devices");
    assert_eq!(opts.envs.len(), 1);
    let (k, v) = &opts.envs[0];
    assert_eq!(k, "STUB_DEVICES");
    assert_eq!(opts.devices.len(), 1);
    assert_eq!(opts.devices[0].container_path, format!("/dev/{v}"));
    assert_eq!(opts.devices[0].host_path, format!("/dev/host-{v}"));
    assert_eq!(opts.devices[0].permissions, "rw");
    assert_eq!(opts.mounts[0].host_path, "/opt/stub");
    assert!(opts.mounts[0].read_only);
    assert_eq!(
        opts.annotations,
        vec![("stub/annotation".to_string(), "yes".to_string())]
    );
    assert_eq!(
        opts.cdi_devices[0].name,
        format!("stub.example.com/dev={v}")
    );

    let p2 = pod("p2", vec![], vec![container("c", 1)]);
    m.admit_pod(&p2).await.expect("admit p2");
    assert_eq!(m.pod_devices("p2").keys().collect::<Vec<_>>(), vec!["c"]);
    let d1 = m.get_devices("p1", "c");
    let d2 = m.get_devices("p2", "c");
    assert_ne!(
        d1[RES].keys().next(),
        d2[RES].keys().next(),
        "two pods share a device"
    );
    assert_eq!(p.calls().allocate.len(), 2);

    let p3 = pod("p3", vec![], vec![container("c", 1)]);
    let rejected = m.admit_pod(&p3).await.expect_err("third pod rejected");
    assert_eq!(rejected.reason, "UnexpectedAdmissionError");
    assert_eq!(
        rejected.message,
        "Allocate failed due to requested number of devices unavailable for example.com/dev. \
         Requested: 1, Available: 0, which is unexpected"
    );
    let e = m
        .allocate(&p3, &container("c", 1))
        .await
        .expect_err("no device left");
    assert_eq!(
        e.to_string(),
        "requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0"
    );
    assert!(!m.has_pod("p3"));
    assert_eq!(m.allocated_device_counts()[RES], 2);
    // A container without device requests has no options.
    let plain = Container {
        name: "plain".into(),
        ..Default::default()
    };
    assert_eq!(
        m.get_device_run_container_options(&p1, &plain)
            .await
            .expect("ok"),
        None
    );
    m.stop();
}

#[tokio::test]
async fn preferred_allocation_is_honoured() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&["p1"])).await;
    let opts = DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    };
    let p = registered(dir.path(), &m, opts, vec!["dev-b".into()]).await;
    let p1 = pod("p1", vec![], vec![container("c", 1)]);
    m.allocate(&p1, &container("c", 1)).await.expect("allocate");
    assert_eq!(
        m.get_devices("p1", "c")[RES].keys().collect::<Vec<_>>(),
        vec!["dev-b"]
    );
    let calls = p.calls();
    assert_eq!(calls.preferred.len(), 1);
    assert_eq!(calls.preferred[0].allocation_size, 1);
    assert_eq!(
        calls.preferred[0].available_device_i_ds,
        vec!["dev-a", "dev-b"]
    );
    assert_eq!(calls.allocate, vec![vec!["dev-b".to_string()]]);
    m.stop();
}

#[tokio::test]
async fn pre_start_container_is_called_when_the_plugin_asks() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&["p1"])).await;
    let opts = DevicePluginOptions {
        pre_start_required: true,
        get_preferred_allocation_available: false,
    };
    let p = registered(dir.path(), &m, opts, vec![]).await;
    let p1 = pod("p1", vec![], vec![container("c", 1)]);
    m.allocate(&p1, &container("c", 1)).await.expect("allocate");
    assert!(p.calls().pre_start.is_empty());
    m.get_device_run_container_options(&p1, &container("c", 1))
        .await
        .expect("options");
    let held: Vec<String> = m.get_devices("p1", "c")[RES].keys().cloned().collect();
    assert_eq!(p.calls().pre_start, vec![held]);
    m.stop();
}

#[tokio::test]
async fn init_container_devices_are_reused_by_the_app_container() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&["p1", "p2"])).await;
    let _p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    let p1 = pod("p1", vec![container("init", 1)], vec![container("app", 1)]);
    m.allocate(&p1, &container("init", 1)).await.expect("init");
    m.allocate(&p1, &container("app", 1)).await.expect("app");
    assert_eq!(
        m.get_devices("p1", "init")[RES].keys().collect::<Vec<_>>(),
        m.get_devices("p1", "app")[RES].keys().collect::<Vec<_>>()
    );
    assert_eq!(m.allocated_device_counts()[RES], 1);
    // The other device is still free for another pod.
    let p2 = pod("p2", vec![], vec![container("c", 1)]);
    m.allocate(&p2, &container("c", 1)).await.expect("p2");
    m.stop();
}

#[tokio::test]
async fn checkpoint_restores_allocations_so_no_device_is_handed_out_twice() {
    let dir = tempfile::tempdir().expect("tmp");
    let pods = FakePods::ready_with(&["p1", "p2", "p3"]);
    let (m, _) = started(dir.path(), pods.clone()).await;
    let p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    let p1 = pod("p1", vec![], vec![container("c", 1)]);
    m.allocate(&p1, &container("c", 1)).await.expect("allocate");
    let held = m.get_devices("p1", "c");
    let before = m
        .get_device_run_container_options(&p1, &container("c", 1))
        .await
        .expect("opts");
    let text = std::fs::read_to_string(dir.path().join("device-plugins").join(CHECKPOINT_NAME))
        .expect("checkpoint");
    assert!(
        text.contains(r#""PodUID":"p1""#)
            && text.contains(r#""RegisteredDevices":{"example.com/dev":["dev-a","dev-b"]}"#),
        "{text}"
    );
    m.stop();
    p.stop().await;

    // A new kubelet: the plugin's socket is stale until it registers again.
    let (m2, _) = started(dir.path(), pods).await;
    assert!(
        !dir.path().join("device-plugins/fake.sock").exists(),
        "stale socket removed"
    );
    assert_eq!(m2.get_devices("p1", "c"), held);
    assert_eq!(m2.get_capacity().await.capacity.get(RES), Some(&0));
    assert_eq!(
        m2.get_device_run_container_options(&p1, &container("c", 1))
            .await
            .expect("opts"),
        before
    );

    let _p = registered(dir.path(), &m2, DevicePluginOptions::default(), vec![]).await;
    let p2 = pod("p2", vec![], vec![container("c", 1)]);
    m2.allocate(&p2, &container("c", 1))
        .await
        .expect("p2 gets the free device");
    assert_ne!(
        m2.get_devices("p2", "c")[RES].keys().next(),
        held[RES].keys().next()
    );
    let p3 = pod("p3", vec![], vec![container("c", 1)]);
    let e = m2
        .allocate(&p3, &container("c", 1))
        .await
        .expect_err("both held");
    assert!(
        e.to_string()
            .starts_with("requested number of devices unavailable"),
        "{e}"
    );
    m2.stop();
}

#[tokio::test]
async fn pods_no_longer_active_free_their_devices() {
    let dir = tempfile::tempdir().expect("tmp");
    let pods = FakePods::ready_with(&["p1", "p2", "p3"]);
    let (m, _) = started(dir.path(), pods.clone()).await;
    let _p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    for uid in ["p1", "p2"] {
        let p = pod(uid, vec![], vec![container("c", 1)]);
        m.allocate(&p, &container("c", 1)).await.expect("allocate");
    }
    pods.uids.lock().remove("p1");
    // Allocation frees the devices of inactive pods first.
    let p3 = pod("p3", vec![], vec![container("c", 1)]);
    m.allocate(&p3, &container("c", 1))
        .await
        .expect("p1's device is free");
    assert!(!m.has_pod("p1"));
    pods.uids.lock().remove("p2");
    m.update_allocated_devices();
    assert!(!m.has_pod("p2"));
    assert_eq!(m.allocated_device_counts()[RES], 1);
    m.stop();
}

#[tokio::test]
async fn a_stream_that_ends_makes_devices_unhealthy_and_the_resource_goes_after_the_grace_period() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, clock) = started(dir.path(), FakePods::ready_with(&[])).await;
    let p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    p.stop().await;
    let c = wait_capacity(&m, 2, 0).await;
    assert!(c.deleted.is_empty());
    clock.advance(Duration::from_secs(4 * 60));
    assert_eq!(
        m.get_capacity().await.capacity.get(RES),
        Some(&2),
        "still within the grace period"
    );
    clock.advance(Duration::from_secs(61 + 60));
    let c = m.get_capacity().await;
    assert_eq!(c.deleted, vec![RES.to_string()]);
    assert!(c.capacity.is_empty() && c.allocatable.is_empty());
    assert!(m.get_capacity().await.deleted.is_empty(), "reported once");
    m.stop();
}

#[tokio::test]
async fn re_registration_replaces_the_endpoint() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&[])).await;
    let old = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    let new = Stub::start(
        &dir.path().join("device-plugins/fake2.sock"),
        vec![
            device("dev-a", true),
            device("dev-b", true),
            device("dev-c", true),
        ],
        StubConfig::default(),
    )
    .expect("stub");
    new.register(&m.socket_path(), RES, "v1beta1")
        .await
        .expect("register");
    wait_capacity(&m, 3, 3).await;
    // The old plugin going away no longer affects the resource.
    old.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    wait_capacity(&m, 3, 3).await;
    m.stop();
}

#[tokio::test]
async fn plugin_watcher_registration_goes_through_the_handler() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&[])).await;
    let p = plugin(
        dir.path(),
        "watched.sock",
        DevicePluginOptions::default(),
        vec![],
    )
    .await;
    let versions = vec!["v1beta1".to_string()];
    let reg = PluginRegistration {
        name: RES,
        endpoint: p.socket(),
        versions: &versions,
    };
    m.validate_plugin(&reg).await.expect("valid");
    let bad_versions = vec!["v1".to_string(), "v1alpha1".to_string()];
    let e = m
        .validate_plugin(&PluginRegistration {
            versions: &bad_versions,
            ..reg.clone()
        })
        .await
        .expect_err("version");
    assert_eq!(
        e.to_string(),
        "manager version, v1beta1, is not among plugin supported versions [v1 v1alpha1]"
    );
    let e = m
        .validate_plugin(&PluginRegistration {
            name: "gpu",
            ..reg.clone()
        })
        .await
        .expect_err("name");
    assert_eq!(
        e.to_string(),
        r#"invalid name of device plugin socket: the ResourceName "gpu" is invalid"#
    );

    m.register_plugin(&reg, Duration::from_secs(5))
        .await
        .expect("register");
    wait_capacity(&m, 2, 2).await;
    m.deregister_plugin(RES, p.socket()).await;
    wait_capacity(&m, 2, 0).await;
    m.stop();
}

#[tokio::test]
async fn after_a_restart_running_containers_keep_devices_before_their_plugin_returns() {
    let dir = tempfile::tempdir().expect("tmp");
    let pods = FakePods::ready_with(&["p1", "p2"]);
    let (m, _) = started(dir.path(), pods.clone()).await;
    let p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    let p1 = pod("p1", vec![], vec![container("c", 1)]);
    m.admit_pod(&p1).await.expect("admit");
    m.stop();
    p.stop().await;

    // Restarted kubelet, sources not ready yet, p1/c reported running by the runtime.
    let not_ready = Arc::new(FakePods::default());
    *not_ready.uids.lock() = HashSet::from(["p1".to_string(), "p2".to_string()]);
    let m2 = DeviceManager::new(config(dir.path()));
    m2.start(
        not_ready.clone(),
        HashSet::from([("p1".to_string(), "c".to_string())]),
    )
    .await
    .expect("start");
    m2.admit_pod(&p1)
        .await
        .expect("a running container is re-admitted without its plugin");
    assert_eq!(m2.allocated_device_counts()[RES], 1);
    // A new pod cannot get devices before the plugin is back.
    let p2 = pod("p2", vec![], vec![container("c", 1)]);
    let e = m2.admit_pod(&p2).await.expect_err("no plugin yet");
    assert_eq!(
        e.message,
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices \
         example.com/dev, which is unexpected"
    );
    assert!(
        dir.path().join("device-plugins/DEPRECATION").exists(),
        "marker for plugin-watcher registration"
    );
    m2.stop();
}

#[tokio::test]
async fn only_pods_asking_for_a_registered_resource_need_allocation() {
    let dir = tempfile::tempdir().expect("tmp");
    let (m, _) = started(dir.path(), FakePods::ready_with(&[])).await;
    let wants = pod("p1", vec![], vec![container("c", 1)]);
    assert!(!m.requests_devices(&wants), "nothing registered yet");
    let _p = registered(dir.path(), &m, DevicePluginOptions::default(), vec![]).await;
    assert!(m.requests_devices(&wants));
    assert!(!m.requests_devices(&pod("p2", vec![], vec![container("c", 0)])));
    let mut plain = container("c", 1);
    plain.resources = None;
    assert!(!m.requests_devices(&pod("p3", vec![], vec![plain])));
    assert!(m.requests_devices(&pod("p4", vec![container("init", 1)], vec![])));
}
