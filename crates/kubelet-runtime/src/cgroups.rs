//! The runtime manager's side of pod cgroups (upstream
//! `cm/pod_container_manager_linux.go` as `kuberuntime` and
//! `Kubelet.SyncPod`/`SyncTerminatedPod` use it): the pod's cgroup exists,
//! with the pod's resources, before its sandbox starts, and is removed
//! once the pod is gone. The kubelet's `kubelet_cm::ContainerManager` does
//! the work behind [`PodContainerManager`]; without one (tests, tools) the
//! runtime creates the path when it starts the sandbox and
//! [`remove_pod_cgroups`] removes the empty directories afterwards.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::CgroupDriver;
use kubelet_types::events::{EventType, Recorder, pod_ref};
use tracing::{debug, warn};

use crate::runtime_config::RuntimeConfig;
use crate::{Error, Result};

pub use kubelet_cm::PodContainerManager;

/// Where the cgroup hierarchies are mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// A shared [`PodContainerManager`] in [`RuntimeConfig`].
#[derive(Clone)]
pub struct PodCgroupsHandle(pub Arc<dyn PodContainerManager>);

impl std::fmt::Debug for PodCgroupsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodContainerManager")
    }
}

/// Makes sure the pod's cgroup exists before its sandbox is created
/// (upstream `Kubelet.SyncPod`: `pcm.EnsureExists`). A failure is a
/// `FailedCreatePodContainer` event and fails the sync.
pub async fn ensure_pod_cgroup(
    cfg: &RuntimeConfig,
    recorder: &dyn Recorder,
    p: &Pod,
) -> Result<()> {
    let Some(pcm) = &cfg.pod_cgroups else {
        return Ok(());
    };
    if let Err(e) = pcm.0.ensure_exists(p).await {
        recorder.event(
            &pod_ref(p, None),
            EventType::Warning,
            kubelet_cm::reason::FAILED_TO_CREATE_POD_CONTAINER,
            format!("unable to ensure pod container exists: {e}"),
        );
        return Err(Error::Io {
            context: format!(
                "failed to ensure that the pod: {} cgroups exist and are correctly applied",
                kubelet_types::pod::uid(p)
            ),
            source: std::io::Error::other(e),
        });
    }
    Ok(())
}

/// Removes a gone pod's cgroup: through the kubelet's container manager
/// (which kills what is left in it first), or, without one, the empty
/// cgroupfs directories. Failures are logged; the next cleanup retries.
pub async fn destroy_pod_cgroups(cfg: &RuntimeConfig, uid: &str) {
    if let Some(pcm) = &cfg.pod_cgroups {
        if let Err(e) = pcm.0.destroy(uid).await {
            warn!(pod.uid = uid, error = %e, "Failed to remove pod cgroup");
        }
        return;
    }
    if cfg.cgroup_driver != CgroupDriver::Cgroupfs {
        return;
    }
    let (root, uid) = (cfg.cgroup_root.clone(), uid.to_string());
    // Directory removal is blocking IO: off the async runtime.
    let removal = tokio::task::spawn_blocking(move || {
        remove_pod_cgroups(Path::new(CGROUP_MOUNT), &root, &uid)
    });
    if let Err(e) = removal.await {
        warn!(error = %e, "Pod cgroup removal did not run");
    }
}

/// Removes the pod's cgroup directories below every hierarchy mounted at
/// `mount_root` (normally `/sys/fs/cgroup`). Missing directories are fine;
/// ones still in use are left for a later attempt. Returns how many were removed.
pub fn remove_pod_cgroups(mount_root: &Path, cgroup_root: &str, uid: &str) -> usize {
    let root = cgroup_root.trim_matches('/');
    let rel: Vec<String> = ["", "burstable/", "besteffort/"]
        .iter()
        .map(|q| {
            let p = format!("kubepods/{q}pod{uid}");
            if root.is_empty() {
                p
            } else {
                format!("{root}/{p}")
            }
        })
        .collect();
    // v2 (or hybrid "unified") at the root, v1 controllers one level down.
    let mut bases = vec![mount_root.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(mount_root) {
        bases.extend(
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir()),
        );
    }
    let mut removed = 0;
    for base in &bases {
        for r in &rel {
            let dir = base.join(r);
            match std::fs::remove_dir(&dir) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => debug!(dir = %dir.display(), error = %e, "Pod cgroup not removed yet"),
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[test]
    fn removes_the_pod_cgroup_under_every_controller() {
        let mnt = tempfile::tempdir().expect("tempdir");
        for ctl in ["memory", "cpu", "pids"] {
            std::fs::create_dir_all(mnt.path().join(ctl).join("kubepods/besteffort/podU1"))
                .expect("mkdir");
            std::fs::create_dir_all(mnt.path().join(ctl).join("kubepods/besteffort/podOTHER"))
                .expect("mkdir");
        }
        // A busy cgroup (here: one with a child) is left alone.
        std::fs::create_dir_all(mnt.path().join("memory/kubepods/burstable/podU1/busy"))
            .expect("mkdir");
        assert_eq!(remove_pod_cgroups(mnt.path(), "/", "U1"), 3);
        assert!(!mnt.path().join("cpu/kubepods/besteffort/podU1").exists());
        assert!(mnt.path().join("cpu/kubepods/besteffort/podOTHER").exists());
        assert!(mnt.path().join("memory/kubepods/burstable/podU1").exists());
        assert_eq!(remove_pod_cgroups(mnt.path(), "/", "U1"), 0, "idempotent");
    }

    /// A pod container manager that records calls and fails on demand.
    #[derive(Default)]
    struct FakePcm {
        calls: Mutex<Vec<String>>,
        fail: bool,
    }

    #[async_trait::async_trait]
    impl PodContainerManager for FakePcm {
        async fn ensure_exists(
            &self,
            pod: &Pod,
        ) -> std::result::Result<(), kubelet_cm::CgroupError> {
            self.calls
                .lock()
                .push(format!("ensure {}", kubelet_types::pod::uid(pod)));
            if self.fail {
                return Err(kubelet_cm::CgroupError::NoMounts);
            }
            Ok(())
        }
        async fn destroy(&self, uid: &str) -> std::result::Result<(), kubelet_cm::CgroupError> {
            self.calls.lock().push(format!("destroy {uid}"));
            Ok(())
        }
        fn cgroup_parent(&self, _: &Pod) -> String {
            "/custom".into()
        }
    }

    #[derive(Default)]
    struct Events(Mutex<Vec<(String, String)>>);
    impl Recorder for Events {
        fn event(
            &self,
            _: &k8s_openapi::api::core::v1::ObjectReference,
            _: EventType,
            r: &str,
            m: String,
        ) {
            self.0.lock().push((r.to_string(), m));
        }
    }

    #[tokio::test]
    async fn pod_cgroup_goes_through_the_container_manager() {
        let p: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "a", "uid": "u1"},
            "spec": {"containers": [{"name": "c"}]}}))
            .expect("pod");
        let ev = Events::default();
        ensure_pod_cgroup(&RuntimeConfig::default(), &ev, &p)
            .await
            .expect("no manager: nothing to do");
        let ok = Arc::new(FakePcm::default());
        let cfg = RuntimeConfig {
            pod_cgroups: Some(PodCgroupsHandle(ok.clone())),
            ..Default::default()
        };
        ensure_pod_cgroup(&cfg, &ev, &p).await.expect("ensured");
        destroy_pod_cgroups(&cfg, "u1").await;
        assert_eq!(ok.calls.lock().clone(), vec!["ensure u1", "destroy u1"]);
        assert!(ev.0.lock().is_empty());
        let failing = RuntimeConfig {
            pod_cgroups: Some(PodCgroupsHandle(Arc::new(FakePcm {
                fail: true,
                ..Default::default()
            }))),
            ..Default::default()
        };
        let err = ensure_pod_cgroup(&failing, &ev, &p)
            .await
            .expect_err("fails the sync");
        assert!(
            err.to_string()
                .starts_with("failed to ensure that the pod: u1 cgroups exist"),
            "{err}"
        );
        assert_eq!(
            ev.0.lock().clone(),
            vec![(
                "FailedCreatePodContainer".to_string(),
                "unable to ensure pod container exists: failed to find cgroup mounts".to_string()
            )]
        );
    }
}
