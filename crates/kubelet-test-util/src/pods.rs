//! Pod builders for tests: a pod from JSON with a fresh UID, and the common
//! one-container pod.

use k8s_openapi::api::core::v1::Pod;

/// A pod from `json`; `metadata.uid` and `metadata.namespace` are filled in
/// when missing (a fresh UID, `default`).
pub fn from_json(json: serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(json).expect("pod JSON");
    if p.metadata.uid.is_none() {
        p.metadata.uid = Some(unique_uid());
    }
    if p.metadata.namespace.is_none() {
        p.metadata.namespace = Some("default".into());
    }
    p
}

/// A pod `name` with one container `c` running `image`, under `restart_policy`.
pub fn simple(name: &str, image: &str, restart_policy: &str) -> Pod {
    from_json(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [{"name": "c", "image": image}],
        },
    }))
}

/// A UID no other test uses.
pub fn unique_uid() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{:08x}-test-{:012x}", std::process::id(), n)
}
