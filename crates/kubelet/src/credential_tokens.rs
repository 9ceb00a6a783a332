//! Service accounts and tokens for image credential provider plugins in
//! service-account token mode (upstream `kubelet.go` handing the token
//! manager's `GetServiceAccountToken` and a service account getter to
//! `RegisterCredentialProviderPlugins`, KEP-4412): a token bound to the pod
//! being pulled for, with the audience the provider's `tokenAttributes` name,
//! from the kubelet's token manager (cached and refreshed, so a provider
//! with `cacheType: Token` sees the same token pull after pull); the service
//! account read by name, as the Node authorizer allows for a pod on this node.
//!
//! The credential providers are registered before the apiserver client and
//! the token manager exist, so both are handed over later
//! ([`KubeletTokens::connect`], [`KubeletTokens::set_token_manager`]); until
//! then (and in standalone mode) every request fails with a clear error.

use std::sync::OnceLock;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client};
use kubelet_credentialprovider::{ServiceAccountData, ServiceAccountTokens, TokenSourceError};
use kubelet_volume::host::TokenRequest;

use crate::objects::token::TokenManager;
use crate::objects::{ObjectError, object_error, with_deadline};

/// Upstream's default expiry of a token requested for a plugin (the
/// TokenRequest default, one hour).
const TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// The kubelet's service accounts and tokens for credential providers.
#[derive(Default)]
pub struct KubeletTokens {
    client: OnceLock<Client>,
    tokens: OnceLock<TokenManager>,
}

fn unavailable(what: &str) -> TokenSourceError {
    Box::new(ObjectError::Other(format!(
        "no {what}: service account tokens are only available to a kubelet in a cluster"
    )))
}

impl KubeletTokens {
    /// Hands over the apiserver client (cluster mode), to read service
    /// accounts with. A second call is ignored.
    pub fn connect(&self, client: Client) {
        let _ = self.client.set(client);
    }

    /// Hands over the kubelet's token manager, tokens come from once the
    /// pod pipeline is built. A second call is ignored.
    pub fn set_token_manager(&self, tokens: TokenManager) {
        let _ = self.tokens.set(tokens);
    }
}

#[async_trait::async_trait]
impl ServiceAccountTokens for KubeletTokens {
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ServiceAccountData, TokenSourceError> {
        let client = self
            .client
            .get()
            .ok_or_else(|| unavailable("apiserver client"))?;
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
        let tokens = self
            .tokens
            .get()
            .ok_or_else(|| unavailable("token manager"))?;
        let req = TokenRequest {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            audience: audience.to_string(),
            expiration_seconds: TOKEN_EXPIRATION_SECONDS,
            pod_name: pod_name.to_string(),
            pod_uid: pod_uid.to_string(),
        };
        let token = tokens.get_service_account_token(&req).await?;
        if token.is_empty() {
            return Err(Box::new(ObjectError::Other(format!(
                "the TokenRequest for serviceaccount {namespace}/{service_account} returned no token"
            ))));
        }
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use jiff::SignedDuration;
    use k8s_openapi::api::authentication::v1::{
        TokenRequest as ApiTokenRequest, TokenRequestStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubelet_client::clock::{Clock, TokioClock};
    use kubelet_credentialprovider::api::{AuthConfig, CacheKeyType, CredentialProviderResponse};
    use kubelet_credentialprovider::config::TokenAttributes;
    use kubelet_credentialprovider::exec::Plugin;
    use kubelet_credentialprovider::provider::PluginProvider;
    use kubelet_credentialprovider::serviceaccount::ServiceAccountMode;
    use kubelet_runtime::credentialprovider::PullPod;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::objects::token::TokenSource;

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
            .expect_err("no token manager");
        assert!(e.to_string().contains("no token manager"), "{e}");
    }

    /// A TokenRequest API issuing `t1`, `t2`, ... valid for what was asked,
    /// by the token manager's clock.
    struct Issuer(AtomicUsize, TokioClock);

    #[async_trait::async_trait]
    impl TokenSource for Issuer {
        async fn create_token(
            &self,
            _: &str,
            _: &str,
            req: &ApiTokenRequest,
        ) -> Result<ApiTokenRequest, ObjectError> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            let mut answer = req.clone();
            let ttl = req.spec.expiration_seconds.unwrap_or(3600);
            answer.status = Some(TokenRequestStatus {
                token: format!("t{n}"),
                expiration_timestamp: Time(self.1.now() + SignedDuration::from_secs(ttl)),
            });
            Ok(answer)
        }
    }

    /// The kubelet's tokens with a fixed service account (the apiserver
    /// read is not what is tested).
    struct FixedAccount(Arc<KubeletTokens>);

    #[async_trait::async_trait]
    impl ServiceAccountTokens for FixedAccount {
        async fn service_account(
            &self,
            _: &str,
            _: &str,
        ) -> Result<ServiceAccountData, TokenSourceError> {
            Ok(ServiceAccountData {
                uid: "sa-uid".into(),
                annotations: BTreeMap::new(),
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
            self.0
                .token(namespace, service_account, audience, pod_name, pod_uid)
                .await
        }
    }

    /// A plugin answering for the registry with the default cache duration.
    #[derive(Default)]
    struct CountingPlugin(AtomicUsize);

    #[async_trait::async_trait]
    impl Plugin for CountingPlugin {
        async fn exec_plugin(
            &self,
            _: &str,
            _: &str,
            _: &BTreeMap<String, String>,
        ) -> Result<CredentialProviderResponse, kubelet_credentialprovider::Error> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(CredentialProviderResponse {
                cache_key_type: Ok(CacheKeyType::Registry),
                cache_duration: None,
                auth: [(
                    "registry.test".to_string(),
                    AuthConfig {
                        username: "u".into(),
                        password: "p".into(),
                    },
                )]
                .into(),
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn token_cache_type_hits_because_the_token_manager_caches_the_token() {
        let clock = TokioClock::default();
        let issuer = Arc::new(Issuer(AtomicUsize::new(0), clock));
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let kubelet = Arc::new(KubeletTokens::default());
        kubelet.set_token_manager(TokenManager::with_source(
            issuer.clone(),
            Arc::new(clock),
            &tasks,
            &stop,
        ));
        let attrs = TokenAttributes {
            service_account_token_audience: "registry.test".into(),
            cache_type: "Token".into(),
            require_service_account: Some(true),
            ..Default::default()
        };
        let plugin = Arc::new(CountingPlugin::default());
        let provider = PluginProvider::new(
            "creds",
            vec!["registry.test".into()],
            60_000_000_000,
            plugin.clone(),
            ServiceAccountMode::new(Some(&attrs), true, Some(Arc::new(FixedAccount(kubelet)))),
        );
        let pod = PullPod {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "pod-uid".into(),
            service_account_name: "default".into(),
        };
        for _ in 0..2 {
            let got = provider.provide("registry.test/app", &pod).await;
            assert_eq!(got["registry.test"].password, "p");
        }
        assert_eq!(issuer.0.load(Ordering::SeqCst), 1, "one TokenRequest");
        assert_eq!(plugin.0.load(Ordering::SeqCst), 1, "one plugin run");
        stop.cancel();
    }
}
