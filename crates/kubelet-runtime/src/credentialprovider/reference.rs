//! The repository an image reference pulls from, normalized as Docker does
//! (upstream `pkg/util/parsers.ParseImageName`, which is
//! `reference.ParseNormalizedNamed(image).Name()` of distribution): no
//! registry means `docker.io`, a Docker Hub name without a user gets
//! `library/`, and the tag and digest are dropped. Keyring lookups use it.

/// Why an image reference is invalid (distribution's messages).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// Does not follow the reference grammar.
    #[error("invalid reference format")]
    Format,
    /// The repository path has capitals.
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    Uppercase(String),
    /// A bare image ID, which cannot be pulled.
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    HexId(String),
    /// Longer than 255 characters.
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
}

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";

/// `image`'s repository: `busybox:1.35` is `docker.io/library/busybox`,
/// `localhost:5001/private/busybox@sha256:…` is `localhost:5001/private/busybox`.
pub fn repo_to_pull(image: &str) -> Result<String, ReferenceError> {
    if image.len() == 64
        && image
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(ReferenceError::HexId(image.to_string()));
    }
    let (domain, remainder) = split_docker_domain(image);
    let remote = remainder.split(':').next().unwrap_or("");
    if remote.to_lowercase() != remote {
        return Err(ReferenceError::Uppercase(remote.to_string()));
    }
    // Name, then an optional `:tag`, then an optional `@digest`.
    let (named, digest) = match remainder.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (remainder.as_str(), None),
    };
    let (path, tag) = match named.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, Some(t)),
        _ => (named, None),
    };
    let valid = valid_domain(&domain)
        && path.split('/').all(valid_path_component)
        && tag.is_none_or(valid_tag)
        && digest.is_none_or(valid_digest);
    if !valid {
        return Err(ReferenceError::Format);
    }
    let name = format!("{domain}/{path}");
    if name.len() > 255 {
        return Err(ReferenceError::NameTooLong);
    }
    Ok(name)
}

/// distribution's `splitDockerDomain`.
fn split_docker_domain(name: &str) -> (String, String) {
    let (mut domain, mut remainder) = match name.split_once('/') {
        Some((d, r)) if d.contains(['.', ':']) || d == "localhost" || d.to_lowercase() != d => {
            (d.to_string(), r.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    if domain == LEGACY_DEFAULT_DOMAIN {
        domain = DEFAULT_DOMAIN.to_string();
    }
    if domain == DEFAULT_DOMAIN && !remainder.contains('/') {
        remainder = format!("library/{remainder}");
    }
    (domain, remainder)
}

fn alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let mut i = 0;
    let mut first = true;
    while i < b.len() {
        if !first {
            let sep_start = i;
            while i < b.len() && !alnum_lower(b[i]) {
                i += 1;
            }
            let sep = &c[sep_start..i];
            let ok = matches!(sep, "." | "_" | "__")
                || (!sep.is_empty() && sep.bytes().all(|x| x == b'-'));
            if !ok {
                return false;
            }
        }
        let start = i;
        while i < b.len() && alnum_lower(b[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        first = false;
    }
    !first
}

/// Dot-separated host labels (alphanumerics, inner `-`) or a bracketed IPv6
/// address, then an optional numeric port.
fn valid_domain(d: &str) -> bool {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return false;
        };
        if ip.is_empty()
            || !ip
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        match after {
            "" => return true,
            a => ("", a.strip_prefix(':')),
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (d, None),
        }
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let host_ok = d.starts_with('[')
        || host.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        });
    port_ok && host_ok
}

/// `[\w][\w.-]{0,127}`
fn valid_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b[1..].iter().all(|&c| word(c) || c == b'.' || c == b'-')
}

/// `algorithm:hex` with at least 32 hex digits.
fn valid_digest(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let alg_ok = alg.split(['-', '_', '+', '.']).all(|c| {
        let b = c.as_bytes();
        !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
    });
    alg_ok && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_as_docker() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for (image, want) in [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.35", "docker.io/library/busybox"),
            ("user/app:v1", "docker.io/user/app"),
            ("docker.io/busybox", "docker.io/library/busybox"),
            ("index.docker.io/user/app", "docker.io/user/app"),
            ("localhost/app", "localhost/app"),
            (
                "localhost:5001/private/busybox:1.35",
                "localhost:5001/private/busybox",
            ),
            (
                "127.0.0.1:5001/private/busybox",
                "127.0.0.1:5001/private/busybox",
            ),
            ("quay.io/coreos/etcd:v3.5.0-0", "quay.io/coreos/etcd"),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause"),
            ("[::1]:5000/app:1", "[::1]:5000/app"),
            (
                "a-b.example.com/x__y/z.w/v--u",
                "a-b.example.com/x__y/z.w/v--u",
            ),
        ] {
            assert_eq!(repo_to_pull(image).as_deref(), Ok(want), "{image}");
        }
        assert_eq!(
            repo_to_pull(&format!("reg.io/app@{digest}")).as_deref(),
            Ok("reg.io/app")
        );
        assert_eq!(
            repo_to_pull(&format!("reg.io/app:1@{digest}")).as_deref(),
            Ok("reg.io/app")
        );
    }

    #[test]
    fn rejects_what_docker_rejects() {
        assert_eq!(
            repo_to_pull("Busybox"),
            Err(ReferenceError::Uppercase("library/Busybox".into()))
        );
        assert!(matches!(
            repo_to_pull(&"a".repeat(64)),
            Err(ReferenceError::HexId(_))
        ));
        for bad in [
            "reg.io/app:",
            "reg.io//app",
            "reg.io/-app",
            "reg.io/app@sha256:xyz",
            "reg.io/app:-tag",
            "reg.io:port/app",
            "-reg.io/app",
            "reg.io/a..b",
        ] {
            assert_eq!(repo_to_pull(bad), Err(ReferenceError::Format), "{bad}");
        }
        assert_eq!(
            repo_to_pull(&format!("reg.io/{}", "a".repeat(250))),
            Err(ReferenceError::NameTooLong)
        );
    }
}
