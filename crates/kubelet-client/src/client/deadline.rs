//! A deadline on every apiserver request (client-go's `rest.Config.Timeout`,
//! which the kubelet sets on its heartbeat client, applied here to every
//! client the kubelet builds).
//!
//! A request that gets no complete answer within the deadline fails with
//! [`RequestTimeout`], which kube surfaces as `kube::Error::Service`; the
//! caller's retry takes over. As in client-go, the deadline starts after the
//! client-side rate limiter let the request through, so a throttled client does
//! not time out before it sent anything.
//!
//! Watches are long-running: their response headers must arrive within the
//! deadline (the apiserver flushes them as the watch starts), and their body
//! may run until the watch's own `timeoutSeconds`, plus the deadline as grace.
//! The apiserver ends the watch at `timeoutSeconds`; a watch still open after
//! that is on a dead connection, and is cut so the watcher re-lists. A watch
//! without `timeoutSeconds` has no body deadline (TCP keepalive notices a dead
//! peer).
//!
//! The default, 60s, is the apiserver's own `--request-timeout`: past it a
//! healthy apiserver has answered 504 itself, so a client still waiting is
//! waiting on a hung server or a dead connection.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// The default request deadline: the apiserver's `--request-timeout` default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A request that did not complete within its deadline.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{method} {path}: no complete answer from the apiserver within {after:?}")]
pub struct RequestTimeout {
    /// HTTP method.
    pub method: http::Method,
    /// Request path (no query).
    pub path: String,
    /// How long the request had.
    pub after: Duration,
    /// Whether it was a watch (cut after its `timeoutSeconds` plus grace).
    pub watch: bool,
}

/// Whether `err` is, or was caused by, a request deadline.
pub fn is_timeout(err: &kube::Error) -> bool {
    caused_by_timeout(err)
}

fn caused_by_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<RequestTimeout>() {
            return true;
        }
        // `io::Error` hides what it wraps from `source()`: look inside.
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            return caused_by_timeout(inner);
        }
        next = e.source();
    }
    false
}

/// How a request is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Headers and body within the deadline.
    Request,
    /// Headers within the deadline; the body within `timeoutSeconds` plus the
    /// deadline, or unbounded without `timeoutSeconds`.
    Watch {
        /// The watch's `timeoutSeconds`, if it has one.
        timeout_seconds: Option<u64>,
    },
}

/// The first value of query parameter `key`, as Go's `url.Values.Get` reads it.
fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then_some(v)
    })
}

/// Whether a request is a watch, as the apiserver decides: a `watch` parameter
/// whose first value is anything but `0` or `false` (upstream
/// `Convert_Slice_string_To_bool`), or a path under the deprecated
/// `/api/v1/watch/` or `/apis/<group>/<version>/watch/` prefixes.
pub fn classify(uri: &http::Uri) -> Bound {
    let query = uri.query().unwrap_or("");
    let param =
        query_value(query, "watch").is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"));
    let segments: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let path = matches!(
        segments.as_slice(),
        ["api", _, "watch", ..] | ["apis", _, _, "watch", ..]
    );
    if !(param || path) {
        return Bound::Request;
    }
    let timeout_seconds = query_value(query, "timeoutSeconds")
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0);
    Bound::Watch { timeout_seconds }
}

/// Adds a [`Deadline`] to a service.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    timeout: Duration,
}

impl DeadlineLayer {
    /// Requests get `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Deadline {
            inner,
            timeout: self.timeout,
        }
    }
}

/// Bounds each request through `inner` (see the module docs).
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    timeout: Duration,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Deadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body,
{
    type Response = Response<DeadlineBody<ResBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let bound = classify(req.uri());
        let timeout = self.timeout;
        let mut error = RequestTimeout {
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            after: timeout,
            watch: bound != Bound::Request,
        };
        let start = Instant::now();
        let headers_by = start.checked_add(timeout);
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = match headers_by {
                Some(by) => match tokio::time::timeout_at(by, response).await {
                    Ok(r) => r.map_err(Into::into)?,
                    Err(_) => return Err(Box::new(error) as BoxError),
                },
                None => response.await.map_err(Into::into)?,
            };
            let body_by = match bound {
                Bound::Request => headers_by,
                Bound::Watch {
                    timeout_seconds: Some(s),
                } => {
                    let grace = Duration::from_secs(s).checked_add(timeout);
                    if let Some(g) = grace {
                        error.after = g;
                    }
                    grace.and_then(|g| start.checked_add(g))
                }
                Bound::Watch {
                    timeout_seconds: None,
                } => None,
            };
            Ok(response.map(|b| DeadlineBody::new(b, body_by, error)))
        })
    }
}

/// A response body that fails with [`RequestTimeout`] once its deadline passed.
pub struct DeadlineBody<B> {
    inner: Pin<Box<B>>,
    sleep: Option<Pin<Box<Sleep>>>,
    error: RequestTimeout,
    expired: bool,
}

impl<B> DeadlineBody<B> {
    fn new(inner: B, by: Option<Instant>, error: RequestTimeout) -> Self {
        Self {
            inner: Box::pin(inner),
            sleep: by.map(|by| Box::pin(tokio::time::sleep_until(by))),
            error,
            expired: false,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(None);
        }
        // What has arrived is delivered; the deadline cuts only a wait.
        let r = this.inner.as_mut().poll_frame(cx);
        if let Poll::Ready(frame) = r {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        if let Some(sleep) = this.sleep.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            this.expired = true;
            return Poll::Ready(Some(Err(Box::new(this.error.clone()))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::Bytes;
    use tower::ServiceExt;

    /// A body that never yields: a server that sent headers and then hung.
    struct Stalled;

    impl Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    const TIMEOUT: Duration = Duration::from_secs(60);

    /// What a request to `uri` ends with, and when, against a server that
    /// answers with headers at once (or never, with `hang`) and then stalls.
    async fn outcome(uri: &str, hang: bool) -> (Result<(), BoxError>, Duration) {
        let server = tower::service_fn(move |_: Request<()>| async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Ok::<_, std::convert::Infallible>(Response::new(Stalled))
        });
        let svc = DeadlineLayer::new(TIMEOUT).layer(server);
        let started = Instant::now();
        let req = Request::get(uri).body(()).expect("request");
        let result = match svc.oneshot(req).await {
            Err(e) => Err(e),
            Ok(res) => {
                let mut body = res.into_body();
                match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                    Some(Err(e)) => Err(e),
                    other => panic!("a stalled body ends in an error, got {:?}", other.is_some()),
                }
            }
        };
        (result, started.elapsed())
    }

    fn timed_out(r: &Result<(), BoxError>) -> Option<&RequestTimeout> {
        r.as_ref()
            .err()
            .and_then(|e| e.downcast_ref::<RequestTimeout>())
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_request_or_a_stalled_body_fails_at_the_deadline() {
        let (r, took) = outcome("/api/v1/nodes/n1", true).await;
        assert_eq!(took, TIMEOUT, "{r:?}");
        let t = timed_out(&r).expect("RequestTimeout");
        assert_eq!(
            (t.path.as_str(), t.after, t.watch),
            ("/api/v1/nodes/n1", TIMEOUT, false)
        );
        let (r, took) = outcome("/api/v1/nodes/n1", false).await;
        assert_eq!(took, TIMEOUT, "the body shares the deadline: {r:?}");
        assert!(timed_out(&r).is_some(), "{r:?}");
        let (r, took) = outcome("/api/v1/pods?watch=true&timeoutSeconds=290", true).await;
        assert_eq!(
            took, TIMEOUT,
            "a watch's headers are due within the deadline: {r:?}"
        );
        assert!(timed_out(&r).is_some_and(|t| t.watch), "{r:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_body_runs_to_its_timeout_seconds_plus_the_deadline() {
        let (r, took) = outcome("/api/v1/pods?watch=true&timeoutSeconds=290", false).await;
        assert_eq!(took, Duration::from_secs(350), "{r:?}");
        assert_eq!(
            timed_out(&r).map(|t| t.after),
            Some(Duration::from_secs(350))
        );
        let unbounded = tokio::time::timeout(
            Duration::from_secs(24 * 3600),
            outcome("/api/v1/pods?watch=1", false),
        )
        .await;
        assert!(unbounded.is_err(), "no timeoutSeconds: no body deadline");
    }

    fn bound(uri: &str) -> Bound {
        classify(&uri.parse().expect("uri"))
    }

    #[test]
    fn watches_are_recognised_as_the_apiserver_does() {
        assert_eq!(bound("/api/v1/nodes/n1"), Bound::Request);
        assert_eq!(bound("/api/v1/pods?fieldSelector=x"), Bound::Request);
        assert_eq!(bound("/api/v1/pods?watch=false"), Bound::Request);
        assert_eq!(bound("/api/v1/pods?watch=FALSE"), Bound::Request);
        assert_eq!(bound("/api/v1/pods?watch=0"), Bound::Request);
        let w = |t| Bound::Watch { timeout_seconds: t };
        assert_eq!(bound("/api/v1/pods?watch=true"), w(None));
        assert_eq!(bound("/api/v1/pods?watch=1"), w(None));
        assert_eq!(bound("/api/v1/pods?watch="), w(None), "empty is true");
        assert_eq!(
            bound("/api/v1/pods?watch=0&watch=true"),
            Bound::Request,
            "the first value counts"
        );
        assert_eq!(
            bound("/api/v1/pods?fieldSelector=a&watch=true&timeoutSeconds=290"),
            w(Some(290))
        );
        assert_eq!(bound("/api/v1/pods?watch=1&timeoutSeconds=-5"), w(None));
        assert_eq!(bound("/api/v1/pods?watch=1&timeoutSeconds=x"), w(None));
        assert_eq!(bound("/api/v1/watch/pods"), w(None));
        assert_eq!(
            bound("/apis/coordination.k8s.io/v1/watch/namespaces/kube-node-lease/leases"),
            w(None)
        );
        assert_eq!(bound("/api/v1/namespaces/watch/pods"), Bound::Request);
    }

    #[test]
    fn a_timeout_is_recognised_through_kube_and_io_wrappers() {
        let t = RequestTimeout {
            method: http::Method::GET,
            path: "/api/v1/nodes/n1".into(),
            after: DEFAULT_REQUEST_TIMEOUT,
            watch: false,
        };
        assert!(is_timeout(&kube::Error::Service(Box::new(t.clone()))));
        let nested = kube::Error::Service(Box::new(t));
        assert!(is_timeout(&kube::Error::ReadEvents(std::io::Error::other(
            nested
        ))));
        assert!(!is_timeout(&kube::Error::Service("other".into())));
    }
}
