//! The CRI endpoint, as kubeadm's preflight `CRICheck` and the kubelet's
//! start (`getRuntimeAndImageServices`, whose `validateServiceConnection`
//! calls `Version` on the v1 API) see it: reachable within
//! [`crate::RUNTIME_DEADLINE`], answering CRI v1, and ready by its `Status`
//! conditions as the kubelet's `updateRuntimeUp` reads them (`RuntimeReady`
//! false stops pods from starting; `NetworkReady` false keeps the node
//! NotReady). The cgroup driver comparison is in [`cgroup`].

mod cgroup;

use std::collections::HashMap;
use std::time::Duration;

use cri::{RemoteRuntime, RuntimeService, pb};
use kubelet_config::KubeletConfig;
use kubelet_types::CgroupDriver;

use crate::finding::{Finding, Kind};
use crate::report::Report;

/// Reports an unreachable runtime, its version, its conditions and a cgroup
/// driver mismatch.
pub(crate) async fn check(cfg: &KubeletConfig, report: &mut Report) {
    check_endpoint(
        &cfg.container_runtime_endpoint,
        cfg.image_service_endpoint.as_deref(),
        cfg.cgroup_driver,
        cfg.feature_gates
            .get("KubeletCgroupDriverFromCRI")
            .copied()
            .unwrap_or(true),
        crate::RUNTIME_DEADLINE,
        report,
    )
    .await;
}

/// What the runtime answered to a verbose `Status`.
struct StatusAnswer {
    conditions: Vec<pb::RuntimeCondition>,
    info: HashMap<String, String>,
}

/// The checks on one runtime endpoint (and the image endpoint, if another),
/// each CRI call under `deadline`.
pub(crate) async fn check_endpoint(
    endpoint: &str,
    image_endpoint: Option<&str>,
    driver: CgroupDriver,
    driver_from_cri: bool,
    deadline: Duration,
    report: &mut Report,
) {
    let field = "--container-runtime-endpoint";
    let rt = match RemoteRuntime::new(endpoint, None, deadline) {
        Ok(rt) => rt,
        Err(e) => {
            report.push(Finding::error(Kind::Runtime, e.to_string()).field(field));
            return;
        }
    };
    let version = match rt.version().await {
        Ok(v) => v,
        Err(e) => {
            report.push(
                Finding::error(Kind::Runtime, not_running(endpoint, "runtime", &e)).field(field),
            );
            return;
        }
    };
    report.push(Finding::info(Kind::Runtime, version_message(endpoint, &version)).field(field));
    if version.runtime_api_version != "v1" {
        report.push(
            Finding::error(
                Kind::Runtime,
                format!(
                    "the container runtime at {endpoint:?} reports CRI API version {:?}; the kubelet needs v1",
                    version.runtime_api_version
                ),
            )
            .field(field),
        );
    }
    match verbose_status(&rt, deadline).await {
        Ok(status) => {
            for f in condition_findings(&status.conditions) {
                report.push(f.field(field));
            }
            let from_cri = cgroup::from_runtime_config(&rt, deadline).await;
            report.push(cgroup::finding(
                driver,
                driver_from_cri,
                from_cri,
                &status.info,
            ));
        }
        Err(e) => {
            report.push(
                Finding::error(
                    Kind::Runtime,
                    format!("container runtime is not running: getting status of runtime: {e}"),
                )
                .field(field),
            );
        }
    }
    if let Some(image) = image_endpoint.filter(|i| !i.is_empty() && *i != endpoint) {
        check_image_endpoint(endpoint, image, deadline, report).await;
    }
}

/// `--image-service-endpoint`: the kubelet validates it with `ImageFsInfo`.
async fn check_image_endpoint(
    endpoint: &str,
    image: &str,
    deadline: Duration,
    report: &mut Report,
) {
    let field = "--image-service-endpoint";
    let rt = match RemoteRuntime::new(endpoint, Some(image), deadline) {
        Ok(rt) => rt,
        Err(e) => {
            report.push(Finding::error(Kind::Runtime, e.to_string()).field(field));
            return;
        }
    };
    match rt.image_fs_info().await {
        Ok(_) => report.push(
            Finding::info(
                Kind::Runtime,
                format!("image service at {image:?} answers CRI v1"),
            )
            .field(field),
        ),
        Err(e) => {
            report.push(Finding::error(Kind::Runtime, not_running(image, "image", &e)).field(field))
        }
    }
}

/// kubeadm's `CRICheck` wording around the kubelet's
/// `validateServiceConnection` one.
fn not_running(endpoint: &str, api: &str, e: &cri::CriError) -> String {
    format!(
        "container runtime is not running: validate CRI v1 {api} API for endpoint {endpoint:?}: {e}"
    )
}

/// `containerd 1.6.20~ds1, CRI v1 (unix:///run/containerd/containerd.sock)`.
fn version_message(endpoint: &str, v: &pb::VersionResponse) -> String {
    format!(
        "{} {}, CRI {} ({endpoint})",
        v.runtime_name, v.runtime_version, v.runtime_api_version
    )
}

/// `Status` with `verbose` set: the conditions, and the runtime's own info
/// (containerd puts its CRI plugin config under `config`).
async fn verbose_status(rt: &RemoteRuntime, deadline: Duration) -> Result<StatusAnswer, String> {
    let mut client = rt.runtime_client();
    let mut req = tonic::Request::new(pb::StatusRequest { verbose: true });
    req.set_timeout(deadline);
    match tokio::time::timeout(deadline, client.status(req)).await {
        Ok(Ok(resp)) => {
            let resp = resp.into_inner();
            Ok(StatusAnswer {
                conditions: resp.status.map(|s| s.conditions).unwrap_or_default(),
                info: resp.info,
            })
        }
        Ok(Err(status)) => {
            Err(cri::CriError::from_status_with_deadline("Status", status, deadline).to_string())
        }
        Err(_) => Err(format!("Status: no answer within {deadline:?}")),
    }
}

/// `RuntimeReady=false reason:X message:Y`, as the kubelet prints a condition.
fn describe(c: &pb::RuntimeCondition) -> String {
    format!(
        "{}={} reason:{} message:{}",
        c.r#type, c.status, c.reason, c.message
    )
}

/// The kubelet's `updateRuntimeUp`: a missing or false `RuntimeReady` is an
/// error (no pod can start), a missing or false `NetworkReady` a warning
/// (host-network pods still run, the node stays NotReady).
fn condition_findings(conditions: &[pb::RuntimeCondition]) -> Vec<Finding> {
    let find = |t: &str| conditions.iter().find(|c| c.r#type == t);
    let mut out = Vec::new();
    match find("RuntimeReady") {
        Some(c) if c.status => {}
        Some(c) => out.push(Finding::error(
            Kind::Runtime,
            format!("container runtime not ready: {}", describe(c)),
        )),
        None => out.push(Finding::error(
            Kind::Runtime,
            "container runtime not ready: the runtime reports no RuntimeReady condition",
        )),
    }
    match find("NetworkReady") {
        Some(c) if c.status => {}
        Some(c) => out.push(Finding::warning(
            Kind::Runtime,
            format!(
                "container runtime network not ready: {}; the node stays NotReady and only host-network pods start",
                describe(c)
            ),
        )),
        None => out.push(Finding::warning(
            Kind::Runtime,
            "container runtime network not ready: the runtime reports no NetworkReady condition",
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Severity;

    fn cond(t: &str, status: bool) -> pb::RuntimeCondition {
        pb::RuntimeCondition {
            r#type: t.into(),
            status,
            reason: if status {
                String::new()
            } else {
                "NetworkPluginNotReady".into()
            },
            message: if status {
                String::new()
            } else {
                "cni config uninitialized".into()
            },
        }
    }

    #[test]
    fn runtime_not_ready_is_an_error_and_network_not_ready_a_warning() {
        assert!(
            condition_findings(&[cond("RuntimeReady", true), cond("NetworkReady", true)])
                .is_empty()
        );
        let f = condition_findings(&[cond("RuntimeReady", true), cond("NetworkReady", false)]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(
            f[0].message.starts_with(
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni config uninitialized"
            ),
            "{}",
            f[0].message
        );
        let f = condition_findings(&[cond("RuntimeReady", false), cond("NetworkReady", true)]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].severity, Severity::Error);
        assert!(
            f[0].message
                .starts_with("container runtime not ready: RuntimeReady=false")
        );
        let f = condition_findings(&[]);
        assert_eq!(
            f.iter().map(|f| f.severity).collect::<Vec<_>>(),
            [Severity::Error, Severity::Warning]
        );
    }

    #[test]
    fn version_is_named_with_runtime_and_api() {
        let v = pb::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "containerd".into(),
            runtime_version: "1.6.20~ds1".into(),
            runtime_api_version: "v1".into(),
        };
        assert_eq!(
            version_message("unix:///run/containerd/containerd.sock", &v),
            "containerd 1.6.20~ds1, CRI v1 (unix:///run/containerd/containerd.sock)"
        );
    }

    #[test]
    fn a_socket_nobody_listens_on_is_an_error_within_the_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("none.sock");
        // A socket file with no listener: connect is refused at once.
        drop(std::os::unix::net::UnixListener::bind(&sock).expect("bind"));
        for path in [sock.clone(), dir.path().join("missing.sock")] {
            let endpoint = format!("unix://{}", path.display());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            let mut report = Report::default();
            let start = tokio::time::Instant::now();
            rt.block_on(check_endpoint(
                &endpoint,
                None,
                CgroupDriver::Cgroupfs,
                true,
                Duration::from_secs(2),
                &mut report,
            ));
            assert!(start.elapsed() < Duration::from_secs(3));
            assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
            let f = &report.findings[0];
            assert_eq!((f.kind, f.severity), (Kind::Runtime, Severity::Error));
            assert!(
                f.message.starts_with(&format!(
                    "container runtime is not running: validate CRI v1 runtime API for endpoint {endpoint:?}: "
                )),
                "{}",
                f.message
            );
        }
    }

    #[test]
    fn an_endpoint_that_is_not_a_unix_socket_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let mut report = Report::default();
        rt.block_on(check_endpoint(
            "tcp://127.0.0.1:1234",
            None,
            CgroupDriver::Cgroupfs,
            true,
            Duration::from_secs(1),
            &mut report,
        ));
        assert_eq!(report.count(Severity::Error), 1);
        assert!(
            report.findings[0]
                .message
                .contains("only unix:// endpoints")
        );
    }
}
