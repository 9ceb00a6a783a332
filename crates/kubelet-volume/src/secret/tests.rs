//! Tests of Secret volumes.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{KeyToPath, SecretVolumeSource, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::configmap::tests::{FakeHost, UnmountOnDrop, mode, mount_options, read, test_pod};

fn source(name: &str) -> SecretVolumeSource {
    SecretVolumeSource {
        secret_name: Some(name.into()),
        ..Default::default()
    }
}

async fn set_up_secret(
    host: &FakeHost,
    pods: &Path,
    source: SecretVolumeSource,
) -> Result<MountedVolume> {
    let pod = test_pod();
    let v = Volume {
        name: "sec".into(),
        secret: Some(source),
        ..Default::default()
    };
    set_up(
        host,
        SetUpRequest {
            pod: &pod,
            volume: &v,
            pods_dir: pods,
        },
    )
    .await
}

#[tokio::test]
async fn secret_is_written_into_a_tmpfs_mounted_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = FakeHost {
        allocatable: BTreeMap::from([("memory".to_string(), Quantity("64Mi".into()))]),
        ..Default::default()
    };
    host.put_secret("s", &[("user", "admin"), ("pass", "hunter2")]);

    let m = set_up_secret(&host, tmp.path(), source("s"))
        .await
        .expect("set up");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~secret/sec");
    assert_eq!(m.host_path, dir);
    assert_eq!(m.plugin, names::SECRET);
    assert!(m.read_only && m.refresh);
    assert_eq!(
        crate::mount::fs_type(&dir).await.expect("type").as_deref(),
        Some("tmpfs")
    );
    let opts = mount_options(&dir);
    assert!(opts.contains("size=65536k"), "{opts}");
    assert_eq!(mode(&dir), 0o1777);
    assert_eq!(read(&dir.join("user")), "admin");
    assert_eq!(read(&dir.join("pass")), "hunter2");
    assert_eq!(mode(&dir.join("pass")), 0o644);
    let ready = tmp
        .path()
        .join("uid-1/plugins/kubernetes.io~empty-dir/wrapped_sec/ready");
    assert_eq!(mode(&ready), 0o600);

    // Set up again: refreshed in place, no second tmpfs stacked.
    host.put_secret("s", &[("user", "root")]);
    set_up_secret(&host, tmp.path(), source("s"))
        .await
        .expect("refresh");
    assert_eq!(read(&dir.join("user")), "root");
    assert!(std::fs::symlink_metadata(dir.join("pass")).is_err());
    let canonical = std::fs::canonicalize(&dir).expect("canonical");
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let count = info
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| Path::new(p) == canonical)
        })
        .count();
    assert_eq!(count, 1);
}

#[tokio::test]
async fn items_modes_and_optional_rules() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = FakeHost::default();
    host.put_secret("s", &[("user", "admin")]);
    let items = vec![
        KeyToPath {
            key: "user".into(),
            path: "creds/user".into(),
            mode: Some(0o400),
        },
        KeyToPath {
            key: "missing".into(),
            path: "missing".into(),
            mode: None,
        },
    ];
    let src = SecretVolumeSource {
        items: Some(items),
        default_mode: Some(0o440),
        ..source("s")
    };
    let err = set_up_secret(&host, tmp.path(), src.clone())
        .await
        .expect_err("missing key");
    assert_eq!(
        err.to_string(),
        "references non-existent secret key: missing"
    );

    let src = SecretVolumeSource {
        optional: Some(true),
        ..src
    };
    set_up_secret(&host, tmp.path(), src)
        .await
        .expect("optional");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~secret/sec");
    assert_eq!(read(&dir.join("creds/user")), "admin");
    assert_eq!(mode(&dir.join("creds/user")), 0o400);
    assert!(!dir.join("missing").exists());
}

#[tokio::test]
async fn missing_secret_fails_unless_optional() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = FakeHost::default();
    let err = set_up_secret(&host, tmp.path(), source("gone"))
        .await
        .expect_err("missing");
    assert_eq!(err.to_string(), "secrets \"gone\" not found");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~secret/sec");
    assert!(!dir.exists(), "nothing mounted for a failed fetch");

    let src = SecretVolumeSource {
        optional: Some(true),
        ..source("gone")
    };
    set_up_secret(&host, tmp.path(), src)
        .await
        .expect("optional");
    assert!(std::fs::read_link(dir.join("..data")).is_ok());
    assert_eq!(
        crate::mount::fs_type(&dir).await.expect("type").as_deref(),
        Some("tmpfs")
    );
}

#[tokio::test]
async fn tmpfs_is_sized_to_the_pod_memory_limit_when_smaller() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = FakeHost {
        allocatable: BTreeMap::from([("memory".to_string(), Quantity("64Mi".into()))]),
        ..Default::default()
    };
    host.put_secret("s", &[("k", "v")]);
    let mut pod = test_pod();
    pod.spec.as_mut().expect("spec").containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity("16Mi".into()),
        )])),
        ..Default::default()
    });
    let v = Volume {
        name: "sec".into(),
        secret: Some(source("s")),
        ..Default::default()
    };
    set_up(
        &host,
        SetUpRequest {
            pod: &pod,
            volume: &v,
            pods_dir: tmp.path(),
        },
    )
    .await
    .expect("set up");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~secret/sec");
    let opts = mount_options(&dir);
    assert!(opts.contains("size=16384k"), "{opts}");
}

#[tokio::test]
async fn a_failed_write_unmounts_and_removes_the_tmpfs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = FakeHost::default();
    host.put_secret("s", &[("k", "v")]);
    let src = SecretVolumeSource {
        items: Some(vec![KeyToPath {
            key: "k".into(),
            path: "/abs".into(),
            mode: None,
        }]),
        ..source("s")
    };
    let err = set_up_secret(&host, tmp.path(), src)
        .await
        .expect_err("invalid path");
    assert_eq!(err.to_string(), "invalid path: must be relative path: /abs");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~secret/sec");
    assert!(!dir.exists());
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let root = std::fs::canonicalize(tmp.path()).expect("canonical");
    assert!(
        !info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|p| Path::new(p).starts_with(&root)),
        "nothing left mounted"
    );
}
