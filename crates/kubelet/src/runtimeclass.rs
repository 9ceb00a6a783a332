//! RuntimeClass lookups (upstream `pkg/kubelet/runtimeclass`
//! `Manager.LookupRuntimeHandler`): the CRI handler of a pod's
//! `runtimeClassName`, read from `node.k8s.io/v1`, or `node.k8s.io/v1beta1`
//! where the apiserver predates v1 (1.19). Lookups happen once per sandbox
//! creation; each is one GET with a deadline.

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
}

impl RuntimeClassManager {
    /// A manager asking through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
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
        let v1: Api<RuntimeClass> = Api::all(self.client.clone());
        match tokio::time::timeout(LOOKUP_TIMEOUT, v1.get(name)).await {
            Err(_) => return Err(fail(format!("timed out after {LOOKUP_TIMEOUT:?}"))),
            Ok(Ok(rc)) => return Ok(Some(rc.handler)),
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {}
            Ok(Err(e)) => return Err(fail(e.to_string())),
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
