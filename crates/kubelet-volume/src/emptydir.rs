//! emptyDir volumes (upstream `pkg/volume/emptydir`): a directory of mode
//! 0777 in the pod's volume directory; `medium: Memory` mounts a tmpfs on
//! it, sized as upstream's `calculateEmptyDirMemorySize` (the smallest of
//! node allocatable memory, the pod's memory limit and the volume's
//! `sizeLimit`); `medium: HugePages[-<size>]` mounts a hugetlbfs with the
//! page size the pod's containers request. A "ready" marker in
//! `<pod>/plugins/kubernetes.io~empty-dir/<name>/ready` makes set-up after
//! a kubelet restart keep the data and skip the fsGroup walk.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kubelet_types::quantity::{Quantity, parse_bytes};

use crate::mount::{blocking, fs_type_blocking, is_mount_point_blocking, mount_blocking};
use crate::plugin::{MountedVolume, SetUpRequest, names};
use crate::{Error, Result, VolumeHost};

/// The volume directory's mode (upstream `perm`).
const PERM: u32 = 0o777;

/// A storage medium (upstream `v1.StorageMedium`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Medium {
    Default,
    Memory,
    /// `HugePages` (None) or `HugePages-<size>`.
    HugePages(Option<String>),
}

impl Medium {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "" => Self::Default,
            "Memory" => Self::Memory,
            "HugePages" => Self::HugePages(None),
            _ => match s.strip_prefix("HugePages-") {
                Some(size) => Self::HugePages(Some(size.to_string())),
                None => return Err(Error::Invalid(format!("unknown storage medium {s:?}"))),
            },
        })
    }
}

/// Sets up the emptyDir volume `req.volume`.
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let Some(src) = req.volume.empty_dir.as_ref() else {
        return Err(Error::Invalid(format!(
            "volume {:?} is not an emptyDir volume",
            req.volume.name
        )));
    };
    let medium_name = src.medium.clone().unwrap_or_default();
    let medium = Medium::parse(&medium_name)?;
    let uid = kubelet_types::pod::uid(req.pod).to_string();
    let dir = req.dir(names::EMPTY_DIR);
    let meta = meta_dir(req.pods_dir, &uid, &req.volume.name);
    let size = match medium {
        Medium::Memory => {
            memory_size_limit(&host.node_allocatable(), req.pod, src.size_limit.as_ref())
        }
        _ => None,
    };
    let page_size = match &medium {
        Medium::HugePages(size) => Some(page_size_mount_option(
            &medium_name,
            size.as_deref(),
            req.pod,
        )?),
        _ => None,
    };
    let (d, m) = (dir.clone(), meta.clone());
    let fresh =
        blocking(move || set_up_blocking(&d, &m, &medium, size, page_size.as_deref())).await?;
    if fresh {
        // Upstream ignores the outcome of the fsGroup walk for emptyDir.
        if let Err(e) = crate::ownership::set_volume_ownership(&dir, req.fs_group(), None).await {
            tracing::warn!(volume = %req.volume.name, error = %e, "setting emptyDir ownership failed");
        }
        let m = meta.clone();
        blocking(move || set_ready(&m)).await?;
    }
    Ok(MountedVolume {
        name: req.volume.name.clone(),
        plugin: names::EMPTY_DIR,
        host_path: dir,
        read_only: false,
        refresh: false,
        block: false,
    })
}

/// `<pods_dir>/<uid>/plugins/kubernetes.io~empty-dir/<name>` (upstream
/// `getMetaDir`).
pub fn meta_dir(pods_dir: &Path, uid: &str, name: &str) -> PathBuf {
    pods_dir
        .join(uid)
        .join("plugins")
        .join(names::EMPTY_DIR)
        .join(name)
}

/// The set-up proper; false when the volume was already ready.
fn set_up_blocking(
    dir: &Path,
    meta: &Path,
    medium: &Medium,
    size: Option<i64>,
    page_size: Option<&str>,
) -> Result<bool> {
    let mounted = is_mount_point_blocking(dir)?;
    if is_ready(meta) {
        match medium {
            Medium::Memory | Medium::HugePages(_) if mounted => return Ok(false),
            Medium::Default if dir.is_dir() => return Ok(false),
            _ => {
                tracing::warn!(dir = %dir.display(), "emptyDir ready file exists but the volume does not; removing the ready file");
                let _ = crate::removeall::remove_all_one_filesystem_blocking(meta);
            }
        }
    }
    setup_dir(dir)?;
    match medium {
        Medium::Default => {}
        Medium::Memory => {
            let is_tmpfs = mounted && fs_type_blocking(dir)?.as_deref() == Some("tmpfs");
            if !is_tmpfs {
                let mut opts = Vec::new();
                if let Some(size) = size {
                    opts.push(format!("size={size}"));
                }
                if crate::mount::tmpfs_noswap_supported() {
                    opts.push("noswap".to_string());
                }
                mount_blocking("tmpfs", dir, "tmpfs", &opts.join(","))?;
            }
        }
        Medium::HugePages(_) => {
            let is_huge = mounted && fs_type_blocking(dir)?.as_deref() == Some("hugetlbfs");
            if !is_huge {
                mount_blocking("nodev", dir, "hugetlbfs", page_size.unwrap_or_default())?;
            }
        }
    }
    Ok(true)
}

/// Upstream `setupDir`: create with 0777 and chmod if the umask took bits.
fn setup_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PERM)
        .create(dir)
        .map_err(Error::io("create emptyDir", dir))?;
    let md = std::fs::symlink_metadata(dir).map_err(Error::io("lstat", dir))?;
    if md.permissions().mode() & 0o777 != PERM {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PERM))
            .map_err(Error::io("chmod emptyDir", dir))?;
    }
    Ok(())
}

fn is_ready(meta: &Path) -> bool {
    std::fs::symlink_metadata(meta.join("ready")).is_ok_and(|m| m.is_file())
}

/// Upstream `volumeutil.SetReady`: the meta dir (0750) and an empty
/// `ready` file (0600).
fn set_ready(meta: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(meta)
        .map_err(Error::io("create directory", meta))?;
    let ready = meta.join("ready");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&ready)
        .map_err(Error::io("create", &ready))?;
    std::fs::set_permissions(&ready, std::fs::Permissions::from_mode(0o600))
        .map_err(Error::io("chmod", &ready))
}

/// Removes the emptyDir ready marker named `meta_name` of the pod whose
/// volume directory is `dir` (`<pod>/volumes/<plugin>/<name>`): `<name>`
/// for an emptyDir, `wrapped_<name>` for the volumes upstream sets up
/// through a wrapped emptyDir (configMap, secret, downwardAPI, projected).
/// Upstream's emptyDir TearDown does this first.
pub(crate) fn remove_ready_blocking(dir: &Path, meta_name: &str) -> Result<()> {
    let Some(pod_dir) = dir.parent().and_then(Path::parent).and_then(Path::parent) else {
        return Ok(());
    };
    let meta = pod_dir
        .join("plugins")
        .join(names::EMPTY_DIR)
        .join(meta_name);
    crate::removeall::remove_all_one_filesystem_blocking(&meta)
}

/// Upstream `calculateEmptyDirMemorySize`: node allocatable memory, lowered
/// to the pod's memory limit and then to the volume's `sizeLimit` when
/// those are positive and smaller. None when nothing positive is known
/// (the kernel's default of half the RAM applies).
pub fn memory_size_limit(
    allocatable: &BTreeMap<String, ApiQuantity>,
    pod: &Pod,
    size_limit: Option<&ApiQuantity>,
) -> Option<i64> {
    let mut size = allocatable
        .get("memory")
        .and_then(|q| parse_bytes(&q.0))
        .unwrap_or(0);
    if let Some(limit) = pod_memory_limit(pod)
        && limit > 0
        && limit <= size
    {
        size = limit;
    }
    if let Some(limit) = size_limit.and_then(|q| parse_bytes(&q.0))
        && limit > 0
        && limit <= size
    {
        size = limit;
    }
    (size > 0).then_some(size)
}

fn memory_limit(c: &Container) -> Option<i64> {
    let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
    parse_bytes(&q.0)
}

/// The pod's memory limit as its cgroup gets it (upstream
/// `ResourceConfigForPod`): only when every container declares one; the
/// larger of the app containers plus sidecars and of each init container
/// plus the sidecars started before it, plus the pod overhead.
fn pod_memory_limit(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let mut sidecars = 0i64;
    let mut init_max = 0i64;
    for c in inits {
        let limit = memory_limit(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars = sidecars.saturating_add(limit);
            init_max = init_max.max(sidecars);
        } else {
            init_max = init_max.max(sidecars.saturating_add(limit));
        }
    }
    let mut apps = sidecars;
    for c in &spec.containers {
        apps = apps.saturating_add(memory_limit(c)?);
    }
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get("memory"))
        .and_then(|q| parse_bytes(&q.0))
        .unwrap_or(0);
    Some(apps.max(init_max).saturating_add(overhead))
}

/// Upstream `getPageSizeMountOption`: `pagesize=<size>` from the huge page
/// requests of the pod's containers.
fn page_size_mount_option(medium: &str, medium_size: Option<&str>, pod: &Pod) -> Result<String> {
    let canonical = |s: &str| Quantity::parse(s).ok().map(|q| (q.value(), q.to_string()));
    let wanted = match medium_size {
        Some(s) => Some(canonical(s).ok_or_else(|| {
            Error::Invalid(format!(
                "HugePageSizeFromMedium: medium {medium:?} is not a valid huge page size"
            ))
        })?),
        None => None,
    };
    let spec = pod.spec.as_ref();
    let containers = spec
        .map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .into_iter()
        .flatten();
    let mut found: Option<(i64, String)> = None;
    for c in containers {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        for name in requests.into_iter().flat_map(|r| r.keys()) {
            let Some(size) = name.strip_prefix("hugepages-") else {
                continue;
            };
            let current = canonical(size).ok_or_else(|| {
                Error::Invalid(format!(
                    "size not specified or invalid in huge page resource name {name:?}"
                ))
            })?;
            match &wanted {
                None => {
                    if found.as_ref().is_some_and(|f| f.0 != current.0) {
                        return Err(Error::Invalid(format!(
                            "medium: {medium} can't be used if container requests multiple huge page sizes"
                        )));
                    }
                    found = Some(current);
                }
                Some(w) if w.0 == current.0 => found = Some(current),
                Some(_) => {}
            }
        }
    }
    let Some((_, size)) = found else {
        return Err(Error::Invalid(format!(
            "medium {medium}: hugePages storage requested, but there is no resource request for huge pages"
        )));
    };
    Ok(format!("pagesize={size}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::fake::FakeHost;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, ResourceRequirements, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some("uid-1".into()),
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container(memory_limit: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            resources: memory_limit.map(|m| ResourceRequirements {
                limits: Some(BTreeMap::from([("memory".into(), ApiQuantity(m.into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn volume(medium: Option<&str>, size_limit: Option<&str>) -> Volume {
        Volume {
            name: "cache".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: medium.map(Into::into),
                size_limit: size_limit.map(|s| ApiQuantity(s.into())),
            }),
            ..Default::default()
        }
    }

    fn host(memory: &str) -> FakeHost {
        FakeHost {
            allocatable: BTreeMap::from([("memory".into(), ApiQuantity(memory.into()))]),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn default_medium_is_a_0777_directory_and_set_up_again_keeps_data() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (p, v) = (pod(vec![container(None)]), volume(None, None));
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: tmp.path(),
        };
        let m = set_up(&host("1Gi"), req).await.expect("set up");
        let dir = tmp
            .path()
            .join("uid-1/volumes/kubernetes.io~empty-dir/cache");
        assert_eq!(m.host_path, dir);
        assert_eq!(m.plugin, names::EMPTY_DIR);
        assert_eq!(
            std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o7777,
            0o777
        );
        assert!(
            tmp.path()
                .join("uid-1/plugins/kubernetes.io~empty-dir/cache/ready")
                .is_file()
        );
        std::fs::write(dir.join("data"), b"kept").expect("write");
        // A restarted kubelet sets the volume up again.
        set_up(&host("1Gi"), req).await.expect("set up again");
        assert_eq!(std::fs::read(dir.join("data")).expect("read"), b"kept");
        crate::plugin::tear_down(names::EMPTY_DIR, &dir)
            .await
            .expect("tear down");
        assert!(!dir.exists());
        assert!(
            !tmp.path()
                .join("uid-1/plugins/kubernetes.io~empty-dir/cache")
                .exists()
        );
    }

    #[tokio::test]
    async fn memory_medium_is_a_tmpfs_of_the_size_limit_kept_across_set_ups() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (p, v) = (
            pod(vec![container(None)]),
            volume(Some("Memory"), Some("3Mi")),
        );
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: tmp.path(),
        };
        let m = set_up(&host("1Gi"), req).await.expect("set up");
        assert_eq!(
            crate::mount::fs_type(&m.host_path)
                .await
                .expect("fs")
                .as_deref(),
            Some("tmpfs")
        );
        let mode = std::fs::metadata(&m.host_path)
            .expect("root")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o7777,
            0o1777,
            "tmpfs root as upstream mounts it (no mode option)"
        );
        let st = nix::sys::statvfs::statvfs(&m.host_path).expect("statvfs");
        assert_eq!(st.blocks() * st.fragment_size(), 3 << 20);
        std::fs::write(m.host_path.join("data"), b"kept").expect("write");
        set_up(&host("1Gi"), req).await.expect("set up again");
        assert_eq!(
            std::fs::read(m.host_path.join("data")).expect("read"),
            b"kept"
        );
        let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let canon = std::fs::canonicalize(&m.host_path).expect("canonical");
        let n = info
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(canon.to_str().expect("utf8")))
            .count();
        assert_eq!(n, 1, "not mounted twice");
        crate::plugin::tear_down(names::EMPTY_DIR, &m.host_path)
            .await
            .expect("tear down");
        assert!(!m.host_path.exists());
    }

    #[test]
    fn memory_size_is_the_smallest_of_allocatable_pod_limit_and_size_limit() {
        let alloc = BTreeMap::from([("memory".to_string(), ApiQuantity("1Gi".into()))]);
        let q = |s: &str| ApiQuantity(s.into());
        let unlimited = pod(vec![container(Some("100Mi")), container(None)]);
        assert_eq!(memory_size_limit(&alloc, &unlimited, None), Some(1 << 30));
        let limited = pod(vec![container(Some("100Mi")), container(Some("28Mi"))]);
        assert_eq!(memory_size_limit(&alloc, &limited, None), Some(128 << 20));
        assert_eq!(
            memory_size_limit(&alloc, &limited, Some(&q("64Mi"))),
            Some(64 << 20)
        );
        assert_eq!(
            memory_size_limit(&alloc, &limited, Some(&q("2Gi"))),
            Some(128 << 20)
        );
        assert_eq!(memory_size_limit(&BTreeMap::new(), &limited, None), None);
    }

    #[tokio::test]
    async fn bad_media_are_refused_with_upstream_messages() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = pod(vec![container(None)]);
        let v = volume(Some("Disk"), None);
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: tmp.path(),
        };
        let e = set_up(&host("1Gi"), req).await.expect_err("unknown");
        assert_eq!(e.to_string(), "unknown storage medium \"Disk\"");
        let v = volume(Some("HugePages"), None);
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: tmp.path(),
        };
        let e = set_up(&host("1Gi"), req)
            .await
            .expect_err("no hugepage requests");
        assert_eq!(
            e.to_string(),
            "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"
        );
    }

    #[test]
    fn huge_page_size_comes_from_the_containers_requests() {
        let with = |names: &[&str]| {
            let mut c = container(None);
            c.resources = Some(ResourceRequirements {
                requests: Some(
                    names
                        .iter()
                        .map(|n| ((*n).to_string(), ApiQuantity("4Mi".into())))
                        .collect(),
                ),
                ..Default::default()
            });
            pod(vec![c])
        };
        let p = with(&["hugepages-2Mi"]);
        assert_eq!(
            page_size_mount_option("HugePages", None, &p).expect("size"),
            "pagesize=2Mi"
        );
        assert_eq!(
            page_size_mount_option("HugePages-2Mi", Some("2Mi"), &p).expect("size"),
            "pagesize=2Mi"
        );
        assert!(page_size_mount_option("HugePages-1Gi", Some("1Gi"), &p).is_err());
        let p = with(&["hugepages-2Mi", "hugepages-1Gi"]);
        assert_eq!(
            page_size_mount_option("HugePages", None, &p)
                .expect_err("two sizes")
                .to_string(),
            "medium: HugePages can't be used if container requests multiple huge page sizes"
        );
    }
}
