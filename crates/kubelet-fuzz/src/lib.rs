//! Fuzz targets for every parser of outside bytes (issue 20, point 3: hostile
//! input never panics or hangs). Upstream fuzzes the same surfaces through
//! OSS-Fuzz (`kubernetes/test/fuzz`: YAML/JSON decoding, quantities); here
//! each target feeds raw bytes into the kubelet's real parsing functions and
//! then into what the kubelet computes from the result.
//!
//! A target panics only when it finds a bug: a panic in the parser, or a
//! broken invariant the target checks (a round trip, a bound). Hangs are the
//! fuzzer's timeout (`-timeout=2` under cargo-fuzz) or the stable runner's
//! deadline (`tests/corpus.rs`).
//!
//! Run on stable by `cargo test -p kubelet-fuzz` (seed corpus plus seeded
//! mutations) and on nightly by `hack/fuzz.sh` (cargo-fuzz, `fuzz/`).

mod api;
mod config;
mod streaming;
mod text;

pub use api::{docker_config, kubeconfig, manifest, watch_event};
pub use config::{credential_provider, flags, kubelet_config};
pub use streaming::{spdy_frames, websocket};
pub use text::{container_logs_query, cri_log, quantity};

/// A fuzz target: takes any bytes, panics only on a bug.
pub type Target = fn(&[u8]);

/// Every target by name (the name of its `fuzz/fuzz_targets/<name>.rs` and
/// of its seed corpus directory `corpus/<name>/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("manifest", manifest),
    ("kubelet_config", kubelet_config),
    ("flags", flags),
    ("kubeconfig", kubeconfig),
    ("watch_event", watch_event),
    ("quantity", quantity),
    ("cri_log", cri_log),
    ("spdy_frames", spdy_frames),
    ("websocket", websocket),
    ("container_logs_query", container_logs_query),
    ("docker_config", docker_config),
    ("credential_provider", credential_provider),
];

/// The bytes as text, lossily: most parsers take `&str`, and a lossy
/// conversion keeps every byte string meaningful to them.
fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}
