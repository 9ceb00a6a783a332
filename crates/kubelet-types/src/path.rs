//! Go's `filepath.Clean` and `filepath.Join`, for paths upstream builds
//! with them (ConfigMap and downward API item paths, the atomic writer's
//! payload, seccomp profiles under `<root-dir>/seccomp`), so that kubelet-rs
//! names the same files.

/// Go's `filepath.Clean`: one separator between elements, no `.` elements,
/// `..` popping the element before it (never above `/`), `.` for nothing.
pub fn clean(p: &str) -> String {
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." if rooted && parts.is_empty() => {}
            ".." if parts.last().is_some_and(|l| *l != "..") => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// Go's `filepath.Join(base, name)`: `name` appended whatever it starts
/// with, then cleaned (so `..` in `name` climbs out of `base`).
pub fn join(base: &str, name: &str) -> String {
    clean(&format!("{base}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_go() {
        assert_eq!(clean("./a//b/"), "a/b");
        assert_eq!(clean("a/../b"), "b");
        assert_eq!(clean("../a"), "../a");
        assert_eq!(clean("/../a"), "/a");
        assert_eq!(clean(""), ".");
        assert_eq!(
            join("/var/lib/kubelet/seccomp", "/abs/p.json"),
            "/var/lib/kubelet/seccomp/abs/p.json"
        );
        assert_eq!(join("/var/lib/kubelet/seccomp", "../../../x"), "/var/x");
        assert_eq!(join("root", "a"), "root/a");
    }
}
