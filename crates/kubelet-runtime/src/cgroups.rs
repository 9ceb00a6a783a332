//! Pod cgroup removal for the cgroupfs driver (upstream
//! `cm/pod_container_manager_linux.go` `Destroy`). The runtime creates
//! `<cgroupRoot>/kubepods[/<qos>]/pod<uid>` under every controller when it
//! starts the sandbox but never removes it; once a pod is gone its (empty)
//! cgroup is removed here, on cgroup v1 and v2 alike. With the systemd driver
//! the slices belong to systemd, which collects empty ones.

use std::path::Path;

use tracing::debug;

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
}
