//! Service accounts and tokens for image credential provider plugins in
//! service-account token mode (upstream `kubelet.go` handing the token
//! manager's `GetServiceAccountToken` and the service account lister to
//! `RegisterCredentialProviderPlugins`, KEP-4412): a token bound to the pod
//! being pulled for, with the audience the provider's `tokenAttributes` name,
//! from the TokenRequest API; the service account read by name, as the Node
//! authorizer allows for a pod on this node.
//!
//! The credential providers are registered before the apiserver client
//! exists, so the client is handed over once connected ([`KubeletTokens::connect`]);
//! until then (and in standalone mode) every request fails with a clear error.

use std::sync::OnceLock;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest as ApiTokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client};
use kubelet_credentialprovider::{ServiceAccountData, ServiceAccountTokens, TokenSourceError};

use crate::objects::token::{ApiTokenSource, TokenSource};
use crate::objects::{ObjectError, object_error, with_deadline};

/// Upstream's default expiry of a token requested for a plugin (the token
/// manager's default, one hour).
const TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// The kubelet's service accounts and tokens for credential providers.
#[derive(Default)]
pub struct KubeletTokens {
    client: OnceLock<(Client, ApiTokenSource)>,
}

impl KubeletTokens {
    /// Hands over the apiserver client (cluster mode). A second call is
    /// ignored.
    pub fn connect(&self, client: Client) {
        let _ = self
            .client
            .set((client.clone(), ApiTokenSource::new(client)));
    }

    fn client(&self) -> Result<&(Client, ApiTokenSource), TokenSourceError> {
        self.client.get().ok_or_else(|| {
            Box::new(ObjectError::Other(
                "no apiserver client: service account tokens are only available to a kubelet in a cluster"
                    .into(),
            )) as TokenSourceError
        })
    }
}

#[async_trait::async_trait]
impl ServiceAccountTokens for KubeletTokens {
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ServiceAccountData, TokenSourceError> {
        let (client, _) = self.client()?;
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let sa = with_deadline(format!("get serviceaccount {namespace}/{name}"), async {
            api.get(name)
                .await
                .map_err(|e| object_error("serviceaccounts", name, e))
        })
        .await?;
        Ok(ServiceAccountData {
            uid: sa.metadata.uid.unwrap_or_default(),
            annotations: sa.metadata.annotations.unwrap_or_default(),
        })
    }

    async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<String, TokenSourceError> {
        let (_, source) = self.client()?;
        let req = ApiTokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.to_string()],
                expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod_name.to_string()),
                    uid: Some(pod_uid.to_string()),
                }),
            },
            ..Default::default()
        };
        let answered = source
            .create_token(namespace, service_account, &req)
            .await?;
        answered
            .status
            .map(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Box::new(ObjectError::Other(format!(
                    "the TokenRequest for serviceaccount {namespace}/{service_account} returned no token"
                ))) as TokenSourceError
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_client_every_request_fails_clearly() {
        let t = KubeletTokens::default();
        let e = t.service_account("ns", "sa").await.expect_err("no client");
        assert!(
            e.to_string()
                .contains("only available to a kubelet in a cluster"),
            "{e}"
        );
        let e = t
            .token("ns", "sa", "aud", "p", "uid")
            .await
            .expect_err("no client");
        assert!(e.to_string().contains("no apiserver client"), "{e}");
    }
}
