//! Container hashes, bit for bit as upstream 1.31+ computes them
//! (`pkg/kubelet/container/helpers.go` `HashContainer`, `pkg/util/hash`
//! `DeepHashObject`), plus the versioning kubelet-rs keeps beside them.
//!
//! Upstream 1.31+ hashes only what must restart a container when it changes,
//! the name and the image: it JSON-encodes `{"image": …, "name": …}` (a Go
//! map, so keys sorted), prints the bytes with go-spew's `%#v` formatter
//! (`([]uint8)[123 34 …]`: the type, then each byte in decimal) and feeds that
//! text to FNV-32a; the annotation is the value in lowercase hex, unpadded.
//!
//! kubelet-rs writes the same `io.kubernetes.container.hash`, and its own
//! [`HASH_VERSION_ANNOTATION`] beside it. A running container whose hash was
//! computed another way is compared with the algorithm that made it, or, when
//! that algorithm covered fields whose change no longer restarts anything,
//! adopted as it is: an upgrade never restarts a container by itself.

use k8s_openapi::api::core::v1::Container;
use sha2::{Digest, Sha256};

/// Container annotation (kubelet-rs' own): which algorithm made the hash.
pub const HASH_VERSION_ANNOTATION: &str = "io.kubelet-rs.container.hashVersion";
/// The algorithm this build writes: upstream 1.31+ (name and image, FNV-32a).
pub const HASH_VERSION: &str = "1";

const FNV32_OFFSET: u32 = 0x811c_9dc5;
const FNV32_PRIME: u32 = 0x0100_0193;

/// FNV-32a over text written in pieces (upstream `fnv.New32a`).
struct Fnv32a(u32);

impl Fnv32a {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u32::from(*b)).wrapping_mul(FNV32_PRIME);
        }
    }
}

/// Upstream `DeepHashObject(fnv.New32a(), bytes)` for a `[]byte`: FNV-32a of
/// go-spew's `%#v` rendering, `([]uint8)[b0 b1 …]` with decimal bytes.
pub fn deep_hash_bytes(bytes: &[u8]) -> u32 {
    let mut h = Fnv32a(FNV32_OFFSET);
    h.write(b"([]uint8)[");
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            h.write(b" ");
        }
        h.write(b.to_string().as_bytes());
    }
    h.write(b"]");
    h.0
}

/// Appends `s` as a JSON string the way Go's `encoding/json` writes it:
/// `<`, `>` and `&` escaped for HTML, U+2028/U+2029 escaped, short escapes
/// for `\b \f \n \r \t`, `\u00XX` for other control bytes.
fn go_json_string(s: &str, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(ch)));
            }
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The bytes upstream 1.31+ hashes: `json.Marshal(map[string]string{"name", "image"})`.
fn fields_to_hash(c: &Container) -> String {
    let mut out = String::from("{\"image\":");
    go_json_string(c.image.as_deref().unwrap_or(""), &mut out);
    out.push_str(",\"name\":");
    go_json_string(&c.name, &mut out);
    out.push('}');
    out
}

/// Upstream 1.31+ `HashContainer`.
pub fn hash_container(c: &Container) -> u64 {
    u64::from(deep_hash_bytes(fields_to_hash(c).as_bytes()))
}

/// The `io.kubernetes.container.hash` annotation value (`strconv.FormatUint(h, 16)`).
pub fn container_hash(c: &Container) -> String {
    format!("{:x}", hash_container(c))
}

/// What kubelet-rs before hash versions wrote: the first 8 bytes of the
/// SHA-256 of the whole container's JSON, as 16 hex digits.
fn unversioned_kubelet_rs_hash(c: &Container) -> String {
    let json = serde_json::to_vec(c).unwrap_or_default();
    Sha256::digest(&json)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How the hash on a running container compares with the desired spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashCheck {
    /// Same algorithm, same value: nothing that restarts a container changed.
    Same,
    /// Same algorithm, another value: the container must be replaced.
    Changed,
    /// The hash was made by an algorithm whose value cannot tell a change that
    /// restarts from one that does not (an older kubelet-rs, or a version
    /// this build does not know): the container is adopted as it runs.
    Adopted,
}

/// Compares the hash recorded on a running container (and kubelet-rs'
/// version annotation, if any) with the desired spec `c`.
///
/// - version [`HASH_VERSION`], or no version and an upstream-style hash (at
///   most 8 hex digits, as upstream 1.31+ writes): compared with
///   [`container_hash`] by value;
/// - no version and 16 hex digits (kubelet-rs before versions, whole-spec
///   SHA-256): the same value means the same spec; another value is adopted,
///   since a new API default changes it too;
/// - any other version: adopted.
pub fn check(c: &Container, recorded: &str, version: Option<&str>) -> HashCheck {
    let same_value = |want: u64| u64::from_str_radix(recorded, 16).ok() == Some(want);
    match version {
        Some(HASH_VERSION) => {
            if same_value(hash_container(c)) {
                HashCheck::Same
            } else {
                HashCheck::Changed
            }
        }
        Some(_) => HashCheck::Adopted,
        None if recorded.len() == 16 => {
            if recorded == unversioned_kubelet_rs_hash(c) {
                HashCheck::Same
            } else {
                HashCheck::Adopted
            }
        }
        None => {
            if same_value(hash_container(c)) {
                HashCheck::Same
            } else {
                HashCheck::Changed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, image: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(image.into()),
            ..Default::default()
        }
    }

    /// Upstream's own vector (`TestHashContainer`, pre-1.31 whole-container
    /// hash): the JSON Go's `json.Marshal` gives for that container, through
    /// `DeepHashObject` into FNV-32a, is 0x3c42280f.
    #[test]
    fn upstream_deep_hash_vector() {
        let go_json = br#"{"name":"test_container","image":"foo/image:v1","args":["/bin/sh","-c","echo abc"],"ports":[{"containerPort":8001}],"resources":{}}"#;
        assert_eq!(deep_hash_bytes(go_json), 0x3c42_280f);
    }

    #[test]
    fn hash_is_upstream_1_31_name_and_image() {
        // Values computed independently from the same encoding.
        assert_eq!(container_hash(&container("app", "busybox:1.36")), "395745");
        assert_eq!(container_hash(&container("c", "reg/busybox:1")), "35b9bd23");
        // Go escapes <, > and & in JSON strings.
        assert_eq!(container_hash(&container("x", "a<b&")), "874e3d86");
        // Only name and image count.
        let mut c = container("app", "busybox:1.36");
        c.command = Some(vec!["sleep".into()]);
        c.termination_message_path = Some("/dev/termination-log".into());
        assert_eq!(container_hash(&c), "395745");
        assert_ne!(container_hash(&container("app", "busybox:1.37")), "395745");
    }

    #[test]
    fn recorded_hashes_are_compared_by_the_algorithm_that_made_them() {
        let c = container("app", "busybox:1.36");
        let newer = container("app", "busybox:1.37");
        // This build's own hashes.
        assert_eq!(check(&c, "395745", Some(HASH_VERSION)), HashCheck::Same);
        assert_eq!(
            check(&newer, "395745", Some(HASH_VERSION)),
            HashCheck::Changed
        );
        // Upstream 1.31+ writes no version: same algorithm.
        assert_eq!(check(&c, "395745", None), HashCheck::Same);
        assert_eq!(check(&newer, "395745", None), HashCheck::Changed);
        // Leading zeros do not matter (upstream parses the hex).
        assert_eq!(check(&c, "00395745", None), HashCheck::Same);
        // kubelet-rs before versions: whole-spec SHA-256.
        let old = unversioned_kubelet_rs_hash(&c);
        assert_eq!(old.len(), 16);
        assert_eq!(check(&c, &old, None), HashCheck::Same);
        let mut defaulted = c.clone();
        defaulted.termination_message_policy = Some("File".into());
        assert_eq!(check(&defaulted, &old, None), HashCheck::Adopted);
        // A version this build does not know.
        assert_eq!(check(&c, "abc", Some("7")), HashCheck::Adopted);
    }
}
