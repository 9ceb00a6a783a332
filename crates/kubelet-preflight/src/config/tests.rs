use super::*;
use crate::Severity;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

/// Runs the check with a config file of `body` (after the header) and `args`.
fn run(body: &str, args: &[&str]) -> (tempfile::TempDir, Option<KubeletConfig>, Vec<Finding>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, format!("{HEAD}{body}")).expect("write");
    let mut flags: Vec<OsString> = vec![format!("--config={}", path.display()).into()];
    flags.extend(args.iter().map(OsString::from));
    let mut r = Report::default();
    let cfg = check(&flags, &mut r);
    (dir, cfg, r.findings)
}

fn one<'a>(f: &'a [Finding], field: &str) -> &'a Finding {
    let hits: Vec<&Finding> = f
        .iter()
        .filter(|x| x.field.as_deref() == Some(field))
        .collect();
    assert_eq!(hits.len(), 1, "{field}: {f:#?}");
    hits[0]
}

#[test]
fn a_clean_kubeadm_config_has_no_findings() {
    let body = "authentication:\n  anonymous: {enabled: false}\n  webhook:\n    cacheTTL: 0s\n    enabled: true\n  x509:\n    clientCAFile: /etc/kubernetes/pki/ca.crt\nauthorization:\n  mode: Webhook\ncgroupDriver: systemd\nclusterDNS: [10.96.0.10]\nevictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\nstaticPodPath: /etc/kubernetes/manifests\nlogging: {format: text, options: {json: {infoBufferSize: '0'}}}\n";
    let (_d, cfg, f) = run(body, &[]);
    assert_eq!(f, vec![]);
    assert!(cfg.is_some());
}

#[test]
fn unknown_fields_top_level_and_nested_are_at_their_own_line() {
    let body = "bogus: 1\nwebhook: {}\nauthentication:\n  webhook:\n    enabled: true\n  x509:\n    clientCAFile: /ca.crt\n    bogus: 2\nlogging:\n  options:\n    json:\n      nope: 1\n";
    let (d, cfg, f) = run(body, &[]);
    assert!(cfg.is_some(), "unknown fields are ignored: {f:#?}");
    let path = d.path().join("config.yaml");
    let top = one(&f, "bogus");
    assert_eq!((top.line, top.severity), (Some(3), Severity::Warning));
    assert_eq!(top.file.as_deref(), Some(path.as_path()));
    assert!(
        top.message.starts_with("unknown field \"bogus\""),
        "{top:?}"
    );
    assert_eq!(one(&f, "webhook").line, Some(4));
    assert_eq!(one(&f, "authentication.x509.bogus").line, Some(10));
    assert_eq!(one(&f, "logging.options.json.nope").line, Some(14));
    assert_eq!(f.len(), 4, "{f:#?}");
}

#[test]
fn out_of_range_values_use_upstreams_words_and_lines() {
    let body = "maxPods: -1\nhealthzPort: 70000\nreadOnlyPort: -2\nimageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 60\nkubeAPIQPS: -5\ncontainerLogMaxFiles: 1\nhairpinMode: sideways\n";
    let (_d, cfg, f) = run(body, &[]);
    assert!(cfg.is_none(), "maxPods -1 stops a start");
    let m = one(&f, "maxPods");
    assert_eq!(
        (m.kind, m.severity, m.line),
        (Kind::Config, Severity::Error, Some(3))
    );
    assert_eq!(
        m.message,
        "invalid configuration: maxPods (--max-pods) -1 must not be a negative number"
    );
    assert_eq!(
        one(&f, "healthzPort").message,
        "invalid configuration: healthzPort (--healthz-port) 70000 must be between 1 and 65535, inclusive"
    );
    assert_eq!(
        one(&f, "readOnlyPort").message,
        "invalid configuration: readOnlyPort (--read-only-port) -2 must be between 0 and 65535, inclusive"
    );
    let low = one(&f, "imageGCLowThresholdPercent");
    assert_eq!(low.line, Some(7));
    assert_eq!(
        low.message,
        "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 60 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 50"
    );
    assert_eq!(one(&f, "kubeAPIQPS").line, Some(8));
    assert_eq!(
        one(&f, "containerLogMaxFiles").message,
        "invalid configuration: containerLogMaxFiles must be greater than 1"
    );
    assert!(one(&f, "hairpinMode").message.contains("Valid options are"));
    // The resolve refusal of maxPods is not reported twice.
    assert_eq!(f.len(), 7, "{f:#?}");
}

#[test]
fn flags_beat_the_file_and_are_named_as_flags() {
    let (_d, cfg, f) = run("maxPods: 10\n", &["--max-pods=-3"]);
    assert!(cfg.is_none());
    let errors: Vec<Finding> = f
        .iter()
        .filter(|x| x.severity == Severity::Error)
        .cloned()
        .collect();
    let m = one(&errors, "--max-pods");
    assert_eq!((m.kind, m.file.as_ref()), (Kind::Flag, None));
    assert_eq!(
        m.message,
        "invalid configuration: maxPods (--max-pods) -3 must not be a negative number"
    );
    // A resolve refusal that no rule covers, from the file: at its line.
    let (_d, cfg, f) = run("clusterDNS: [not-an-ip]\n", &[]);
    assert!(cfg.is_none());
    let c = one(&f, "clusterDNS");
    assert_eq!((c.kind, c.line), (Kind::Config, Some(3)));
    assert!(
        c.message
            .starts_with("invalid configuration: invalid value for clusterDNS"),
        "{c:?}"
    );
    let (_d, _, f) = run("cgroupDriver: upstart\n", &[]);
    assert_eq!(one(&f, "cgroupDriver").line, Some(3));
}

#[test]
fn eviction_maps_and_reserved_resources() {
    let body = "evictionHard:\n  memory.available: 100Mi\n  foo: 1%\n  nodefs.available: lots\nevictionSoftGracePeriod:\n  memory.available: soon\nkubeReserved:\n  cpu: -1\n";
    let (_d, _, f) = run(body, &[]);
    let foo = one(&f, "evictionHard.foo");
    assert_eq!((foo.line, foo.severity), (Some(5), Severity::Error));
    assert_eq!(
        foo.message,
        "invalid configuration: evictionHard: unsupported eviction signal foo"
    );
    assert_eq!(one(&f, "evictionHard.nodefs.available").line, Some(6));
    assert_eq!(
        one(&f, "evictionSoftGracePeriod.memory.available").line,
        Some(8)
    );
    assert_eq!(one(&f, "kubeReserved.cpu").line, Some(10));
}

#[test]
fn deprecated_fields_and_flags_are_warnings() {
    let (_d, cfg, f) = run(
        "iptablesMasqueradeBit: 14\n",
        &[
            "--network-plugin=cni",
            "--max-pods=20",
            "--cpu-manager-policy=static",
        ],
    );
    assert!(cfg.is_some());
    let dep = one(&f, "iptablesMasqueradeBit");
    assert_eq!((dep.severity, dep.line), (Severity::Warning, Some(3)));
    assert_eq!(
        dep.message,
        "iptablesMasqueradeBit is deprecated upstream and no longer has any effect"
    );
    let net = one(&f, "--network-plugin");
    assert_eq!((net.kind, net.severity), (Kind::Flag, Severity::Warning));
    assert!(net.message.contains("removed upstream"), "{net:?}");
    let mp = one(&f, "--max-pods");
    assert!(
        mp.message.starts_with(
            "Flag --max-pods has been deprecated, This parameter should be set via the config file"
        ),
        "{mp:?}"
    );
    let cpu: Vec<_> = f
        .iter()
        .filter(|x| x.field.as_deref() == Some("--cpu-manager-policy"))
        .collect();
    assert_eq!(
        cpu.len(),
        2,
        "not implemented and set via the config file: {cpu:#?}"
    );
    assert!(f.iter().all(|x| x.severity == Severity::Warning));
}

#[test]
fn flag_parse_errors_name_the_flag() {
    let mut r = Report::default();
    assert!(check(&[OsString::from("--no-such-flag")], &mut r).is_none());
    assert_eq!(r.findings.len(), 1);
    assert_eq!(r.findings[0].kind, Kind::Flag);
    assert_eq!(r.findings[0].field.as_deref(), Some("--no-such-flag"));
    let mut r = Report::default();
    assert!(check(&[OsString::from("--max-pods=many")], &mut r).is_none());
    assert_eq!(r.findings[0].field.as_deref(), Some("--max-pods"));
    assert!(r.findings[0].message.contains("many"), "{:?}", r.findings);
}

#[test]
fn syntax_kind_and_unreadable_files_stop_the_check() {
    let (_d, cfg, f) = run("maxPods: [1\nport: 2\n", &[]);
    assert!(cfg.is_none());
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!((f[0].kind, f[0].severity), (Kind::Config, Severity::Error));
    assert!(f[0].line.is_some(), "{f:#?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("k.yaml");
    std::fs::write(&path, "apiVersion: v1\nkind: Pod\n").expect("write");
    let mut r = Report::default();
    assert!(check(&[format!("--config={}", path.display()).into()], &mut r).is_none());
    assert_eq!(r.findings[0].field.as_deref(), Some("kind"));
    assert_eq!(r.findings[0].line, Some(2));
    let mut r = Report::default();
    let missing = dir.path().join("missing.yaml");
    assert!(check(&[format!("--config={}", missing.display()).into()], &mut r).is_none());
    assert_eq!(r.findings[0].file.as_deref(), Some(missing.as_path()));
}

#[test]
fn argv_values_take_the_last_use_in_either_spelling() {
    let a = Argv::new(&[
        OsString::from("--max-pods=3"),
        OsString::from("--max_pods"),
        OsString::from("5"),
        OsString::from("--max-pods-x=1"),
        OsString::from("--fail-swap-on"),
    ]);
    assert_eq!(a.value("max-pods").as_deref(), Some("5"));
    assert_eq!(a.value("fail-swap-on").as_deref(), Some("true"));
    assert_eq!(a.names(), ["max-pods", "max-pods-x", "fail-swap-on"]);
}
