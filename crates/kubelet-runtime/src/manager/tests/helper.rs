//! The `RuntimeHelper` seam: environment and mounts come from the kubelet,
//! and a configuration error leaves the container waiting with
//! `CreateContainerConfigError`.

use super::*;
use crate::{ContainerConfigError, RunContainerOptions, RuntimeHelper};
use k8s_openapi::api::core::v1::Secret;

struct Helper {
    fail: bool,
    seen_ips: parking_lot::Mutex<Vec<Vec<String>>>,
}

#[async_trait::async_trait]
impl RuntimeHelper for Helper {
    async fn generate_run_container_options(
        &self,
        _: &Pod,
        _: &Container,
        pod_ips: &[String],
    ) -> Result<RunContainerOptions, ContainerConfigError> {
        self.seen_ips.lock().push(pod_ips.to_vec());
        if self.fail {
            return Err(ContainerConfigError {
                message: "configmap \"cfg\" not found".into(),
            });
        }
        Ok(RunContainerOptions {
            envs: vec![cri::pb::KeyValue {
                key: "FROM_API".into(),
                value: "yes".into(),
            }],
            mounts: vec![cri::pb::Mount {
                container_path: "/etc/config".into(),
                host_path: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~configmap/cfg".into(),
                readonly: true,
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    async fn get_pull_secrets(&self, _: &Pod) -> Vec<Secret> {
        vec![]
    }
}

#[tokio::test]
async fn the_helpers_mounts_reach_the_container_and_its_errors_keep_it_waiting() {
    let dir = tempfile::tempdir().expect("tmp");
    let fake = FakeRuntime::new();
    fake.add_image("reg/busybox:1");
    let m = manager(&fake, dir.path());
    let helper = Arc::new(Helper {
        fail: false,
        seen_ips: parking_lot::Mutex::new(vec![]),
    });
    m.set_runtime_helper(helper.clone());
    let (s, r) = sync(&m, &pod("Always"), UNIX_EPOCH).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let c = fake.containers().pop().expect("created");
    assert_eq!(c.mounts.len(), 1);
    assert_eq!(c.mounts[0].container_path, "/etc/config");
    assert!(c.mounts[0].readonly);
    assert_eq!(s.containers.len(), 1);
    let ips = helper.seen_ips.lock().clone();
    assert_eq!(ips.len(), 1);
    assert!(
        !ips[0].is_empty(),
        "the new sandbox's IPs are passed: {ips:?}"
    );

    let fake = FakeRuntime::new();
    fake.add_image("reg/busybox:1");
    let m = manager(&fake, dir.path());
    m.set_runtime_helper(Arc::new(Helper {
        fail: true,
        seen_ips: parking_lot::Mutex::new(vec![]),
    }));
    let (_, r) = sync(&m, &pod("Always"), UNIX_EPOCH).await;
    assert_eq!(r.errors.len(), 1);
    assert_eq!(fake.call_count("CreateContainer"), 0);
    assert_eq!(
        m.waiting_reason("uid-1", "c"),
        Some((
            "CreateContainerConfigError",
            "configmap \"cfg\" not found".to_string()
        ))
    );
}
