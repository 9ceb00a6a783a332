//! Issue 7, fix 4.12: the flags real node bootstrap scripts pass (EKS, GKE,
//! kops, kubeadm, CIS hardening guides), which kubelet-rs used to reject with
//! "unexpected argument", start the binary; each one kubelet-rs does not act
//! on is named in exactly one warning.

mod common;

use std::time::Duration;

use common::{BIN, Kubelet, standalone_args};

/// The real-world flags of the issue (values as scripts write them).
const BOOTSTRAP_SCRIPT_FLAGS: &[&str] = &[
    "--pod-cidr=10.244.1.0/24",
    "--image-gc-high-threshold=85",
    "--image-gc-low-threshold=80",
    "--serialize-image-pulls=false",
    "--container-log-max-size=50Mi",
    "--container-log-max-files=5",
    "--protect-kernel-defaults=true",
    "--streaming-connection-idle-timeout=5m",
    "--make-iptables-util-chains=true",
    "--volume-plugin-dir=/usr/libexec/kubernetes/kubelet-plugins/volume/exec/",
    "--cpu-manager-policy=static",
    "--topology-manager-policy=single-numa-node",
    "--reserved-cpus=0-1",
    "--kubelet-cgroups=/systemd/system.slice",
    "--enforce-node-allocatable=pods",
    "--cgroups-per-qos=true",
    "--logging-format=text",
    "--allowed-unsafe-sysctls=net.core.somaxconn,net.ipv4.*",
    "--seccomp-default",
    "--pod-max-pids=4096",
    "--exit-on-lock-contention",
    "--oom-score-adj=-999",
    "--eviction-soft=memory.available<300Mi,nodefs.available<15%",
    "--eviction-soft-grace-period=memory.available=1m30s,nodefs.available=2m",
    "--eviction-max-pod-grace-period=60",
    "--shutdown-grace-period=30s",
    "--shutdown-grace-period-critical-pods=10s",
    "--maximum-dead-containers=100",
    "--minimum-container-ttl-duration=1m",
    "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "--event-qps=0",
    "--read-only-port=0",
    "--anonymous-auth=false",
];

/// Flags of older scripts that upstream has since removed, in both spellings
/// pflag accepts.
const LEGACY_FLAGS: &[&str] = &[
    "--network-plugin=cni",
    "--cni-bin-dir=/opt/cni/bin",
    "--docker-endpoint",
    "unix:///var/run/docker.sock",
    "--allow-privileged=true",
    "--cadvisor-port=0",
    "--experimental-check-node-capabilities-before-mount=true",
    "--logtostderr=true",
    "--log_dir=/var/log/kubelet",
    "-v=2",
];

#[test]
fn bootstrap_script_flags_start_the_kubelet_with_one_warning_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = standalone_args(dir.path(), "bootstrap");
    args.extend(BOOTSTRAP_SCRIPT_FLAGS.iter().map(|s| s.to_string()));
    args.extend(LEGACY_FLAGS.iter().map(|s| s.to_string()));
    // The EKS bootstrap's credential provider flags, with a config and a
    // plugin that exist (upstream refuses to start without them).
    let providers = dir.path().join("image-credential-provider");
    std::fs::create_dir_all(&providers).expect("mkdir");
    let plugin = providers.join("ecr-credential-provider");
    std::fs::write(&plugin, "#!/bin/sh\nexit 1\n").expect("plugin");
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let config = providers.join("config.json");
    std::fs::write(
        &config,
        r#"{"apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig",
            "providers": [{"name": "ecr-credential-provider",
                           "matchImages": ["*.dkr.ecr.*.amazonaws.com"],
                           "defaultCacheDuration": "12h",
                           "apiVersion": "credentialprovider.kubelet.k8s.io/v1"}]}"#,
    )
    .expect("config");
    args.push(format!(
        "--image-credential-provider-config={}",
        config.display()
    ));
    args.push(format!(
        "--image-credential-provider-bin-dir={}",
        providers.display()
    ));
    // The lock file of the list, in the test's own directory.
    args.push(format!(
        "--lock-file={}",
        dir.path().join("kubelet.lock").display()
    ));

    let mut k = Kubelet::start(&args);
    if !k.wait_for("Started kubelet", Duration::from_secs(30)) {
        let status = k.exited_within(Duration::from_secs(5));
        panic!("kubelet-rs did not start ({status:?}):\n{}", k.output());
    }
    std::thread::sleep(Duration::from_millis(200));
    let out = k.output();
    assert!(!out.contains("unexpected argument"), "{out}");

    let not_implemented = [
        "pod-cidr",
        "serialize-image-pulls",
        "protect-kernel-defaults",
        "streaming-connection-idle-timeout",
        "make-iptables-util-chains",
        "volume-plugin-dir",
        "cpu-manager-policy",
        "topology-manager-policy",
        "reserved-cpus",
        "kubelet-cgroups",
        "oom-score-adj",
    ];
    // Flags kubelet-rs acts on since issue 10 (and, since issue 18, the GC,
    // log rotation, eviction and node shutdown ones): no warning at all.
    for flag in [
        "enforce-node-allocatable",
        "allowed-unsafe-sysctls",
        "pod-max-pids",
        "image-gc-high-threshold",
        "image-gc-low-threshold",
        "container-log-max-size",
        "container-log-max-files",
        "eviction-soft",
        "eviction-soft-grace-period",
        "eviction-max-pod-grace-period",
        "shutdown-grace-period",
        "shutdown-grace-period-critical-pods",
        "maximum-dead-containers",
        "minimum-container-ttl-duration",
        "image-credential-provider-config",
        "image-credential-provider-bin-dir",
        // Since issue 28.
        "seccomp-default",
    ] {
        assert!(
            !out.contains(&format!("flag --{flag} ")),
            "--{flag} warned:\n{out}"
        );
    }
    for flag in not_implemented {
        let line = format!("flag --{flag} is accepted but not implemented by kubelet-rs; ignored");
        assert_eq!(out.matches(&line).count(), 1, "{line}\n{out}");
    }
    for (flag, version) in [
        ("network-plugin", "1.24"),
        ("cni-bin-dir", "1.24"),
        ("docker-endpoint", "1.24"),
        ("allow-privileged", "1.15"),
        ("cadvisor-port", "1.12"),
        ("experimental-check-node-capabilities-before-mount", "1.24"),
        ("logtostderr", "1.26"),
        ("log-dir", "1.26"),
    ] {
        let line =
            format!("flag --{flag} was removed upstream in Kubernetes {version} and has no effect");
        assert_eq!(out.matches(&line).count(), 1, "{line}\n{out}");
    }
    // What kubelet-rs already does, or implements, draws no warning.
    for quiet in [
        "--cgroups-per-qos ",
        "--logging-format ",
        "--read-only-port ",
        "--anonymous-auth ",
        "--tls-cipher-suites ",
        "--event-qps ",
        "--lock-file ",
        "--exit-on-lock-contention ",
    ] {
        assert!(!out.contains(&format!("flag {quiet}")), "{quiet}\n{out}");
    }
    assert!(k.terminate().success(), "{}", k.output());
}

/// Upstream `BuildAuthn`: webhook authentication needs an apiserver client,
/// so a standalone kubelet asked for it refuses to start, naming why.
#[test]
fn standalone_webhook_authentication_is_refused_as_upstream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = standalone_args(dir.path(), "webhook");
    args.push("--authentication-token-webhook".into());
    let mut k = Kubelet::start(&args);
    let status = k.exited_within(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| !s.success()),
        "{status:?}\n{}",
        k.output()
    );
    assert!(
        k.output()
            .contains("no client provided, cannot use webhook authentication"),
        "{}",
        k.output()
    );
}

#[test]
fn malformed_values_are_usage_errors() {
    for arg in [
        "--image-gc-high-threshold=high",
        "--streaming-connection-idle-timeout=5d",
        "--cgroups-per-qos=yes",
    ] {
        let out = std::process::Command::new(BIN)
            .arg(arg)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{arg}: clap's usage error");
        let err = String::from_utf8_lossy(&out.stderr);
        let name = arg.split('=').next().unwrap_or(arg);
        assert!(err.contains(name), "{arg}: {err}");
    }
}

#[test]
fn help_lists_accepted_upstream_flags_and_version_takes_verflag_values() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--cpu-manager-policy"), "{help}");
    assert!(
        !help.contains("--network-plugin-mtu"),
        "removed flags stay hidden"
    );

    for v in ["--version", "--version=raw", "--version=true"] {
        let out = std::process::Command::new(BIN)
            .arg(v)
            .output()
            .expect("run");
        assert!(out.status.success(), "{v}");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("Kubernetes v"),
            "{v}"
        );
    }
}
