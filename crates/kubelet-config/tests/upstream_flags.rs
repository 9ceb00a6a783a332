//! Issue 7, fix 4.12: every flag an upstream kubelet 1.19..1.34 accepts is
//! accepted, typed by its Go syntax, stored, and warned about by kind.

use kubelet_config::flag_table::{FLAGS, FlagKind, lookup};
use kubelet_config::{
    Flags, KubeletConfig, KubeletConfiguration, SettingValue, WarningCategory, flag_warnings,
};

fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
    let mut argv = vec!["kubelet"];
    argv.extend_from_slice(args);
    Flags::parse_args(argv)
}

/// `kubelet --help` of v1.34 (the reference page generated from it), `-h` and
/// `--help` aside: each must be accepted and not reported as removed.
const UPSTREAM_1_34: &[&str] = &[
    "address",
    "allowed-unsafe-sysctls",
    "anonymous-auth",
    "authentication-token-webhook",
    "authentication-token-webhook-cache-ttl",
    "authorization-mode",
    "authorization-webhook-cache-authorized-ttl",
    "authorization-webhook-cache-unauthorized-ttl",
    "bootstrap-kubeconfig",
    "cert-dir",
    "cgroup-driver",
    "cgroup-root",
    "cgroups-per-qos",
    "client-ca-file",
    "cloud-provider",
    "cluster-dns",
    "cluster-domain",
    "config",
    "config-dir",
    "container-log-max-files",
    "container-log-max-size",
    "container-runtime-endpoint",
    "contention-profiling",
    "cpu-cfs-quota",
    "cpu-cfs-quota-period",
    "cpu-manager-policy",
    "cpu-manager-policy-options",
    "cpu-manager-reconcile-period",
    "enable-controller-attach-detach",
    "enable-debugging-handlers",
    "enable-server",
    "enforce-node-allocatable",
    "event-burst",
    "event-qps",
    "eviction-hard",
    "eviction-max-pod-grace-period",
    "eviction-minimum-reclaim",
    "eviction-pressure-transition-period",
    "eviction-soft",
    "eviction-soft-grace-period",
    "exit-on-lock-contention",
    "experimental-allocatable-ignore-eviction",
    "experimental-mounter-path",
    "fail-cgroupv1",
    "fail-swap-on",
    "feature-gates",
    "file-check-frequency",
    "hairpin-mode",
    "healthz-bind-address",
    "healthz-port",
    "hostname-override",
    "http-check-frequency",
    "image-credential-provider-bin-dir",
    "image-credential-provider-config",
    "image-gc-high-threshold",
    "image-gc-low-threshold",
    "image-service-endpoint",
    "kernel-memcg-notification",
    "kube-api-burst",
    "kube-api-content-type",
    "kube-api-qps",
    "kube-reserved",
    "kube-reserved-cgroup",
    "kubeconfig",
    "kubelet-cgroups",
    "local-storage-capacity-isolation",
    "lock-file",
    "log-flush-frequency",
    "log-json-info-buffer-size",
    "log-json-split-stream",
    "log-text-info-buffer-size",
    "log-text-split-stream",
    "logging-format",
    "make-iptables-util-chains",
    "manifest-url",
    "manifest-url-header",
    "max-open-files",
    "max-pods",
    "maximum-dead-containers",
    "maximum-dead-containers-per-container",
    "memory-manager-policy",
    "minimum-container-ttl-duration",
    "minimum-image-ttl-duration",
    "node-ip",
    "node-labels",
    "node-status-max-images",
    "node-status-update-frequency",
    "oom-score-adj",
    "pod-cidr",
    "pod-infra-container-image",
    "pod-manifest-path",
    "pod-max-pids",
    "pods-per-core",
    "port",
    "protect-kernel-defaults",
    "provider-id",
    "qos-reserved",
    "read-only-port",
    "register-node",
    "register-with-taints",
    "registry-burst",
    "registry-qps",
    "reserved-cpus",
    "reserved-memory",
    "resolv-conf",
    "root-dir",
    "rotate-certificates",
    "rotate-server-certificates",
    "runonce",
    "runtime-cgroups",
    "runtime-request-timeout",
    "seccomp-default",
    "serialize-image-pulls",
    "streaming-connection-idle-timeout",
    "sync-frequency",
    "system-cgroups",
    "system-reserved",
    "system-reserved-cgroup",
    "tls-cert-file",
    "tls-cipher-suites",
    "tls-min-version",
    "tls-private-key-file",
    "topology-manager-policy",
    "topology-manager-policy-options",
    "topology-manager-scope",
    "v",
    "version",
    "vmodule",
    "volume-plugin-dir",
    "volume-stats-agg-period",
];

/// Flags of 1.19..1.33 (visible and hidden-deprecated) that 1.34 no longer
/// has, with the release that removed them.
const GONE_BY_1_34: &[(&str, &str)] = &[
    ("add-dir-header", "1.26"),
    ("alsologtostderr", "1.26"),
    ("log-backtrace-at", "1.26"),
    ("log-dir", "1.26"),
    ("log-file", "1.26"),
    ("log-file-max-size", "1.26"),
    ("logtostderr", "1.26"),
    ("one-output", "1.26"),
    ("skip-headers", "1.26"),
    ("skip-log-headers", "1.26"),
    ("stderrthreshold", "1.26"),
    ("experimental-logging-sanitization", "1.26"),
    ("azure-container-registry-config", "1.30"),
    ("chaos-chance", "1.22"),
    ("cloud-config", "1.34"),
    ("cni-bin-dir", "1.24"),
    ("cni-cache-dir", "1.24"),
    ("cni-conf-dir", "1.24"),
    ("container-runtime", "1.27"),
    ("docker-endpoint", "1.24"),
    ("dynamic-config-dir", "1.24"),
    ("enable-cadvisor-json-endpoints", "1.21"),
    ("experimental-bootstrap-kubeconfig", "1.23"),
    ("experimental-check-node-capabilities-before-mount", "1.24"),
    ("experimental-dockershim-root-directory", "1.24"),
    ("experimental-kernel-memcg-notification", "1.25"),
    ("image-pull-progress-deadline", "1.24"),
    ("iptables-drop-bit", "1.31"),
    ("iptables-masquerade-bit", "1.31"),
    ("keep-terminated-pod-volumes", "1.31"),
    ("master-service-namespace", "1.27"),
    ("network-plugin", "1.24"),
    ("network-plugin-mtu", "1.24"),
    ("non-masquerade-cidr", "1.24"),
    ("really-crash-for-testing", "1.24"),
    ("redirect-container-streaming", "1.22"),
    ("register-schedulable", "1.34"),
    ("seccomp-profile-root", "1.23"),
];

/// The 37-ish flags real node bootstrap scripts pass that kubelet-rs used to
/// reject with "unexpected argument".
pub const BOOTSTRAP_SCRIPT_FLAGS: &[&str] = &[
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
    "--address=0.0.0.0",
    "--kubelet-cgroups=/systemd/system.slice",
    "--enforce-node-allocatable=pods",
    "--cgroups-per-qos=true",
    "--logging-format=text",
    "--image-credential-provider-config=/etc/eks/image-credential-provider/config.json",
    "--image-credential-provider-bin-dir=/etc/eks/image-credential-provider",
    "--allowed-unsafe-sysctls=net.core.somaxconn,net.ipv4.*",
    "--seccomp-default",
    "--pod-max-pids=4096",
    "--authentication-token-webhook",
    "--lock-file=/var/run/lock/kubelet.lock",
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
];

#[test]
fn every_upstream_flag_parses_with_a_sample_and_warns_by_kind() {
    for f in FLAGS.iter().filter(|f| f.name != "help") {
        let arg = format!("--{}={}", f.name, f.example());
        let flags = parse(&[&arg]).unwrap_or_else(|e| panic!("{arg}: {e}"));
        let cfg =
            KubeletConfig::resolve(&flags, None, "node-a").unwrap_or_else(|e| panic!("{arg}: {e}"));
        let warnings = flag_warnings(&flags);
        let honoured = f.honoured == Some(f.example());
        let expected = match f.kind {
            FlagKind::Implemented => None,
            FlagKind::Config if f.acted_on => None,
            FlagKind::Config | FlagKind::NotImplemented if honoured => None,
            FlagKind::Config | FlagKind::NotImplemented => Some(WarningCategory::NotImplemented),
            FlagKind::Removed(v) => Some(WarningCategory::Removed(v)),
        };
        match expected {
            None => assert!(warnings.is_empty(), "{arg}: {warnings:?}"),
            Some(category) => {
                assert_eq!(
                    warnings.len(),
                    1,
                    "{arg}: exactly one warning: {warnings:?}"
                );
                assert_eq!(
                    (warnings[0].flag, warnings[0].category),
                    (f.name, category),
                    "{arg}"
                );
                assert!(
                    warnings[0].to_string().contains(&format!("--{}", f.name)),
                    "{arg}"
                );
            }
        }
        // Stored where its kind says.
        match f.kind {
            FlagKind::Implemented => {
                assert!(flags.extra.get(f.name).is_none(), "{arg} has a typed field");
                assert!(
                    cfg.ignored_flags.is_empty() && cfg.settings.is_empty(),
                    "{arg}"
                );
            }
            FlagKind::Config => {
                let field = f.field.unwrap_or_default();
                assert!(
                    cfg.settings.contains_key(field),
                    "{arg} -> {field}: {:?}",
                    cfg.settings
                );
            }
            FlagKind::NotImplemented | FlagKind::Removed(_) => {
                assert!(
                    cfg.ignored_flags.contains_key(f.name),
                    "{arg}: {:?}",
                    cfg.ignored_flags
                );
            }
        }
        // `--flag value` (or bare `--flag` for bools) and `_` spelling parse alike.
        let underscored = format!("--{}", f.name.replace('-', "_"));
        let spaced = if f.value.is_bool() {
            parse(&[&underscored])
        } else {
            parse(&[&underscored, f.example()])
        };
        assert!(
            spaced.is_ok(),
            "{underscored} {}: {:?}",
            f.example(),
            spaced.err()
        );
    }
}

#[test]
fn the_table_covers_every_upstream_flag_with_its_removal() {
    for name in UPSTREAM_1_34 {
        let f = lookup(name).unwrap_or_else(|| panic!("--{name} is missing from the table"));
        assert!(
            !matches!(f.kind, FlagKind::Removed(_)),
            "--{name} is still in 1.34"
        );
    }
    for (name, version) in GONE_BY_1_34 {
        let f = lookup(name).unwrap_or_else(|| panic!("--{name} is missing from the table"));
        assert_eq!(f.kind, FlagKind::Removed(version), "--{name}");
    }
}

#[test]
fn go_flag_syntax_is_accepted() {
    let cases: &[&[&str]] = &[&["--v=4"], &["--v", "4"], &["-v=4"], &["-v", "4"], &["-v4"]];
    for args in cases {
        let f = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(f.verbosity, Some(4), "{args:?}");
    }
    let f = parse(&[
        "--oom-score-adj",
        "-999",
        "--serialize-image-pulls=F",
        "--protect-kernel-defaults",
        "--fail-swap-on=false",
        "--register-node=0",
        "--log_dir=/var/log/kubelet",
        "--node_labels=a=b",
        "--vmodule",
        "server=4",
        "--max-pods=0x20",
    ])
    .expect("pflag syntax");
    assert_eq!(f.fail_swap_on, Some(false));
    assert_eq!(f.register_node, Some(false));
    assert_eq!(f.node_labels.as_deref(), Some("a=b"));
    assert_eq!(f.max_pods, Some(32), "int32 flags take Go's base prefixes");
    let cfg = KubeletConfig::resolve(
        &parse(&[
            "--oom-score-adj",
            "-999",
            "--serialize-image-pulls=F",
            "--protect-kernel-defaults",
        ])
        .expect("flags"),
        None,
        "h",
    )
    .expect("resolve");
    assert_eq!(cfg.settings["oomScoreAdj"], SettingValue::Int(-999));
    assert_eq!(
        cfg.settings["serializeImagePulls"],
        SettingValue::Bool(false)
    );
    assert_eq!(
        cfg.settings["protectKernelDefaults"],
        SettingValue::Bool(true)
    );
    assert_eq!(
        f.extra.get("log-dir"),
        Some(&["/var/log/kubelet".to_string()][..])
    );
}

#[test]
fn malformed_values_are_usage_errors_naming_the_flag() {
    let cases = [
        "--image-gc-high-threshold=high",
        "--streaming-connection-idle-timeout=5d",
        "--eviction-soft=memory.available=1Gi",
        "--cgroups-per-qos=yes",
        "--address=not-an-ip",
        "--container-log-max-size=10MB",
        "--qos-reserved=memory",
        "--reserved-memory=memory=1Gi",
        "--pod-max-pids=12.5",
    ];
    for arg in cases {
        let e = parse(&[arg])
            .err()
            .unwrap_or_else(|| panic!("{arg} must not parse"));
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{arg}: {e}"
        );
        let name = arg.split('=').next().unwrap_or(arg);
        assert!(e.to_string().contains(name), "{arg}: {e}");
    }
    assert!(parse(&["--not-a-kubelet-flag"]).is_err());
}

#[test]
fn config_backed_flags_follow_upstream_precedence() {
    let (file, ignored) = KubeletConfiguration::parse(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         cpuManagerPolicy: static\npodPidsLimit: 2048\nreadOnlyPort: 10255\n\
         authentication: {webhook: {enabled: true}, anonymous: {enabled: false}}\n",
    )
    .expect("file");
    assert!(
        ignored.is_empty(),
        "fields behind a flag are not unknown: {ignored:?}"
    );
    let flags = parse(&["--pod-max-pids=4096", "--anonymous-auth=true"]).expect("flags");
    let cfg = KubeletConfig::resolve(&flags, Some(&file), "h").expect("resolve");
    assert_eq!(
        cfg.settings["podPidsLimit"],
        SettingValue::Int(4096),
        "flag over file"
    );
    assert_eq!(
        cfg.settings["authentication.anonymous.enabled"],
        SettingValue::Bool(true)
    );
    assert_eq!(
        cfg.settings["cpuManagerPolicy"],
        SettingValue::String("static".into())
    );
    assert_eq!(cfg.settings["readOnlyPort"], SettingValue::Int(10255));
    assert_eq!(
        cfg.settings["authentication.webhook.enabled"],
        SettingValue::Bool(true)
    );
    assert!(
        !cfg.settings.contains_key("topologyManagerPolicy"),
        "default: absent"
    );
}

#[test]
fn bootstrap_script_flags_parse_resolve_and_warn_once_each() {
    let flags = parse(BOOTSTRAP_SCRIPT_FLAGS).expect("bootstrap flags parse");
    let cfg = KubeletConfig::resolve(&flags, None, "node-a").expect("resolve");
    assert_eq!(
        cfg.lock_file.as_deref(),
        Some(std::path::Path::new("/var/run/lock/kubelet.lock"))
    );
    assert!(cfg.exit_on_lock_contention);
    assert_eq!(
        cfg.settings["streamingConnectionIdleTimeout"],
        SettingValue::Duration(kubelet_config::GoDuration::parse("5m").expect("duration"))
    );
    let warnings = flag_warnings(&flags);
    let mut names: Vec<&str> = warnings.iter().map(|w| w.flag).collect();
    names.dedup();
    assert_eq!(
        names.len(),
        warnings.len(),
        "one warning per flag: {warnings:?}"
    );
    for quiet in [
        "cgroups-per-qos",
        "logging-format",
        "read-only-port",
        "event-qps",
        "lock-file",
    ] {
        assert!(
            !names.contains(&quiet),
            "--{quiet}: kubelet-rs does that already"
        );
    }
    assert!(names.contains(&"cpu-manager-policy") && names.contains(&"make-iptables-util-chains"));
}

#[test]
fn exit_on_lock_contention_needs_a_lock_file() {
    let e = KubeletConfig::resolve(
        &parse(&["--exit-on-lock-contention"]).expect("flags"),
        None,
        "h",
    )
    .expect_err("no lock file");
    assert!(e.to_string().contains("no lock file specified"), "{e}");
    let cfg = KubeletConfig::resolve(&parse(&["--lock-file=/tmp/l"]).expect("flags"), None, "h")
        .expect("lock file alone");
    assert!(!cfg.exit_on_lock_contention);
}
