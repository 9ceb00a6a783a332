//! The user namespace a pod asks for (upstream `pkg/kubelet/userns`
//! `GetOrCreateUserNamespaceMappings`, up to where mappings would be made).
//!
//! A pod with `hostUsers: false` (UserNamespacesSupport, on by default since
//! 1.33) must run in a user namespace of its own, or not at all: container
//! root must never be host root when the pod asked otherwise. Where the
//! runtime handler cannot give one, its sandbox is refused with upstream's
//! error (`FailedCreatePodSandBox`, the pod waits in `ContainerCreating`),
//! so on containerd 1.6, which lists no runtime handlers:
//! ``can't set `spec.hostUsers: false`, runtime does not support user
//! namespaces: the handler "" is not known``. kubelet-rs does not allocate
//! ID mappings yet, so it refuses such a pod on a runtime that could give
//! one too, saying so.

use k8s_openapi::api::core::v1::Pod;

use crate::runtime_helper::RuntimeHandlerError;

/// Whether `pod` may get a sandbox from `handler` as far as its user
/// namespace goes; the error is the sandbox's failure message.
/// `supports` is the runtime's answer for `handler` (upstream
/// `HandlerSupportsUserNamespaces`).
pub fn check_host_users(
    pod: &Pod,
    handler: &str,
    supports: impl FnOnce(&str) -> Result<bool, RuntimeHandlerError>,
) -> Result<(), String> {
    let host_users = pod.spec.as_ref().and_then(|s| s.host_users);
    if host_users != Some(false) {
        return Ok(());
    }
    let msg = if handler.is_empty() {
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces".to_string()
    } else {
        format!(
            "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
        )
    };
    match supports(handler) {
        Err(e) => Err(format!("{msg}: {}", e.message)),
        Ok(false) => Err(msg),
        Ok(true) => Err(
            "can't set `spec.hostUsers: false`: kubelet-rs does not create user namespaces yet, \
             and does not run the pod in the node's user namespace instead"
                .to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(host_users: Option<bool>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                host_users,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn unknown(h: &str) -> Result<bool, RuntimeHandlerError> {
        Err(RuntimeHandlerError {
            message: format!("the handler {h:?} is not known"),
        })
    }

    #[test]
    fn pods_in_the_hosts_user_namespace_need_nothing() {
        for p in [pod(None), pod(Some(true))] {
            assert_eq!(check_host_users(&p, "", unknown), Ok(()));
        }
    }

    #[test]
    fn upstreams_messages_when_the_runtime_cannot() {
        let p = pod(Some(false));
        assert_eq!(
            check_host_users(&p, "", unknown).expect_err("refused"),
            r#"can't set `spec.hostUsers: false`, runtime does not support user namespaces: the handler "" is not known"#
        );
        assert_eq!(
            check_host_users(&p, "runc", |_| Ok(false)).expect_err("refused"),
            r#"can't set `spec.hostUsers: false`, RuntimeClass handler "runc" does not support user namespaces"#
        );
        assert_eq!(
            check_host_users(&p, "sysbox-runc", unknown).expect_err("refused"),
            r#"can't set `spec.hostUsers: false`, RuntimeClass handler "sysbox-runc" does not support user namespaces: the handler "sysbox-runc" is not known"#
        );
    }

    #[test]
    fn refused_also_where_the_runtime_could() {
        let e = check_host_users(&pod(Some(false)), "", |_| Ok(true)).expect_err("refused");
        assert!(e.contains("does not create user namespaces yet"), "{e}");
    }
}
