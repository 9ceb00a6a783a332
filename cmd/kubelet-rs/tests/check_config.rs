//! `kubelet-rs check`'s flag, config-file and static-manifest findings,
//! through the built binary, on the broken files of
//! `tests/fixtures/check/config` and `tests/fixtures/check/manifests`: the
//! kind, file, line and message of each. The CRI endpoint is a socket
//! nobody serves and the ports are free, so no containerd is needed; the
//! runtime, host and credential findings that also appear are not asserted.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-rs");

/// Kinds this test owns.
const MINE: &[&str] = &["flag", "config", "manifest"];

fn fixture(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/check")
        .join(kind)
        .join(name)
}

// Ports from lane 1's range, which the other lane's `:0` binds never take.
use common::free_port;

/// Flags that keep the other checks out of the way: a tempdir root, a
/// socket nobody serves, free loopback ports, swap allowed.
fn base(dir: &Path) -> Vec<String> {
    vec![
        format!("--root-dir={}", dir.join("root").display()),
        format!("--cert-dir={}", dir.join("pki").display()),
        format!(
            "--container-runtime-endpoint=unix://{}",
            dir.join("none.sock").display()
        ),
        format!("--healthz-port={}", free_port()),
        format!("--port={}", free_port()),
        "--read-only-port=0".into(),
        "--fail-swap-on=false".into(),
        "--hostname-override=check-node".into(),
    ]
}

struct Run {
    code: i32,
    doc: Value,
}

impl Run {
    /// Findings of my kinds.
    fn mine(&self) -> Vec<&Value> {
        self.doc["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .filter(|f| MINE.contains(&f["kind"].as_str().unwrap_or("")))
            .collect()
    }

    /// The one finding of my kinds with this field.
    fn at(&self, field: &str) -> &Value {
        let hits: Vec<&Value> = self
            .mine()
            .into_iter()
            .filter(|f| f["field"] == field)
            .collect();
        assert_eq!(hits.len(), 1, "{field}: {:#}", self.doc);
        hits[0]
    }

    fn errors_of_mine(&self) -> usize {
        self.mine()
            .iter()
            .filter(|f| f["severity"] == "error")
            .count()
    }
}

fn check(extra: &[String]) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("check")
        .args(["-o", "json"])
        .args(base(dir.path()))
        .args(extra)
        .output()
        .expect("run kubelet-rs check");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let code = out.status.code().expect("exit code");
    let errors = doc["errors"].as_u64().expect("errors");
    assert_eq!(code, i32::from(errors > 0), "exit follows errors: {doc:#}");
    Run { code, doc }
}

fn config(name: &str) -> (PathBuf, Run) {
    let path = fixture("config", name);
    let run = check(&[format!("--config={}", path.display())]);
    (path, run)
}

fn manifest(name: &str) -> (PathBuf, Run) {
    let path = fixture("manifests", name);
    let run = check(&[format!("--pod-manifest-path={}", path.display())]);
    (path, run)
}

fn assert_at(f: &Value, severity: &str, kind: &str, file: &Path, line: u64) {
    assert_eq!(f["severity"], severity, "{f:#}");
    assert_eq!(f["kind"], kind, "{f:#}");
    assert_eq!(f["file"], file.display().to_string(), "{f:#}");
    assert_eq!(f["line"], line, "{f:#}");
}

#[test]
fn a_clean_config_and_a_valid_manifest_have_no_errors_of_these_kinds() {
    let path = fixture("config", "clean.yaml");
    let m = fixture("manifests", "valid.yaml");
    let run = check(&[
        format!("--config={}", path.display()),
        format!("--pod-manifest-path={}", m.display()),
    ]);
    assert_eq!(run.errors_of_mine(), 0, "{:#}", run.doc);
    // Only flag deprecations: the base flags set config-file fields.
    for f in run.mine() {
        assert_eq!(f["kind"], "flag", "{f:#}");
        assert_eq!(f["severity"], "warning", "{f:#}");
    }
    let port = run.at("--healthz-port");
    assert!(
        port["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Flag --healthz-port has been deprecated")),
        "{port:#}"
    );
}

#[test]
fn unknown_fields_are_warnings_at_the_nested_keys_line() {
    let (path, run) = config("unknown-nested.yaml");
    let nested = run.at("authentication.x509.bogus");
    assert_at(nested, "warning", "config", &path, 10);
    assert!(
        nested["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("unknown field \"authentication.x509.bogus\"")),
        "{nested:#}"
    );
    assert_at(run.at("x509"), "warning", "config", &path, 3);
    assert_at(run.at("maxPodz"), "warning", "config", &path, 11);
    assert_eq!(run.errors_of_mine(), 0, "{:#}", run.doc);
}

#[test]
fn out_of_range_values_are_errors_in_upstreams_words() {
    let (path, run) = config("out-of-range.yaml");
    assert_eq!(run.code, 1);
    let m = run.at("maxPods");
    assert_at(m, "error", "config", &path, 3);
    assert_eq!(
        m["message"],
        "invalid configuration: maxPods (--max-pods) -1 must not be a negative number"
    );
    let e = run.at("eventBurst");
    assert_at(e, "error", "config", &path, 7);
    assert_eq!(
        e["message"],
        "invalid configuration: eventBurst (--event-burst) -3 must not be a negative number"
    );
    // --healthz-port (a free port) beats the file's 70000.
    assert!(
        run.mine().iter().all(|f| f["field"] != "healthzPort"),
        "{:#}",
        run.doc
    );
    let gc = run.at("imageGCLowThresholdPercent");
    assert_at(gc, "error", "config", &path, 6);
    assert_eq!(
        gc["message"],
        "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 90 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 70"
    );
}

#[test]
fn an_unknown_eviction_signal_and_a_bad_cgroup_driver_are_errors() {
    let (path, run) = config("eviction-signal.yaml");
    assert_eq!(run.code, 1);
    let e = run.at("evictionHard.foo");
    assert_at(e, "error", "config", &path, 5);
    assert_eq!(
        e["message"],
        "invalid configuration: evictionHard: unsupported eviction signal foo"
    );
    let (path, run) = config("bad-cgroup-driver.yaml");
    assert_eq!(run.code, 1);
    let c = run.at("cgroupDriver");
    assert_at(c, "error", "config", &path, 3);
    assert!(
        c["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"upstart\"") && m.contains("cgroupfs or systemd")),
        "{c:#}"
    );
}

#[test]
fn deprecated_fields_are_warnings() {
    let (path, run) = config("deprecated.yaml");
    let m = run.at("iptablesMasqueradeBit");
    assert_at(m, "warning", "config", &path, 3);
    assert_eq!(
        m["message"],
        "iptablesMasqueradeBit is deprecated upstream and no longer has any effect"
    );
    assert_at(run.at("iptablesDropBit"), "warning", "config", &path, 4);
    assert_eq!(run.errors_of_mine(), 0, "{:#}", run.doc);
}

#[test]
fn syntax_errors_and_a_wrong_kind_stop_the_check() {
    let (path, run) = config("bad-syntax.yaml");
    assert_eq!(run.code, 1);
    let all: Vec<&Value> = run.doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] != "flag")
        .collect();
    assert_eq!(all.len(), 1, "nothing else is checked: {:#}", run.doc);
    assert_eq!(all[0]["kind"], "config");
    assert_eq!(all[0]["file"], path.display().to_string());
    assert!(
        all[0]["line"]
            .as_u64()
            .is_some_and(|l| (3..=5).contains(&l)),
        "{:#}",
        all[0]
    );
    assert!(
        all[0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("failed to decode kubelet config file")),
        "{:#}",
        all[0]
    );
    let (path, run) = config("wrong-kind.yaml");
    assert_eq!(run.code, 1);
    let k = run.at("kind");
    assert_at(k, "error", "config", &path, 2);
    assert!(
        k["message"]
            .as_str()
            .is_some_and(|m| m.contains("KubeProxyConfiguration")),
        "{k:#}"
    );
}

#[test]
fn flag_errors_and_warnings() {
    let run = check(&["--max-pods=lots".into()]);
    assert_eq!(run.code, 1);
    let f = run.at("--max-pods");
    assert_eq!(
        (&f["kind"], &f["severity"]),
        (&"flag".into(), &"error".into())
    );
    assert!(
        f["message"].as_str().is_some_and(|m| m.contains("lots")),
        "{f:#}"
    );
    let run = check(&["--no-such-flag".into()]);
    assert_eq!(run.code, 1);
    assert_eq!(run.at("--no-such-flag")["severity"], "error");
    let run = check(&["--network-plugin=cni".into()]);
    let w = run.at("--network-plugin");
    assert_eq!(w["severity"], "warning");
    assert_eq!(
        w["message"],
        "flag --network-plugin was removed upstream in Kubernetes 1.24 and has no effect"
    );
}

#[test]
fn invalid_manifest_names() {
    let (path, run) = manifest("invalid-name.yaml");
    assert_eq!(run.code, 1);
    let n = run.at("metadata.name");
    assert_at(n, "error", "manifest", &path, 4);
    assert!(
        n["message"].as_str().is_some_and(|m| m.starts_with(
            "invalid pod: Invalid value: \"Web_Server-check-node\": a lowercase RFC 1123 subdomain must consist of"
        )),
        "{n:#}"
    );
}

#[test]
fn duplicate_and_invalid_container_names() {
    let (path, run) = manifest("duplicate-container.yaml");
    assert_eq!(run.code, 1);
    let d = run.at("spec.containers[0].name");
    assert_at(d, "error", "manifest", &path, 10);
    assert_eq!(d["message"], "invalid pod: Duplicate value: \"app\"");
    let s = run.at("spec.containers[1].name");
    assert_at(s, "error", "manifest", &path, 12);
    assert!(
        s["message"].as_str().is_some_and(|m| m.starts_with(
            "invalid pod: Invalid value: \"Sidecar\": a lowercase RFC 1123 label must consist of"
        )),
        "{s:#}"
    );
}

#[test]
fn bad_probes() {
    let (path, run) = manifest("bad-probe.yaml");
    let two = run.at("spec.containers[0].livenessProbe.tcpSocket");
    assert_at(two, "error", "manifest", &path, 12);
    assert_eq!(
        two["message"],
        "invalid pod: Forbidden: may not specify more than 1 handler type"
    );
    let st = run.at("spec.containers[0].livenessProbe.successThreshold");
    assert_at(st, "error", "manifest", &path, 14);
    assert_eq!(st["message"], "invalid pod: Invalid value: 2: must be 1");
    let none = run.at("spec.containers[0].readinessProbe");
    assert_at(none, "error", "manifest", &path, 15);
    assert_eq!(
        none["message"],
        "invalid pod: Required value: must specify a handler type"
    );
    let period = run.at("spec.containers[0].readinessProbe.periodSeconds");
    assert_at(period, "error", "manifest", &path, 16);
}

#[test]
fn bad_volumes_and_mounts() {
    let (path, run) = manifest("bad-volume-mount.yaml");
    assert_at(
        run.at("spec.volumes[1].hostPath.path"),
        "error",
        "manifest",
        &path,
        11,
    );
    let nf = run.at("spec.containers[0].volumeMounts[1].name");
    assert_at(nf, "error", "manifest", &path, 18);
    assert_eq!(nf["message"], "invalid pod: Not found: \"missing\"");
    let dup = run.at("spec.containers[0].volumeMounts[1].mountPath");
    assert_at(dup, "error", "manifest", &path, 19);
    assert_eq!(
        dup["message"],
        "invalid pod: Invalid value: \"/data\": must be unique"
    );
}

#[test]
fn bad_resources_and_ports() {
    let (path, run) = manifest("bad-resources.yaml");
    let p = run.at("spec.containers[0].ports[0].containerPort");
    assert_at(p, "error", "manifest", &path, 10);
    assert_eq!(
        p["message"],
        "invalid pod: Invalid value: 70000: must be between 1 and 65535, inclusive"
    );
    assert_at(
        run.at("spec.containers[0].ports[0].protocol"),
        "error",
        "manifest",
        &path,
        11,
    );
    let cpu = run.at("spec.containers[0].resources.requests[cpu]");
    assert_at(cpu, "error", "manifest", &path, 16);
    assert_eq!(
        cpu["message"],
        "invalid pod: Invalid value: \"2\": must be less than or equal to cpu limit of 500m"
    );
    let mem = run.at("spec.containers[0].resources.requests[memory]");
    assert_at(mem, "error", "manifest", &path, 17);
    assert_eq!(
        mem["message"],
        "invalid pod: Invalid value: \"-64Mi\": must be greater than or equal to 0"
    );
}

#[test]
fn manifest_syntax_errors_and_a_missing_static_pod_path() {
    let (path, run) = manifest("bad-syntax.yaml");
    assert_eq!(run.code, 1);
    let all: Vec<&Value> = run
        .mine()
        .into_iter()
        .filter(|f| f["kind"] == "manifest")
        .collect();
    assert_eq!(all.len(), 1, "{:#}", run.doc);
    assert_eq!(all[0]["file"], path.display().to_string());
    assert!(
        all[0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("invalid YAML/JSON")),
        "{:#}",
        all[0]
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("manifests");
    let run = check(&[format!("--pod-manifest-path={}", missing.display())]);
    let w = run.at("staticPodPath");
    assert_eq!(
        (&w["kind"], &w["severity"]),
        (&"manifest".into(), &"warning".into())
    );
    assert_eq!(w["file"], missing.display().to_string());
}

#[test]
fn text_output_has_one_line_per_finding_with_file_and_line() {
    let path = fixture("config", "out-of-range.yaml");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("check")
        .args(base(dir.path()))
        .arg(format!("--config={}", path.display()))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!(
        "error[config] {}:3: maxPods: invalid configuration: maxPods (--max-pods) -1 must not be a negative number",
        path.display()
    );
    assert!(text.lines().any(|l| l == want), "{text}");
}

#[test]
fn help_prints_the_usage_and_exits_zero() {
    let out = std::process::Command::new(BIN)
        .args(["check", "--help"])
        .output()
        .expect("run kubelet-rs check --help");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("Usage: kubelet-rs check [-o text|json]"),
        "{text}"
    );
}

/// kubeadm's `--ignore-preflight-errors`: the named kinds' errors become
/// warnings, and with `all` the run exits 0.
#[test]
fn ignored_kinds_turn_errors_into_warnings() {
    let path = fixture("config", "out-of-range.yaml");
    let strict = check(&[format!("--config={}", path.display())]);
    assert_eq!(strict.code, 1);
    let relaxed = check(&[
        format!("--config={}", path.display()),
        "--ignore-preflight-errors=all".into(),
    ]);
    assert_eq!(relaxed.code, 0, "{:#}", relaxed.doc);
    let config: Vec<&Value> = relaxed.doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == "config")
        .collect();
    assert!(!config.is_empty());
    assert!(
        config.iter().any(|f| f["severity"] == "warning"
            && f["message"]
                .as_str()
                .is_some_and(|m| m.ends_with("(ignored: --ignore-preflight-errors)"))),
        "{config:#?}"
    );
    assert!(config.iter().all(|f| f["severity"] != "error"));
}
