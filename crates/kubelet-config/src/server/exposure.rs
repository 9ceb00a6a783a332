//! Who opens the node API to everyone: upstream's legacy flag defaults
//! (`applyLegacyDefaults` in `cmd/kubelet/app/options`: anonymous requests
//! on, `AlwaysAllow`) make every anonymous client root in every container of
//! a kubelet listening on `0.0.0.0`.
//!
//! kubelet-rs goes beyond upstream in one case only: when neither
//! `--anonymous-auth` nor `--authorization-mode` nor `--address` is given
//! and there is no config file, both servers (10250 and the read-only port)
//! bind loopback. Any of those given keeps upstream's behaviour exactly, and
//! [`Exposure::Open`] names what opened it so the start-up log can say so.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use crate::settings::SettingValue;

/// The setting fields that decide who may use the node API, with the flag
/// that sets each.
const FIELDS: [(&str, &str); 3] = [
    ("address", "--address"),
    ("authentication.anonymous.enabled", "--anonymous-auth"),
    ("authorization.mode", "--authorization-mode"),
];

/// How open the node API is to anonymous clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exposure {
    /// Anonymous requests are refused, or authorized by the apiserver.
    Guarded,
    /// Anonymous requests with `AlwaysAllow` come only from upstream's
    /// legacy flag defaults, so kubelet-rs serves on loopback instead of
    /// `0.0.0.0`.
    LoopbackOnly,
    /// Anonymous requests are allowed everything, as the operator chose:
    /// the flags and config fields that decided it, e.g.
    /// `--anonymous-auth=true` or `config field address: 0.0.0.0`.
    Open {
        /// What set `address`, `authentication.anonymous.enabled` and
        /// `authorization.mode`, in that order.
        by: Vec<String>,
    },
}

/// Where one setting's value came from, in words for the log.
fn origin(
    field: &str,
    flag: &str,
    settings: &BTreeMap<&'static str, SettingValue>,
    from_flags: &BTreeMap<&'static str, SettingValue>,
    config_file: bool,
) -> String {
    match (from_flags.get(field), settings.get(field)) {
        (Some(v), _) => format!("{flag}={v}"),
        (None, Some(v)) => format!("config field {field}: {v}"),
        (None, None) if config_file => format!("the config file's default {field}"),
        (None, None) => format!("the legacy default of {flag}"),
    }
}

/// Decides the exposure and the address both servers bind, from the
/// resolved `settings` (flag over file), the part of them given as flags,
/// whether a config file was given, and what anonymous and the
/// authorization mode resolved to.
pub(crate) fn decide(
    settings: &BTreeMap<&'static str, SettingValue>,
    from_flags: &BTreeMap<&'static str, SettingValue>,
    config_file: bool,
    anonymous: bool,
    always_allow: bool,
    address: IpAddr,
) -> (Exposure, IpAddr) {
    if !(anonymous && always_allow) {
        return (Exposure::Guarded, address);
    }
    let all_legacy = !config_file && FIELDS.iter().all(|(f, _)| !settings.contains_key(f));
    if all_legacy {
        return (Exposure::LoopbackOnly, IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let by = FIELDS
        .iter()
        .map(|(field, flag)| origin(field, flag, settings, from_flags, config_file))
        .collect();
    (Exposure::Open { by }, address)
}

#[cfg(test)]
mod tests {
    use crate::server::{AuthorizationMode, ServerConfig};
    use crate::{Flags, KubeletConfig};

    use super::Exposure;

    fn resolve(args: &[&str], file: Option<&str>) -> ServerConfig {
        let mut v = vec!["kubelet-rs"];
        v.extend_from_slice(args);
        let flags = Flags::parse_args(v).expect("flags");
        let file = file.map(|y| serde_saphyr::from_str(y).expect("yaml"));
        KubeletConfig::resolve(&flags, file.as_ref(), "node")
            .expect("resolves")
            .server
    }

    #[test]
    fn flags_alone_serve_loopback_only() {
        let s = resolve(&[], None);
        assert_eq!(s.exposure, Exposure::LoopbackOnly);
        assert_eq!(s.address.to_string(), "127.0.0.1");
        // The legacy defaults themselves are upstream's.
        assert!(s.authentication.anonymous_enabled);
        assert_eq!(s.authorization.mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(s.read_only_port, 10255);
    }

    #[test]
    fn an_explicit_choice_keeps_upstreams_address_and_names_what_opened_it() {
        let s = resolve(&["--anonymous-auth=true"], None);
        assert_eq!(s.address.to_string(), "0.0.0.0");
        assert_eq!(
            s.exposure,
            Exposure::Open {
                by: vec![
                    "the legacy default of --address".into(),
                    "--anonymous-auth=true".into(),
                    "the legacy default of --authorization-mode".into(),
                ]
            }
        );
        let s = resolve(&["--authorization-mode=AlwaysAllow"], None);
        assert_eq!(s.address.to_string(), "0.0.0.0");
        assert!(matches!(s.exposure, Exposure::Open { .. }));
        let s = resolve(&["--address=0.0.0.0"], None);
        assert_eq!(s.address.to_string(), "0.0.0.0");
        assert!(matches!(s.exposure, Exposure::Open { .. }));
    }

    #[test]
    fn a_config_file_keeps_upstreams_behaviour() {
        // v1beta1 defaults: anonymous off, Webhook.
        let s = resolve(&[], Some("kind: KubeletConfiguration\n"));
        assert_eq!(s.exposure, Exposure::Guarded);
        assert_eq!(s.address.to_string(), "0.0.0.0");
        // A file that opens it on purpose is named.
        let s = resolve(
            &[],
            Some(
                "kind: KubeletConfiguration\nauthentication: {anonymous: {enabled: true}}\n\
                 authorization: {mode: AlwaysAllow}\n",
            ),
        );
        assert_eq!(s.address.to_string(), "0.0.0.0");
        assert_eq!(
            s.exposure,
            Exposure::Open {
                by: vec![
                    "the config file's default address".into(),
                    "config field authentication.anonymous.enabled: true".into(),
                    "config field authorization.mode: AlwaysAllow".into(),
                ]
            }
        );
    }

    #[test]
    fn closing_either_setting_keeps_upstreams_address() {
        let s = resolve(&["--anonymous-auth=false"], None);
        assert_eq!(s.exposure, Exposure::Guarded);
        assert_eq!(s.address.to_string(), "0.0.0.0");
        let s = resolve(&["--authorization-mode=Webhook"], None);
        assert_eq!(s.exposure, Exposure::Guarded);
        assert_eq!(s.address.to_string(), "0.0.0.0");
    }
}
