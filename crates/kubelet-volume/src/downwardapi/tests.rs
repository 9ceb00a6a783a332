//! Tests of downward API volumes.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, ObjectFieldSelector, ResourceFieldSelector,
    Volume,
};

use super::*;
use crate::configmap::tests::{FakeHost, UnmountOnDrop, mode, read, test_pod};

fn field(path: &str, field_path: &str, mode: Option<i32>) -> DownwardAPIVolumeFile {
    DownwardAPIVolumeFile {
        path: path.into(),
        field_ref: Some(ObjectFieldSelector {
            field_path: field_path.into(),
            ..Default::default()
        }),
        mode,
        ..Default::default()
    }
}

fn resource(path: &str, container: &str) -> DownwardAPIVolumeFile {
    DownwardAPIVolumeFile {
        path: path.into(),
        resource_field_ref: Some(ResourceFieldSelector {
            container_name: Some(container.into()),
            resource: "limits.cpu".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn set_up_dapi(
    host: &FakeHost,
    pods: &Path,
    pod: &Pod,
    items: Vec<DownwardAPIVolumeFile>,
) -> Result<MountedVolume> {
    let v = Volume {
        name: "info".into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(items),
            default_mode: None,
        }),
        ..Default::default()
    };
    set_up(
        host,
        SetUpRequest {
            pod,
            volume: &v,
            pods_dir: pods,
        },
    )
    .await
}

fn labelled(labels: &[(&str, &str)]) -> Pod {
    let mut pod = test_pod();
    pod.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    pod
}

#[tokio::test]
async fn pod_fields_are_written_with_modes_into_a_tmpfs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = FakeHost::default();
    let pod = labelled(&[("app", "web")]);
    let items = vec![
        field("name", "metadata.name", None),
        field("ns", "metadata.namespace", Some(0o400)),
        field("meta/uid", "metadata.uid", None),
        field("./app", "metadata.labels['app']", None),
    ];
    let m = set_up_dapi(&host, tmp.path(), &pod, items)
        .await
        .expect("set up");
    let dir = tmp
        .path()
        .join("uid-1/volumes/kubernetes.io~downward-api/info");
    assert_eq!(m.host_path, dir);
    assert_eq!(m.plugin, names::DOWNWARD_API);
    assert!(m.read_only && m.refresh);
    assert_eq!(
        crate::mount::fs_type(&dir).await.expect("type").as_deref(),
        Some("tmpfs")
    );
    assert_eq!(read(&dir.join("name")), "p");
    assert_eq!(read(&dir.join("ns")), "ns");
    assert_eq!(read(&dir.join("meta/uid")), "uid-1");
    assert_eq!(read(&dir.join("app")), "web");
    assert_eq!(mode(&dir.join("name")), 0o644);
    assert_eq!(mode(&dir.join("ns")), 0o400);
}

#[tokio::test]
async fn labels_are_rewritten_when_the_pod_changes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = FakeHost::default();
    let pod = labelled(&[("a", "1")]);
    let items = || {
        vec![
            field("labels", "metadata.labels", None),
            field("a", "metadata.labels['a']", None),
        ]
    };
    set_up_dapi(&host, tmp.path(), &pod, items())
        .await
        .expect("set up");
    let dir = tmp
        .path()
        .join("uid-1/volumes/kubernetes.io~downward-api/info");
    assert_eq!(read(&dir.join("labels")), "a=\"1\"");
    let before = std::fs::read_link(dir.join("..data")).expect("..data");

    // The kubelet's pod has new labels; the request still carries the old.
    host.pods
        .lock()
        .insert("uid-1".into(), labelled(&[("a", "2"), ("b", "3")]));
    set_up_dapi(&host, tmp.path(), &pod, items())
        .await
        .expect("refresh");
    assert_eq!(read(&dir.join("a")), "2");
    assert_eq!(read(&dir.join("labels")), "a=\"2\"\nb=\"3\"");
    assert_ne!(
        std::fs::read_link(dir.join("..data")).expect("..data"),
        before
    );
}

#[test]
fn unknown_containers_are_upstream_errors_aggregated() {
    let pod = test_pod();
    let one = collect_data(&[resource("cpu", "x")], &pod, None, &BTreeMap::new())
        .expect_err("no container");
    assert_eq!(one.to_string(), "container x not found");
    let two = collect_data(
        &[
            resource("cpu", "x"),
            resource("cpu2", "y"),
            resource("cpu3", "x"),
        ],
        &pod,
        None,
        &BTreeMap::new(),
    )
    .expect_err("no containers");
    assert_eq!(
        two.to_string(),
        "[container x not found, container y not found]"
    );
}

#[test]
fn item_paths_are_cleaned() {
    use crate::configmap::clean as clean_path;
    assert_eq!(clean_path("./a//b/"), "a/b");
    assert_eq!(clean_path("a/../b"), "b");
    assert_eq!(clean_path("../a"), "../a");
    assert_eq!(clean_path("/../a"), "/a");
    assert_eq!(clean_path(""), ".");
}
