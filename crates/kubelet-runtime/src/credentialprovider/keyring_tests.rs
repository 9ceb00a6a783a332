//! Upstream `keyring_test.go` cases.

use super::*;
use crate::credentialprovider::config::{DockerConfigEntry, read_docker_config_file_from_bytes};

const AUTH_FOO_BAR: &str = "Zm9vOmJhcg=="; // base64("foo:bar")

fn keyring_of(doc: &str) -> BasicDockerKeyring {
    let cfg = read_docker_config_file_from_bytes(doc.as_bytes()).expect("config");
    let mut k = BasicDockerKeyring::default();
    k.add(&cfg);
    k
}

fn one_entry(loc: &str) -> BasicDockerKeyring {
    keyring_of(&format!(
        r#"{{"{loc}": {{"email": "foo@bar.baz", "auth": "{AUTH_FOO_BAR}"}}}}"#
    ))
}

#[test]
fn urls_match() {
    let cases = [
        // No path component.
        ("*.kubernetes.io", "prefix.kubernetes.io", true),
        ("prefix.*.io", "prefix.kubernetes.io", true),
        ("prefix.kubernetes.*", "prefix.kubernetes.io", true),
        ("*-good.kubernetes.io", "prefix-good.kubernetes.io", true),
        // Paths.
        ("*.kubernetes.io/blah", "prefix.kubernetes.io/blah", true),
        ("prefix.*.io/foo", "prefix.kubernetes.io/foo/bar", true),
        // Paths and ports.
        (
            "*.kubernetes.io:1111/blah",
            "prefix.kubernetes.io:1111/blah",
            true,
        ),
        (
            "prefix.*.io:1111/foo",
            "prefix.kubernetes.io:1111/foo/bar",
            true,
        ),
        // The number of labels differs.
        ("*.kubernetes.io", "kubernetes.io", false),
        ("*.*.kubernetes.io", "prefix.kubernetes.io", false),
        ("*.*.kubernetes.io", "kubernetes.io", false),
        // Some label differs.
        ("kubernetes.io", "kubernetes.com", false),
        ("k*.io", "quay.io", false),
        // Ports differ.
        (
            "*.kubernetes.io:1234/blah",
            "prefix.kubernetes.io:1111/blah",
            false,
        ),
        (
            "prefix.*.io/foo",
            "prefix.kubernetes.io:1111/foo/bar",
            false,
        ),
        // The location's path is no prefix.
        ("kubernetes.io/foo", "kubernetes.io/bar", false),
        // Classes and single characters.
        ("reg[0-9].io", "reg7.io", true),
        ("reg[^0-9].io", "reg7.io", false),
        // `?` starts a URL query, as with Go's parser: no glob.
        ("re?.io", "reg.io", false),
        // A malformed glob matches nothing.
        ("reg[.io", "reg[.io", false),
    ];
    for (glob, target, want) in cases {
        assert_eq!(urls_match_str(glob, target), want, "{glob} vs {target}");
    }
}

#[test]
fn label_globs_match_as_go_s_filepath_match() {
    let long = "a".repeat(60);
    let cases = [
        ("a*b*c", "aXXbYYc", Some(true)),
        ("a*b*c", "aXXbYYcZ", Some(false)),
        // The last chunk must end the name, wherever it first matched.
        ("*c", "abcbc", Some(true)),
        ("a*", "abc", Some(true)),
        ("**", "", Some(true)),
        ("*x", "", Some(false)),
        ("a?c", "abc", Some(true)),
        ("a\\*c", "a*c", Some(true)),
        ("a\\*c", "abc", Some(false)),
        ("[a-c]*x", "bzzx", Some(true)),
        ("[^a-c]*x", "bzzx", Some(false)),
        // Malformed after a match, and after a mismatch: Go's ErrBadPattern.
        ("a*[", "abc", None),
        ("x[", "abc", None),
        // Stars backtracking would take 60^8 steps over.
        ("a*a*a*a*a*a*a*a*b", long.as_str(), Some(false)),
        ("a*a*a*a*a*a*a*a*a", long.as_str(), Some(true)),
    ];
    for (pattern, name, want) in cases {
        assert_eq!(
            glob_match(pattern.as_bytes(), name.as_bytes()),
            want,
            "{pattern} vs {name}"
        );
    }
    // The fuzz finding: a registry glob of eight stars against a long host.
    let host = format!("registry.example{}", "_".repeat(59));
    assert!(!urls_match_str("re*.examp********e?com.demae-", &host));
}

#[test]
fn keyring_for_glob() {
    let cases = [
        ("https://hello.kubernetes.io", "hello.kubernetes.io"),
        ("https://*.docker.io", "prefix.docker.io"),
        ("https://prefix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.*", "prefix.docker.io"),
        ("https://*.docker.io/path", "prefix.docker.io/path"),
        ("https://prefix.*.io/path", "prefix.docker.io/path/subpath"),
        ("https://prefix.docker.*/path", "prefix.docker.io/path"),
        ("https://*.docker.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.*.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.docker.*:8888", "prefix.docker.io:8888"),
        (
            "https://*.docker.io/path:1111",
            "prefix.docker.io/path:1111",
        ),
        ("https://*.docker.io/v1/", "prefix.docker.io/path:1111"),
        ("https://*.docker.io/v2/", "prefix.docker.io/path:1111"),
        (
            "https://prefix.docker.*/path:1111",
            "prefix.docker.io/path:1111",
        ),
        ("prefix.docker.io:1111", "prefix.docker.io:1111/path"),
        ("*.docker.io:1111", "prefix.docker.io:1111/path"),
    ];
    for (glob, target) in cases {
        let creds = one_entry(glob).lookup(&format!("{target}/foo/bar"));
        let c = creds
            .first()
            .unwrap_or_else(|| panic!("{glob} serves {target}"));
        assert_eq!(
            (c.username.as_str(), c.password.as_str(), c.email.as_str()),
            ("foo", "bar", "foo@bar.baz"),
            "{glob}"
        );
    }
}

#[test]
fn keyring_miss() {
    let cases = [
        ("https://hello.kubernetes.io", "world.mesos.org/foo/bar"),
        ("https://*.docker.com", "prefix.docker.io"),
        ("https://suffix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.c*", "prefix.docker.io"),
        (
            "https://prefix.*.io/path:1111",
            "prefix.docker.io/path/subpath:1111",
        ),
        ("suffix.*.io", "prefix.docker.io"),
    ];
    for (glob, lookup) in cases {
        assert!(
            one_entry(glob)
                .lookup(&format!("{lookup}/foo/bar"))
                .is_empty(),
            "{glob} must not serve {lookup}"
        );
    }
}

#[test]
fn docker_hub_credentials() {
    let k = one_entry("https://index.docker.io/v1/");
    // Another registry is not Docker Hub.
    assert!(k.lookup("world.mesos.org/foo/bar").is_empty());
    // Unqualified names, with and without a user, are.
    for image in ["google/docker-registry", "jenkins"] {
        let creds = k.lookup(image);
        assert_eq!(creds.len(), 1, "{image}");
        assert_eq!(creds[0].username, "foo");
        assert_eq!(creds[0].password, "bar");
    }
    // Qualified with the registry: the location itself matches.
    let creds = k.lookup("index.docker.io/v1//google/docker-registry");
    assert!(!creds.is_empty() && creds.len() <= 2);
    assert_eq!(creds[0].username, "foo");
    // The normalized form the kubelet looks up with.
    assert_eq!(k.lookup("docker.io/library/busybox").len(), 1);
}

#[test]
fn default_registry_match() {
    for (image, want) in [
        ("foo/bar", true),
        ("docker.io/foo/bar", true),
        ("index.docker.io/foo/bar", true),
        ("foo", true),
        ("", false),
        ("registry.tld/foo/bar", false),
        ("registry:5000/foo/bar", false),
        ("myhostdocker.io/foo/bar", false),
    ] {
        assert_eq!(is_default_registry_match(image), want, "{image:?}");
    }
}

fn entry(user: &str, pass: &str, email: &str) -> DockerConfigEntry {
    DockerConfigEntry {
        username: user.into(),
        password: pass.into(),
        email: email.into(),
    }
}

fn users(creds: &[AuthConfig]) -> Vec<&str> {
    creds.iter().map(|c| c.username.as_str()).collect()
}

#[test]
fn lookup_more_specific_first() {
    let mut dk = BasicDockerKeyring::default();
    dk.add(&DockerConfig::from([
        (
            "bar.example.com/pong".to_string(),
            entry("grace", "squash", "grace@example.com"),
        ),
        (
            "bar.example.com".to_string(),
            entry("ada", "smash", "ada@example.com"),
        ),
    ]));
    let cases: [(&str, &[&str]); 7] = [
        ("bar.example.com", &["ada"]),
        ("bar.example.com/pong", &["grace", "ada"]),
        ("bar.example.com/ping", &["ada"]),
        // A path prefix, not a path component, as upstream.
        ("bar.example.com/pongz", &["grace", "ada"]),
        ("bar.example.com/pong/pang", &["grace", "ada"]),
        ("example.com", &[]),
        ("foo.example.com", &[]),
    ];
    for (image, want) in cases {
        assert_eq!(users(&dk.lookup(image)), want, "{image}");
    }
    let grace = &dk.lookup("bar.example.com/pong")[0];
    assert_eq!(
        grace,
        &AuthConfig {
            username: "grace".into(),
            password: "squash".into(),
            email: "grace@example.com".into(),
            ..AuthConfig::default()
        }
    );
}

#[test]
fn scheme_and_api_path_match_the_host() {
    // Upstream issue 3797.
    let mut dk = BasicDockerKeyring::default();
    dk.add(&DockerConfig::from([(
        "https://quay.io/v1/".to_string(),
        entry("rex", "tiny arms", "rex@example.com"),
    )]));
    for image in ["quay.io", "quay.io/foo", "quay.io/foo/bar"] {
        assert_eq!(users(&dk.lookup(image)), ["rex"], "{image}");
    }
}

#[test]
fn same_location_from_two_configs_keeps_add_order() {
    let mut dk = BasicDockerKeyring::default();
    dk.add(&DockerConfig::from([(
        "localhost:5001".to_string(),
        entry("first", "p1", ""),
    )]));
    dk.add(&DockerConfig::from([(
        "http://localhost:5001".to_string(),
        entry("second", "p2", ""),
    )]));
    assert_eq!(
        users(&dk.lookup("localhost:5001/private/busybox")),
        ["first", "second"]
    );
    // Another port is another registry.
    assert!(dk.lookup("localhost:5000/private/busybox").is_empty());
    // A location that is no URL is skipped.
    dk.add(&DockerConfig::from([(
        "bad host:x".to_string(),
        entry("bad", "", ""),
    )]));
    assert!(dk.lookup("bad host:x/a").is_empty());
}

#[test]
fn union_keeps_keyring_order_and_cri_form() {
    let mut a = BasicDockerKeyring::default();
    a.add(&DockerConfig::from([(
        "reg.io".to_string(),
        entry("a", "pa", "e"),
    )]));
    let mut b = BasicDockerKeyring::default();
    b.add(&DockerConfig::from([(
        "reg.io".to_string(),
        entry("b", "pb", "e"),
    )]));
    let u = UnionDockerKeyring(vec![Arc::new(a), Arc::new(b)]);
    let creds = u.lookup("reg.io/x");
    assert_eq!(users(&creds), ["a", "b"]);
    let cri: cri::pb::AuthConfig = (&creds[0]).into();
    assert_eq!(
        cri,
        cri::pb::AuthConfig {
            username: "a".into(),
            password: "pa".into(),
            ..Default::default()
        }
    );
}

#[test]
fn schemeless_url_errors_in_go_s_words() {
    for ok in [
        "*.registry.io",
        "registry.io:8080/path",
        "*.*.ecr.*.amazonaws.com",
        "[::1]:5000",
    ] {
        assert_eq!(schemeless_url_error(ok), None, "{ok}");
    }
    assert_eq!(
        schemeless_url_error("reg io").as_deref(),
        Some("parse \"https://reg io\": invalid character \" \" in host name")
    );
    assert_eq!(
        schemeless_url_error("reg.io:port").as_deref(),
        Some("parse \"https://reg.io:port\": invalid port \":port\" after host")
    );
}
