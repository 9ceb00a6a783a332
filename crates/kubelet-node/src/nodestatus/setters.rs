//! The node status setters (upstream `pkg/kubelet/nodestatus/setters.go`):
//! addresses, capacity and allocatable, nodeInfo, daemonEndpoints, images and
//! the four conditions with upstream reasons and messages.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_types::quantity::{parse_bytes, parse_milli_cpu};

use super::machine::MachineInfo;
use kubelet_config::ClusterConfig;

/// Upstream `nodeStatusMaxImages`.
pub const MAX_IMAGES: usize = 50;
/// Upstream `maxNamesPerImageInNodeStatus`.
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// A byte count in the canonical binary-SI form of `resource.Quantity`
/// (`16Gi`, `8148552Ki`, or plain bytes when no suffix divides it).
pub fn binary_si(bytes: u64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    for (suffix, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        let unit = 1u64 << shift;
        if bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

fn cpu_quantity(milli: i64) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// `capacity`: cpu, memory, pods, ephemeral-storage and hugepages-*.
pub fn capacity(m: &MachineInfo, max_pods: u32) -> BTreeMap<String, Quantity> {
    let mut c = BTreeMap::new();
    c.insert("cpu".into(), Quantity(m.num_cores.to_string()));
    // Hugepages preallocated are not available as regular memory.
    let huge: u64 = m.hugepages.iter().map(|(_, b)| b).sum();
    c.insert(
        "memory".into(),
        Quantity(binary_si(m.memory_bytes.saturating_sub(huge))),
    );
    c.insert("pods".into(), Quantity(max_pods.to_string()));
    c.insert(
        "ephemeral-storage".into(),
        Quantity(binary_si(m.root_fs_bytes)),
    );
    for (kb, bytes) in &m.hugepages {
        c.insert(
            format!("hugepages-{}", binary_si(kb * 1024)),
            Quantity(binary_si(*bytes)),
        );
    }
    c
}

/// A threshold (`100Mi` or `10%`) against a capacity, in bytes.
fn threshold_bytes(t: &str, capacity: i64) -> i64 {
    match t.strip_suffix('%') {
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        Some(p) => p
            .trim()
            .parse::<f64>()
            .map_or(0, |p| (capacity as f64 * p / 100.0) as i64),
        None => parse_bytes(t).unwrap_or(0),
    }
}

/// `allocatable`: capacity minus kubeReserved, systemReserved and the hard
/// eviction thresholds (upstream `GetNodeAllocatableAbsolute` + `hardEvictionReservation`).
pub fn allocatable(
    capacity: &BTreeMap<String, Quantity>,
    cfg: &ClusterConfig,
) -> BTreeMap<String, Quantity> {
    let reserved = |name: &str, parse: fn(&str) -> Option<i64>| -> i64 {
        [&cfg.kube_reserved, &cfg.system_reserved]
            .iter()
            .filter_map(|m| m.get(name))
            .filter_map(|q| parse(q))
            .sum()
    };
    let mut out = capacity.clone();
    if let Some(cpu) = capacity.get("cpu").and_then(|q| parse_milli_cpu(&q.0)) {
        out.insert(
            "cpu".into(),
            Quantity(cpu_quantity(
                (cpu - reserved("cpu", parse_milli_cpu)).max(0),
            )),
        );
    }
    for (resource, signal) in [
        ("memory", "memory.available"),
        ("ephemeral-storage", "nodefs.available"),
    ] {
        let Some(cap) = capacity.get(resource).and_then(|q| parse_bytes(&q.0)) else {
            continue;
        };
        let eviction = cfg
            .eviction_hard
            .get(signal)
            .map_or(0, |t| threshold_bytes(t, cap));
        let left = (cap - reserved(resource, parse_bytes) - eviction).max(0);
        out.insert(
            resource.into(),
            Quantity(binary_si(u64::try_from(left).unwrap_or(0))),
        );
    }
    out
}

/// `addresses`: InternalIP(s), then Hostname.
pub fn addresses(ips: &[IpAddr], hostname: &str) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = ips
        .iter()
        .map(|ip| NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        })
        .collect();
    out.push(NodeAddress {
        type_: "Hostname".into(),
        address: hostname.to_string(),
    });
    out
}

/// `nodeInfo.containerRuntimeVersion` (upstream `VersionInfo`): the runtime's
/// name and its version as upstream's `newRuntimeVersion` reads and prints it
/// (`containerd://1.6.20` for `1.6.20~ds1`), or `Unknown` when that cannot
/// read it.
pub fn container_runtime_version(runtime_name: &str, runtime_version: &str) -> String {
    let version = crate::version::parse_runtime_version(runtime_version)
        .map_or_else(|_| "Unknown".to_string(), |v| v.to_string());
    format!("{runtime_name}://{version}")
}

/// `nodeInfo`.
pub fn node_info(m: &MachineInfo, runtime_version: &str, kubelet_version: &str) -> NodeSystemInfo {
    NodeSystemInfo {
        machine_id: m.machine_id.clone(),
        system_uuid: m.system_uuid.clone(),
        boot_id: m.boot_id.clone(),
        kernel_version: m.kernel_version.clone(),
        os_image: m.os_image.clone(),
        container_runtime_version: runtime_version.to_string(),
        kubelet_version: kubelet_version.to_string(),
        kube_proxy_version: String::new(),
        operating_system: "linux".into(),
        architecture: m.architecture.clone(),
        ..Default::default()
    }
}

/// `images`: the 50 largest, each with up to 5 names (digests first, then tags).
/// Equal sizes are ordered by first name: the runtime lists images in no set
/// order, and an order that moved would read as a status change.
pub fn images(list: &[cri::pb::Image]) -> Vec<ContainerImage> {
    let first_name = |i: &cri::pb::Image| i.repo_digests.iter().chain(&i.repo_tags).next().cloned();
    let mut sorted: Vec<&cri::pb::Image> = list.iter().collect();
    sorted.sort_by_cached_key(|i| (std::cmp::Reverse(i.size), first_name(i)));
    sorted
        .into_iter()
        .filter(|i| !i.repo_digests.is_empty() || !i.repo_tags.is_empty())
        .take(MAX_IMAGES)
        .map(|i| {
            let names: Vec<String> = i
                .repo_digests
                .iter()
                .chain(&i.repo_tags)
                .take(MAX_NAMES_PER_IMAGE)
                .cloned()
                .collect();
            ContainerImage {
                names: Some(names),
                size_bytes: i64::try_from(i.size).ok(),
            }
        })
        .collect()
}

/// Resource pressure the eviction manager reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressures {
    /// `MemoryPressure`.
    pub memory: bool,
    /// `DiskPressure`.
    pub disk: bool,
    /// `PIDPressure`.
    pub pid: bool,
}

impl Pressures {
    /// Reads `p` once.
    pub fn of(p: &dyn crate::NodePressure) -> Self {
        Self {
            memory: p.memory_pressure(),
            disk: p.disk_pressure(),
            pid: p.pid_pressure(),
        }
    }
}

fn pressure_condition(
    ty: &'static str,
    under: bool,
    yes: (&'static str, &'static str),
    no: (&'static str, &'static str),
) -> (&'static str, &'static str, &'static str, String) {
    let (status, (reason, message)) = if under { ("True", yes) } else { ("False", no) };
    (ty, status, reason, message.to_string())
}

/// Upstream `errors.NewAggregate(errs).Error()`: one message as it is,
/// several (repeats dropped) as `[a, b]`.
pub fn aggregate_message(errors: &[String]) -> String {
    let mut seen: Vec<&str> = vec![];
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The kubelet's conditions given why it is not ready (empty: ready) and
/// the pressure the eviction manager reports (upstream
/// `MemoryPressureCondition`, `DiskPressureCondition`,
/// `PIDPressureCondition`, `ReadyCondition`). Transition times move only
/// when a condition's status changes.
pub fn conditions(
    previous: &[NodeCondition],
    not_ready: &[String],
    pressure: Pressures,
    now: &Time,
) -> Vec<NodeCondition> {
    let ready_msg = if not_ready.is_empty() {
        "kubelet is posting ready status".to_string()
    } else {
        aggregate_message(not_ready)
    };
    let wanted = [
        pressure_condition(
            "MemoryPressure",
            pressure.memory,
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
        ),
        pressure_condition(
            "DiskPressure",
            pressure.disk,
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ),
        pressure_condition(
            "PIDPressure",
            pressure.pid,
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
        ),
        if not_ready.is_empty() {
            ("Ready", "True", "KubeletReady", ready_msg)
        } else {
            ("Ready", "False", "KubeletNotReady", ready_msg)
        },
    ];
    wanted
        .into_iter()
        .map(|(ty, status, reason, message)| {
            let transition = previous
                .iter()
                .find(|p| p.type_ == ty && p.status == status)
                .and_then(|p| p.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            NodeCondition {
                type_: ty.into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(transition),
            }
        })
        .collect()
}

/// `daemonEndpoints`.
pub fn daemon_endpoints(port: u16) -> NodeDaemonEndpoints {
    NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: i32::from(port),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_of_equal_size_are_ordered_by_first_name() {
        let image = |name: &str, size: u64| cri::pb::Image {
            repo_tags: vec![name.to_string()],
            size,
            ..Default::default()
        };
        let mut list: Vec<cri::pb::Image> = (0..60)
            .map(|n| image(&format!("example.com/i{n:02}:1"), 7))
            .collect();
        list.push(image("example.com/big:1", 9));
        let forward = images(&list);
        list.reverse();
        assert_eq!(
            images(&list),
            forward,
            "the runtime's order does not matter"
        );
        let names: Vec<String> = forward
            .iter()
            .map(|i| i.names.clone().unwrap_or_default().join(","))
            .collect();
        assert_eq!(names.len(), MAX_IMAGES);
        assert_eq!(names[0], "example.com/big:1");
        assert_eq!(names[1], "example.com/i00:1");
        assert_eq!(names[49], "example.com/i48:1");
    }

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(binary_si(16 << 30), "16Gi");
        assert_eq!(binary_si(8_344_117_248), "8148552Ki");
        assert_eq!(binary_si(1025), "1025");
        assert_eq!(binary_si(2048 * 1024), "2Mi");
    }

    #[test]
    fn allocatable_subtracts_reserved_and_eviction() {
        let m = MachineInfo {
            num_cores: 4,
            memory_bytes: 8 << 30,
            root_fs_bytes: 100 << 30,
            ..Default::default()
        };
        let cap = capacity(&m, 110);
        let mut cfg = kubelet_config::cluster::resolve(&Default::default(), &Default::default())
            .expect("defaults");
        cfg.kube_reserved.insert("cpu".into(), "100m".into());
        cfg.system_reserved.insert("memory".into(), "1Gi".into());
        let a = allocatable(&cap, &cfg);
        assert_eq!(a["cpu"].0, "3900m");
        assert_eq!(
            a["memory"].0,
            binary_si((8 << 30) - (1 << 30) - (100 << 20))
        );
        assert_eq!(
            a["ephemeral-storage"].0,
            binary_si((100u64 << 30) - (10u64 << 30))
        );
        assert_eq!(a["pods"].0, "110");
    }

    #[test]
    fn the_runtime_version_is_normalised_as_upstream() {
        for (raw, want) in [
            ("1.6.20~ds1", "containerd://1.6.20"),
            ("1.7.0-rc.1", "containerd://1.7.0-rc.1"),
            ("v1.7.2", "containerd://1.7.2"),
            ("2.0.0+unknown", "containerd://2.0.0+unknown"),
            ("garbage", "containerd://Unknown"),
        ] {
            assert_eq!(container_runtime_version("containerd", raw), want, "{raw}");
        }
    }

    #[test]
    fn pressure_conditions_as_upstream() {
        let t0 = Time(jiff::Timestamp::from_second(1000).expect("t"));
        let t1 = Time(jiff::Timestamp::from_second(2000).expect("t"));
        let c0 = conditions(&[], &[], Pressures::default(), &t0);
        let all = Pressures {
            memory: true,
            disk: true,
            pid: true,
        };
        let c1 = conditions(&c0, &[], all, &t1);
        let get = |ty: &str| {
            c1.iter()
                .find(|c| c.type_ == ty)
                .expect("condition")
                .clone()
        };
        for (ty, reason, message) in [
            (
                "MemoryPressure",
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (
                "DiskPressure",
                "KubeletHasDiskPressure",
                "kubelet has disk pressure",
            ),
            (
                "PIDPressure",
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
        ] {
            let c = get(ty);
            assert_eq!(c.status, "True", "{ty}");
            assert_eq!(c.reason.as_deref(), Some(reason));
            assert_eq!(c.message.as_deref(), Some(message));
            assert_eq!(c.last_transition_time, Some(t1.clone()), "{ty} changed");
        }
        assert_eq!(get("Ready").status, "True");
    }

    #[test]
    fn the_ready_message_is_upstreams_aggregate() {
        assert_eq!(aggregate_message(&["a".into()]), "a");
        assert_eq!(
            aggregate_message(&["a".into(), "b".into(), "a".into()]),
            "[a, b]"
        );
    }

    #[test]
    fn ready_condition_reasons_and_transitions() {
        let t0 = Time(jiff::Timestamp::from_second(1000).expect("t"));
        let t1 = Time(jiff::Timestamp::from_second(2000).expect("t"));
        let c0 = conditions(&[], &[], Pressures::default(), &t0);
        let ready = c0.iter().find(|c| c.type_ == "Ready").expect("ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("True", Some("KubeletReady"))
        );
        let c1 = conditions(
            &c0,
            &["container runtime is down".into()],
            Pressures::default(),
            &t1,
        );
        let nr = c1.iter().find(|c| c.type_ == "Ready").expect("ready");
        assert_eq!(nr.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(nr.last_transition_time, Some(t1.clone()));
        let mem = c1
            .iter()
            .find(|c| c.type_ == "MemoryPressure")
            .expect("mem");
        assert_eq!(
            mem.last_transition_time,
            Some(t0),
            "unchanged status keeps its transition time"
        );
        assert_eq!(mem.last_heartbeat_time, Some(t1));
    }
}
