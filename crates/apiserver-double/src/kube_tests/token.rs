//! TokenRequest and the tokens it issues.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::{Cluster, api_error, create_pod};
use crate::ApiServer;

pub(super) fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("payload");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("b64")).expect("claims")
}

/// Checks the ES256 signature with the double's public key.
fn verify(api: &ApiServer, token: &str) -> bool {
    use rcgen::PublicKeyData;
    let (input, sig) = token.rsplit_once('.').expect("signed");
    let raw = URL_SAFE_NO_PAD.decode(sig).expect("b64");
    let int = |b: &[u8]| {
        let b = &b[b.iter().position(|x| *x != 0).unwrap_or(b.len() - 1)..];
        let mut v = vec![0x02];
        if b[0] & 0x80 != 0 {
            v.extend([u8::try_from(b.len() + 1).expect("len"), 0]);
        } else {
            v.push(u8::try_from(b.len()).expect("len"));
        }
        v.extend(b);
        v
    };
    let mut body = int(&raw[..32]);
    body.extend(int(&raw[32..]));
    let mut der = vec![0x30, u8::try_from(body.len()).expect("len")];
    der.extend(body);
    let provider = rustls::crypto::ring::default_provider();
    let alg = provider
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(s, _)| *s == rustls::SignatureScheme::ECDSA_NISTP256_SHA256)
        .expect("p256")
        .1[0];
    alg.verify_signature(api.shared.signer.key.der_bytes(), input.as_bytes(), &der)
        .is_ok()
}

pub(super) fn token_request(
    audiences: Option<Vec<&str>>,
    seconds: Option<i64>,
    pod: Option<&Pod>,
) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences
                .map(|a| a.iter().map(|s| s.to_string()).collect())
                .unwrap_or_default(),
            expiration_seconds: seconds,
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: p.metadata.name.clone(),
                uid: p.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn token_requests_issue_signed_bound_tokens() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    let pod = create_pod(&admin, "default", "p", "n1", json!({})).await;
    let sas = Api::<ServiceAccount>::namespaced(admin.clone(), "default");
    let sa = sas.get("default").await.expect("sa");
    let before = jiff::Timestamp::now().as_second();
    let tr = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(Some(vec!["vault"]), Some(600), Some(&pod)),
        )
        .await
        .expect("token");
    let status = tr.status.expect("status");
    assert!(verify(&c.api, &status.token), "signature checks out");
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(status.token.split('.').next().expect("header"))
            .expect("b64"),
    )
    .expect("header");
    assert_eq!(
        header,
        json!({"alg": "ES256", "kid": c.api.service_account_key_id()})
    );
    let cl = claims(&status.token);
    assert_eq!(cl["iss"], json!(crate::DEFAULT_ISSUER));
    assert_eq!(cl["sub"], json!("system:serviceaccount:default:default"));
    assert_eq!(cl["aud"], json!(["vault"]));
    let (iat, exp) = (
        cl["iat"].as_i64().expect("iat"),
        cl["exp"].as_i64().expect("exp"),
    );
    assert_eq!(exp - iat, 600);
    assert_eq!(cl["nbf"], cl["iat"]);
    assert!(iat >= before);
    assert_eq!(status.expiration_timestamp.0.as_second(), exp);
    assert_eq!(
        cl["kubernetes.io"],
        json!({"namespace": "default",
            "serviceaccount": {"name": "default", "uid": sa.metadata.uid},
            "pod": {"name": "p", "uid": pod.metadata.uid}})
    );

    // Defaults: one hour, the API audience.
    let tr = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, None, None),
        )
        .await
        .expect("token");
    assert_eq!(tr.spec.expiration_seconds, Some(3600));
    let token = tr.status.expect("status").token;
    let cl = claims(&token);
    assert_eq!(
        cl["exp"].as_i64().expect("exp") - cl["iat"].as_i64().expect("iat"),
        3600
    );
    assert_eq!(cl["aud"], json!([crate::DEFAULT_ISSUER]));
    assert!(cl["kubernetes.io"].get("pod").is_none());

    // The token authenticates the service account.
    let review = Api::<TokenReview>::all(admin.clone())
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.clone()),
                    audiences: None,
                },
                ..Default::default()
            },
        )
        .await
        .expect("review");
    let st = serde_json::to_value(review.status.expect("status")).expect("json");
    assert_eq!(st["authenticated"], json!(true));
    assert_eq!(
        st["user"]["username"],
        json!("system:serviceaccount:default:default")
    );
    assert_eq!(
        st["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );
    let (code, msg) = api_error(
        Api::<Secret>::namespaced(c.bearer(&token).await, "default")
            .get("x")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403, "authenticated, not authorized: {msg}");
    assert!(
        msg.contains("User \"system:serviceaccount:default:default\""),
        "{msg}"
    );

    // Too short, unknown service account, a pod that is not the bound one.
    let (code, msg) = api_error(
        sas.create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, Some(599), None),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            422,
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
        )
    );
    let (code, msg) = api_error(
        sas.create_token_request(
            "nobody",
            &PostParams::default(),
            &token_request(None, None, None),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (code, msg.as_str()),
        (404, "serviceaccounts \"nobody\" not found")
    );
    let mut stale = pod.clone();
    stale.metadata.uid = Some("0000".into());
    let (code, _) = api_error(
        sas.create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, None, Some(&stale)),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 409);
    // Once the bound pod is gone, its tokens no longer authenticate.
    let bound = sas
        .create_token_request(
            "default",
            &PostParams::default(),
            &token_request(None, None, Some(&pod)),
        )
        .await
        .expect("token")
        .status
        .expect("status")
        .token;
    assert!(c.api.review_token(&bound, &[]).is_some());
    Api::<Pod>::namespaced(admin.clone(), "default")
        .delete("p", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    assert!(c.api.review_token(&bound, &[]).is_none());
}
