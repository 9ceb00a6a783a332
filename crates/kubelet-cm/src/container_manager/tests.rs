use super::*;
use parking_lot::Mutex;

fn list(items: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity::parse(v).expect("quantity")))
        .collect()
}

fn cfg(root: &str) -> NodeConfig {
    NodeConfig {
        node_name: "n1".into(),
        cgroup_driver: CgroupDriver::Cgroupfs,
        cgroup_root: root.into(),
        cgroups_per_qos: true,
        cfs: CfsSettings::default(),
        pod_pids_limit: -1,
        enforce_node_allocatable: vec!["pods".into()],
        capacity: list(&[("cpu", "4"), ("memory", "8Gi")]),
        kube_reserved: list(&[("memory", "1Gi")]),
        system_reserved: list(&[("cpu", "500m")]),
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<(String, String)>>);

impl Recorder for Events {
    fn event(
        &self,
        _: &k8s_openapi::api::core::v1::ObjectReference,
        _: EventType,
        reason: &str,
        message: String,
    ) {
        self.0.lock().push((reason.to_string(), message));
    }
}

fn pod(json: serde_json::Value) -> Pod {
    serde_json::from_value(json).expect("pod")
}

fn read(p: std::path::PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[tokio::test]
async fn start_checks_the_root_and_builds_the_tree() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v1(mnt.path(), &["cpu", "memory", "pids"]);
    let cm = ContainerManager::new(cfg("/nodes/a"), subs.clone(), vec![]);
    let err = cm.start().await.expect_err("cgroupRoot must exist");
    assert!(err.to_string().contains("missing paths"), "{err}");
    for c in ["cpu", "memory", "pids"] {
        std::fs::create_dir_all(mnt.path().join(c).join("nodes/a")).expect("mkdir");
    }
    let events = Arc::new(Events::default());
    cm.set_recorder(events.clone());
    cm.start().await.expect("start");
    let kp = |c: &str| mnt.path().join(c).join("nodes/a/kubepods");
    assert_eq!(
        read(kp("memory").join("memory.limit_in_bytes")),
        (7i64 << 30).to_string()
    );
    assert_eq!(read(kp("cpu").join("cpu.shares")), "3584");
    assert_eq!(read(kp("cpu").join("besteffort/cpu.shares")), "2");
    assert!(kp("pids").join("burstable").is_dir());
    cm.enforce_node_allocatable().await.expect("enforce");
    assert_eq!(
        events.0.lock().clone(),
        vec![(
            "NodeAllocatableEnforced".to_string(),
            "Updated Node Allocatable limit across pods".to_string()
        )]
    );
}

#[tokio::test]
async fn pod_cgroup_exists_before_the_sandbox_and_goes_with_the_pod() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v1(mnt.path(), &["cpu", "memory", "pids"]);
    let mut c = cfg("/");
    c.pod_pids_limit = 1024;
    let cm = ContainerManager::new(c, subs, vec![]);
    for ctl in ["cpu", "memory", "pids"] {
        std::fs::create_dir_all(mnt.path().join(ctl)).expect("mkdir");
    }
    let b = Arc::new(pod(
        serde_json::json!({"metadata": {"uid": "b1"}, "spec": {"containers": [
        {"name": "a", "resources": {"requests": {"cpu": "250m"}}}]}}),
    ));
    let active = Arc::new(Mutex::new(vec![b.clone()]));
    let reader = active.clone();
    cm.set_active_pods(Arc::new(move || reader.lock().clone()));
    cm.start().await.expect("start");
    assert_eq!(
        read(mnt.path().join("cpu/kubepods/burstable/cpu.shares")),
        "256"
    );
    cm.ensure_exists(&b).await.expect("ensure");
    let dir = |ctl: &str| mnt.path().join(ctl).join("kubepods/burstable/podb1");
    assert_eq!(read(dir("cpu").join("cpu.shares")), "256");
    assert_eq!(read(dir("pids").join("pids.max")), "1024");
    assert!(
        !dir("memory").join("memory.limit_in_bytes").exists(),
        "no memory limit declared"
    );
    assert_eq!(cm.cgroup_parent(&b), "/kubepods/burstable/podb1");
    active.lock().clear();
    cm.destroy("b1").await.expect("destroy");
    assert!(!dir("cpu").exists());
    assert_eq!(
        read(mnt.path().join("cpu/kubepods/burstable/cpu.shares")),
        "2"
    );
    cm.destroy("gone").await.expect("nothing to remove is fine");
}

#[tokio::test]
async fn systemd_and_no_qos_write_nothing() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v1(mnt.path(), &["cpu"]);
    let mut c = cfg("/");
    c.cgroup_driver = CgroupDriver::Systemd;
    let cm = ContainerManager::new(c.clone(), subs.clone(), vec![]);
    cm.start().await.expect("start");
    let p = pod(
        serde_json::json!({"metadata": {"uid": "a-b"}, "spec": {"containers": [{"name": "a"}]}}),
    );
    cm.ensure_exists(&p).await.expect("ensure");
    assert_eq!(
        cm.cgroup_parent(&p),
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poda_b.slice"
    );
    assert_eq!(std::fs::read_dir(mnt.path()).expect("read").count(), 0);
    c.cgroup_driver = CgroupDriver::Cgroupfs;
    c.cgroups_per_qos = false;
    let cm = ContainerManager::new(c, subs, vec![]);
    cm.start().await.expect("start");
    cm.ensure_exists(&p).await.expect("ensure");
    assert_eq!(cm.cgroup_parent(&p), "");
    assert_eq!(std::fs::read_dir(mnt.path()).expect("read").count(), 0);
}

#[tokio::test(start_paused = true)]
async fn run_retries_enforcement_and_updates_tiers_every_minute() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v1(mnt.path(), &["cpu"]);
    let cm = Arc::new(ContainerManager::new(cfg("/"), subs, vec![]));
    let events = Arc::new(Events::default());
    cm.set_recorder(events.clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn(cm.clone().run(stop.clone()));
    // Nothing exists yet: enforcement fails and is retried a minute later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::yield_now().await;
    wait_for(&events, 1).await;
    assert_eq!(events.0.lock()[0].0, "FailedNodeAllocatableEnforcement");
    std::fs::create_dir_all(mnt.path().join("cpu")).expect("mkdir");
    cm.start().await.expect("start");
    tokio::time::sleep(ENFORCE_RETRY).await;
    wait_for(&events, 2).await;
    assert_eq!(events.0.lock()[1].0, "NodeAllocatableEnforced");
    stop.cancel();
    task.await.expect("run ends");
}

/// Waits (in paused time, driving the blocking pool) for `n` events.
async fn wait_for(events: &Events, n: usize) {
    for _ in 0..200 {
        if events.0.lock().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} events, have {:?}", events.0.lock());
}

#[tokio::test]
async fn orphaned_pod_cgroups_are_removed_and_running_ones_kept() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v1(mnt.path(), &["cpu", "memory"]);
    let cm = ContainerManager::new(cfg("/"), subs, vec![]);
    for ctl in ["cpu", "memory"] {
        for pod in [
            "kubepods/podkeep",
            "kubepods/burstable/podgone",
            "kubepods/besteffort/notapod",
        ] {
            std::fs::create_dir_all(mnt.path().join(ctl).join(pod)).expect("mkdir");
        }
    }
    let keep = std::collections::HashSet::from(["keep".to_string()]);
    assert_eq!(cm.cleanup_orphaned_pod_cgroups(keep).await, vec!["gone"]);
    assert!(!mnt.path().join("cpu/kubepods/burstable/podgone").exists());
    assert!(mnt.path().join("memory/kubepods/podkeep").is_dir());
    assert!(
        mnt.path()
            .join("memory/kubepods/besteffort/notapod")
            .is_dir()
    );
}

/// systemd for tests: records each call and makes or removes the slice's
/// directory below a v2 mount, as systemd does.
#[derive(Debug)]
struct FakeSystemd {
    mount: std::path::PathBuf,
    calls: Mutex<Vec<(&'static str, String, Vec<crate::systemd_unit::UnitProperty>)>>,
}

impl FakeSystemd {
    fn dir(&self, unit: &str) -> std::path::PathBuf {
        let expanded = CgroupName::parse_systemd(unit).to_systemd();
        self.mount.join(expanded.trim_start_matches('/'))
    }

    fn calls(&self, op: &str) -> Vec<String> {
        self.calls
            .lock()
            .iter()
            .filter(|(o, _, _)| *o == op)
            .map(|(_, u, _)| u.clone())
            .collect()
    }

    fn props(&self, op: &str, unit: &str) -> Vec<crate::systemd_unit::UnitProperty> {
        self.calls
            .lock()
            .iter()
            .rev()
            .find(|(o, u, _)| *o == op && u == unit)
            .map(|(_, _, p)| p.clone())
            .unwrap_or_default()
    }
}

impl SystemdUnits for FakeSystemd {
    fn start_slice(
        &self,
        unit: &str,
        props: &[crate::systemd_unit::UnitProperty],
    ) -> Result<(), CgroupError> {
        self.calls
            .lock()
            .push(("start", unit.into(), props.to_vec()));
        std::fs::create_dir_all(self.dir(unit)).map_err(|source| CgroupError::Io {
            path: self.dir(unit),
            source,
        })
    }

    fn set_properties(
        &self,
        unit: &str,
        props: &[crate::systemd_unit::UnitProperty],
    ) -> Result<(), CgroupError> {
        self.calls.lock().push(("set", unit.into(), props.to_vec()));
        Ok(())
    }

    fn stop_slice(&self, unit: &str) -> Result<(), CgroupError> {
        self.calls.lock().push(("stop", unit.into(), vec![]));
        let _ = std::fs::remove_dir_all(self.dir(unit));
        Ok(())
    }
}

#[tokio::test]
async fn systemd_driver_makes_every_tier_a_slice_with_its_limits() {
    use crate::systemd_unit::PropertyValue;
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v2(mnt.path(), &["cpu", "memory", "pids"]);
    let fake = Arc::new(FakeSystemd {
        mount: mnt.path().to_path_buf(),
        calls: Mutex::new(vec![]),
    });
    let mut c = cfg("/");
    c.cgroup_driver = CgroupDriver::Systemd;
    let cm = ContainerManager::with_units(c, subs, vec![], Some(fake.clone()));
    assert!(cm.manages_cgroups());
    let b = Arc::new(pod(
        serde_json::json!({"metadata": {"uid": "b-1"}, "spec": {"containers": [
        {"name": "a", "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "64Mi"}}}]}}),
    ));
    cm.set_active_pods(Arc::new({
        let b = b.clone();
        move || vec![b.clone()]
    }));
    cm.start().await.expect("start");
    assert_eq!(
        fake.calls("start"),
        [
            "kubepods.slice",
            "kubepods-burstable.slice",
            "kubepods-besteffort.slice"
        ]
    );
    // Node allocatable on kubepods.slice: 8Gi - 1Gi kube-reserved, 3.5 CPUs.
    let kubepods = fake.props("start", "kubepods.slice");
    assert!(
        kubepods
            .iter()
            .any(|p| p.name == "MemoryMax" && p.value == PropertyValue::U64(7 << 30))
    );
    assert!(
        kubepods
            .iter()
            .any(|p| p.name == "Wants" && p.value == PropertyValue::Strs(vec!["-.slice".into()]))
    );
    assert_eq!(
        read(mnt.path().join("kubepods.slice/memory.max")),
        "7516192768"
    );
    // The Burstable tier's weight is its pods' requests (250m -> 256 shares -> 10).
    assert_eq!(
        read(
            mnt.path()
                .join("kubepods.slice/kubepods-burstable.slice/cpu.weight")
        ),
        "10"
    );
    cm.ensure_exists(&b).await.expect("ensure");
    let unit = "kubepods-burstable-podb_1.slice";
    let props = fake.props("start", unit);
    assert!(
        props
            .iter()
            .any(|p| p.name == "MemoryMax" && p.value == PropertyValue::U64(64 << 20))
    );
    assert!(
        props
            .iter()
            .any(|p| p.name == "CPUWeight" && p.value == PropertyValue::U64(10))
    );
    assert_eq!(read(fake.dir(unit).join("memory.max")), "67108864");
    assert_eq!(
        cm.cgroup_parent(&b),
        format!("/kubepods.slice/kubepods-burstable.slice/{unit}")
    );
    // Adopted, not created again, when it exists.
    cm.ensure_exists(&b).await.expect("ensure again");
    assert_eq!(fake.calls("start").iter().filter(|u| *u == unit).count(), 1);
    cm.destroy("b-1").await.expect("destroy");
    assert_eq!(fake.calls("stop"), [unit]);
    assert!(!fake.dir(unit).exists());
}
