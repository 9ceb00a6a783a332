//! The docker keyring (upstream `pkg/credentialprovider/keyring.go`):
//! credentials indexed by registry location, scheme and a `/v1/` or `/v2/`
//! API path stripped, looked up by a normalized repository name. A location
//! matches when the port is the same, the host has as many dot-separated
//! labels each matching as a glob (`*.example.com`), and the location's path
//! is a prefix of the repository's. Locations are tried in reverse byte
//! order, so the more specific of overlapping paths comes first; Docker Hub
//! credentials (`index.docker.io`) also serve unqualified names.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::error;

use super::config::DockerConfig;

/// Credentials for a registry (upstream `credentialprovider.AuthConfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// base64 of `username:password`.
    pub auth: String,
    /// E-mail (not sent to the runtime).
    pub email: String,
    /// Registry the credentials are for.
    pub server_address: String,
    /// Token to obtain an access token with.
    pub identity_token: String,
    /// Bearer token for the registry.
    pub registry_token: String,
}

impl From<&AuthConfig> for cri::pb::AuthConfig {
    fn from(c: &AuthConfig) -> Self {
        Self {
            username: c.username.clone(),
            password: c.password.clone(),
            auth: c.auth.clone(),
            server_address: c.server_address.clone(),
            identity_token: c.identity_token.clone(),
            registry_token: c.registry_token.clone(),
        }
    }
}

/// Credentials for images (upstream `DockerKeyring`).
pub trait DockerKeyring: Send + Sync {
    /// Every credential that may serve `image` (a repository name without
    /// tag, as [`super::repo_to_pull`] gives), in the order to try them;
    /// empty when none matches.
    fn lookup(&self, image: &str) -> Vec<AuthConfig>;
}

/// A keyring of docker config documents (upstream `BasicDockerKeyring`).
#[derive(Clone, Debug, Default)]
pub struct BasicDockerKeyring {
    /// Locations, reverse-sorted, without duplicates.
    index: Vec<String>,
    creds: HashMap<String, Vec<AuthConfig>>,
}

/// The Docker Hub location credentials for unqualified names are kept under.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

impl BasicDockerKeyring {
    /// Adds every entry of `cfg`; entries whose location is no URL are
    /// skipped with an error logged, as upstream.
    pub fn add(&mut self, cfg: &DockerConfig) {
        for (loc, ident) in cfg {
            let value = if loc.starts_with("https://") || loc.starts_with("http://") {
                loc.clone()
            } else {
                format!("https://{loc}")
            };
            let Some(url) = SchemelessUrl::parse(&value) else {
                error!(entry = %loc, "Entry in dockercfg invalid, ignoring");
                continue;
            };
            // Docker treats /v1/ and /v2/ as the registry itself.
            let mut path = url.path;
            if path.starts_with("/v2/") || path.starts_with("/v1/") {
                path = &path[3..];
            }
            let key = if !path.is_empty() && path != "/" {
                format!("{}{path}", url.host)
            } else {
                url.host.to_string()
            };
            self.creds.entry(key.clone()).or_default().push(AuthConfig {
                username: ident.username.clone(),
                password: ident.password.clone(),
                email: ident.email.clone(),
                ..AuthConfig::default()
            });
            self.index.push(key);
        }
        self.index.sort_unstable_by(|a, b| b.cmp(a));
        self.index.dedup();
    }
}

impl DockerKeyring for BasicDockerKeyring {
    fn lookup(&self, image: &str) -> Vec<AuthConfig> {
        let ret: Vec<AuthConfig> = self
            .index
            .iter()
            .filter(|k| urls_match_str(k, image))
            .filter_map(|k| self.creds.get(k))
            .flatten()
            .cloned()
            .collect();
        if !ret.is_empty() {
            return ret;
        }
        if is_default_registry_match(image)
            && let Some(hub) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            return hub.clone();
        }
        Vec::new()
    }
}

/// Several keyrings, each one's matches in turn (upstream `UnionDockerKeyring`).
#[derive(Clone, Default)]
pub struct UnionDockerKeyring(pub Vec<Arc<dyn DockerKeyring>>);

impl DockerKeyring for UnionDockerKeyring {
    fn lookup(&self, image: &str) -> Vec<AuthConfig> {
        self.0.iter().flat_map(|k| k.lookup(image)).collect()
    }
}

/// Whether `image` is pulled from Docker Hub, judged by its name (upstream
/// `isDefaultRegistryMatch`): a first component without `.` or `:` is a
/// user name, not a registry.
pub fn is_default_registry_match(image: &str) -> bool {
    let (first, rest) = match image.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (image, None),
    };
    if first.is_empty() {
        return false;
    }
    if rest.is_none() || first == "docker.io" || first == "index.docker.io" {
        return true;
    }
    !first.contains(['.', ':'])
}

/// A URL's host (with port) and path; Go's `url.Parse` for what registry
/// locations hold.
struct SchemelessUrl<'a> {
    host: &'a str,
    path: &'a str,
}

impl<'a> SchemelessUrl<'a> {
    /// Parses `scheme://[userinfo@]host[:port][/path][?query][#fragment]`.
    fn parse(url: &'a str) -> Option<Self> {
        let (_, rest) = url.split_once("://")?;
        let rest = rest.split(['?', '#']).next().unwrap_or("");
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        valid_host(host).then_some(Self { host, path })
    }

    /// Host labels and port (upstream `SplitURL`: `net.SplitHostPort`, the
    /// whole host without a port when that fails).
    fn split(&self) -> (Vec<&'a str>, &'a str) {
        let (host, port) = split_host_port(self.host).unwrap_or((self.host, ""));
        (host.split('.').collect(), port)
    }
}

/// Go's `net.SplitHostPort`, `None` where it fails.
fn split_host_port(hostport: &str) -> Option<(&str, &str)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        return (!port.contains([':', '[', ']'])).then_some((host, port));
    }
    let (host, port) = hostport.rsplit_once(':')?;
    (!host.contains([':', '[', ']'])).then_some((host, port))
}

/// What Go's URL parser accepts in a host: no spaces or controls, a numeric port.
fn valid_host(host: &str) -> bool {
    let chars_ok = host.chars().all(|c| {
        !c.is_ascii() || c.is_ascii_alphanumeric() || "-_.~!$&'()*+,;=:[]<>\"%".contains(c)
    });
    let port_ok = match host.rfind(':') {
        Some(i) if !host[i..].contains(']') => host[i + 1..].bytes().all(|b| b.is_ascii_digit()),
        _ => true,
    };
    chars_ok && port_ok
}

/// Why `location` (no scheme) is no URL, in Go's `url.Parse` words (upstream
/// `ParseSchemelessURL`, used to validate a credential provider's
/// `matchImages`); `None` when it parses.
pub fn schemeless_url_error(location: &str) -> Option<String> {
    let url = format!("https://{location}");
    if SchemelessUrl::parse(&url).is_some() {
        return None;
    }
    let rest = url["https://".len()..]
        .split(['?', '#'])
        .next()
        .unwrap_or("");
    let authority = rest.split('/').next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let why = match host.chars().find(|c| {
        c.is_ascii() && !c.is_ascii_alphanumeric() && !"-_.~!$&'()*+,;=:[]<>\"%".contains(*c)
    }) {
        Some(c) => format!("invalid character {:?} in host name", c.to_string()),
        None => {
            let port = host.rfind(':').map_or("", |i| &host[i..]);
            format!("invalid port {port:?} after host")
        }
    };
    Some(format!("parse {url:?}: {why}"))
}

/// Whether registry location `glob` (labels may be globs) serves `target`,
/// both without scheme (upstream `URLsMatchStr`).
pub fn urls_match_str(glob: &str, target: &str) -> bool {
    let (glob, target) = (format!("https://{glob}"), format!("https://{target}"));
    let (Some(g), Some(t)) = (SchemelessUrl::parse(&glob), SchemelessUrl::parse(&target)) else {
        return false;
    };
    let ((g_parts, g_port), (t_parts, t_port)) = (g.split(), t.split());
    g_port == t_port
        && g_parts.len() == t_parts.len()
        && t.path.starts_with(g.path)
        && g_parts
            .iter()
            .zip(&t_parts)
            .all(|(p, n)| glob_match(p.as_bytes(), n.as_bytes()) == Some(true))
}

/// Go's `path/filepath.Match` on one label: `*`, `?`, `[...]` classes with
/// `^` negation and ranges, `\` escapes. `None` for a malformed pattern.
///
/// As Go does, the pattern is cut into chunks, each after a run of stars,
/// and each chunk is taken at its leftmost match (chunks have a fixed width,
/// so that is never wrong; only the last chunk must end the name): the cost
/// is the pattern's length times the name's. Backtracking over every star
/// is exponential in the stars: a 142-byte image and pattern found by the
/// `docker_config` fuzz target ran for seven minutes.
fn glob_match(mut pattern: &[u8], mut name: &[u8]) -> Option<bool> {
    'chunks: while !pattern.is_empty() {
        let star = pattern[0] == b'*';
        while let Some((b'*', rest)) = pattern.split_first() {
            pattern = rest;
        }
        let (chunk, rest) = pattern.split_at(chunk_end(pattern));
        pattern = rest;
        if star && chunk.is_empty() {
            // A trailing star takes the rest of the label.
            return Some(!name.contains(&b'/'));
        }
        if let Some(t) = match_chunk(chunk, name)?
            && (t.is_empty() || !pattern.is_empty())
        {
            name = t;
            continue;
        }
        if star {
            let mut i = 0;
            while i < name.len() && name[i] != b'/' {
                if let Some(t) = match_chunk(chunk, &name[i + 1..])? {
                    // The last chunk must end the name: look further on.
                    if pattern.is_empty() && !t.is_empty() {
                        i += 1;
                        continue;
                    }
                    name = t;
                    continue 'chunks;
                }
                i += 1;
            }
        }
        check_pattern(pattern)?;
        return Some(false);
    }
    Some(name.is_empty())
}

/// Where the chunk at the start of `pattern` ends: at the first star that
/// is neither escaped nor inside a class (Go's `scanChunk`).
fn chunk_end(pattern: &[u8]) -> usize {
    let mut in_class = false;
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'\\' if i + 1 < pattern.len() => i += 1,
            b'[' => in_class = true,
            b']' => in_class = false,
            b'*' if !in_class => break,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Matches one chunk (no stars) against the start of `s`: the rest of `s`
/// when it matched, `None` inside when it did not, `None` outside for a
/// malformed chunk (checked also past a mismatch, as Go's `matchChunk`).
fn match_chunk<'a>(mut chunk: &[u8], mut s: &'a [u8]) -> Option<Option<&'a [u8]>> {
    let mut failed = false;
    while let Some((&c, rest)) = chunk.split_first() {
        failed |= s.is_empty();
        let next = if failed { None } else { s.first().copied() };
        let (hit, after) = match c {
            b'[' => match_class(rest, next)?,
            b'?' => (next.is_some_and(|n| n != b'/'), rest),
            b'\\' => {
                let (&e, after) = rest.split_first()?;
                (next == Some(e), after)
            }
            _ => (next == Some(c), rest),
        };
        if !failed {
            s = &s[1..];
            failed = !hit;
        }
        chunk = after;
    }
    Some((!failed).then_some(s))
}

/// A pattern's remaining classes and escapes are well formed.
fn check_pattern(mut p: &[u8]) -> Option<()> {
    while let Some((c, rest)) = p.split_first() {
        p = match c {
            b'[' => match_class(rest, None)?.1,
            b'\\' => rest.split_first()?.1,
            _ => rest,
        };
    }
    Some(())
}

/// Matches `c` against the class after `[`; returns whether it matched and
/// the pattern after `]`. With no `c`, only checks the class is well formed.
fn match_class(p: &[u8], c: Option<u8>) -> Option<(bool, &[u8])> {
    let (negated, mut p) = match p.split_first() {
        Some((b'^', rest)) => (true, rest),
        _ => (false, p),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        if let Some((b']', rest)) = p.split_first()
            && !first
        {
            let hit = c.is_some_and(|c| c != b'/' && matched != negated);
            return Some((hit, rest));
        }
        first = false;
        let (lo, rest) = class_char(p)?;
        let (hi, rest) = match rest.split_first() {
            Some((b'-', r)) => class_char(r)?,
            _ => (lo, rest),
        };
        if hi < lo {
            return None;
        }
        if c.is_some_and(|c| lo <= c && c <= hi) {
            matched = true;
        }
        p = rest;
    }
}

fn class_char(p: &[u8]) -> Option<(u8, &[u8])> {
    match p.split_first()? {
        (b'-' | b']', _) => None,
        (b'\\', rest) => rest.split_first().map(|(c, r)| (*c, r)),
        (c, rest) => Some((*c, rest)),
    }
}

#[cfg(test)]
#[path = "keyring_tests.rs"]
mod tests;
