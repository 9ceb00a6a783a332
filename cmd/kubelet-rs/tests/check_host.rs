//! `kubelet-rs check`'s runtime, host and credential findings, through the
//! built binary: the real containerd (its version, its cgroup driver against
//! `--cgroup-driver`), a socket nobody serves, a taken port, swap, and
//! kubeconfigs with an expired, a soon-expiring and a broken client setup
//! (`tests/fixtures/check/kubeconfig`). Other kinds of findings (flags,
//! config, manifests) may appear too; only these kinds are asserted.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-rs");
const CONTAINERD: &str = "unix:///run/containerd/containerd.sock";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/check/kubeconfig")
}

// Ports from lane 1's range, which the other lane's `:0` binds never take.
use common::free_port;

/// Flags for a start that touches nothing of the machine's kubelet: its own
/// root and cert dirs, loopback ports of its own, the real containerd.
fn base(dir: &Path) -> Vec<String> {
    vec![
        format!("--root-dir={}", dir.join("root").display()),
        format!("--cert-dir={}", dir.join("pki").display()),
        "--address=127.0.0.1".into(),
        format!("--port={}", free_port()),
        format!("--healthz-port={}", free_port()),
        "--read-only-port=0".into(),
        format!("--container-runtime-endpoint={CONTAINERD}"),
        "--fail-swap-on=false".into(),
    ]
}

/// Runs `kubelet-rs check -o json <args>`: exit code and the document.
fn check_json(args: &[String]) -> (i32, Value) {
    let out = Command::new(BIN)
        .arg("check")
        .args(["-o", "json"])
        .args(args)
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
    // The exit status follows the errors, whatever their kind.
    assert_eq!(
        code,
        i32::from(doc["errors"].as_u64() != Some(0)),
        "{doc:#}"
    );
    (code, doc)
}

/// The findings of one kind.
fn kind<'a>(doc: &'a Value, k: &str) -> Vec<&'a Value> {
    doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == k)
        .collect()
}

fn msg(f: &Value) -> &str {
    f["message"].as_str().unwrap_or_default()
}

/// The driver this machine's containerd uses (deploy/setup-runtime.sh
/// writes runc's `SystemdCgroup`), and the other one.
fn containerd_driver() -> (&'static str, &'static str) {
    let config = std::fs::read_to_string("/etc/containerd/config.toml").expect("containerd config");
    if config.contains("SystemdCgroup = true") {
        ("systemd", "cgroupfs")
    } else {
        ("cgroupfs", "systemd")
    }
}

#[tokio::test]
async fn the_real_containerd_its_version_and_its_cgroup_driver() {
    let rt = cri::RemoteRuntime::new(CONTAINERD, None, Duration::from_secs(10)).expect("client");
    let v = cri::RuntimeService::version(&rt)
        .await
        .expect("containerd answers");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, other) = containerd_driver();

    let mut args = base(dir.path());
    args.push(format!("--cgroup-driver={ours}"));
    let (_, doc) = check_json(&args);
    let runtime = kind(&doc, "runtime");
    let info = runtime
        .iter()
        .find(|f| f["severity"] == "info")
        .unwrap_or_else(|| panic!("{doc:#}"));
    assert_eq!(
        msg(info),
        format!(
            "{} {}, CRI v1 ({CONTAINERD})",
            v.runtime_name, v.runtime_version
        )
    );
    assert!(msg(info).starts_with("containerd "), "{}", msg(info));
    assert!(runtime.iter().all(|f| f["severity"] != "error"), "{doc:#}");
    let cg = kind(&doc, "cgroup-driver");
    assert_eq!(cg.len(), 1, "{doc:#}");
    assert_eq!(cg[0]["severity"], "info");
    assert_eq!(cg[0]["field"], "cgroupDriver");
    assert!(
        msg(cg[0]).starts_with(&format!("cgroup driver \"{ours}\" matches")),
        "{}",
        msg(cg[0])
    );
    // containerd 1.6 has no RuntimeConfig: the source is its CRI config.
    if v.runtime_version.starts_with("1.") {
        assert!(msg(cg[0]).contains("SystemdCgroup = "), "{}", msg(cg[0]));
        assert!(
            msg(cg[0]).contains("RuntimeConfig is not implemented"),
            "{}",
            msg(cg[0])
        );
    }

    let mut args = base(dir.path());
    args.push(format!("--cgroup-driver={other}"));
    let (code, doc) = check_json(&args);
    assert_eq!(code, 1);
    let cg = kind(&doc, "cgroup-driver");
    assert_eq!(cg[0]["severity"], "error", "{doc:#}");
    assert!(
        msg(cg[0]).starts_with(&format!(
            "misconfiguration: kubelet cgroup driver: \"{other}\" is different from the container runtime's cgroup driver: \"{ours}\""
        )),
        "{}",
        msg(cg[0])
    );

    // Text output: one line per finding, the same verdict.
    let out = Command::new(BIN)
        .arg("check")
        .args(&args)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("error[cgroup-driver] cgroupDriver: misconfiguration")),
        "{text}"
    );
}

#[test]
fn a_socket_nobody_serves_is_an_error_within_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let endpoint = format!("unix://{}", dir.path().join("nobody.sock").display());
    let mut args = base(dir.path());
    args.push(format!("--container-runtime-endpoint={endpoint}"));
    let start = Instant::now();
    let (code, doc) = check_json(&args);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(code, 1);
    let runtime = kind(&doc, "runtime");
    assert_eq!(runtime.len(), 1, "{doc:#}");
    assert_eq!(runtime[0]["severity"], "error");
    assert_eq!(runtime[0]["field"], "--container-runtime-endpoint");
    assert!(
        msg(runtime[0]).starts_with(&format!(
            "container runtime is not running: validate CRI v1 runtime API for endpoint {endpoint:?}"
        )),
        "{}",
        msg(runtime[0])
    );
    // No runtime, no driver to compare.
    assert!(kind(&doc, "cgroup-driver").is_empty(), "{doc:#}");

    // A separate image service nobody serves, next to the real runtime.
    let mut args = base(dir.path());
    args.push(format!("--image-service-endpoint={endpoint}"));
    let (code, doc) = check_json(&args);
    assert_eq!(code, 1);
    let errors: Vec<_> = kind(&doc, "runtime")
        .into_iter()
        .filter(|f| f["severity"] == "error")
        .collect();
    assert_eq!(errors.len(), 1, "{doc:#}");
    assert_eq!(errors[0]["field"], "--image-service-endpoint");
    assert!(
        msg(errors[0]).starts_with(&format!(
            "container runtime is not running: validate CRI v1 image API for endpoint {endpoint:?}"
        )),
        "{}",
        msg(errors[0])
    );
}

#[test]
fn a_taken_port_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let busy = taken.local_addr().expect("addr").port();
    for flag in ["port", "healthz-port"] {
        let mut args = base(dir.path());
        args.push(format!("--{flag}={busy}"));
        let (code, doc) = check_json(&args);
        assert_eq!(code, 1);
        let errors: Vec<_> = kind(&doc, "port")
            .into_iter()
            .filter(|f| f["severity"] == "error")
            .collect();
        assert_eq!(errors.len(), 1, "{doc:#}");
        assert_eq!(msg(errors[0]), format!("Port {busy} is in use"));
        let field = if flag == "port" {
            "port"
        } else {
            "healthzPort"
        };
        assert_eq!(errors[0]["field"], field);
    }
    drop(taken);
}

#[test]
fn swap_against_fail_swap_on() {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let swap_on = swaps.lines().skip(1).any(|l| !l.trim().is_empty());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = base(dir.path());
    args.retain(|a| a != "--fail-swap-on=false");
    let (_, doc) = check_json(&args);
    let swap = kind(&doc, "swap");
    assert_eq!(swap.len(), 1, "{doc:#}");
    if swap_on {
        assert_eq!(swap[0]["severity"], "error");
        assert!(
            msg(swap[0]).starts_with("running with swap on is not supported, please disable swap!")
        );
    } else {
        assert_eq!(swap[0]["severity"], "info");
        assert_eq!(msg(swap[0]), "swap is off");
    }
}

#[test]
fn an_expired_client_certificate_and_a_valid_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = fixtures().canonicalize().expect("fixtures");
    let mut args = base(dir.path());
    args.push(format!(
        "--kubeconfig={}",
        fx.join("expired.conf").display()
    ));
    let (code, doc) = check_json(&args);
    assert_eq!(code, 1);
    let certs = kind(&doc, "certificate");
    let expired: Vec<_> = certs.iter().filter(|f| f["severity"] == "error").collect();
    assert_eq!(expired.len(), 1, "{doc:#}");
    assert_eq!(
        expired[0]["file"],
        fx.join("expired.crt").display().to_string()
    );
    assert_eq!(
        expired[0]["field"],
        "users[\"system:node:expired\"].client-certificate"
    );
    assert!(
        msg(expired[0]).starts_with(
            "client certificate \"CN=system:node:expired, O=system:nodes\" has expired: notAfter 2021-01-01T00:00:00Z is before the current time"
        ),
        "{}",
        msg(expired[0])
    );

    let mut args = base(dir.path());
    args.push(format!("--kubeconfig={}", fx.join("valid.conf").display()));
    let (_, doc) = check_json(&args);
    for k in ["kubeconfig", "certificate"] {
        assert!(
            kind(&doc, k).iter().all(|f| f["severity"] == "info"),
            "{doc:#}"
        );
    }
    assert!(
        kind(&doc, "certificate")
            .iter()
            .any(|f| msg(f).contains("is valid until 2099-12-31T00:00:00Z")),
        "{doc:#}"
    );
}

#[tokio::test]
async fn a_client_certificate_expiring_within_30_days_is_a_warning() {
    // The apiserver double signs client certificates for one day.
    let api = apiserver_double::ApiServer::start(apiserver_double::Options::default())
        .await
        .expect("double");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubelet.conf");
    api.write_cert_kubeconfig(&kubeconfig, "system:node:soon", &["system:nodes"])
        .expect("kubeconfig");
    for (rotate, note) in [
        (
            "true",
            "the kubelet rotates its client certificate before then (rotateCertificates is on)",
        ),
        ("false", "renew it before then (rotateCertificates is off)"),
    ] {
        let mut args = base(dir.path());
        args.push(format!("--kubeconfig={}", kubeconfig.display()));
        args.push(format!("--rotate-certificates={rotate}"));
        let (_, doc) = check_json(&args);
        let warnings: Vec<_> = kind(&doc, "certificate")
            .into_iter()
            .filter(|f| f["severity"] == "warning")
            .collect();
        assert_eq!(warnings.len(), 1, "{doc:#}");
        let m = msg(warnings[0]);
        assert!(
            m.starts_with("client certificate \"") && m.contains("CN=system:node:soon"),
            "{m}"
        );
        assert!(
            (m.contains("expires in 1 day, on ") || m.contains("expires in less than a day, on "))
                && m.contains("(within 30 days)"),
            "{m}"
        );
        assert!(m.ends_with(note), "{m}");
        assert_eq!(warnings[0]["file"], kubeconfig.display().to_string());
        assert!(
            kind(&doc, "kubeconfig")
                .iter()
                .all(|f| f["severity"] != "error"),
            "{doc:#}"
        );
    }
}

#[test]
fn a_broken_kubeconfig_is_an_error_in_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = fixtures()
        .canonicalize()
        .expect("fixtures")
        .join("broken.conf");
    let mut args = base(dir.path());
    args.push(format!("--kubeconfig={}", broken.display()));
    let (code, doc) = check_json(&args);
    assert_eq!(code, 1);
    let k = kind(&doc, "kubeconfig");
    assert_eq!(k.len(), 1, "{doc:#}");
    assert_eq!(k[0]["severity"], "error");
    assert_eq!(k[0]["file"], broken.display().to_string());
    assert_eq!(k[0]["field"], "--kubeconfig");
    assert!(
        msg(k[0]).starts_with("unable to load kubeconfig: "),
        "{}",
        msg(k[0])
    );
    // The parser's position, as the file's line, and no source snippet.
    assert_eq!(k[0]["line"], 6, "{doc:#}");
    assert!(!msg(k[0]).contains('\n'), "{}", msg(k[0]));
}
