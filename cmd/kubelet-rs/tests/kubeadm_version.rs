//! Issue 28: `kubeadm join` of every supported control plane (1.19 to 1.35)
//! accepts kubelet-rs's version without `--ignore-preflight-errors`.
//!
//! kubeadm's rules, as read in `cmd/kubeadm/app/preflight` and `constants`
//! of each release (docs/operating.md, "The version a node reports"):
//! `GetKubeletVersion` runs `kubelet --version` and matches the whole
//! trimmed stdout against `^\s*Kubernetes v(\d+\.\d+\.\d+)([-0-9a-zA-Z_\.+]*)?\s*$`;
//! `KubeletVersionCheck` refuses a kubelet older than
//! `MinimumKubeletVersion` (v1.18.0 in 1.19, v1.19.0 in 1.20, one minor
//! back through 1.28, three from 1.29) and, only with a control plane
//! version (`kubeadm init`, not `join`), one newer than the control plane.
//! From 1.19 on, join reads the kubelet ConfigMap named after the control
//! plane's version, never the kubelet's.

mod common;

use std::process::Command;

use common::BIN;

/// kubeadm's parse of `kubelet --version`: `(major, minor, patch)`.
fn kubeadm_parse(stdout: &str) -> Option<(u32, u32, u32)> {
    let line = stdout.trim();
    let rest = line.strip_prefix("Kubernetes v")?;
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (semver, suffix) = rest.split_at(end);
    if !suffix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))
    {
        return None;
    }
    let mut n = semver.split('.').map(str::parse::<u32>);
    let v = (n.next()?.ok()?, n.next()?.ok()?, n.next()?.ok()?);
    n.next().is_none().then_some(v)
}

/// `constants.MinimumKubeletVersion` of kubeadm `1.<minor>`.
fn minimum_kubelet(kubeadm_minor: u32) -> (u32, u32) {
    match kubeadm_minor {
        19 => (1, 18),
        20..=28 => (1, kubeadm_minor - 1),
        _ => (1, kubeadm_minor - 3),
    }
}

#[test]
fn kubeadm_join_of_1_19_to_1_35_accepts_the_version() {
    let out = Command::new(BIN).arg("--version").output().expect("run");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (major, minor, _) =
        kubeadm_parse(&stdout).unwrap_or_else(|| panic!("kubeadm cannot parse {stdout:?}"));
    for kubeadm in 19..=35 {
        let min = minimum_kubelet(kubeadm);
        assert!(
            (major, minor) >= min,
            "kubeadm 1.{kubeadm} join: kubelet v{major}.{minor} is lower than v{}.{}",
            min.0,
            min.1
        );
    }
}

#[test]
fn version_pins_what_the_node_reports_within_the_served_range() {
    // `--version=vX.Y.Z` does not print: the kubelet runs (here it fails later
    // for want of a runtime, past flag parsing).
    for bad in ["v1.18.20", "v1.36.0", "vnext"] {
        let out = Command::new(BIN)
            .args([
                &format!("--version={bad}"),
                "--container-runtime-endpoint=unix:///nonexistent.sock",
            ])
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "--version={bad}: {err}");
        assert!(err.contains(&format!("--version={bad}")), "{err}");
    }
    let out = Command::new(BIN)
        .args(["--version=v1.30.4", "--version"])
        .output()
        .expect("run");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&format!(
            "Kubernetes {}+kubelet-rs.",
            kubelet_types::KUBERNETES_VERSION
        )),
        "the last --version wins"
    );
}
