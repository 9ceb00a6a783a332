//! Tests of projected volumes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
    ObjectFieldSelector, PodSecurityContext, ProjectedVolumeSource, SecretProjection,
    SecurityContext, ServiceAccountTokenProjection, Volume, VolumeProjection,
};

use super::*;
use crate::configmap::tests::{FakeHost, UnmountOnDrop, mode, read, test_pod};

/// The sources of a `kube-api-access-*` volume, as the apiserver adds them.
fn kube_api_access() -> ProjectedVolumeSource {
    ProjectedVolumeSource {
        default_mode: Some(0o644),
        sources: Some(vec![
            VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    path: "token".into(),
                    expiration_seconds: Some(3607),
                    audience: None,
                }),
                ..Default::default()
            },
            VolumeProjection {
                config_map: Some(ConfigMapProjection {
                    name: "kube-root-ca.crt".into(),
                    items: Some(vec![KeyToPath {
                        key: "ca.crt".into(),
                        path: "ca.crt".into(),
                        mode: None,
                    }]),
                    optional: None,
                }),
                ..Default::default()
            },
            VolumeProjection {
                downward_api: Some(DownwardAPIProjection {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "namespace".into(),
                        field_ref: Some(ObjectFieldSelector {
                            api_version: Some("v1".into()),
                            field_path: "metadata.namespace".into(),
                        }),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            },
        ]),
    }
}

async fn set_up_projected(
    host: &FakeHost,
    pods: &Path,
    pod: &Pod,
    source: ProjectedVolumeSource,
) -> Result<MountedVolume> {
    let v = Volume {
        name: "kube-api-access-x".into(),
        projected: Some(source),
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

fn host_with_ca() -> FakeHost {
    let host = FakeHost::default();
    host.put_config_map("kube-root-ca.crt", &[("ca.crt", "CA")]);
    host
}

#[tokio::test]
async fn kube_api_access_layout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = host_with_ca();
    let pod = test_pod();
    let m = set_up_projected(&host, tmp.path(), &pod, kube_api_access())
        .await
        .expect("set up");
    let dir = tmp
        .path()
        .join("uid-1/volumes/kubernetes.io~projected/kube-api-access-x");
    assert_eq!(m.host_path, dir);
    assert_eq!(m.plugin, names::PROJECTED);
    assert!(m.read_only && m.refresh);
    assert_eq!(
        crate::mount::fs_type(&dir).await.expect("type").as_deref(),
        Some("tmpfs")
    );
    assert_eq!(read(&dir.join("token")), "token-for-default");
    assert_eq!(read(&dir.join("ca.crt")), "CA");
    assert_eq!(read(&dir.join("namespace")), "ns");
    for f in ["token", "ca.crt", "namespace"] {
        assert_eq!(mode(&dir.join(f)), 0o644, "{f}");
        assert_eq!(
            std::fs::read_link(dir.join(f)).expect("link"),
            Path::new("..data").join(f)
        );
    }
    assert_eq!(
        host.token_requests.lock().clone(),
        vec![TokenRequest {
            namespace: "ns".into(),
            service_account: "default".into(),
            audience: String::new(),
            expiration_seconds: 3607,
            pod_name: "p".into(),
            pod_uid: "uid-1".into(),
        }]
    );
}

#[tokio::test]
async fn token_is_private_with_fs_group_and_owned_by_the_one_user() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = host_with_ca();
    let mut pod = test_pod();
    let spec = pod.spec.as_mut().expect("spec");
    spec.service_account_name = Some("builder".into());
    spec.security_context = Some(PodSecurityContext {
        fs_group: Some(2000),
        run_as_user: Some(1000),
        ..Default::default()
    });
    set_up_projected(&host, tmp.path(), &pod, kube_api_access())
        .await
        .expect("set up");
    let dir = tmp
        .path()
        .join("uid-1/volumes/kubernetes.io~projected/kube-api-access-x");
    assert_eq!(read(&dir.join("token")), "token-for-builder");
    assert_eq!(mode(&dir.join("token")), 0o600);
    assert_eq!(
        std::fs::metadata(dir.join("token")).expect("stat").uid(),
        1000
    );
    assert_eq!(mode(&dir.join("ca.crt")), 0o644);
    assert_ne!(
        std::fs::metadata(dir.join("ca.crt")).expect("stat").uid(),
        1000
    );
}

#[tokio::test]
async fn missing_sources_fail_unless_optional() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _unmount = UnmountOnDrop(tmp.path().to_path_buf());
    let host = host_with_ca();
    host.put_secret("s", &[("k", "v")]);
    let source = |optional: Option<bool>| ProjectedVolumeSource {
        default_mode: Some(0o440),
        sources: Some(vec![
            VolumeProjection {
                config_map: Some(ConfigMapProjection {
                    name: "nocm".into(),
                    optional,
                    ..Default::default()
                }),
                ..Default::default()
            },
            VolumeProjection {
                secret: Some(SecretProjection {
                    name: "nosecret".into(),
                    optional,
                    ..Default::default()
                }),
                ..Default::default()
            },
            VolumeProjection {
                secret: Some(SecretProjection {
                    name: "s".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
    };
    let pod = test_pod();
    let err = set_up_projected(&host, tmp.path(), &pod, source(None))
        .await
        .expect_err("missing");
    assert_eq!(
        err.to_string(),
        "[configmaps \"nocm\" not found, secrets \"nosecret\" not found]"
    );
    let dir = tmp
        .path()
        .join("uid-1/volumes/kubernetes.io~projected/kube-api-access-x");
    assert!(!dir.exists());

    set_up_projected(&host, tmp.path(), &pod, source(Some(true)))
        .await
        .expect("optional");
    assert_eq!(read(&dir.join("k")), "v");
    assert_eq!(mode(&dir.join("k")), 0o440);
}

fn with_users(pod_user: Option<i64>, users: &[Option<i64>]) -> Pod {
    let mut pod = test_pod();
    let spec = pod.spec.as_mut().expect("spec");
    spec.security_context = pod_user.map(|u| PodSecurityContext {
        run_as_user: Some(u),
        ..Default::default()
    });
    spec.containers = users
        .iter()
        .map(|u| Container {
            name: "c".into(),
            security_context: u.map(|u| SecurityContext {
                run_as_user: Some(u),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    pod
}

#[test]
fn fs_user_is_the_single_effective_run_as_user() {
    assert_eq!(fs_user_from(&with_users(Some(5), &[None, None])), Some(5));
    assert_eq!(
        fs_user_from(&with_users(Some(5), &[Some(7), Some(7)])),
        Some(7)
    );
    assert_eq!(fs_user_from(&with_users(Some(5), &[Some(7), None])), None);
    assert_eq!(fs_user_from(&with_users(None, &[Some(7), None])), None);
    assert_eq!(fs_user_from(&with_users(None, &[])), None);
    let mut pod = with_users(None, &[Some(7)]);
    pod.spec.as_mut().expect("spec").init_containers = Some(vec![Container {
        name: "init".into(),
        security_context: Some(SecurityContext {
            run_as_user: Some(8),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    assert_eq!(fs_user_from(&pod), None);
}

#[test]
fn token_request_defaults() {
    let pod = test_pod();
    let r = token_request(&pod, Some("vault"), None);
    assert_eq!(r.audience, "vault");
    assert_eq!(r.expiration_seconds, DEFAULT_EXPIRATION_SECONDS);
    assert_eq!(r.service_account, "default");
}
