//! The kubelet's `cgroupDriver` against the runtime's. Upstream 1.28+
//! (`KubeletCgroupDriverFromCRI`, `getCgroupDriverFromCRI`) asks the runtime
//! with CRI `RuntimeConfig`; runtimes older than containerd 2.0 and CRI-O
//! 1.28 answer Unimplemented, and the kubelet keeps its own setting. Here the
//! fallback reads what containerd reports in its verbose `Status` info: the
//! CRI plugin's config under the `config` key, whose default runtime's
//! `options.SystemdCgroup` (runc v2 shim) or plugin-level `systemdCgroup`
//! (the v1 linux runtime) is the driver runc will use.
//!
//! kubelet-rs takes the runtime's driver as upstream does when the runtime
//! answers (and `KubeletCgroupDriverFromCRI` is on, its default): the
//! finding says which driver is in effect and where it came from. Otherwise
//! it uses `cgroupDriver`, and a mismatch breaks every sandbox (runc refuses
//! a cgroupfs path under systemd, and the reverse): an error.

use std::collections::HashMap;
use std::time::Duration;

use cri::{Code, RemoteRuntime, pb};
use kubelet_types::CgroupDriver;
use serde_json::Value;

use crate::finding::{Finding, Kind};

/// What `RuntimeConfig` answered.
#[derive(Debug, PartialEq)]
pub(super) enum FromCri {
    /// The runtime named its driver.
    Driver(CgroupDriver),
    /// The runtime does not implement `RuntimeConfig` (containerd 1.x).
    Unimplemented,
    /// The call failed otherwise, or the answer had no Linux section.
    Failed(String),
}

/// Calls `RuntimeConfig` under `deadline`.
pub(super) async fn from_runtime_config(rt: &RemoteRuntime, deadline: Duration) -> FromCri {
    let mut client = rt.runtime_client();
    let mut req = tonic::Request::new(pb::RuntimeConfigRequest {});
    req.set_timeout(deadline);
    match tokio::time::timeout(deadline, client.runtime_config(req)).await {
        Ok(Ok(resp)) => match resp.into_inner().linux {
            Some(linux) => match pb::CgroupDriver::try_from(linux.cgroup_driver) {
                Ok(pb::CgroupDriver::Systemd) => FromCri::Driver(CgroupDriver::Systemd),
                Ok(pb::CgroupDriver::Cgroupfs) => FromCri::Driver(CgroupDriver::Cgroupfs),
                Err(_) => FromCri::Failed(format!("unknown cgroup driver {}", linux.cgroup_driver)),
            },
            None => FromCri::Failed("the answer has no linux section".into()),
        },
        Ok(Err(status)) if status.code() == Code::Unimplemented => FromCri::Unimplemented,
        Ok(Err(status)) => FromCri::Failed(format!(
            "rpc error: code = {:?} desc = {}",
            status.code(),
            status.message()
        )),
        Err(_) => FromCri::Failed(format!("no answer within {deadline:?}")),
    }
}

/// The driver in containerd's CRI config (`Status` info `config`), and how it
/// was found. `Err` says why it could not be.
pub(super) fn from_status_info(
    info: &HashMap<String, String>,
) -> Result<(CgroupDriver, String), String> {
    let raw = info
        .get("config")
        .ok_or("the runtime's Status info has no \"config\" key")?;
    let config: Value = serde_json::from_str(raw)
        .map_err(|e| format!("the runtime's Status info \"config\" is not JSON: {e}"))?;
    let containerd = config
        .get("containerd")
        .ok_or("the runtime's Status info \"config\" has no containerd section")?;
    let name = containerd
        .get("defaultRuntimeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("containerd's CRI config names no default runtime")?;
    let runtime = containerd
        .get("runtimes")
        .and_then(|r| r.get(name))
        .ok_or_else(|| format!("containerd's CRI config has no runtime {name:?}"))?;
    let runtime_type = runtime
        .get("runtimeType")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let driver = |systemd: bool| {
        if systemd {
            CgroupDriver::Systemd
        } else {
            CgroupDriver::Cgroupfs
        }
    };
    if runtime_type == "io.containerd.runtime.v1.linux" {
        let systemd = config
            .get("systemdCgroup")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        return Ok((
            driver(systemd),
            format!(
                "containerd's CRI config: default runtime {name:?} ({runtime_type}), systemd_cgroup = {systemd}"
            ),
        ));
    }
    let option = runtime
        .get("options")
        .and_then(|o| o.get("SystemdCgroup"))
        .and_then(Value::as_bool);
    match (option, runtime_type) {
        (Some(systemd), _) => Ok((
            driver(systemd),
            format!(
                "containerd's CRI config: default runtime {name:?} ({runtime_type}), SystemdCgroup = {systemd}"
            ),
        )),
        // runc's shims default to cgroupfs when the option is not set.
        (None, "io.containerd.runc.v2" | "io.containerd.runc.v1") => Ok((
            CgroupDriver::Cgroupfs,
            format!(
                "containerd's CRI config: default runtime {name:?} ({runtime_type}), SystemdCgroup not set"
            ),
        )),
        (None, other) => Err(format!(
            "containerd's default runtime {name:?} is {other:?}, whose options do not say"
        )),
    }
}

/// The finding: match (info), mismatch (error), or unknown (warning).
pub(super) fn finding(
    ours: CgroupDriver,
    from_cri_gate: bool,
    cri: FromCri,
    info: &HashMap<String, String>,
) -> Finding {
    let field = "cgroupDriver";
    if let (true, FromCri::Driver(theirs)) = (from_cri_gate, &cri) {
        let config = if *theirs == ours {
            "the same as cgroupDriver".to_string()
        } else {
            format!(
                "cgroupDriver {:?} in the kubelet config is not used",
                ours.as_str()
            )
        };
        return Finding::info(
            Kind::CgroupDriver,
            format!(
                "cgroup driver {:?} in effect: the container runtime's, from CRI RuntimeConfig (KubeletCgroupDriverFromCRI); {config}",
                theirs.as_str()
            ),
        )
        .field(field);
    }
    let (theirs, source) = match cri {
        FromCri::Driver(d) => (d, "CRI RuntimeConfig".to_string()),
        other => {
            let why = match other {
                FromCri::Failed(e) => format!("RuntimeConfig failed: {e}"),
                _ => "RuntimeConfig is not implemented by this runtime".to_string(),
            };
            match from_status_info(info) {
                Ok((d, how)) => (d, format!("{how}; {why}")),
                Err(e) => {
                    return Finding::warning(
                        Kind::CgroupDriver,
                        format!(
                            "cannot tell the container runtime's cgroup driver ({why}; {e}): make sure it uses {:?} as the kubelet does",
                            ours.as_str()
                        ),
                    )
                    .field(field);
                }
            }
        }
    };
    if theirs == ours {
        Finding::info(
            Kind::CgroupDriver,
            format!(
                "cgroup driver {:?} matches the container runtime's (from {source}); in effect from the kubelet config (cgroupDriver)",
                ours.as_str()
            ),
        )
        .field(field)
    } else {
        Finding::error(
            Kind::CgroupDriver,
            format!(
                "misconfiguration: kubelet cgroup driver: {:?} is different from the container runtime's cgroup driver: {:?} (from {source})",
                ours.as_str(),
                theirs.as_str()
            ),
        )
        .field(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Severity;

    /// The shape containerd 1.6 answers (trimmed).
    fn info(options: &str, runtime_type: &str) -> HashMap<String, String> {
        let config = format!(
            r#"{{"containerd":{{"snapshotter":"overlayfs","defaultRuntimeName":"runc","runtimes":{{"runc":{{"runtimeType":"{runtime_type}","options":{options}}}}}}},"systemdCgroup":true,"enableSelinux":false}}"#
        );
        HashMap::from([("config".to_string(), config)])
    }

    #[test]
    fn runc_options_give_the_driver_and_the_source_is_named() {
        let i = info(
            r#"{"SystemdCgroup":false,"BinaryName":""}"#,
            "io.containerd.runc.v2",
        );
        let (d, how) = from_status_info(&i).expect("driver");
        assert_eq!(d, CgroupDriver::Cgroupfs);
        assert!(how.contains("SystemdCgroup = false"), "{how}");
        let i = info(r#"{"SystemdCgroup":true}"#, "io.containerd.runc.v2");
        assert_eq!(
            from_status_info(&i).expect("driver").0,
            CgroupDriver::Systemd
        );
        // No option: runc's default, cgroupfs.
        let i = info("{}", "io.containerd.runc.v2");
        assert_eq!(
            from_status_info(&i).expect("driver").0,
            CgroupDriver::Cgroupfs
        );
        // The v1 linux runtime: the plugin-level systemd_cgroup.
        let i = info("{}", "io.containerd.runtime.v1.linux");
        assert_eq!(
            from_status_info(&i).expect("driver").0,
            CgroupDriver::Systemd
        );
        // Another shim that does not say.
        assert!(from_status_info(&info("{}", "io.containerd.kata.v2")).is_err());
        assert!(from_status_info(&HashMap::new()).is_err());
    }

    #[test]
    fn runtime_config_wins_over_status_info_and_mismatch_is_an_error() {
        let i = info(r#"{"SystemdCgroup":false}"#, "io.containerd.runc.v2");
        let f = finding(
            CgroupDriver::Systemd,
            false,
            FromCri::Driver(CgroupDriver::Systemd),
            &i,
        );
        assert_eq!(f.severity, Severity::Info);
        assert!(
            f.message.contains("from CRI RuntimeConfig"),
            "{}",
            f.message
        );
        let f = finding(CgroupDriver::Systemd, true, FromCri::Unimplemented, &i);
        assert_eq!((f.kind, f.severity), (Kind::CgroupDriver, Severity::Error));
        assert!(
            f.message.starts_with(
                "misconfiguration: kubelet cgroup driver: \"systemd\" is different from the container runtime's cgroup driver: \"cgroupfs\""
            ),
            "{}",
            f.message
        );
        assert!(
            f.message.contains("RuntimeConfig is not implemented"),
            "{}",
            f.message
        );
        let f = finding(CgroupDriver::Cgroupfs, true, FromCri::Unimplemented, &i);
        assert_eq!(f.severity, Severity::Info);
    }

    #[test]
    fn the_runtimes_answer_is_the_driver_in_effect() {
        let i = info(r#"{"SystemdCgroup":true}"#, "io.containerd.runc.v2");
        let f = finding(
            CgroupDriver::Cgroupfs,
            true,
            FromCri::Driver(CgroupDriver::Systemd),
            &i,
        );
        assert_eq!(
            f.severity,
            Severity::Info,
            "the kubelet follows the runtime"
        );
        assert_eq!(
            f.message,
            "cgroup driver \"systemd\" in effect: the container runtime's, from CRI RuntimeConfig (KubeletCgroupDriverFromCRI); cgroupDriver \"cgroupfs\" in the kubelet config is not used"
        );
        // The gate off: the config's driver, and the mismatch is an error.
        let f = finding(
            CgroupDriver::Cgroupfs,
            false,
            FromCri::Driver(CgroupDriver::Systemd),
            &i,
        );
        assert_eq!(f.severity, Severity::Error);
    }

    #[test]
    fn unknown_driver_is_a_warning() {
        let f = finding(
            CgroupDriver::Cgroupfs,
            true,
            FromCri::Failed("boom".into()),
            &HashMap::new(),
        );
        assert_eq!(f.severity, Severity::Warning);
        assert!(
            f.message.contains("RuntimeConfig failed: boom"),
            "{}",
            f.message
        );
    }
}
