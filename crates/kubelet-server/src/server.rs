//! The node API's handler sets, as upstream `server.NewServer` installs them:
//! - [`auth_not_required`] (`InstallAuthNotRequiredHandlers`): `/healthz`
//!   with ping, log and syncloop, `/pods`, stats and metrics. Served on both
//!   the secure port and the read-only port.
//! - [`debugging`] (`InstallAuthRequiredHandlers` plus the debug flags
//!   handler): `/runningpods/`, `/configz`, `/debug/flags/v`, and the
//!   logs and streaming routers merged in by the caller. Secure port only,
//!   and only with `enableDebuggingHandlers`.
//! - [`debugging_disabled`] (`InstallDebuggingDisabledHandlers`): 405 with
//!   "Debug endpoints are disabled." where the debugging handlers would be,
//!   as the read-only port and `enableDebuggingHandlers: false` serve them.
//!
//! On the secure port every path, `/healthz` included, sits behind the
//! authentication and authorization filter, as upstream's filter wraps the
//! whole container.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use crate::healthz::{self, Checks};
use crate::{HostInterface, ServerError};

/// Changes the log verbosity at run time (upstream `logs.GlogSetter`).
pub trait VerbositySetter: Send + Sync + 'static {
    /// Sets klog's `-v` level.
    fn set_verbosity(&self, level: u8) -> Result<(), ServerError>;
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    // Upstream's http.Error: plain text, a trailing newline.
    let mut body = body.into();
    body.push('\n');
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

/// 405 for anything but GET, as upstream's `GETOnlyRestfulFilter`.
fn method_not_allowed() -> Response {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    r
}

fn pod_list(pods: Vec<Pod>) -> Response {
    // Upstream encodes a v1.PodList with the v1 codec: kind and apiVersion set.
    let items = match serde_json::to_value(&pods) {
        Ok(v) => v,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let v = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn get_pods(State(host): State<Arc<dyn HostInterface>>, method: Method) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    pod_list(host.get_pods())
}

async fn get_running_pods(State(host): State<Arc<dyn HostInterface>>, method: Method) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    match host.get_running_pods().await {
        Ok(pods) => pod_list(pods),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `/healthz` (ping, log, syncloop) and `/pods`. The caller merges the
/// stats and metrics routers in.
pub fn auth_not_required(host: Arc<dyn HostInterface>, checks: Arc<Checks>) -> Router {
    Router::new()
        .route("/pods", any(get_pods))
        .route("/pods/", any(get_pods))
        .with_state(host)
        .merge(healthz::router(checks))
}

/// What the debugging handlers serve besides logs and streaming.
pub struct Debugging {
    /// The kubelet.
    pub host: Arc<dyn HostInterface>,
    /// The `/configz` body (`{"kubeletconfig": ...}`).
    pub configz: serde_json::Value,
    /// `/debug/flags/v`; `None` when `enableDebugFlagsHandler` is off.
    pub verbosity: Option<Arc<dyn VerbositySetter>>,
}

async fn put_verbosity(
    State(setter): State<Option<Arc<dyn VerbositySetter>>>,
    method: Method,
    body: Bytes,
) -> Response {
    let Some(setter) = setter else {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "flags endpoint is disabled.",
        );
    };
    if method != Method::PUT {
        return plain(StatusCode::NOT_ACCEPTABLE, "unsupported http method");
    }
    let val = String::from_utf8_lossy(&body).to_string();
    let level = val
        .trim()
        .parse::<u8>()
        .map_err(|e| ServerError::Verbosity(Box::new(e)));
    match level.and_then(|l| setter.set_verbosity(l).map(|()| l)) {
        Ok(_) => plain(
            StatusCode::OK,
            &format!("successfully set klog.logging.verbosity to {val}"),
        ),
        Err(e) => {
            warn!(value = %val, error = %e, "Refused a verbosity change");
            plain(
                StatusCode::BAD_REQUEST,
                &format!("failed set klog.logging.verbosity {val}: {e}"),
            )
        }
    }
}

/// Upstream `writePlainText`: the text and a newline, `text/plain`.
fn plain(status: StatusCode, msg: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain")],
        format!("{msg}\n"),
    )
        .into_response()
}

/// `/runningpods/`, `/configz` and `/debug/flags/v`. The caller merges the
/// logs and streaming routers in.
pub fn debugging(d: Debugging) -> Router {
    let configz = Arc::new(d.configz);
    Router::new()
        .route("/runningpods", any(get_running_pods))
        .route("/runningpods/", any(get_running_pods))
        .with_state(d.host)
        .route(
            "/configz",
            get(move || {
                let c = configz.clone();
                async move {
                    (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json")],
                        c.to_string(),
                    )
                }
            }),
        )
        .route("/debug/flags/v", any(put_verbosity).with_state(d.verbosity))
}

async fn disabled() -> Response {
    text(
        StatusCode::METHOD_NOT_ALLOWED,
        "Debug endpoints are disabled.",
    )
}

/// 405 "Debug endpoints are disabled." on the debugging paths.
pub fn debugging_disabled() -> Router {
    let mut r = Router::new();
    for p in [
        "/run",
        "/exec",
        "/attach",
        "/portForward",
        "/containerLogs",
        "/runningpods",
        "/debug/pprof",
        "/logs",
    ] {
        r = r
            .route(p, any(disabled))
            .route(&format!("{p}/"), any(disabled))
            .route(&format!("{p}/{{*rest}}"), any(disabled));
    }
    r
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use parking_lot::Mutex;
    use tower::ServiceExt;

    use super::*;

    struct FakeHost;

    #[async_trait::async_trait]
    impl HostInterface for FakeHost {
        fn resync_interval(&self) -> Duration {
            Duration::from_secs(60)
        }
        fn latest_loop_entry_time(&self) -> Option<tokio::time::Instant> {
            Some(tokio::time::Instant::now())
        }
        fn get_pods(&self) -> Vec<Pod> {
            vec![
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                    "status": {"phase": "Running"}
                }))
                .expect("pod"),
            ]
        }
        async fn get_running_pods(&self) -> Result<Vec<Pod>, ServerError> {
            Err(ServerError::Runtime(cri::CriError::Unavailable {
                op: "ListPodSandbox",
                message: "down".into(),
            }))
        }
    }

    #[derive(Default)]
    struct Levels(Mutex<Vec<u8>>);
    impl VerbositySetter for Levels {
        fn set_verbosity(&self, level: u8) -> Result<(), ServerError> {
            self.0.lock().push(level);
            Ok(())
        }
    }

    async fn call(r: &Router, method: &str, uri: &str, body: &str) -> (StatusCode, String) {
        let resp = r
            .clone()
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .body(Body::from(body.to_string()))
                    .expect("request"),
            )
            .await
            .expect("infallible");
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&bytes).to_string())
    }

    fn full(levels: Option<Arc<Levels>>) -> Router {
        let host: Arc<dyn HostInterface> = Arc::new(FakeHost);
        let checks = Arc::new(Checks::new(
            host.clone(),
            Arc::new(healthz::LogCheck::default()),
        ));
        auth_not_required(host.clone(), checks).merge(debugging(Debugging {
            host,
            configz: serde_json::json!({"kubeletconfig": {"port": 10250}}),
            verbosity: levels.map(|l| l as Arc<dyn VerbositySetter>),
        }))
    }

    #[tokio::test]
    async fn pods_are_a_v1_pod_list_and_get_only() {
        let r = full(None);
        let (s, body) = call(&r, "GET", "/pods", "").await;
        assert_eq!(s, StatusCode::OK);
        let list: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(list["kind"], "PodList");
        assert_eq!(list["apiVersion"], "v1");
        assert_eq!(list["items"][0]["metadata"]["uid"], "u1");
        assert_eq!(list["items"][0]["status"]["phase"], "Running");
        let (s, body) = call(&r, "POST", "/pods", "").await;
        assert_eq!(
            (s, body.as_str()),
            (StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n")
        );
    }

    #[tokio::test]
    async fn running_pods_report_a_runtime_error_as_500() {
        let (s, body) = call(&full(None), "GET", "/runningpods/", "").await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("down"), "{body}");
    }

    #[tokio::test]
    async fn configz_and_healthz_are_served() {
        let r = full(None);
        let (s, body) = call(&r, "GET", "/configz", "").await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).expect("json")["kubeletconfig"]["port"],
            10250
        );
        let (s, body) = call(&r, "GET", "/healthz", "").await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, "ok"));
        let (s, _) = call(&r, "GET", "/healthz/syncloop", "").await;
        assert_eq!(s, StatusCode::OK);
    }

    #[tokio::test]
    async fn debug_flags_v_sets_the_level_with_put_only() {
        let levels = Arc::new(Levels::default());
        let r = full(Some(levels.clone()));
        let (s, body) = call(&r, "PUT", "/debug/flags/v", "4").await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(body, "successfully set klog.logging.verbosity to 4\n");
        assert_eq!(*levels.0.lock(), vec![4]);
        let (s, _) = call(&r, "PUT", "/debug/flags/v", "loud").await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let (s, body) = call(&r, "GET", "/debug/flags/v", "").await;
        assert_eq!(
            (s, body.as_str()),
            (StatusCode::NOT_ACCEPTABLE, "unsupported http method\n")
        );
        let (s, body) = call(&full(None), "PUT", "/debug/flags/v", "4").await;
        assert_eq!(
            (s, body.as_str()),
            (
                StatusCode::METHOD_NOT_ALLOWED,
                "flags endpoint is disabled.\n"
            )
        );
    }

    #[tokio::test]
    async fn debugging_disabled_answers_405_on_every_debug_path() {
        let r = debugging_disabled();
        for p in [
            "/exec/ns/p/c",
            "/containerLogs/ns/p/c",
            "/runningpods/",
            "/portForward/ns/p",
            "/run/ns/p/c",
        ] {
            let (s, body) = call(&r, "GET", p, "").await;
            assert_eq!(
                (s, body.as_str()),
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Debug endpoints are disabled.\n"
                ),
                "{p}"
            );
        }
    }
}
