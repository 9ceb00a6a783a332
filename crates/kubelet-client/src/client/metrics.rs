//! client-go's request metrics (component-base `prometheus/restclient`,
//! recorded by `rest.Request`): `rest_client_requests_total{code,method,host}`
//! for every request that reached the transport, with `<error>` as the code
//! when no response came, and `rest_client_request_duration_seconds{verb,host}`
//! from before the client-side rate limiter (as client-go measures it) to the
//! response headers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use kubelet_metrics::{KubeletMetrics, RestClientLabels};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// Records each request in [`KubeletMetrics`].
#[derive(Clone, Debug)]
pub struct RestClientMetricsLayer {
    metrics: Arc<KubeletMetrics>,
}

impl RestClientMetricsLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: Arc<KubeletMetrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for RestClientMetricsLayer {
    type Service = RestClientMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RestClientMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`RestClientMetricsLayer`].
#[derive(Clone, Debug)]
pub struct RestClientMetrics<S> {
    inner: S,
    metrics: Arc<KubeletMetrics>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RestClientMetrics<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        let metrics = self.metrics.clone();
        let start = Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let r = response.await.map_err(Into::into);
            let code = match &r {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            metrics.record_rest_client_request(
                RestClientLabels { code, method, host },
                start.elapsed(),
            );
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use kubelet_metrics::parse::parse;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn responses_and_transport_errors_are_counted_by_code_method_and_host() {
        let metrics = Arc::new(KubeletMetrics::new());
        let ok = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::builder().status(404).body(()).expect("response"))
        });
        let svc = RestClientMetricsLayer::new(metrics.clone()).layer(ok);
        for _ in 0..2 {
            let req = Request::get("https://10.0.0.1:6443/api/v1/nodes/n1")
                .body(())
                .expect("request");
            svc.clone().oneshot(req).await.expect("response");
        }
        let failing = tower::service_fn(|_req: Request<()>| async {
            Err::<Response<()>, BoxError>("connection refused".into())
        });
        let svc = RestClientMetricsLayer::new(metrics.clone()).layer(failing);
        let req = Request::patch("https://10.0.0.1:6443/api/v1/nodes/n1/status")
            .body(())
            .expect("request");
        assert!(svc.oneshot(req).await.is_err());

        let f = parse(&metrics.render()).expect("parses");
        let find = |code: &str, method: &str| {
            f["rest_client_requests_total"]
                .samples
                .iter()
                .find(|s| {
                    s.label("code") == Some(code)
                        && s.label("method") == Some(method)
                        && s.label("host") == Some("10.0.0.1:6443")
                })
                .map(|s| s.value)
        };
        assert_eq!(find("404", "GET"), Some(2.0));
        assert_eq!(find("<error>", "PATCH"), Some(1.0));
        let latency = f["rest_client_request_duration_seconds"]
            .samples
            .iter()
            .find(|s| s.name.ends_with("_count") && s.label("verb") == Some("GET"))
            .map(|s| s.value);
        assert_eq!(latency, Some(2.0));
    }
}
