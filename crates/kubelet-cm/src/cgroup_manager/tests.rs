use super::*;

const MOUNTINFO_V1: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
";

#[test]
fn mountinfo_v1_maps_controllers_to_the_shortest_mount() {
    let s = CgroupSubsystems::from_mountinfo(MOUNTINFO_V1, "");
    assert!(!s.is_v2(), "a hybrid host's unified mount is not v2 mode");
    assert_eq!(s.mount_points["cpu"], PathBuf::from("/sys/fs/cgroup/cpu"));
    assert_eq!(
        s.mount_points["cpuacct"],
        PathBuf::from("/sys/fs/cgroup/cpuacct")
    );
    assert_eq!(
        s.mount_points["systemd"],
        PathBuf::from("/sys/fs/cgroup/systemd")
    );
    assert!(!s.mount_points.contains_key("xattr"));
    assert!(!s.mount_points.contains_key("rw"));
}

#[test]
fn mountinfo_v2_maps_every_controller_to_the_unified_mount() {
    let info = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
    let s = CgroupSubsystems::from_mountinfo(info, "cpuset cpu io memory pids\n");
    assert!(s.is_v2());
    assert_eq!(s.mount_points.len(), 5);
    assert_eq!(s.mount_points["memory"], PathBuf::from("/sys/fs/cgroup"));
}

#[test]
fn v1_update_writes_each_controller_and_unlimited_values() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v1(mnt.path(), &["cpu", "memory", "pids", "hugetlb"]);
    let m = CgroupManager::new(
        subs,
        CgroupDriver::Cgroupfs,
        vec!["2MB".into(), "1GB".into()],
    );
    let name = CgroupName::root().child("kubepods");
    let rc = ResourceConfig {
        memory: Some(-1),
        cpu_shares: Some(1024),
        cpu_quota: Some(-1),
        cpu_period: Some(100_000),
        pids_limit: Some(-1),
        hugepage_limit: BTreeMap::from([(2 << 20, 4 << 20)]),
    };
    m.create(&name, &rc).expect("create");
    let read = |p: &str| std::fs::read_to_string(mnt.path().join(p)).expect(p);
    assert_eq!(read("cpu/kubepods/cpu.shares"), "1024");
    assert_eq!(read("cpu/kubepods/cpu.cfs_quota_us"), "-1");
    assert_eq!(read("memory/kubepods/memory.limit_in_bytes"), "-1");
    assert_eq!(read("pids/kubepods/pids.max"), "max");
    assert_eq!(
        read("hugetlb/kubepods/hugetlb.2MB.limit_in_bytes"),
        (4 << 20).to_string()
    );
    assert_eq!(
        read("hugetlb/kubepods/hugetlb.1GB.limit_in_bytes"),
        "0",
        "omitted sizes get 0"
    );
    // Unset fields leave the kernel's value alone.
    m.update(
        &name,
        &ResourceConfig {
            cpu_shares: Some(2),
            ..Default::default()
        },
    )
    .expect("update");
    assert_eq!(read("cpu/kubepods/cpu.shares"), "2");
    assert_eq!(read("memory/kubepods/memory.limit_in_bytes"), "-1");
}

#[test]
fn v1_existence_needs_every_managed_controller() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let subs = CgroupSubsystems::v1(mnt.path(), &["cpu", "memory", "devices"]);
    let m = CgroupManager::new(subs, CgroupDriver::Cgroupfs, vec![]);
    let name = CgroupName::root().child("kubepods");
    std::fs::create_dir_all(mnt.path().join("cpu/kubepods")).expect("mkdir");
    let err = m.validate(&name).expect_err("memory is missing");
    assert!(err.to_string().contains("memory/kubepods"), "{err}");
    std::fs::create_dir_all(mnt.path().join("memory/kubepods")).expect("mkdir");
    assert!(m.exists(&name), "devices is not a managed controller");
}

#[test]
fn v1_cpuset_is_initialised_from_its_parent() {
    let mnt = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(mnt.path().join("cpuset")).expect("mkdir");
    std::fs::write(mnt.path().join("cpuset/cpuset.cpus"), "0-1\n").expect("write");
    std::fs::write(mnt.path().join("cpuset/cpuset.mems"), "0\n").expect("write");
    let m = CgroupManager::new(
        CgroupSubsystems::v1(mnt.path(), &["cpuset"]),
        CgroupDriver::Cgroupfs,
        vec![],
    );
    m.create(
        &CgroupName::root().child("a").child("b"),
        &ResourceConfig::default(),
    )
    .expect("create");
    let read = |p: &str| std::fs::read_to_string(mnt.path().join(p)).expect(p);
    assert_eq!(read("cpuset/a/cpuset.cpus"), "0-1");
    assert_eq!(read("cpuset/a/b/cpuset.mems"), "0");
}

#[test]
fn v2_quota_without_limit_is_max() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let m = CgroupManager::new(
        CgroupSubsystems::v2(mnt.path(), &["cpu", "memory", "pids"]),
        CgroupDriver::Cgroupfs,
        vec![],
    );
    let name = CgroupName::root().child("x");
    let rc = ResourceConfig {
        cpu_quota: Some(-1),
        cpu_period: Some(100_000),
        memory: Some(-1),
        pids_limit: Some(50),
        ..Default::default()
    };
    m.create(&name, &rc).expect("create");
    let read = |p: &str| std::fs::read_to_string(mnt.path().join(p)).expect(p);
    assert_eq!(read("x/cpu.max"), "max 100000");
    assert_eq!(read("x/memory.max"), "max");
    assert_eq!(read("x/pids.max"), "50");
    assert_eq!(m.pids(&name), Vec::<i32>::new());
    std::fs::write(mnt.path().join("x/cgroup.procs"), "12\n7\n").expect("write");
    std::fs::create_dir(mnt.path().join("x/c")).expect("mkdir");
    std::fs::write(mnt.path().join("x/c/cgroup.procs"), "9\n").expect("write");
    assert_eq!(m.pids(&name), vec![7, 9, 12]);
}
