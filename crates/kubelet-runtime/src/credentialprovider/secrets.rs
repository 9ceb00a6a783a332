//! Image pull secrets as a keyring (upstream
//! `pkg/credentialprovider/secrets/secrets.go` `MakeDockerKeyring`): secrets
//! of type `kubernetes.io/dockerconfigjson` (key `.dockerconfigjson`) and
//! `kubernetes.io/dockercfg` (key `.dockercfg`); other secrets are ignored.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;

use super::Error;
use super::config::{read_docker_config_file_from_bytes, read_docker_config_json_file_from_bytes};
use super::keyring::{BasicDockerKeyring, DockerKeyring, UnionDockerKeyring};

/// Secret type of a `config.json` document.
pub const SECRET_TYPE_DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// Its data key.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// Secret type of a legacy `.dockercfg` document.
pub const SECRET_TYPE_DOCKERCFG: &str = "kubernetes.io/dockercfg";
/// Its data key.
pub const DOCKER_CONFIG_KEY: &str = ".dockercfg";

/// The credentials of `secrets`, tried before `default`'s; `default` alone
/// when no secret holds a docker config. A malformed docker config fails the
/// whole keyring, as upstream (the pull then fails).
pub fn make_docker_keyring(
    secrets: &[Secret],
    default: Arc<dyn DockerKeyring>,
) -> Result<Arc<dyn DockerKeyring>, Error> {
    let mut keyring = BasicDockerKeyring::default();
    let mut found = 0;
    for s in secrets {
        let ty = s.type_.as_deref().unwrap_or("");
        let data = |key: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| b.0.as_slice())
                .filter(|b| !b.is_empty())
        };
        if let (SECRET_TYPE_DOCKER_CONFIG_JSON, Some(doc)) = (ty, data(DOCKER_CONFIG_JSON_KEY)) {
            keyring.add(&read_docker_config_json_file_from_bytes(doc)?);
            found += 1;
        } else if let (SECRET_TYPE_DOCKERCFG, Some(doc)) = (ty, data(DOCKER_CONFIG_KEY)) {
            keyring.add(&read_docker_config_file_from_bytes(doc)?);
            found += 1;
        }
    }
    if found == 0 {
        return Ok(default);
    }
    Ok(Arc::new(UnionDockerKeyring(vec![
        Arc::new(keyring),
        default,
    ])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(ty: &str, key: &str, doc: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "ns"},
            "type": ty,
            "data": {key: k8s_openapi::ByteString(doc.as_bytes().to_vec())},
        }))
        .expect("secret")
    }

    fn node_keyring() -> Arc<dyn DockerKeyring> {
        let mut k = BasicDockerKeyring::default();
        k.add(&crate::credentialprovider::DockerConfig::from([(
            "reg.io".to_string(),
            crate::credentialprovider::DockerConfigEntry {
                username: "node".into(),
                ..Default::default()
            },
        )]));
        Arc::new(k)
    }

    fn users(k: &dyn DockerKeyring, image: &str) -> Vec<String> {
        k.lookup(image).into_iter().map(|c| c.username).collect()
    }

    #[test]
    fn both_secret_types_before_the_node_keyring() {
        let secrets = [
            secret(
                SECRET_TYPE_DOCKER_CONFIG_JSON,
                DOCKER_CONFIG_JSON_KEY,
                r#"{"auths": {"reg.io": {"username": "json", "password": "p"}}}"#,
            ),
            secret(
                SECRET_TYPE_DOCKERCFG,
                DOCKER_CONFIG_KEY,
                r#"{"https://reg.io": {"auth": "Y2ZnOnA="}}"#,
            ),
        ];
        let k = make_docker_keyring(&secrets, node_keyring()).expect("keyring");
        assert_eq!(users(k.as_ref(), "reg.io/app"), ["json", "cfg", "node"]);
        assert!(users(k.as_ref(), "other.io/app").is_empty());
    }

    #[test]
    fn other_secrets_leave_the_default() {
        let secrets = [
            // Wrong key for its type, wrong type, empty document.
            secret(
                SECRET_TYPE_DOCKER_CONFIG_JSON,
                DOCKER_CONFIG_KEY,
                r#"{"reg.io": {}}"#,
            ),
            secret(
                "Opaque",
                DOCKER_CONFIG_JSON_KEY,
                r#"{"auths": {"reg.io": {}}}"#,
            ),
            secret(SECRET_TYPE_DOCKERCFG, DOCKER_CONFIG_KEY, ""),
        ];
        let k = make_docker_keyring(&secrets, node_keyring()).expect("keyring");
        assert_eq!(users(k.as_ref(), "reg.io/app"), ["node"]);
    }

    #[test]
    fn a_malformed_secret_fails() {
        let secrets = [secret(
            SECRET_TYPE_DOCKER_CONFIG_JSON,
            DOCKER_CONFIG_JSON_KEY,
            "{not json",
        )];
        assert!(make_docker_keyring(&secrets, node_keyring()).is_err());
    }
}
