//! Small text formats: resource quantities (upstream
//! `apimachinery/pkg/api/resource` `ParseQuantity`), CRI log lines
//! (`pkg/kubelet/kuberuntime/logs` `parseCRILog`) and the query parameters
//! of `/containerLogs`, `/exec`, `/attach` and `/portForward`
//! (`pkg/kubelet/server`).

use kubelet_runtime::logs::parse_cri_line;
use kubelet_server::logs::decode_query;
use kubelet_server::streaming::StreamOptions;
use kubelet_server::streaming::options::ports_from_query;
use kubelet_types::quantity::{Quantity, parse_bytes, parse_milli_cpu};

/// A quantity as written in a pod spec or a flag (`500m`, `1Gi`, `1e3`).
///
/// Invariant: a parsed quantity formats to its canonical text, which parses
/// back to the same value; formatted again it is the same text (or, for a
/// binary-SI amount printed without a suffix, the decimal-SI text, which is
/// then stable).
pub fn quantity(data: &[u8]) {
    let s = super::text(data);
    let _ = parse_milli_cpu(&s);
    let _ = parse_bytes(&s);
    let Ok(q) = Quantity::parse(&s) else { return };
    let _ = (q.value(), q.milli_value(), q.round_up_milli(), q.signum());
    let canonical = q.to_string();
    let again = match Quantity::parse(&canonical) {
        Ok(again) => again,
        Err(e) => panic!("{s:?} formats to {canonical:?}, which does not parse: {e}"),
    };
    assert_eq!(
        again.as_nanos(),
        q.as_nanos(),
        "{s:?} -> {canonical:?} changes the value"
    );
    // As upstream: a binary-SI amount that is no multiple of 1024 prints
    // without a suffix ("62.5Ki" is "64000"), which parses back as decimal
    // SI and prints as such ("64k"); from there on the text is stable.
    let second = again.to_string();
    if second != canonical {
        assert!(
            canonical
                .trim_start_matches('-')
                .bytes()
                .all(|b| b.is_ascii_digit()),
            "{s:?}: canonical form {canonical:?} changes to {second:?}"
        );
        let third = Quantity::parse(&second)
            .unwrap_or_else(|e| panic!("{s:?}: {second:?} does not parse: {e}"));
        assert_eq!(
            third.as_nanos(),
            q.as_nanos(),
            "{s:?} -> {second:?} changes the value"
        );
        assert_eq!(third.to_string(), second, "{s:?}: canonical form unstable");
    }
    let _ = q.saturating_add(again).saturating_sub(q);
}

/// Lines of a container log file as the runtime writes them
/// (`<time> <stream> <tag> <message>`), one per `\n`.
///
/// Invariant: the content of a parsed line is a suffix of the line.
pub fn cri_log(data: &[u8]) {
    for line in data.split_inclusive(|&b| b == b'\n') {
        if let Ok(l) = parse_cri_line(line) {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            assert!(
                line.ends_with(l.content) || body.ends_with(l.content),
                "content is not the end of the line"
            );
        }
    }
}

/// A request's query string, as `/containerLogs` (upstream's
/// `PodLogOptions` parameter codec) and the streaming endpoints decode it.
pub fn container_logs_query(data: &[u8]) {
    let s = super::text(data);
    for q in [Some(s.as_ref()), None] {
        let _ = decode_query(q);
        let _ = StreamOptions::from_query(q);
        if let Ok(ports) = ports_from_query(q, true) {
            assert!(ports.iter().all(|p| (1..=65535).contains(p)), "{ports:?}");
        }
        let _ = ports_from_query(q, false);
    }
}
