//! Docker config documents (upstream `pkg/credentialprovider/config.go`): the
//! `config.json` form `{"auths": {registry: entry}}` (secret key
//! `.dockerconfigjson`) and the legacy `.dockercfg` form `{registry: entry}`.
//! An entry's `auth` field, base64 of `username:password`, overrides its
//! `username` and `password`.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde_json::Value;

use super::Error;

/// Credentials per registry location (a host, maybe with scheme and path).
pub type DockerConfig = BTreeMap<String, DockerConfigEntry>;

/// One registry's credentials.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerConfigEntry {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// E-mail (deprecated by docker; kept as upstream does).
    pub email: String,
}

/// Reads a `config.json` document: the `auths` map (upstream
/// `ReadDockerConfigJSONFileFromBytes`).
pub fn read_docker_config_json_file_from_bytes(contents: &[u8]) -> Result<DockerConfig, Error> {
    let doc: Value = serde_json::from_slice(contents).map_err(Error::Json)?;
    let Value::Object(doc) = doc else {
        return Err(type_error("an object"));
    };
    // Go matches struct fields case-insensitively, an exact match first.
    let auths = doc
        .get("auths")
        .or_else(|| field_ci(&doc, "auths"))
        .unwrap_or(&Value::Null);
    docker_config(auths)
}

/// Reads a legacy `.dockercfg` document: the registry map itself (upstream
/// `readDockerConfigFileFromBytes`).
pub fn read_docker_config_file_from_bytes(contents: &[u8]) -> Result<DockerConfig, Error> {
    let doc: Value = serde_json::from_slice(contents).map_err(Error::Json)?;
    docker_config(&doc)
}

fn type_error(want: &str) -> Error {
    Error::Unmarshal(format!("json: cannot unmarshal a value that is not {want}"))
}

fn field_ci<'a>(obj: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn docker_config(v: &Value) -> Result<DockerConfig, Error> {
    match v {
        Value::Null => Ok(DockerConfig::new()),
        Value::Object(m) => m
            .iter()
            .map(|(loc, e)| Ok((loc.clone(), entry(e)?)))
            .collect(),
        _ => Err(type_error("an object of registries")),
    }
}

fn string_field(obj: &serde_json::Map<String, Value>, name: &str) -> Result<String, Error> {
    match field_ci(obj, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(type_error(&format!("a string in {name:?}"))),
    }
}

/// Upstream `DockerConfigEntry.UnmarshalJSON`.
fn entry(v: &Value) -> Result<DockerConfigEntry, Error> {
    let obj = match v {
        Value::Null => return Ok(DockerConfigEntry::default()),
        Value::Object(o) => o,
        _ => return Err(type_error("an object per registry")),
    };
    let mut e = DockerConfigEntry {
        username: string_field(obj, "username")?,
        password: string_field(obj, "password")?,
        email: string_field(obj, "email")?,
    };
    let auth = string_field(obj, "auth")?;
    if !auth.is_empty() {
        (e.username, e.password) = decode_docker_config_field_auth(&auth)?;
    }
    Ok(e)
}

/// Splits an `auth` field, base64 (padded or not) of `username:password`
/// (upstream `decodeDockerConfigFieldAuth`).
pub fn decode_docker_config_field_auth(field: &str) -> Result<(String, String), Error> {
    // Go's decoders skip line breaks; padded input needs the padded alphabet.
    let cleaned: String = field
        .chars()
        .filter(|c| !matches!(c, '\r' | '\n'))
        .collect();
    let padding = if field.trim().ends_with('=') {
        DecodePaddingMode::RequireCanonical
    } else {
        DecodePaddingMode::RequireNone
    };
    let engine = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(padding),
    );
    let decoded = engine.decode(cleaned.as_bytes()).map_err(|e| match e {
        base64::DecodeError::InvalidByte(at, _) | base64::DecodeError::InvalidLastSymbol(at, _) => {
            Error::Base64(at)
        }
        base64::DecodeError::InvalidLength(n) => Error::Base64(n),
        base64::DecodeError::InvalidPadding => Error::Base64(cleaned.len()),
    })?;
    let decoded = String::from_utf8_lossy(&decoded);
    let (user, pass) = decoded.split_once(':').ok_or(Error::AuthField)?;
    Ok((user.to_string(), pass.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn config_json_with_auth_field() {
        let doc = format!(
            r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{}", "email": "a@b.c"}},
               "reg.example.com:5000": {{"username": "u", "password": "p"}}}}}}"#,
            b64("foo:bar:baz")
        );
        let cfg = read_docker_config_json_file_from_bytes(doc.as_bytes()).expect("parse");
        assert_eq!(cfg.len(), 2);
        let hub = &cfg["https://index.docker.io/v1/"];
        // Only the first colon separates: passwords may hold colons.
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("foo", "bar:baz")
        );
        assert_eq!(hub.email, "a@b.c");
        let own = &cfg["reg.example.com:5000"];
        assert_eq!((own.username.as_str(), own.password.as_str()), ("u", "p"));
    }

    #[test]
    fn auth_field_overrides_username_and_password() {
        let doc = format!(
            r#"{{"reg": {{"username": "x", "password": "y", "auth": "{}"}}}}"#,
            b64("u:p")
        );
        let cfg = read_docker_config_file_from_bytes(doc.as_bytes()).expect("parse");
        assert_eq!(cfg["reg"].username, "u");
        assert_eq!(cfg["reg"].password, "p");
    }

    #[test]
    fn field_names_match_case_insensitively_as_go() {
        let cfg = read_docker_config_json_file_from_bytes(
            br#"{"Auths": {"reg": {"Username": "u", "PASSWORD": "p"}}}"#,
        )
        .expect("parse");
        assert_eq!(cfg["reg"].username, "u");
        assert_eq!(cfg["reg"].password, "p");
    }

    #[test]
    fn legacy_dockercfg_is_the_map_itself() {
        let cfg =
            read_docker_config_file_from_bytes(br#"{"reg": {"username": "u"}}"#).expect("parse");
        assert_eq!(cfg["reg"].username, "u");
        // A config.json without auths has no credentials.
        assert!(
            read_docker_config_json_file_from_bytes(b"{}")
                .expect("parse")
                .is_empty()
        );
    }

    #[test]
    fn auth_decoding_padded_unpadded_and_bad() {
        // "u:pw" is 4 bytes: padded "dTpwdw==", unpadded "dTpwdw".
        assert_eq!(
            decode_docker_config_field_auth("dTpwdw==").expect("padded"),
            ("u".into(), "pw".into())
        );
        assert_eq!(
            decode_docker_config_field_auth("dTpwdw").expect("unpadded"),
            ("u".into(), "pw".into())
        );
        assert!(matches!(
            decode_docker_config_field_auth(&b64("nocolon")),
            Err(Error::AuthField)
        ));
        assert!(matches!(
            decode_docker_config_field_auth("!!!!"),
            Err(Error::Base64(0))
        ));
        let doc = br#"{"auths": {"reg": {"auth": "!!!!"}}}"#;
        assert!(read_docker_config_json_file_from_bytes(doc).is_err());
    }

    #[test]
    fn malformed_documents_fail() {
        assert!(matches!(
            read_docker_config_json_file_from_bytes(b"not json"),
            Err(Error::Json(_))
        ));
        assert!(read_docker_config_json_file_from_bytes(br#"{"auths": []}"#).is_err());
        assert!(read_docker_config_file_from_bytes(br#"{"reg": {"username": 3}}"#).is_err());
    }
}
