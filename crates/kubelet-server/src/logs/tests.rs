use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tower::ServiceExt;

use super::*;

#[derive(Default)]
struct FakeHost {
    seen: Mutex<Vec<PodLogOptions>>,
    cancelled: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl ContainerLogsHost for FakeHost {
    fn get_pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        (namespace == "ns" && name == "p").then(|| {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "p", "namespace": "ns"},
                    "spec": {"containers": [{"name": "c"}, {"name": "waiting"}],
                             "initContainers": [{"name": "init"}]}
                }))
                .expect("pod"),
            )
        })
    }

    async fn container_logs(
        &self,
        pod: &Pod,
        container: &str,
        opts: &PodLogOptions,
    ) -> Result<LogStreamer, LogsError> {
        self.seen.lock().push(opts.clone());
        if container == "waiting" {
            return Err(LogsError::Waiting {
                container: container.into(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
                reason: "ContainerCreating".into(),
            });
        }
        let follow = opts.follow;
        let cancelled = self.cancelled.clone();
        Ok(Box::new(
            move |mut out: LogSink, stop: CancellationToken| {
                Box::pin(async move {
                    out.write_all(b"line 1\n")
                        .await
                        .map_err(|e| LogsError::Read(Box::new(e)))?;
                    if follow {
                        stop.cancelled().await;
                        cancelled.notify_one();
                    }
                    Ok(())
                })
            },
        ))
    }
}

async fn get(host: Arc<FakeHost>, uri: &str) -> (StatusCode, String) {
    let resp = routes(host)
        .oneshot(Request::get(uri).body(Body::empty()).expect("req"))
        .await
        .expect("infallible");
    let s = resp.status();
    let b = resp.into_body().collect().await.expect("body").to_bytes();
    (s, String::from_utf8_lossy(&b).to_string())
}

#[tokio::test]
async fn the_query_decodes_as_pod_log_options() {
    let host = Arc::new(FakeHost::default());
    let (s, body) = get(
        host.clone(),
        "/containerLogs/ns/p/c?tailLines=5&timestamps=true&limitBytes=10&sinceTime=2024-01-01T00:00:00Z&previous=1",
    )
    .await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "line 1\n"));
    let want = PodLogOptions {
        previous: true,
        timestamps: true,
        tail_lines: Some(5),
        limit_bytes: Some(10),
        since_time: Some("2024-01-01T00:00:00Z".parse().expect("ts")),
        ..Default::default()
    };
    assert_eq!(host.seen.lock().last(), Some(&want));
    // The legacy `tail`, and `tail=all`.
    get(host.clone(), "/containerLogs/ns/p/init?tail=3").await;
    assert_eq!(host.seen.lock().last().and_then(|o| o.tail_lines), Some(3));
    get(host.clone(), "/containerLogs/ns/p/c?tail=all&tailLines=3").await;
    assert_eq!(host.seen.lock().last().and_then(|o| o.tail_lines), None);
}

#[tokio::test]
async fn bad_requests_get_upstreams_codes_and_messages() {
    let host = Arc::new(FakeHost::default());
    let cases = [
        (
            "/containerLogs/ns/p/c?follow=maybe",
            StatusCode::BAD_REQUEST,
            r#"{"message": "Unable to decode query."}"#,
        ),
        (
            "/containerLogs/ns/p/c?tailLines=-1",
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#,
        ),
        (
            "/containerLogs/ns/p/c?limitBytes=0",
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#,
        ),
        (
            "/containerLogs/ns/p/c?sinceSeconds=5&sinceTime=2024-01-01T00:00:00Z",
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#,
        ),
        (
            "/containerLogs/ns/nope/c",
            StatusCode::NOT_FOUND,
            "pod \"nope\" does not exist",
        ),
        (
            "/containerLogs/ns/p/x",
            StatusCode::NOT_FOUND,
            "container \"x\" not found in pod \"p\"",
        ),
        (
            "/containerLogs/ns/p/waiting",
            StatusCode::BAD_REQUEST,
            "container \"waiting\" in pod \"p\" is waiting to start: ContainerCreating",
        ),
        (
            "/containerLogs/ns/p/c?stream=Stdout",
            StatusCode::BAD_REQUEST,
            "unable to return the given log stream: \"Stdout\". Please enable PodLogsQuerySplitStreams feature gate in kubelet",
        ),
    ];
    for (uri, status, body) in cases {
        assert_eq!(
            get(host.clone(), uri).await,
            (status, body.to_string()),
            "{uri}"
        );
    }
}

#[tokio::test]
async fn a_client_going_away_cancels_the_follow() {
    let host = Arc::new(FakeHost::default());
    let resp = routes(host.clone())
        .oneshot(
            Request::get("/containerLogs/ns/p/c?follow=true")
                .body(Body::empty())
                .expect("req"),
        )
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.into_data().ok().as_deref(), Some(&b"line 1\n"[..]));
    let cancelled = host.cancelled.notified();
    drop(body);
    tokio::time::timeout(std::time::Duration::from_secs(5), cancelled)
        .await
        .expect("the host's follow is cancelled");
}
