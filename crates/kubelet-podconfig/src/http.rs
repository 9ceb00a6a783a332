//! Static pods from a URL (upstream `pkg/kubelet/config/http.go`): polled every
//! `httpCheckFrequency` with the configured headers; the body is one Pod or a
//! PodList, YAML or JSON. A failed fetch keeps the previous pods running; an
//! empty body means "no pods".

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kubelet_types::Source;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::manifest::parse_pods_document;
use super::{SourceSender, SourceUpdate};

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Upstream's client timeout for manifest URLs.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BODY: usize = 10 * 1024 * 1024;

/// The manifest URL source.
pub struct HttpSource {
    url: String,
    headers: Vec<(String, String)>,
    node_name: String,
    period: Duration,
    client: HttpsClient,
}

/// What a fetch produced.
#[derive(Debug)]
pub enum Fetch {
    /// The pods served now.
    Pods(Vec<k8s_openapi::api::core::v1::Pod>),
    /// Nothing usable; the reason.
    Failed(String),
}

impl HttpSource {
    /// A source polling `url` every `period`.
    pub fn new(
        url: String,
        headers: Vec<(String, String)>,
        node_name: String,
        period: Duration,
    ) -> Result<Self, crate::Error> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(crate::Error::Tls)?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            url,
            headers,
            node_name,
            period,
            client: Client::builder(TokioExecutor::new()).build(https),
        })
    }

    /// Fetches and parses the URL once.
    pub async fn fetch(&self) -> Fetch {
        let mut req = http::Request::get(&self.url);
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let req = match req.body(Empty::<Bytes>::new()) {
            Ok(r) => r,
            Err(e) => return Fetch::Failed(format!("invalid request: {e}")),
        };
        let resp = match tokio::time::timeout(FETCH_TIMEOUT, self.client.request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Fetch::Failed(format!("request failed: {e}")),
            Err(_) => return Fetch::Failed(format!("no answer within {FETCH_TIMEOUT:?}")),
        };
        let status = resp.status();
        let body = match tokio::time::timeout(
            FETCH_TIMEOUT,
            Limited::new(resp.into_body(), MAX_BODY).collect(),
        )
        .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => return Fetch::Failed(format!("reading body failed: {e}")),
            Err(_) => return Fetch::Failed("body not received in time".into()),
        };
        if !status.is_success() {
            return Fetch::Failed(format!(
                "{} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            ));
        }
        if body.is_empty() {
            return Fetch::Pods(vec![]);
        }
        let text = match std::str::from_utf8(&body) {
            Ok(t) => t,
            Err(_) => return Fetch::Failed("body is not UTF-8".into()),
        };
        match parse_pods_document(text, Source::Http, &self.url, &self.node_name) {
            Ok(pods) => Fetch::Pods(pods),
            Err(e) => Fetch::Failed(e.0),
        }
    }

    /// Polls until `stop`, sending a snapshot after each successful fetch.
    pub async fn run(self, tx: SourceSender, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.fetch().await {
                Fetch::Pods(pods) => {
                    if failing {
                        info!(url = %self.url, "Manifest URL is readable again");
                        failing = false;
                    }
                    if tx
                        .send(SourceUpdate {
                            source: Source::Http,
                            pods,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Fetch::Failed(reason) => {
                    if !failing {
                        warn!(url = %self.url, %reason, "Failed to read pods from URL; keeping the pods it served before");
                    }
                    failing = true;
                }
            }
        }
    }
}
