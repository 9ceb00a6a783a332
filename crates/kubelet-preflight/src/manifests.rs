//! Static pod manifests under `staticPodPath`, read with the file source's
//! file selection and decoding (upstream `pkg/kubelet/config/file.go`) and
//! validated as its `tryDecodeSinglePod` does with the apiserver's
//! `ValidatePodCreate`: one finding per field error, at the key's line.

use std::path::Path;

use kubelet_config::KubeletConfig;
use kubelet_podconfig::check_pod_document;
use kubelet_podconfig::file::{ManifestPathError, manifest_files};
use kubelet_podconfig::validation::{FieldError, Seg};

use crate::config::{Step, locate};
use crate::finding::{Finding, Kind, error_line};
use crate::report::Report;

fn steps(e: &FieldError) -> Vec<Step> {
    e.path
        .segments()
        .iter()
        .map(|s| match s {
            Seg::Field(k) | Seg::Key(k) => Step::Key(k.clone()),
            Seg::Index(i) => Step::Index(*i),
        })
        .collect()
}

fn check_file(file: &Path, node: &str, report: &mut Report) {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            report.push(
                Finding::error(Kind::Manifest, format!("cannot read file: {e}")).in_file(file),
            );
            return;
        }
    };
    match check_pod_document(&text, node) {
        Err(e) => {
            // The decoder's first line; the rest is a snippet of the file.
            let first =
                e.0.lines()
                    .next()
                    .unwrap_or_default()
                    .replace(": error: ", ": ");
            report.push(
                Finding::error(Kind::Manifest, first)
                    .in_file(file)
                    .at_line(error_line(&e.0)),
            );
        }
        Ok(errs) => {
            for e in errs {
                let path = e.path.to_string();
                let full = e.to_string();
                let what = full
                    .strip_prefix(&format!("{path}: "))
                    .unwrap_or(&full)
                    .to_string();
                report.push(
                    Finding::error(Kind::Manifest, format!("invalid pod: {what}"))
                        .in_file(file)
                        .at_line(locate(&text, &steps(&e)))
                        .field(path),
                );
            }
        }
    }
}

/// Reports every manifest the file source would refuse, and a static pod
/// path it cannot read (a warning: upstream logs it and keeps watching).
pub(crate) fn check(cfg: &KubeletConfig, report: &mut Report) {
    let Some(dir) = &cfg.static_pod_path else {
        return;
    };
    let files = match manifest_files(dir) {
        Ok(files) => files,
        Err(ManifestPathError::Missing) => {
            report.push(
                Finding::warning(
                    Kind::Manifest,
                    "staticPodPath does not exist: no static pods until it does (the kubelet keeps watching it)",
                )
                .in_file(dir)
                .field("staticPodPath"),
            );
            return;
        }
        Err(e) => {
            report.push(
                Finding::warning(Kind::Manifest, e.to_string())
                    .in_file(dir)
                    .field("staticPodPath"),
            );
            return;
        }
    };
    for f in files {
        check_file(&f, &cfg.node_name, report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(files: &[(&str, &str)]) -> (tempfile::TempDir, Vec<Finding>) {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        let flags = kubelet_config::Flags::parse_args([
            "kubelet".to_string(),
            format!("--pod-manifest-path={}", dir.path().display()),
            "--hostname-override=node-1".to_string(),
        ])
        .expect("flags");
        let cfg = KubeletConfig::resolve(&flags, None, "h").expect("cfg");
        let mut r = Report::default();
        check(&cfg, &mut r);
        (dir, r.findings)
    }

    /// Upstream's file source reads every name not starting with `.`
    /// (`[^.]*`, so GCE's `*.manifest` too): a stray text file is read, and
    /// refused, as the kubelet will refuse it.
    #[test]
    fn valid_manifests_have_no_findings_dot_files_are_skipped_others_read() {
        let (_d, f) = run(&[
            (
                "web.yaml",
                include_str!("../../../deploy/manifests/web.yaml"),
            ),
            (
                "init.yaml",
                include_str!("../../../deploy/manifests/init-demo.yaml"),
            ),
            (".hidden.yaml", "not: a pod"),
            ("notes.txt", "not: a pod"),
        ]);
        let files: Vec<_> = f
            .iter()
            .map(|f| f.file.as_deref().and_then(|p| p.file_name()))
            .collect();
        assert_eq!(
            files,
            vec![Some(std::ffi::OsStr::new("notes.txt"))],
            "{f:?}"
        );
    }

    #[test]
    fn each_field_error_is_one_finding_at_its_line() {
        let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: a\n    image: i\n  - name: a\n    image: i\n    livenessProbe:\n      periodSeconds: -1\n";
        let (d, f) = run(&[("dup.yaml", pod), ("syntax.yaml", "kind: Pod\nspec: [\n")]);
        let dup = d.path().join("dup.yaml");
        let f: Vec<_> = f
            .iter()
            .filter(|f| f.file.as_deref() == Some(&dup))
            .collect();
        assert_eq!(f.len(), 3, "{f:?}");
        assert_eq!(f[0].field.as_deref(), Some("spec.containers[1].name"));
        assert_eq!(f[0].line, Some(9));
        assert_eq!(f[0].message, "invalid pod: Duplicate value: \"a\"");
        assert_eq!(
            f[1].message,
            "invalid pod: Required value: must specify a handler type"
        );
        assert_eq!(f[1].line, Some(11));
        assert_eq!(
            f[2].field.as_deref(),
            Some("spec.containers[1].livenessProbe.periodSeconds")
        );
        assert_eq!(f[2].line, Some(12));
        assert!(
            f.iter()
                .all(|f| f.kind == Kind::Manifest && f.severity == crate::Severity::Error)
        );
    }

    #[test]
    fn syntax_errors_and_a_missing_path() {
        let (d, f) = run(&[("syntax.yaml", "kind: Pod\nspec: [\n")]);
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[0].file.as_deref(),
            Some(d.path().join("syntax.yaml").as_path())
        );
        assert!(f[0].message.contains("invalid YAML"), "{f:?}");
        let flags =
            kubelet_config::Flags::parse_args(["kubelet", "--pod-manifest-path=/nonexistent/m"])
                .expect("flags");
        let cfg = KubeletConfig::resolve(&flags, None, "h").expect("cfg");
        let mut r = Report::default();
        check(&cfg, &mut r);
        assert_eq!(r.findings.len(), 1);
        assert_eq!(r.findings[0].severity, crate::Severity::Warning);
        assert_eq!(r.findings[0].field.as_deref(), Some("staticPodPath"));
    }
}
