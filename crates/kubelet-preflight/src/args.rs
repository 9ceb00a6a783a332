//! `check`'s own options, split from the kubelet flags that follow:
//! `-o`/`--output` and kubeadm's `--ignore-preflight-errors`.

use std::ffi::OsString;

use crate::PreflightError;
use crate::finding::Kind;
use crate::report::OutputFormat;

/// `kubelet-rs check`'s arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckArgs {
    /// `-o`.
    pub format: OutputFormat,
    /// Kinds whose errors are reported as warnings.
    pub ignore: Vec<Kind>,
    /// The kubelet flags, as a start would take them.
    pub flags: Vec<OsString>,
}

const KINDS: &[Kind] = &[
    Kind::Flag,
    Kind::Config,
    Kind::Manifest,
    Kind::Runtime,
    Kind::CgroupDriver,
    Kind::Cgroups,
    Kind::Swap,
    Kind::Kubeconfig,
    Kind::Certificate,
    Kind::Port,
];

fn kinds(list: &str) -> Result<Vec<Kind>, PreflightError> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let name = name.to_ascii_lowercase();
        if name == "all" {
            return Ok(KINDS.to_vec());
        }
        match KINDS.iter().find(|k| k.as_str() == name) {
            Some(k) => out.push(*k),
            None => return Err(PreflightError::UnknownKind(name)),
        }
    }
    Ok(out)
}

/// Splits `check`'s options from the kubelet flags; `args` are what follows
/// `check` on the command line.
pub fn parse_args(args: &[OsString]) -> Result<CheckArgs, PreflightError> {
    let mut out = CheckArgs::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (s.as_ref(), None),
        };
        let option: &'static str = match name {
            "-o" | "--output" => "-o",
            "--ignore-preflight-errors" => "--ignore-preflight-errors",
            _ => {
                out.flags.push(a.clone());
                continue;
            }
        };
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .ok_or(PreflightError::MissingValue(option))?
                .to_string_lossy()
                .into_owned(),
        };
        if option == "-o" {
            out.format = match value.as_str() {
                "text" => OutputFormat::Text,
                "json" => OutputFormat::Json,
                other => return Err(PreflightError::OutputFormat(other.to_owned())),
            };
        } else {
            out.ignore.extend(kinds(&value)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn output_flag_in_every_spelling_is_taken_out_of_the_kubelet_flags() {
        for args in [
            &["-o", "json", "--max-pods=3"][..],
            &["--max-pods=3", "--output=json"][..],
            &["-o=json", "--max-pods=3"][..],
        ] {
            let a = parse_args(&os(args)).expect("parse");
            assert_eq!(a.format, OutputFormat::Json);
            assert_eq!(a.flags, os(&["--max-pods=3"]));
        }
        assert!(matches!(
            parse_args(&os(&["-o", "yaml"])),
            Err(PreflightError::OutputFormat(_))
        ));
        assert!(matches!(
            parse_args(&os(&["-o"])),
            Err(PreflightError::MissingValue("-o"))
        ));
    }

    #[test]
    fn ignored_kinds_as_kubeadm_spells_them() {
        let a = parse_args(&os(&[
            "--ignore-preflight-errors=Port,swap",
            "--ignore-preflight-errors",
            "cgroup-driver",
            "--port=1",
        ]))
        .expect("parse");
        assert_eq!(a.ignore, vec![Kind::Port, Kind::Swap, Kind::CgroupDriver]);
        assert_eq!(a.flags, os(&["--port=1"]));
        let all = parse_args(&os(&["--ignore-preflight-errors=all"])).expect("all");
        assert_eq!(all.ignore.len(), KINDS.len());
        assert!(matches!(
            parse_args(&os(&["--ignore-preflight-errors=ports"])),
            Err(PreflightError::UnknownKind(_))
        ));
        assert!(wants_help_is_separate());
    }

    fn wants_help_is_separate() -> bool {
        crate::wants_help(&os(&["--help"])) && !crate::wants_help(&os(&["--port=1"]))
    }
}
