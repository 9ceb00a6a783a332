//! RuntimeClass lookups (upstream `pkg/kubelet/runtimeclass`
//! `Manager.LookupRuntimeHandler`): the CRI handler of a pod's
//! `runtimeClassName`, read from `node.k8s.io/v1`, or `node.k8s.io/v1beta1`
//! where the apiserver predates v1 (1.19). Lookups happen once per sandbox
//! creation; each is one GET with a deadline. When discovery says the
//! apiserver serves no `node.k8s.io/v1`, lookups go to `v1beta1` at once;
//! the choice is logged once and exposed as
//! `kubelet_apiserver_fallback_info{request="runtimeclass_get"}`.

use std::time::Duration;

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use serde::Deserialize;

/// How long one lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A RuntimeClass lookup failed (upstream's message).
#[derive(Debug, thiserror::Error)]
#[error("failed to lookup RuntimeClass {name}: {reason}")]
pub struct LookupError {
    /// The class.
    pub name: String,
    /// Why (`runtimeclass.node.k8s.io "x" not found`, a transport error).
    pub reason: String,
}

/// The subset of a `node.k8s.io/v1beta1` RuntimeClass the kubelet reads.
#[derive(Deserialize)]
struct V1beta1 {
    handler: String,
}

/// Looks RuntimeClasses up through the apiserver.
#[derive(Clone)]
pub struct RuntimeClassManager {
    client: kube::Client,
    /// The apiserver's groups, when known.
    discovery: Option<kubelet_client::discovery::Discovery>,
    /// Where the version in use is exposed, and whether it was logged.
    metrics: Option<std::sync::Arc<kubelet_metrics::KubeletMetrics>>,
    /// The apiserver release and version choice last reported.
    reported: std::sync::Arc<parking_lot::Mutex<Option<(String, bool)>>>,
}

impl RuntimeClassManager {
    /// A manager asking through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            discovery: None,
            metrics: None,
            reported: Default::default(),
        }
    }

    /// Reads the served versions from `discovery` and reports the one in
    /// use to `metrics`.
    #[must_use]
    pub fn with_discovery(
        mut self,
        discovery: kubelet_client::discovery::Discovery,
        metrics: std::sync::Arc<kubelet_metrics::KubeletMetrics>,
    ) -> Self {
        self.discovery = Some(discovery);
        self.metrics = Some(metrics);
        self
    }

    /// Whether the apiserver is known to serve no `node.k8s.io/v1` (1.19);
    /// says so once per apiserver release, with its version.
    fn v1beta1_only(&self) -> bool {
        let Some(info) = self.discovery.as_ref().and_then(|d| d.current()) else {
            return false;
        };
        let beta = !info.serves("node.k8s.io/v1") && info.serves("node.k8s.io/v1beta1");
        let now = Some((info.git_version.clone(), beta));
        let mut reported = self.reported.lock();
        if *reported != now {
            *reported = now;
            let choice = if beta {
                "node_k8s_io_v1beta1"
            } else {
                "node_k8s_io_v1"
            };
            if beta {
                tracing::warn!(server_version = %info.git_version,
                    "The apiserver serves no node.k8s.io/v1: RuntimeClasses are read through v1beta1");
            }
            if let Some(m) = &self.metrics {
                m.set_apiserver_fallback("runtimeclass_get", choice, &info.git_version);
            }
        }
        beta
    }

    /// Upstream `LookupRuntimeHandler`: `None` without a class name.
    pub async fn lookup_runtime_handler(
        &self,
        name: Option<&str>,
    ) -> Result<Option<String>, LookupError> {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        let fail = |reason: String| LookupError {
            name: name.to_string(),
            reason,
        };
        if !self.v1beta1_only() {
            let v1: Api<RuntimeClass> = Api::all(self.client.clone());
            match tokio::time::timeout(LOOKUP_TIMEOUT, v1.get(name)).await {
                Err(_) => return Err(fail(format!("timed out after {LOOKUP_TIMEOUT:?}"))),
                Ok(Ok(rc)) => return Ok(Some(rc.handler)),
                Ok(Err(kube::Error::Api(e))) if e.code == 404 => {}
                Ok(Err(e)) => return Err(fail(e.to_string())),
            }
        }
        // Not found in v1: the object is missing, or the apiserver serves
        // v1beta1 only. Ask v1beta1 before concluding.
        let req = http::Request::get(format!("/apis/node.k8s.io/v1beta1/runtimeclasses/{name}"))
            .body(Vec::new())
            .map_err(|e| fail(e.to_string()))?;
        match tokio::time::timeout(LOOKUP_TIMEOUT, self.client.request::<V1beta1>(req)).await {
            Err(_) => Err(fail(format!("timed out after {LOOKUP_TIMEOUT:?}"))),
            Ok(Ok(rc)) => Ok(Some(rc.handler)),
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                Err(fail(format!("runtimeclass.node.k8s.io {name:?} not found")))
            }
            Ok(Err(e)) => Err(fail(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kubelet_client::discovery::Discovery;
    use kubelet_metrics::KubeletMetrics;
    use kubelet_test_util::{Cluster, Profile};

    use super::*;

    async fn create_v1beta1(c: &Cluster, name: &str, handler: &str) {
        let body = serde_json::json!({"apiVersion": "node.k8s.io/v1beta1", "kind": "RuntimeClass",
            "metadata": {"name": name}, "handler": handler});
        let req = http::Request::post("/apis/node.k8s.io/v1beta1/runtimeclasses")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("body"))
            .expect("request");
        let _: serde_json::Value = c.admin().await.request(req).await.expect("create");
    }

    /// The RuntimeClass GETs the node sent, by group version.
    fn gets(c: &Cluster) -> Vec<String> {
        c.api
            .requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.path.contains("/runtimeclasses/"))
            .map(|r| r.path)
            .collect()
    }

    #[tokio::test]
    async fn a_1_19_apiserver_is_asked_through_v1beta1_at_once_and_says_so() {
        let c = Cluster::start_profile(Profile::V1_19, Default::default()).await;
        create_v1beta1(&c, "rc", "runc").await;
        let client = c.node_client("n1").await;
        let discovery = Discovery::new(client.clone());
        discovery.refresh().await.expect("discovery");
        let metrics = Arc::new(KubeletMetrics::new());
        let m = RuntimeClassManager::new(client).with_discovery(discovery, metrics.clone());
        for _ in 0..2 {
            let handler = m.lookup_runtime_handler(Some("rc")).await.expect("found");
            assert_eq!(handler.as_deref(), Some("runc"));
        }
        assert_eq!(
            gets(&c),
            vec!["/apis/node.k8s.io/v1beta1/runtimeclasses/rc"; 2],
            "no v1 request to an apiserver without it"
        );
        assert!(
            metrics
                .render()
                .contains(r#"request="runtimeclass_get",choice="node_k8s_io_v1beta1""#)
        );
    }

    #[tokio::test]
    async fn a_1_35_apiserver_is_asked_through_v1() {
        let c = Cluster::start_profile(Profile::V1_35, Default::default()).await;
        let rc: RuntimeClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "rc"}, "handler": "runc"
        }))
        .expect("rc");
        Api::<RuntimeClass>::all(c.admin().await)
            .create(&Default::default(), &rc)
            .await
            .expect("create");
        let client = c.node_client("n1").await;
        let discovery = Discovery::new(client.clone());
        discovery.refresh().await.expect("discovery");
        let metrics = Arc::new(KubeletMetrics::new());
        let m = RuntimeClassManager::new(client).with_discovery(discovery, metrics.clone());
        let handler = m.lookup_runtime_handler(Some("rc")).await.expect("found");
        assert_eq!(handler.as_deref(), Some("runc"));
        assert_eq!(gets(&c), vec!["/apis/node.k8s.io/v1/runtimeclasses/rc"]);
        assert!(metrics.render().contains(r#"choice="node_k8s_io_v1""#));
    }
}
