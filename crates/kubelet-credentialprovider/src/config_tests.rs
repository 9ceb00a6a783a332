//! Tests of config reading and validation.
use super::*;

const V1: &str = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: test
    matchImages: ["*.registry.io", "registry.io:8080/path"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [--v=5]
    env:
      - name: FOO
        value: bar
"#;

fn decode_str(s: &str) -> Result<CredentialProviderConfig, String> {
    decode(s.as_bytes())
}

#[test]
fn a_v1_yaml_config_decodes_in_full() {
    let cfg = decode_str(V1).expect("v1");
    assert_eq!(
        cfg.providers,
        [CredentialProvider {
            name: "test".into(),
            match_images: vec!["*.registry.io".into(), "registry.io:8080/path".into()],
            default_cache_duration: Some(600_000_000_000),
            api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
            args: vec!["--v=5".into()],
            env: vec![ExecEnvVar {
                name: "FOO".into(),
                value: "bar".into()
            }],
            token_attributes: None,
        }]
    );
    assert!(validate(&cfg, true).is_empty());
}

#[test]
fn json_and_the_older_versions_decode_too() {
    for v in ["v1alpha1", "v1beta1"] {
        let doc = format!(
            r#"{{"apiVersion":"kubelet.config.k8s.io/{v}","kind":"CredentialProviderConfig",
            "providers":[{{"name":"p","matchImages":["reg.io"],"defaultCacheDuration":"0s",
            "apiVersion":"credentialprovider.kubelet.k8s.io/{v}"}}]}}"#
        );
        let cfg = decode_str(&doc).expect(v);
        assert_eq!(cfg.providers[0].default_cache_duration, Some(0));
        assert!(validate(&cfg, true).is_empty(), "{v}");
    }
}

#[test]
fn decoding_is_strict_and_checks_group_and_kind() {
    let e = decode_str(&V1.replace("args:", "argz:")).expect_err("unknown field");
    assert!(
        e.starts_with("strict decoding error: unknown field `argz`"),
        "{e}"
    );
    let e = decode_str(&V1.replace("kubelet.config.k8s.io/v1", "other.io/v1")).expect_err("group");
    assert_eq!(
        e,
        "failed to decode CredentialProviderConfig, unexpected Group: other.io"
    );
    let e = decode_str(&V1.replace(
        "kind: CredentialProviderConfig",
        "kind: KubeletConfiguration",
    ))
    .expect_err("kind");
    assert_eq!(e, "failed to decode \"KubeletConfiguration\" (wrong Kind)");
    let e = decode_str(&V1.replace("10m", "10 minutes")).expect_err("duration");
    assert!(e.starts_with("time: "), "{e}");
    // tokenAttributes exist only in the v1 config.
    let beta = V1.replace(
        "kubelet.config.k8s.io/v1\n",
        "kubelet.config.k8s.io/v1beta1\n",
    ) + "    tokenAttributes:\n      serviceAccountTokenAudience: a\n";
    let e = decode_str(&beta).expect_err("v1beta1 tokenAttributes");
    assert_eq!(
        e,
        "strict decoding error: unknown field \"providers[0].tokenAttributes\""
    );
}

fn provider(name: &str) -> CredentialProvider {
    CredentialProvider {
        name: name.into(),
        match_images: vec!["reg.io".into()],
        default_cache_duration: Some(0),
        api_version: PLUGIN_API_V1.into(),
        ..Default::default()
    }
}

fn errors(providers: Vec<CredentialProvider>) -> Vec<String> {
    validate(&CredentialProviderConfig { providers }, true)
}

#[test]
fn validation_errors_are_upstream_s() {
    assert_eq!(
        errors(vec![]),
        ["providers: Required value: at least 1 item in plugins is required"]
    );
    let mut bad = provider("a/b c");
    bad.api_version = "credentialprovider.kubelet.k8s.io/v2".into();
    bad.match_images = vec![];
    bad.default_cache_duration = Some(-60_000_000_000);
    assert_eq!(
        errors(vec![bad]),
        [
            "providers.name: Invalid value: \"a/b c\": provider name cannot contain '/'",
            "providers.name: Invalid value: \"a/b c\": provider name cannot contain spaces",
            "providers.apiVersion: Unsupported value: \"credentialprovider.kubelet.k8s.io/v2\": supported values: \"credentialprovider.kubelet.k8s.io/v1\", \"credentialprovider.kubelet.k8s.io/v1alpha1\", \"credentialprovider.kubelet.k8s.io/v1beta1\"",
            "providers.matchImages: Required value: at least 1 item in matchImages is required",
            "providers.defaultCacheDuration: Invalid value: \"-1m0s\": defaultCacheDuration must be greater than or equal to 0",
        ]
    );
    let mut p = provider("..");
    p.api_version = String::new();
    p.default_cache_duration = None;
    p.match_images = vec!["reg io".into()];
    assert_eq!(
        errors(vec![p, provider("x"), provider("x")]),
        [
            "providers.name: Invalid value: \"..\": provider name cannot be '..'",
            "providers.apiVersion: Required value",
            "providers.matchImages: Invalid value: \"reg io\": match image is invalid: parse \"https://reg io\": invalid character \" \" in host name",
            "providers.defaultCacheDuration: Required value",
            "providers.name: Duplicate value: \"x\"",
        ]
    );
    assert_eq!(
        aggregate(&errors(vec![provider(".")])),
        "providers.name: Invalid value: \".\": provider name cannot be '.'"
    );
}

#[test]
fn token_attributes_are_validated_for_v1_only_and_behind_the_gate() {
    let mut p = provider("sa");
    p.api_version = "credentialprovider.kubelet.k8s.io/v1beta1".into();
    p.token_attributes = Some(TokenAttributes {
        require_service_account: Some(false),
        required_service_account_annotation_keys: vec!["example.com/role".into(), "Bad Key".into()],
        optional_service_account_annotation_keys: vec!["example.com/role".into()],
        cache_type: "Forever".into(),
        ..Default::default()
    });
    let cfg = CredentialProviderConfig { providers: vec![p] };
    let errs = validate(&cfg, false);
    let f = "providers.tokenAttributes";
    assert_eq!(
        errs[..5],
        [
            format!(
                "{f}: Forbidden: tokenAttributes is not supported when KubeletServiceAccountTokenForCredentialProviders feature gate is disabled"
            ),
            format!("{f}.serviceAccountTokenAudience: Required value"),
            format!(
                "{f}: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version"
            ),
            format!(
                "{f}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"
            ),
            format!(
                "{f}.requiredServiceAccountAnnotationKeys: Invalid value: \"Bad Key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            ),
        ]
    );
    assert_eq!(
        errs[5..],
        [
            format!(
                "{f}: Invalid value: [\"example.com/role\"]: annotation keys cannot be both required and optional"
            ),
            format!(
                "{f}.cacheType: Unsupported value: \"Forever\": supported values: \"ServiceAccount\", \"Token\""
            ),
        ]
    );
    let mut ok = provider("sa");
    ok.token_attributes = Some(TokenAttributes {
        service_account_token_audience: "registry.example.com".into(),
        require_service_account: Some(true),
        required_service_account_annotation_keys: vec!["example.com/role".into()],
        cache_type: "ServiceAccount".into(),
        ..Default::default()
    });
    assert!(
        validate(
            &CredentialProviderConfig {
                providers: vec![ok.clone()]
            },
            true
        )
        .is_empty()
    );
    ok.token_attributes.as_mut().expect("attrs").cache_type = String::new();
    assert_eq!(
        validate(
            &CredentialProviderConfig {
                providers: vec![ok]
            },
            true
        ),
        [format!(
            "{f}.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token"
        )]
    );
}

#[tokio::test]
async fn a_directory_of_configs_merges_in_name_order() {
    let dir = tempfile::tempdir().expect("tmp");
    let doc = |name: &str| {
        format!(
            "{{\"apiVersion\":\"kubelet.config.k8s.io/v1\",\"kind\":\"CredentialProviderConfig\",\
             \"providers\":[{{\"name\":\"{name}\",\"matchImages\":[\"r.io\"],\"defaultCacheDuration\":\"1m\",\
             \"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\"}}]}}"
        )
    };
    std::fs::write(dir.path().join("b.yaml"), doc("second")).expect("write");
    std::fs::write(dir.path().join("a.json"), doc("first")).expect("write");
    std::fs::write(dir.path().join("notes.txt"), "ignored").expect("write");
    let cfg = read_credential_provider_config(dir.path())
        .await
        .expect("dir");
    let names: Vec<_> = cfg.providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
    std::fs::write(dir.path().join("c.yml"), doc("first")).expect("write");
    let e = read_credential_provider_config(dir.path())
        .await
        .expect_err("dup");
    assert_eq!(
        e.to_string(),
        "duplicate provider name \"first\" found in configuration file(s)"
    );
    let empty = tempfile::tempdir().expect("tmp");
    let e = read_credential_provider_config(empty.path())
        .await
        .expect_err("empty");
    assert!(matches!(e, Error::NoConfigFiles(_)), "{e}");
    let e = read_credential_provider_config(Path::new(""))
        .await
        .expect_err("empty path");
    assert_eq!(e.to_string(), "credential provider config path is empty");
    let e = read_credential_provider_config(&dir.path().join("missing"))
        .await
        .expect_err("missing");
    assert!(e.to_string().starts_with("unable to access path"), "{e}");
}

#[test]
fn an_alias_bomb_is_refused_and_anchors_are_not() {
    // Five levels of ten aliases in a provider's args: 100,000 replayed
    // events, which the parser's default limit lets through (to a type
    // error); refused here before they are replayed.
    let mut levels = String::from("    x0: &a [x,x,x,x,x,x,x,x,x,x]\n");
    for (i, (prev, next)) in ["a", "b", "c", "d"]
        .iter()
        .zip(["b", "c", "d", "e"])
        .enumerate()
    {
        let refs = vec![format!("*{prev}"); 10].join(",");
        levels.push_str(&format!("    x{}: &{next} [{refs}]\n", i + 1));
    }
    let bomb = format!(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: t\n    matchImages: [a.io]\n    defaultCacheDuration: 1m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n    env:\n{}\n    args: *e\n",
        levels
            .replace("    x", "      - {name: x")
            .replace(": &", ", value: &")
            .replace("]\n", "]}\n")
    );
    let e = decode_str(&bomb).expect_err("100,000 replayed events");
    assert!(e.to_lowercase().contains("alias"), "{e}");
    let anchored = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: a\n    matchImages: &m [a.io]\n    defaultCacheDuration: 1m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n  - name: b\n    matchImages: *m\n    defaultCacheDuration: 1m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n";
    let c = decode_str(anchored).expect("a few aliases are fine");
    assert_eq!(c.providers.len(), 2);
}
