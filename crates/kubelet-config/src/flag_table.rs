//! Every flag an upstream Linux kubelet from 1.19 to 1.34 accepts, with its
//! value type and what kubelet-rs does with it (upstream
//! `cmd/kubelet/app/options`: `KubeletFlags.AddFlags`,
//! `AddKubeletConfigFlags`, `ContainerRuntimeOptions`, and the global klog,
//! cAdvisor, credential-provider and verflag flags of `globalflags*.go`), plus
//! flags removed upstream that real bootstrap scripts still pass.
//!
//! Names are the normalised (`-`) spelling; upstream's `WordSepNormalizeFunc`
//! also accepts `_`, which [`crate::Flags::parse_args`] maps to `-`.

use crate::values::ValueKind;
use crate::values::ValueKind::{
    Bool, ColonMultimap, Duration, Float64, Int32, Int64, Ip, LangleMap, Level, MapStringBool,
    MapStringString, MapStringStringNoSplit, ModuleSpec, Quantity, ReservedMemory, Severity,
    String as Str, StringSlice, Taints, TraceLocation, Uint64, Version,
};

/// What kubelet-rs does with an upstream flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    /// kubelet-rs acts on it; no warning.
    Implemented,
    /// It sets a KubeletConfiguration field that kubelet-rs resolves (flag
    /// over `--config` file) into [`crate::KubeletConfig::settings`] but does
    /// not act on yet; one "not implemented" warning.
    Config,
    /// A command-line-only upstream flag (KubeletFlags, cAdvisor, credential
    /// providers) kubelet-rs accepts and ignores; one "not implemented" warning.
    NotImplemented,
    /// Removed upstream in this Kubernetes minor version; accepted with one
    /// "removed upstream" warning, no effect.
    Removed(&'static str),
}

/// One upstream flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamFlag {
    /// Long name without dashes, e.g. `image-gc-high-threshold`.
    pub name: &'static str,
    /// Value syntax.
    pub value: ValueKind,
    /// What kubelet-rs does with it.
    pub kind: FlagKind,
    /// The KubeletConfiguration (v1beta1) field it sets, as a JSON path
    /// (`authentication.webhook.enabled`), when it has one.
    pub field: Option<&'static str>,
    /// A value that asks for what kubelet-rs already does (`--cgroups-per-qos=true`):
    /// giving exactly this value draws no warning.
    pub honoured: Option<&'static str>,
    /// A valid example value when the type's generic one would not do.
    pub sample: Option<&'static str>,
    /// A [`FlagKind::Config`] flag whose resolved setting kubelet-rs acts on
    /// (read from [`crate::KubeletConfig::settings`] by a subsystem): no warning.
    pub acted_on: bool,
}

impl UpstreamFlag {
    const fn new(name: &'static str, value: ValueKind, kind: FlagKind) -> Self {
        Self {
            name,
            value,
            kind,
            field: None,
            honoured: None,
            sample: None,
            acted_on: false,
        }
    }

    const fn acts(mut self) -> Self {
        self.acted_on = true;
        self
    }

    const fn field(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }

    const fn honours(mut self, value: &'static str) -> Self {
        self.honoured = Some(value);
        self
    }

    const fn sample(mut self, value: &'static str) -> Self {
        self.sample = Some(value);
        self
    }

    /// A valid example value.
    pub fn example(&self) -> &'static str {
        match self.sample {
            Some(s) => s,
            None => self.value.sample(),
        }
    }
}

const fn done(name: &'static str, value: ValueKind) -> UpstreamFlag {
    UpstreamFlag::new(name, value, FlagKind::Implemented)
}

const fn config(name: &'static str, value: ValueKind, field: &'static str) -> UpstreamFlag {
    UpstreamFlag::new(name, value, FlagKind::Config).field(field)
}

const fn ignored(name: &'static str, value: ValueKind) -> UpstreamFlag {
    UpstreamFlag::new(name, value, FlagKind::NotImplemented)
}

const fn removed(name: &'static str, value: ValueKind, version: &'static str) -> UpstreamFlag {
    UpstreamFlag::new(name, value, FlagKind::Removed(version))
}

const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The table, sorted by name.
pub const FLAGS: &[UpstreamFlag] = &[
    removed("add-dir-header", Bool, "1.26"),
    config("address", Ip, "address").acts(),
    removed("allow-privileged", Bool, "1.15"),
    config(
        "allowed-unsafe-sysctls",
        StringSlice,
        "allowedUnsafeSysctls",
    )
    .acts(),
    removed("alsologtostderr", Bool, "1.26"),
    config("anonymous-auth", Bool, "authentication.anonymous.enabled").acts(),
    ignored("application-metrics-count-limit", Int64),
    config(
        "authentication-token-webhook",
        Bool,
        "authentication.webhook.enabled",
    )
    .acts(),
    config(
        "authentication-token-webhook-cache-ttl",
        Duration,
        "authentication.webhook.cacheTTL",
    )
    .acts(),
    config("authorization-mode", Str, "authorization.mode")
        .sample("Webhook")
        .acts(),
    config(
        "authorization-webhook-cache-authorized-ttl",
        Duration,
        "authorization.webhook.cacheAuthorizedTTL",
    )
    .acts(),
    config(
        "authorization-webhook-cache-unauthorized-ttl",
        Duration,
        "authorization.webhook.cacheUnauthorizedTTL",
    )
    .acts(),
    removed("azure-container-registry-config", Str, "1.30"),
    ignored("boot-id-file", Str),
    done("bootstrap-kubeconfig", Str),
    removed("cadvisor-port", Int32, "1.12"),
    done("cert-dir", Str),
    done("cgroup-driver", Str)
        .field("cgroupDriver")
        .sample("systemd"),
    done("cgroup-root", Str).field("cgroupRoot").sample("/"),
    config("cgroups-per-qos", Bool, "cgroupsPerQOS").acts(),
    removed("chaos-chance", Float64, "1.22"),
    config("client-ca-file", Str, "authentication.x509.clientCAFile").acts(),
    removed("cloud-config", Str, "1.34"),
    done("cloud-provider", Str).sample("external"),
    done("cluster-dns", StringSlice)
        .field("clusterDNS")
        .sample("10.96.0.10"),
    done("cluster-domain", Str)
        .field("clusterDomain")
        .sample("cluster.local"),
    removed("cni-bin-dir", Str, "1.24"),
    removed("cni-cache-dir", Str, "1.24"),
    removed("cni-conf-dir", Str, "1.24"),
    done("config", Str),
    ignored("config-dir", Str),
    ignored("container-hints", Str),
    config("container-log-max-files", Int32, "containerLogMaxFiles").acts(),
    config("container-log-max-size", Quantity, "containerLogMaxSize").acts(),
    removed("container-runtime", Str, "1.27").sample("remote"),
    done("container-runtime-endpoint", Str)
        .field("containerRuntimeEndpoint")
        .sample(ENDPOINT),
    ignored("containerd", Str),
    ignored("containerd-namespace", Str),
    config("contention-profiling", Bool, "enableContentionProfiling"),
    config("cpu-cfs-quota", Bool, "cpuCFSQuota").acts(),
    config("cpu-cfs-quota-period", Duration, "cpuCFSQuotaPeriod").acts(),
    config("cpu-manager-policy", Str, "cpuManagerPolicy").sample("static"),
    config(
        "cpu-manager-policy-options",
        MapStringStringNoSplit,
        "cpuManagerPolicyOptions",
    ),
    config(
        "cpu-manager-reconcile-period",
        Duration,
        "cpuManagerReconcilePeriod",
    ),
    ignored("docker", Str),
    removed("docker-endpoint", Str, "1.24"),
    ignored("docker-env-metadata-whitelist", Str),
    ignored("docker-only", Bool),
    ignored("docker-root", Str),
    ignored("docker-tls", Bool),
    ignored("docker-tls-ca", Str),
    ignored("docker-tls-cert", Str),
    ignored("docker-tls-key", Str),
    removed("dynamic-config-dir", Str, "1.24"),
    removed("enable-cadvisor-json-endpoints", Bool, "1.21"),
    config(
        "enable-controller-attach-detach",
        Bool,
        "enableControllerAttachDetach",
    ),
    config("enable-debugging-handlers", Bool, "enableDebuggingHandlers").acts(),
    ignored("enable-load-reader", Bool),
    config("enable-server", Bool, "enableServer")
        .honours("false")
        .acts(),
    config(
        "enforce-node-allocatable",
        StringSlice,
        "enforceNodeAllocatable",
    )
    .sample("pods")
    .acts(),
    done("event-burst", Int32).field("eventBurst"),
    done("event-qps", Int32).field("eventRecordQPS"),
    ignored("event-storage-age-limit", Str),
    ignored("event-storage-event-limit", Str),
    done("eviction-hard", LangleMap).field("evictionHard"),
    config(
        "eviction-max-pod-grace-period",
        Int32,
        "evictionMaxPodGracePeriod",
    )
    .acts(),
    config(
        "eviction-minimum-reclaim",
        MapStringString,
        "evictionMinimumReclaim",
    )
    .acts(),
    config(
        "eviction-pressure-transition-period",
        Duration,
        "evictionPressureTransitionPeriod",
    )
    .acts(),
    config("eviction-soft", LangleMap, "evictionSoft").acts(),
    config(
        "eviction-soft-grace-period",
        MapStringString,
        "evictionSoftGracePeriod",
    )
    .sample("memory.available=1m30s")
    .acts(),
    done("exit-on-lock-contention", Bool).sample("false"),
    ignored("experimental-allocatable-ignore-eviction", Bool),
    removed("experimental-bootstrap-kubeconfig", Str, "1.23"),
    removed(
        "experimental-check-node-capabilities-before-mount",
        Bool,
        "1.24",
    ),
    removed("experimental-dockershim-root-directory", Str, "1.24"),
    removed("experimental-kernel-memcg-notification", Bool, "1.25"),
    removed("experimental-logging-sanitization", Bool, "1.26"),
    ignored("experimental-mounter-path", Str),
    config("fail-cgroupv1", Bool, "failCgroupV1").acts(),
    config("fail-swap-on", Bool, "failSwapOn").honours("false"),
    done("feature-gates", MapStringBool).field("featureGates"),
    done("file-check-frequency", Duration).field("fileCheckFrequency"),
    ignored("global-housekeeping-interval", Duration),
    config("hairpin-mode", Str, "hairpinMode").sample("hairpin-veth"),
    done("healthz-bind-address", Ip)
        .field("healthzBindAddress")
        .sample("127.0.0.1"),
    done("healthz-port", Int32).field("healthzPort").sample("0"),
    done("help", Bool),
    removed("host-ipc-sources", StringSlice, "1.15"),
    removed("host-network-sources", StringSlice, "1.15"),
    removed("host-pid-sources", StringSlice, "1.15"),
    done("hostname-override", Str).sample("node-a"),
    ignored("housekeeping-interval", Duration),
    done("http-check-frequency", Duration).field("httpCheckFrequency"),
    done("image-credential-provider-bin-dir", Str),
    done("image-credential-provider-config", Str),
    config(
        "image-gc-high-threshold",
        Int32,
        "imageGCHighThresholdPercent",
    )
    .sample("85")
    .acts(),
    config(
        "image-gc-low-threshold",
        Int32,
        "imageGCLowThresholdPercent",
    )
    .sample("80")
    .acts(),
    removed("image-pull-progress-deadline", Duration, "1.24"),
    done("image-service-endpoint", Str)
        .field("imageServiceEndpoint")
        .sample(ENDPOINT),
    removed("iptables-drop-bit", Int32, "1.31"),
    removed("iptables-masquerade-bit", Int32, "1.31"),
    removed("keep-terminated-pod-volumes", Bool, "1.31"),
    config("kernel-memcg-notification", Bool, "kernelMemcgNotification"),
    done("kube-api-burst", Int32).field("kubeAPIBurst"),
    config("kube-api-content-type", Str, "contentType").sample("application/json"),
    done("kube-api-qps", Int32).field("kubeAPIQPS"),
    done("kube-reserved", MapStringString).field("kubeReserved"),
    config("kube-reserved-cgroup", Str, "kubeReservedCgroup").sample("/kube-reserved"),
    done("kubeconfig", Str),
    config("kubelet-cgroups", Str, "kubeletCgroups").sample("/system.slice/kubelet.service"),
    config(
        "local-storage-capacity-isolation",
        Bool,
        "localStorageCapacityIsolation",
    )
    .acts(),
    done("lock-file", Str).sample("/run/lock/kubelet.lock"),
    removed("log-backtrace-at", TraceLocation, "1.26"),
    ignored("log-cadvisor-usage", Bool),
    removed("log-dir", Str, "1.26"),
    removed("log-file", Str, "1.26"),
    removed("log-file-max-size", Uint64, "1.26"),
    config("log-flush-frequency", Duration, "logging.flushFrequency"),
    config(
        "log-json-info-buffer-size",
        Quantity,
        "logging.options.json.infoBufferSize",
    ),
    config(
        "log-json-split-stream",
        Bool,
        "logging.options.json.splitStream",
    ),
    config(
        "log-text-info-buffer-size",
        Quantity,
        "logging.options.text.infoBufferSize",
    ),
    config(
        "log-text-split-stream",
        Bool,
        "logging.options.text.splitStream",
    ),
    config("logging-format", Str, "logging.format")
        .acts()
        .sample("json"),
    removed("logtostderr", Bool, "1.26"),
    ignored("machine-id-file", Str),
    config("make-iptables-util-chains", Bool, "makeIPTablesUtilChains").honours("false"),
    done("manifest-url", Str)
        .field("staticPodURL")
        .sample("http://192.0.2.1/pods"),
    done("manifest-url-header", ColonMultimap).field("staticPodURLHeader"),
    removed("master-service-namespace", Str, "1.27"),
    config("max-open-files", Int64, "maxOpenFiles"),
    done("max-pods", Int32).field("maxPods").sample("30"),
    done("maximum-dead-containers", Int32),
    done("maximum-dead-containers-per-container", Int32),
    config("memory-manager-policy", Str, "memoryManagerPolicy").sample("Static"),
    done("minimum-container-ttl-duration", Duration),
    config("minimum-image-ttl-duration", Duration, "imageMinimumGCAge").acts(),
    removed("network-plugin", Str, "1.24").sample("cni"),
    removed("network-plugin-mtu", Int32, "1.24"),
    done("node-ip", Str).sample("192.0.2.10"),
    done("node-labels", MapStringString).sample("tier=edge"),
    config("node-status-max-images", Int32, "nodeStatusMaxImages"),
    done("node-status-update-frequency", Duration).field("nodeStatusUpdateFrequency"),
    removed("non-masquerade-cidr", Str, "1.24"),
    removed("one-output", Bool, "1.26"),
    config("oom-score-adj", Int32, "oomScoreAdj").sample("-999"),
    config("pod-cidr", Str, "podCIDR").sample("10.244.0.0/24"),
    ignored("pod-infra-container-image", Str).sample("registry.k8s.io/pause:3.10"),
    done("pod-manifest-path", Str).field("staticPodPath"),
    config("pod-max-pids", Int64, "podPidsLimit")
        .sample("-1")
        .acts(),
    config("pods-per-core", Int32, "podsPerCore"),
    done("port", Int32).field("port").sample("10250"),
    config("protect-kernel-defaults", Bool, "protectKernelDefaults"),
    done("provider-id", Str)
        .field("providerID")
        .sample("aws:///us-east-1a/i-0123"),
    config("qos-reserved", MapStringString, "qosReserved").sample("memory=50%"),
    config("read-only-port", Int32, "readOnlyPort")
        .honours("0")
        .sample("10255")
        .acts(),
    removed("really-crash-for-testing", Bool, "1.24"),
    removed("redirect-container-streaming", Bool, "1.22"),
    done("register-node", Bool).field("registerNode"),
    removed("register-schedulable", Bool, "1.34"),
    done("register-with-taints", Taints).field("registerWithTaints"),
    config("registry-burst", Int32, "registryBurst"),
    config("registry-qps", Int32, "registryPullQPS"),
    config("reserved-cpus", Str, "reservedSystemCPUs").sample("0-1"),
    config("reserved-memory", ReservedMemory, "reservedMemory"),
    done("resolv-conf", Str)
        .field("resolvConf")
        .sample("/etc/resolv.conf"),
    done("root-dir", Str),
    done("rotate-certificates", Bool).field("rotateCertificates"),
    config("rotate-server-certificates", Bool, "serverTLSBootstrap").acts(),
    config("runonce", Bool, "runOnce"),
    ignored("runtime-cgroups", Str).sample("/system.slice/containerd.service"),
    done("runtime-request-timeout", Duration).field("runtimeRequestTimeout"),
    config("seccomp-default", Bool, "seccompDefault").acts(),
    removed("seccomp-profile-root", Str, "1.23"),
    config("serialize-image-pulls", Bool, "serializeImagePulls"),
    // Config-file-only upstream, but bootstrap scripts pass them as flags.
    config("shutdown-grace-period", Duration, "shutdownGracePeriod").acts(),
    config(
        "shutdown-grace-period-critical-pods",
        Duration,
        "shutdownGracePeriodCriticalPods",
    )
    // Alone, anything above 0s is more than shutdownGracePeriod (0s): refused.
    .sample("0s")
    .acts(),
    removed("skip-headers", Bool, "1.26"),
    removed("skip-log-headers", Bool, "1.26"),
    removed("stderrthreshold", Severity, "1.26"),
    ignored("storage-driver-buffer-duration", Duration),
    ignored("storage-driver-db", Str),
    ignored("storage-driver-host", Str),
    ignored("storage-driver-password", Str),
    ignored("storage-driver-secure", Bool),
    ignored("storage-driver-table", Str),
    ignored("storage-driver-user", Str),
    config(
        "streaming-connection-idle-timeout",
        Duration,
        "streamingConnectionIdleTimeout",
    ),
    done("sync-frequency", Duration).field("syncFrequency"),
    config("system-cgroups", Str, "systemCgroups").sample("/system.slice"),
    done("system-reserved", MapStringString).field("systemReserved"),
    config("system-reserved-cgroup", Str, "systemReservedCgroup").sample("/system-reserved"),
    config("tls-cert-file", Str, "tlsCertFile").acts(),
    config("tls-cipher-suites", StringSlice, "tlsCipherSuites")
        .sample("TLS_AES_128_GCM_SHA256")
        .acts(),
    config("tls-min-version", Str, "tlsMinVersion")
        .sample("VersionTLS12")
        .acts(),
    config("tls-private-key-file", Str, "tlsPrivateKeyFile").acts(),
    config("topology-manager-policy", Str, "topologyManagerPolicy").sample("single-numa-node"),
    config(
        "topology-manager-policy-options",
        MapStringStringNoSplit,
        "topologyManagerPolicyOptions",
    )
    .sample("prefer-closest-numa-nodes=true"),
    config("topology-manager-scope", Str, "topologyManagerScope").sample("pod"),
    done("v", Level).field("logging.verbosity").sample("2"),
    done("version", Version),
    config("vmodule", ModuleSpec, "logging.vmodule"),
    config("volume-plugin-dir", Str, "volumePluginDir")
        .sample("/usr/libexec/kubernetes/kubelet-plugins/volume/exec/"),
    config("volume-stats-agg-period", Duration, "volumeStatsAggPeriod"),
];

/// The entry for a flag name (`-` or `_` spelling).
pub fn lookup(name: &str) -> Option<&'static UpstreamFlag> {
    let name = name.replace('_', "-");
    FLAGS.iter().find(|f| f.name == name)
}

/// The entry that sets a KubeletConfiguration field.
pub fn by_field(field: &str) -> Option<&'static UpstreamFlag> {
    FLAGS.iter().find(|f| f.field == Some(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_unique_and_self_consistent() {
        for pair in FLAGS.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} before {}",
                pair[0].name,
                pair[1].name
            );
        }
        for f in FLAGS {
            assert!(
                !f.name.starts_with('-') && !f.name.contains('_'),
                "{}",
                f.name
            );
            assert_eq!(
                f.value.check(f.example()),
                Ok(()),
                "--{}={}",
                f.name,
                f.example()
            );
            if let Some(h) = f.honoured {
                assert_eq!(f.value.check(h), Ok(()), "--{} honours {h}", f.name);
            }
            match f.kind {
                FlagKind::Config => assert!(f.field.is_some(), "--{} needs its field", f.name),
                FlagKind::Removed(v) => {
                    let minor = v.strip_prefix("1.").and_then(|m| m.parse::<u8>().ok());
                    assert!(minor.is_some_and(|m| m <= 34), "--{}: {v}", f.name);
                }
                FlagKind::Implemented | FlagKind::NotImplemented => {}
            }
        }
        assert_eq!(
            lookup("image_gc_high_threshold").map(|f| f.name),
            Some("image-gc-high-threshold")
        );
        assert_eq!(
            by_field("podPidsLimit").map(|f| f.name),
            Some("pod-max-pids")
        );
    }
}
