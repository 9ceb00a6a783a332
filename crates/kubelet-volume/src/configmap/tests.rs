//! Tests of ConfigMap volumes, and the fake [`VolumeHost`] the plugin tests
//! share.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod,
    PodSpec, Secret, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;

use super::*;
use crate::ObjectError;
use crate::host::TokenRequest;

/// A [`VolumeHost`] over maps, recording token requests.
#[derive(Default)]
pub(crate) struct FakeHost {
    pub config_maps: Mutex<BTreeMap<String, ConfigMap>>,
    pub secrets: Mutex<BTreeMap<String, Secret>>,
    pub pods: Mutex<BTreeMap<String, Pod>>,
    pub token_requests: Mutex<Vec<TokenRequest>>,
    pub allocatable: BTreeMap<String, Quantity>,
}

impl FakeHost {
    pub fn put_config_map(&self, name: &str, data: &[(&str, &str)]) {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        self.config_maps.lock().insert(name.into(), cm);
    }

    pub fn put_secret(&self, name: &str, data: &[(&str, &str)]) {
        let s = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        };
        self.secrets.lock().insert(name.into(), s);
    }
}

#[async_trait::async_trait]
impl VolumeHost for FakeHost {
    async fn get_config_map(&self, _ns: &str, name: &str) -> Result<ConfigMap, ObjectError> {
        self.config_maps
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| ObjectError::NotFound {
                resource: "configmaps",
                name: name.into(),
            })
    }
    async fn get_secret(&self, _ns: &str, name: &str) -> Result<Secret, ObjectError> {
        self.secrets
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| ObjectError::NotFound {
                resource: "secrets",
                name: name.into(),
            })
    }
    async fn get_service_account_token(&self, req: &TokenRequest) -> Result<String, ObjectError> {
        self.token_requests.lock().push(req.clone());
        Ok(format!("token-for-{}", req.service_account))
    }
    async fn get_persistent_volume_claim(
        &self,
        _: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError> {
        Err(ObjectError::Other(format!("no claim {name}")))
    }
    async fn get_persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        Err(ObjectError::Other(format!("no volume {name}")))
    }
    fn node_name(&self) -> String {
        "node".into()
    }
    fn node_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
        self.allocatable.clone()
    }
    fn pod(&self, uid: &str) -> Option<Pod> {
        self.pods.lock().get(uid).cloned()
    }
}

/// A pod `ns/p` with UID `uid-1` and one container `c`.
pub(crate) fn test_pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "c".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The mode bits of `p`.
pub(crate) fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").mode() & 0o7777
}

/// The content of `p`.
pub(crate) fn read(p: &Path) -> String {
    std::fs::read_to_string(p).expect("read")
}

fn volume(source: ConfigMapVolumeSource) -> Volume {
    Volume {
        name: "cfg".into(),
        config_map: Some(source),
        ..Default::default()
    }
}

fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
    KeyToPath {
        key: key.into(),
        path: path.into(),
        mode,
    }
}

async fn set_up_cm(
    host: &FakeHost,
    pods: &Path,
    source: ConfigMapVolumeSource,
) -> Result<MountedVolume> {
    let pod = test_pod();
    let v = volume(source);
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

fn source(name: &str) -> ConfigMapVolumeSource {
    ConfigMapVolumeSource {
        name: name.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn all_keys_with_default_mode_in_the_plugin_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    host.put_config_map("cm", &[("a", "alpha"), ("b", "beta")]);
    host.config_maps
        .lock()
        .get_mut("cm")
        .expect("cm")
        .binary_data = Some(BTreeMap::from([(
        "bin".to_string(),
        ByteString(vec![0, 1, 2]),
    )]));

    let m = set_up_cm(&host, tmp.path(), source("cm"))
        .await
        .expect("set up");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    assert_eq!(
        m,
        MountedVolume {
            name: "cfg".into(),
            plugin: names::CONFIG_MAP,
            host_path: dir.clone(),
            read_only: true,
            refresh: true,
            block: false,
        }
    );
    assert_eq!(mode(&dir), 0o777);
    assert_eq!(read(&dir.join("a")), "alpha");
    assert_eq!(read(&dir.join("b")), "beta");
    assert_eq!(std::fs::read(dir.join("bin")).expect("bin"), vec![0, 1, 2]);
    assert_eq!(mode(&dir.join("a")), 0o644);
    assert!(std::fs::read_link(dir.join("..data")).is_ok());
    let meta = tmp
        .path()
        .join("uid-1/plugins/kubernetes.io~empty-dir/wrapped_cfg");
    assert_eq!(mode(&meta), 0o750);
    assert_eq!(mode(&meta.join("ready")), 0o600);
}

#[tokio::test]
async fn items_choose_keys_paths_and_modes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    host.put_config_map("cm", &[("a", "alpha"), ("b", "beta")]);
    let src = ConfigMapVolumeSource {
        items: Some(vec![
            item("a", "x/a.txt", Some(0o600)),
            item("b", "b", None),
        ]),
        default_mode: Some(0o400),
        ..source("cm")
    };
    set_up_cm(&host, tmp.path(), src).await.expect("set up");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    assert_eq!(read(&dir.join("x/a.txt")), "alpha");
    assert_eq!(mode(&dir.join("x/a.txt")), 0o600);
    assert_eq!(mode(&dir.join("b")), 0o400);
    assert!(!dir.join("a").exists());
}

#[tokio::test]
async fn missing_config_map_fails_unless_optional() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    let err = set_up_cm(&host, tmp.path(), source("nope"))
        .await
        .expect_err("missing");
    assert_eq!(err.to_string(), "configmaps \"nope\" not found");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    assert!(!dir.exists());

    let optional = ConfigMapVolumeSource {
        optional: Some(true),
        items: Some(vec![item("a", "a", None)]),
        ..source("nope")
    };
    set_up_cm(&host, tmp.path(), optional)
        .await
        .expect("optional");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".."))
        .collect();
    names.sort();
    assert!(names.is_empty(), "{names:?}");
    assert!(std::fs::read_link(dir.join("..data")).is_ok());
}

#[tokio::test]
async fn missing_item_key_fails_unless_optional() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    host.put_config_map("cm", &[("a", "alpha")]);
    let src = ConfigMapVolumeSource {
        items: Some(vec![item("a", "a", None), item("zz", "zz", None)]),
        ..source("cm")
    };
    let err = set_up_cm(&host, tmp.path(), src.clone())
        .await
        .expect_err("missing key");
    assert_eq!(
        err.to_string(),
        "configmap references non-existent config key: zz"
    );
    let src = ConfigMapVolumeSource {
        optional: Some(true),
        ..src
    };
    set_up_cm(&host, tmp.path(), src).await.expect("optional");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    assert_eq!(read(&dir.join("a")), "alpha");
    assert!(!dir.join("zz").exists());
}

#[tokio::test]
async fn set_up_again_refreshes_content() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    host.put_config_map("cm", &[("a", "1"), ("old", "o")]);
    set_up_cm(&host, tmp.path(), source("cm"))
        .await
        .expect("set up");
    host.put_config_map("cm", &[("a", "2"), ("new", "n")]);
    set_up_cm(&host, tmp.path(), source("cm"))
        .await
        .expect("refresh");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    assert_eq!(read(&dir.join("a")), "2");
    assert_eq!(read(&dir.join("new")), "n");
    assert!(std::fs::symlink_metadata(dir.join("old")).is_err());
}

/// Unmounts every mount under a directory when dropped, so a failed test
/// leaves no tmpfs behind.
pub(crate) struct UnmountOnDrop(pub std::path::PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let Ok(root) = std::fs::canonicalize(&self.0) else {
            return;
        };
        let mut points: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| Path::new(p).starts_with(&root))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = crate::mount::unmount_blocking(Path::new(p));
        }
    }
}

/// The super options of the mount at `p` (`rw,size=...,mode=...`).
pub(crate) fn mount_options(p: &Path) -> String {
    let root = std::fs::canonicalize(p).expect("canonicalize");
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    info.lines()
        .rev()
        .find(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == root))
        .and_then(|l| l.rsplit(' ').next())
        .expect("mounted")
        .to_string()
}

#[tokio::test]
async fn nested_mount_points_are_created_in_the_volume() {
    use k8s_openapi::api::core::v1::VolumeMount;
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    host.put_config_map("cm", &[("a", "1")]);
    let mut pod = test_pod();
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    };
    pod.spec.as_mut().expect("spec").containers[0].volume_mounts = Some(vec![
        mount("cfg", "/etc/cfg/"),
        mount("other", "/etc/cfg/sub"),
        mount("deeper", "/etc/cfg/sub/deeper"),
        mount("sibling", "/etc/cfgx"),
    ]);
    let v = volume(source("cm"));
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
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    assert!(dir.join("sub").is_dir());
    assert!(!dir.join("sub/deeper").exists());
    assert!(!dir.join("x").exists());
    assert_eq!(read(&dir.join("a")), "1");
}

#[tokio::test]
async fn a_failed_write_tears_the_volume_down() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    host.put_config_map("cm", &[("a", "1")]);
    let src = ConfigMapVolumeSource {
        items: Some(vec![item("a", "..a", None)]),
        ..source("cm")
    };
    let err = set_up_cm(&host, tmp.path(), src)
        .await
        .expect_err("invalid path");
    assert_eq!(
        err.to_string(),
        "invalid path: must not start with '..': ..a"
    );
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    assert!(!dir.exists());
    let meta = tmp
        .path()
        .join("uid-1/plugins/kubernetes.io~empty-dir/wrapped_cfg");
    assert!(!meta.exists());
}

#[tokio::test]
async fn a_failed_update_keeps_the_files_a_running_pod_sees() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let host = FakeHost::default();
    host.put_config_map("cm", &[("a", "1"), ("b", "2")]);
    set_up_cm(&host, tmp.path(), source("cm"))
        .await
        .expect("first set-up");
    let dir = tmp.path().join("uid-1/volumes/kubernetes.io~configmap/cfg");
    // "b" is a file in the payload and a directory of "b/c": the write of
    // the new payload fails half way.
    let src = ConfigMapVolumeSource {
        items: Some(vec![item("a", "b", None), item("b", "b/c", None)]),
        ..source("cm")
    };
    set_up_cm(&host, tmp.path(), src)
        .await
        .expect_err("the payload cannot be written");
    assert_eq!(read(&dir.join("a")), "1", "the old payload is still served");
    assert_eq!(read(&dir.join("b")), "2");
    let payloads = std::fs::read_dir(&dir)
        .expect("volume dir")
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("..") && n != "..data"
        })
        .count();
    assert_eq!(payloads, 1, "no partial payload directory left behind");
}
