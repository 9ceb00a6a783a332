//! Tests of running a plugin binary: shell scripts in a temp dir.
use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::api::CacheKeyType;

/// A plugin script `name` in `dir`.
fn script(dir: &std::path::Path, name: &str, body: &str) -> ExecPlugin {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    ExecPlugin::new(
        dir,
        &CredentialProvider {
            name: name.into(),
            api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
            args: vec!["get-credentials".into()],
            env: vec![ExecEnvVar {
                name: "PLUGIN_MODE".into(),
                value: "test".into(),
            }],
            ..Default::default()
        },
    )
}

const RESPONSE: &str = r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"5m","auth":{"reg.io":{"username":"u","password":"p"}}}"#;

#[tokio::test]
async fn the_request_goes_on_stdin_and_the_response_is_parsed() {
    let dir = tempfile::tempdir().expect("tmp");
    let seen = dir.path().join("seen");
    let plugin = script(
        dir.path(),
        "answer",
        &format!(
            "cat > {seen}.stdin; echo \"$1 $PLUGIN_MODE ${{HOME:+home}}\" > {seen}.env\necho '{RESPONSE}'",
            seen = seen.display()
        ),
    );
    let annotations = BTreeMap::from([("example.com/role".to_string(), "puller".to_string())]);
    let r = plugin
        .exec_plugin("reg.io/app", "tok", &annotations)
        .await
        .expect("response");
    assert_eq!(r.cache_key_type, Ok(CacheKeyType::Registry));
    assert_eq!(r.cache_duration, Some(300_000_000_000));
    assert_eq!(r.auth["reg.io"].username, "u");
    assert_eq!(r.auth["reg.io"].password, "p");
    let stdin: serde_json::Value =
        serde_json::from_slice(&std::fs::read(seen.with_extension("stdin")).expect("stdin"))
            .expect("request json");
    assert_eq!(
        stdin,
        serde_json::json!({
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "kind": "CredentialProviderRequest",
            "image": "reg.io/app",
            "serviceAccountToken": "tok",
            "serviceAccountAnnotations": {"example.com/role": "puller"},
        })
    );
    // The args, the provider's env and the kubelet's own environment.
    let env = std::fs::read_to_string(seen.with_extension("env")).expect("env");
    assert_eq!(env.trim(), "get-credentials test home");
}

#[tokio::test]
async fn older_versions_get_no_token() {
    let dir = tempfile::tempdir().expect("tmp");
    let seen = dir.path().join("seen");
    let mut plugin = script(
        dir.path(),
        "beta",
        &format!(
            "cat > {}\necho '{}'",
            seen.display(),
            RESPONSE.replace("/v1\"", "/v1beta1\"")
        ),
    );
    plugin.api_version = "credentialprovider.kubelet.k8s.io/v1beta1".into();
    plugin
        .exec_plugin("reg.io/app", "tok", &BTreeMap::new())
        .await
        .expect("response");
    let stdin: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&seen).expect("stdin")).expect("json");
    assert_eq!(
        stdin,
        serde_json::json!({
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1beta1",
            "kind": "CredentialProviderRequest",
            "image": "reg.io/app",
        })
    );
}

#[tokio::test]
async fn wrong_answers_are_rejected_with_upstream_s_words() {
    let dir = tempfile::tempdir().expect("tmp");
    let none = BTreeMap::new();
    let other_version = script(
        dir.path(),
        "alpha",
        &format!("echo '{}'", RESPONSE.replace("/v1\"", "/v1alpha1\"")),
    );
    let e = other_version
        .exec_plugin("reg.io/app", "", &none)
        .await
        .expect_err("version");
    assert_eq!(
        e.to_string(),
        "apiVersion from credential plugin response did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1alpha1"
    );
    let extra = script(
        dir.path(),
        "extra",
        &format!(
            "echo '{}'",
            RESPONSE.replace("\"auth\"", "\"secret\":1,\"auth\"")
        ),
    );
    // Unknown fields are ignored, as upstream's decoder ignores them.
    let r = extra
        .exec_plugin("reg.io/app", "", &none)
        .await
        .expect("unknown fields ignored");
    assert_eq!(r.cache_key_type, Ok(CacheKeyType::Registry));
    assert_eq!(r.auth["reg.io"].password, "p");
    // A known field of the wrong type is no response.
    let mistyped = script(
        dir.path(),
        "mistyped",
        &format!(
            "echo '{}'",
            RESPONSE.replace("\"cacheKeyType\":\"Registry\"", "\"cacheKeyType\":1")
        ),
    );
    let e = mistyped
        .exec_plugin("reg.io/app", "", &none)
        .await
        .expect_err("mistyped");
    assert_eq!(
        e.to_string(),
        "error decoding credential provider plugin response from stdout"
    );
    let garbage = script(dir.path(), "garbage", "echo not json");
    let e = garbage
        .exec_plugin("reg.io/app", "", &none)
        .await
        .expect_err("gvk");
    assert!(
        e.to_string()
            .starts_with("error reading GVK from response: "),
        "{e}"
    );
    let failing = script(dir.path(), "failing", "echo 'no registry' >&2; exit 3");
    let e = failing
        .exec_plugin("reg.io/app", "", &none)
        .await
        .expect_err("exit");
    assert_eq!(
        e.to_string(),
        "error execing credential provider plugin failing for image reg.io/app: exit status 3: no registry\n"
    );
}

/// Counts runs and errors per plugin.
#[derive(Default)]
struct Counts(parking_lot::Mutex<Vec<(String, bool)>>);

impl PluginMetrics for Counts {
    fn observe_plugin_duration(&self, plugin: &str, _: Duration) {
        self.0.lock().push((plugin.into(), false));
    }
    fn inc_plugin_errors(&self, plugin: &str) {
        self.0.lock().push((plugin.into(), true));
    }
}

#[tokio::test]
async fn a_hanging_plugin_is_killed_at_its_deadline() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut plugin = script(dir.path(), "hang", "exec sleep 600");
    plugin.timeout = Duration::from_millis(300);
    let counts = Arc::new(Counts::default());
    plugin.metrics = Some(counts.clone());
    let started = tokio::time::Instant::now();
    let e = plugin
        .exec_plugin("reg.io/app", "", &BTreeMap::new())
        .await
        .expect_err("deadline");
    assert_eq!(
        e.to_string(),
        "error execing credential provider plugin hang for image reg.io/app: context deadline exceeded: "
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "not the sleep's end"
    );
    // The run is recorded, as an error too.
    assert_eq!(
        counts.0.lock().clone(),
        [("hang".to_string(), false), ("hang".to_string(), true)]
    );
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

#[tokio::test]
async fn the_deadline_kills_what_the_plugin_started_too() {
    let dir = tempfile::tempdir().expect("tmp");
    let pidfile = dir.path().join("pid");
    let mut plugin = script(
        dir.path(),
        "forks",
        &format!(
            "sleep 600 >/dev/null 2>&1 &\necho $! > {}\nwait",
            pidfile.display()
        ),
    );
    plugin.timeout = Duration::from_millis(500);
    let e = plugin
        .exec_plugin("reg.io/app", "", &BTreeMap::new())
        .await
        .expect_err("deadline");
    assert!(e.to_string().contains("context deadline exceeded"), "{e}");
    let pid = std::fs::read_to_string(&pidfile).expect("pid");
    let pid = pid.trim();
    assert!(!pid.is_empty());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plugin's child {pid} outlived it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn output_past_the_cap_is_an_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let none = BTreeMap::new();
    let chatty = script(dir.path(), "chatty", "head -c 2000000 /dev/zero");
    let e = chatty
        .exec_plugin("reg.io/app", "", &none)
        .await
        .expect_err("stdout cap");
    assert!(
        e.to_string()
            .contains("the plugin's stdout exceeded 1048576 bytes"),
        "{e}"
    );
    let noisy = script(dir.path(), "noisy", "head -c 2000000 /dev/zero >&2");
    let e = noisy
        .exec_plugin("reg.io/app", "", &none)
        .await
        .expect_err("stderr cap");
    assert!(
        e.to_string()
            .contains("the plugin's stderr exceeded 1048576 bytes"),
        "{e}"
    );
}

#[tokio::test]
async fn stderr_in_an_error_is_truncated_and_dropped_in_token_mode() {
    let dir = tempfile::tempdir().expect("tmp");
    let long = script(
        dir.path(),
        "long",
        "head -c 10000 /dev/zero | tr '\\0' x >&2; exit 1",
    );
    let e = long
        .exec_plugin("reg.io/app", "", &BTreeMap::new())
        .await
        .expect_err("exit");
    let Error::Exec { stderr, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(
        stderr,
        &format!("{}... (truncated)", "x".repeat(STDERR_IN_ERROR))
    );
    let echoes = script(dir.path(), "echoes", "cat >&2; exit 1");
    let e = echoes
        .exec_plugin("reg.io/app", "secret-token", &BTreeMap::new())
        .await
        .expect_err("exit");
    assert_eq!(
        e.to_string(),
        "error execing credential provider plugin echoes for image reg.io/app: exit status 1: "
    );
    assert!(!format!("{e:?}").contains("secret-token"));
}
