use super::cert::tests::pair;
use super::*;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig with inline client certificate and key.
fn kubeconfig(cert: &str, key: &str) -> String {
    let (ca, _) = pair("kubernetes", -1, 3650);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\ncurrent-context: ctx\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&ca),
        b64(cert),
        b64(key)
    )
}

fn cfg(args: &[String]) -> KubeletConfig {
    let mut all = vec!["kubelet".to_string()];
    all.extend_from_slice(args);
    let flags = kubelet_config::Flags::parse_args(all).expect("flags");
    KubeletConfig::resolve(&flags, None, "node").expect("config")
}

struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write");
        p
    }
    fn check(&self, kubeconfig: Option<&str>, bootstrap: Option<&str>) -> Report {
        let mut args = vec![format!("--cert-dir={}", self.path("pki").display())];
        if let Some(k) = kubeconfig {
            args.push(format!("--kubeconfig={}", self.path(k).display()));
        }
        if let Some(b) = bootstrap {
            args.push(format!("--bootstrap-kubeconfig={}", self.path(b).display()));
        }
        let mut r = Report::default();
        check(&cfg(&args), &mut r);
        r
    }
}

fn of(r: &Report, kind: Kind) -> Vec<(Severity, String)> {
    r.of_kind(kind)
        .map(|f| (f.severity, f.message.clone()))
        .collect()
}

#[test]
fn standalone_checks_nothing() {
    let n = Node::new();
    let r = n.check(None, None);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
}

#[test]
fn a_good_kubeconfig_is_info_only() {
    let n = Node::new();
    let (cert, key) = pair("system:node:n1", -1, 365);
    n.write("kubelet.conf", &kubeconfig(&cert, &key));
    let r = n.check(Some("kubelet.conf"), None);
    assert_eq!(r.count(Severity::Error), 0, "{:?}", r.findings);
    assert_eq!(r.count(Severity::Warning), 0, "{:?}", r.findings);
    // The CA and the client certificate.
    assert_eq!(of(&r, Kind::Certificate).len(), 2, "{:?}", r.findings);
}

#[test]
fn an_expired_client_certificate_is_an_error_without_bootstrap_and_a_warning_with_it() {
    let n = Node::new();
    let (cert, key) = pair("system:node:n1", -400, -3);
    n.write("kubelet.conf", &kubeconfig(&cert, &key));
    let r = n.check(Some("kubelet.conf"), None);
    let certs = of(&r, Kind::Certificate);
    assert!(
        certs.iter().any(|(s, m)| *s == Severity::Error
            && m.contains("client certificate \"CN=system:node:n1\" has expired")),
        "{certs:?}"
    );
    let f = r
        .of_kind(Kind::Certificate)
        .find(|f| f.severity == Severity::Error)
        .expect("error");
    assert_eq!(f.file.as_deref(), Some(n.path("kubelet.conf").as_path()));
    assert_eq!(
        f.field.as_deref(),
        Some("users[\"u\"].client-certificate-data")
    );

    let (bc, bk) = pair("bootstrap", -1, 365);
    n.write("bootstrap.conf", &kubeconfig(&bc, &bk));
    let r = n.check(Some("kubelet.conf"), Some("bootstrap.conf"));
    assert_eq!(r.count(Severity::Error), 0, "{:?}", r.findings);
    assert!(
        of(&r, Kind::Certificate)
            .iter()
            .any(|(s, m)| *s == Severity::Warning && m.contains("will bootstrap a new one")),
        "{:?}",
        r.findings
    );
}

#[test]
fn missing_kubeconfig_is_fine_with_a_bootstrap_kubeconfig_only() {
    let n = Node::new();
    let r = n.check(Some("kubelet.conf"), None);
    assert_eq!(r.count(Severity::Error), 1);
    assert!(of(&r, Kind::Kubeconfig)[0].1.contains("no such file"));
    let r = n.check(Some("kubelet.conf"), Some("bootstrap.conf"));
    let k = of(&r, Kind::Kubeconfig);
    assert_eq!(k[0].0, Severity::Info, "{k:?}");
    assert!(
        k[0].1.contains("will request a client certificate"),
        "{k:?}"
    );
    // …but then the bootstrap kubeconfig must be there.
    assert_eq!(k[1].0, Severity::Error, "{k:?}");
    n.write("bootstrap.conf", "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\ncurrent-context: ctx\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\n");
    let r = n.check(Some("kubelet.conf"), Some("bootstrap.conf"));
    assert_eq!(r.count(Severity::Error), 0, "{:?}", r.findings);
}

#[test]
fn a_bootstrap_kubeconfig_unused_while_the_kubeconfig_is_valid_only_warns() {
    let n = Node::new();
    let (cert, key) = pair("system:node:n1", -1, 365);
    n.write("kubelet.conf", &kubeconfig(&cert, &key));
    let r = n.check(Some("kubelet.conf"), Some("bootstrap.conf"));
    assert_eq!(r.count(Severity::Error), 0, "{:?}", r.findings);
    assert!(of(&r, Kind::Kubeconfig).iter().any(
        |(s, m)| *s == Severity::Warning && m.contains("not used while --kubeconfig is valid")
    ));
}

#[test]
fn broken_kubeconfigs_say_what_is_wrong() {
    let n = Node::new();
    let (cert, key) = pair("system:node:n1", -1, 365);
    let good = kubeconfig(&cert, &key);
    let cases = [
        (
            "clusters: [\n  - name: c\n   bad",
            "unable to load kubeconfig",
        ),
        (
            &good.replace("current-context: ctx\n", "") as &str,
            "current-context is not set",
        ),
        (
            &good.replace("current-context: ctx", "current-context: other"),
            "context \"other\" (current-context) not found",
        ),
        (
            &good.replace("    server: https://127.0.0.1:6443\n", ""),
            "no server found for cluster \"c\"",
        ),
        (
            &good.replace("    cluster: c\n", "    cluster: d\n"),
            "cluster \"d\" of context \"ctx\" not found",
        ),
        (
            &good.replace("    user: u\n", "    user: v\n"),
            "user \"v\" of context \"ctx\" not found",
        ),
    ];
    for (text, want) in cases {
        n.write("kubelet.conf", text);
        let r = n.check(Some("kubelet.conf"), None);
        let errors: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Error && f.kind == Kind::Kubeconfig)
            .collect();
        assert_eq!(errors.len(), 1, "{want}: {:?}", r.findings);
        assert!(
            errors[0].message.contains(want),
            "{want}: {}",
            errors[0].message
        );
        assert_eq!(
            errors[0].file.as_deref(),
            Some(n.path("kubelet.conf").as_path())
        );
    }
}

#[test]
fn client_files_must_be_readable_and_the_key_must_match() {
    let n = Node::new();
    let (cert, _) = pair("system:node:n1", -1, 365);
    let (_, other) = pair("x", -1, 365);
    let c = n.write("client.crt", &cert);
    let k = n.write("client.key", &other);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\ncurrent-context: ctx\nusers:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: client.key\n",
        c.display()
    );
    n.write("kubelet.conf", &text);
    let r = n.check(Some("kubelet.conf"), None);
    let errors: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .collect();
    assert_eq!(errors.len(), 1, "{:?}", r.findings);
    assert!(
        errors[0]
            .message
            .starts_with("tls: private key does not match public key")
    );
    assert!(
        errors[0].message.contains(&k.display().to_string()),
        "{}",
        errors[0].message
    );
    std::fs::remove_file(&k).expect("rm");
    let r = n.check(Some("kubelet.conf"), None);
    assert!(
        r.findings.iter().any(|f| f.severity == Severity::Error
            && f.message
                .starts_with(&format!("cannot read {}", k.display()))),
        "{:?}",
        r.findings
    );
}

#[test]
fn a_yaml_error_line_is_taken_from_the_message() {
    assert_eq!(error_line("bad: at line 3 column 5"), Some(3));
    assert_eq!(error_line("no position"), None);
}
