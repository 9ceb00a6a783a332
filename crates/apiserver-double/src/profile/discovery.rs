//! What each release serves, and its discovery documents: `/version`
//! (`staging/src/k8s.io/apimachinery/pkg/version/types.go`), `/api`,
//! `/api/v1`, `/apis`, `/apis/<group>` and `/apis/<group>/<version>`
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/discovery`).
//!
//! The table lists only what the double implements, each entry with the
//! releases that serve it; a group/version or subresource outside it gets
//! the profile's 404 ([`super::Profile::path_not_found`]). Sources, as read
//! for `docs/apiserver-versions.md` §2:
//! - 1.19: `pkg/master/master.go` `DefaultAPIResourceConfigSource` and
//!   `pkg/registry/core/rest/storage_core.go` (v1.19.10);
//! - 1.35: `pkg/controlplane/instance.go`
//!   `stableAPIGroupVersionsEnabledByDefault` (newest stored copy) and the
//!   1.35 values of `pkg/features/kube_features.go`'s versioned gates.

use http::StatusCode;
use serde_json::{Value, json};

use super::Profile;
use crate::rest::{Body, respond};

/// One served resource or subresource.
struct Served {
    /// `v1` or `group/version`.
    gv: &'static str,
    /// `pods` or `pods/status`.
    name: &'static str,
    kind: &'static str,
    namespaced: bool,
    verbs: &'static [&'static str],
    /// First minor release that serves it.
    from: u32,
    /// First minor release that no longer serves it.
    until: u32,
}

const CRUD: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const SUB: &[&str] = &["get", "patch", "update"];
const CREATE: &[&str] = &["create"];
const ALWAYS: u32 = 1000;

macro_rules! served {
    ($gv:expr, $name:expr, $kind:expr, $ns:expr, $verbs:expr) => {
        served!($gv, $name, $kind, $ns, $verbs, 0, ALWAYS)
    };
    ($gv:expr, $name:expr, $kind:expr, $ns:expr, $verbs:expr, $from:expr, $until:expr) => {
        Served {
            gv: $gv,
            name: $name,
            kind: $kind,
            namespaced: $ns,
            verbs: $verbs,
            from: $from,
            until: $until,
        }
    };
}

const TABLE: &[Served] = &[
    served!("v1", "configmaps", "ConfigMap", true, CRUD),
    served!("v1", "events", "Event", true, CRUD),
    served!("v1", "namespaces", "Namespace", false, CRUD),
    served!("v1", "namespaces/status", "Namespace", false, SUB),
    served!("v1", "nodes", "Node", false, CRUD),
    served!("v1", "nodes/status", "Node", false, SUB),
    served!(
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        CRUD
    ),
    served!(
        "v1",
        "persistentvolumeclaims/status",
        "PersistentVolumeClaim",
        true,
        SUB
    ),
    served!("v1", "persistentvolumes", "PersistentVolume", false, CRUD),
    served!(
        "v1",
        "persistentvolumes/status",
        "PersistentVolume",
        false,
        SUB
    ),
    served!("v1", "pods", "Pod", true, CRUD),
    served!("v1", "pods/status", "Pod", true, SUB),
    // `EphemeralContainers`: alpha (off) in 1.19, beta (on) 1.23, GA 1.25
    // (storage_core.go registers the subresource only with the gate on).
    served!(
        "v1",
        "pods/ephemeralcontainers",
        "Pod",
        true,
        SUB,
        23,
        ALWAYS
    ),
    // `pods/resize` (`InPlacePodVerticalScaling`, beta on 1.33, GA 1.35) is
    // left out: the double has no resize strategy.
    served!("v1", "secrets", "Secret", true, CRUD),
    served!("v1", "serviceaccounts", "ServiceAccount", true, CRUD),
    // 1.19 registers `token` only with `--service-account-issuer` and a
    // signing key, which kubeadm passes from 1.20 (CHANGELOG-1.20, #93258);
    // TokenRequest is GA and the flags required from 1.20.
    served!(
        "v1",
        "serviceaccounts/token",
        "TokenRequest",
        true,
        CREATE,
        20,
        ALWAYS
    ),
    served!("v1", "services", "Service", true, CRUD),
    served!("v1", "services/status", "Service", true, SUB),
    served!(
        "authentication.k8s.io/v1",
        "tokenreviews",
        "TokenReview",
        false,
        CREATE
    ),
    served!(
        "authorization.k8s.io/v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
        CREATE
    ),
    // certificates.k8s.io/v1 is GA in 1.19.
    served!(
        "certificates.k8s.io/v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        false,
        CRUD
    ),
    served!(
        "certificates.k8s.io/v1",
        "certificatesigningrequests/approval",
        "CertificateSigningRequest",
        false,
        SUB
    ),
    served!(
        "certificates.k8s.io/v1",
        "certificatesigningrequests/status",
        "CertificateSigningRequest",
        false,
        SUB
    ),
    served!("coordination.k8s.io/v1", "leases", "Lease", true, CRUD),
    // RuntimeClass: v1 GA in 1.20 (CHANGELOG-1.20); v1beta1 from 1.14 until
    // its removal in 1.25.
    served!(
        "node.k8s.io/v1",
        "runtimeclasses",
        "RuntimeClass",
        false,
        CRUD,
        20,
        ALWAYS
    ),
    served!(
        "node.k8s.io/v1beta1",
        "runtimeclasses",
        "RuntimeClass",
        false,
        CRUD,
        0,
        25
    ),
    // storage.k8s.io: v1 of CSINode (GA 1.17), CSIDriver (GA 1.18),
    // StorageClass and VolumeAttachment (1.13) in both releases;
    // CSIStorageCapacity v1 from 1.24, VolumeAttributesClass v1 from 1.34.
    // The v1beta1 forms of the first four were removed in 1.22
    // (CHANGELOG-1.22); 1.19 serves both versions, v1 preferred.
    served!("storage.k8s.io/v1", "csidrivers", "CSIDriver", false, CRUD),
    served!("storage.k8s.io/v1", "csinodes", "CSINode", false, CRUD),
    served!(
        "storage.k8s.io/v1",
        "csistoragecapacities",
        "CSIStorageCapacity",
        true,
        CRUD,
        24,
        ALWAYS
    ),
    served!(
        "storage.k8s.io/v1",
        "storageclasses",
        "StorageClass",
        false,
        CRUD
    ),
    served!(
        "storage.k8s.io/v1",
        "volumeattachments",
        "VolumeAttachment",
        false,
        CRUD
    ),
    served!(
        "storage.k8s.io/v1",
        "volumeattachments/status",
        "VolumeAttachment",
        false,
        SUB
    ),
    served!(
        "storage.k8s.io/v1",
        "volumeattributesclasses",
        "VolumeAttributesClass",
        false,
        CRUD,
        34,
        ALWAYS
    ),
    served!(
        "storage.k8s.io/v1beta1",
        "csidrivers",
        "CSIDriver",
        false,
        CRUD,
        0,
        22
    ),
    served!(
        "storage.k8s.io/v1beta1",
        "csinodes",
        "CSINode",
        false,
        CRUD,
        0,
        22
    ),
    served!(
        "storage.k8s.io/v1beta1",
        "storageclasses",
        "StorageClass",
        false,
        CRUD,
        0,
        22
    ),
    served!(
        "storage.k8s.io/v1beta1",
        "volumeattachments",
        "VolumeAttachment",
        false,
        CRUD,
        0,
        22
    ),
    served!(
        "storage.k8s.io/v1beta1",
        "volumeattachments/status",
        "VolumeAttachment",
        false,
        SUB,
        0,
        22
    ),
];

fn in_profile(s: &Served, p: Profile) -> bool {
    (s.from..s.until).contains(&p.minor())
}

/// Whether `p` serves `resource[/sub]` in `gv`.
pub fn serves(p: Profile, gv: &str, resource: &str, sub: &str) -> bool {
    TABLE.iter().filter(|s| in_profile(s, p)).any(|s| {
        s.gv == gv
            && match s.name.split_once('/') {
                Some((r, s)) => r == resource && s == sub,
                None => s.name == resource && sub.is_empty(),
            }
    })
}

/// The group/versions `p` serves, in table order, without duplicates.
pub fn group_versions(p: Profile) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for s in TABLE.iter().filter(|s| in_profile(s, p)) {
        if !out.contains(&s.gv) {
            out.push(s.gv);
        }
    }
    out
}

/// `/version` (`version.Info`). 1.35 adds the compatibility-version fields
/// (`emulationMajor`/`Minor`, `minCompatibilityMajor`/`Minor`, omitempty).
pub fn version(p: Profile) -> Value {
    let mut v = json!({
        "major": "1",
        "minor": p.minor().to_string(),
        "gitVersion": p.git_version(),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-12-17T00:00:00Z",
        "goVersion": if p.at_least(35) { "go1.25.5" } else { "go1.15.15" },
        "compiler": "gc",
        "platform": "linux/amd64",
    });
    if p.at_least(33) {
        v["emulationMajor"] = json!("1");
        v["emulationMinor"] = json!(p.minor().to_string());
        v["minCompatibilityMajor"] = json!("1");
        v["minCompatibilityMinor"] = json!((p.minor() - 1).to_string());
    }
    v
}

fn resource_list(p: Profile, gv: &str) -> Value {
    let resources: Vec<Value> = TABLE
        .iter()
        .filter(|s| in_profile(s, p) && s.gv == gv)
        .map(|s| {
            let mut r = json!({"name": s.name, "singularName": "", "namespaced": s.namespaced,
                "kind": s.kind, "verbs": s.verbs});
            if s.name == "serviceaccounts/token" {
                r["group"] = json!("authentication.k8s.io");
                r["version"] = json!("v1");
            }
            r
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
        "resources": resources})
}

fn group(p: Profile, name: &str) -> Option<Value> {
    let versions: Vec<Value> = group_versions(p)
        .into_iter()
        .filter_map(|gv| gv.split_once('/'))
        .filter(|(g, _)| *g == name)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first()?.clone();
    Some(json!({"name": name, "versions": versions, "preferredVersion": preferred}))
}

fn groups(p: Profile) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for gv in group_versions(p) {
        if let Some((g, _)) = gv.split_once('/')
            && !out.iter().any(|o| o == g)
        {
            out.push(g.to_string());
        }
    }
    out
}

/// The discovery document or `/version` at `path`, if `path` is one.
pub fn serve(p: Profile, path: &str) -> Option<http::Response<Body>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let doc = match segs.as_slice() {
        ["version"] => version(p),
        ["api"] => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]}),
        ["api", "v1"] => resource_list(p, "v1"),
        ["apis"] => {
            let list: Vec<Value> = groups(p).iter().filter_map(|g| group(p, g)).collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": list})
        }
        ["apis", g] => {
            let mut doc = group(p, g)?;
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            doc
        }
        ["apis", g, v] => {
            let gv = format!("{g}/{v}");
            if !group_versions(p).contains(&gv.as_str()) {
                return None;
            }
            resource_list(p, &gv)
        }
        _ => return None,
    };
    Some(respond(StatusCode::OK, &doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_release_serves_its_own_group_versions() {
        let v19 = group_versions(Profile::V1_19);
        let v35 = group_versions(Profile::V1_35);
        assert!(v19.contains(&"node.k8s.io/v1beta1") && !v19.contains(&"node.k8s.io/v1"));
        assert!(v35.contains(&"node.k8s.io/v1") && !v35.contains(&"node.k8s.io/v1beta1"));
        assert!(!serves(Profile::V1_19, "v1", "serviceaccounts", "token"));
        assert!(serves(Profile::V1_35, "v1", "serviceaccounts", "token"));
        assert!(!serves(Profile::V1_19, "v1", "pods", "ephemeralcontainers"));
        assert!(serves(Profile::V1_35, "v1", "pods", "ephemeralcontainers"));
        assert!(serves(Profile::V1_19, "v1", "pods", "status"));
        assert!(!serves(Profile::V1_35, "v1", "pods", "nosuch"));
    }

    #[test]
    fn storage_versions_follow_the_release() {
        let v19 = group_versions(Profile::V1_19);
        let v35 = group_versions(Profile::V1_35);
        assert!(v19.contains(&"storage.k8s.io/v1") && v19.contains(&"storage.k8s.io/v1beta1"));
        assert!(v35.contains(&"storage.k8s.io/v1") && !v35.contains(&"storage.k8s.io/v1beta1"));
        for p in Profile::ALL {
            assert!(serves(
                p,
                "storage.k8s.io/v1",
                "volumeattachments",
                "status"
            ));
            assert!(serves(p, "storage.k8s.io/v1", "csinodes", ""));
            assert!(!serves(p, "storage.k8s.io/v1", "csinodes", "status"));
        }
        assert!(!serves(
            Profile::V1_19,
            "storage.k8s.io/v1",
            "csistoragecapacities",
            ""
        ));
        assert!(serves(
            Profile::V1_35,
            "storage.k8s.io/v1",
            "volumeattributesclasses",
            ""
        ));
        let names = |p| -> Vec<String> {
            resource_list(p, "storage.k8s.io/v1")["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["name"].as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(
            names(Profile::V1_19),
            [
                "csidrivers",
                "csinodes",
                "storageclasses",
                "volumeattachments",
                "volumeattachments/status"
            ]
        );
        assert_eq!(
            names(Profile::V1_35),
            [
                "csidrivers",
                "csinodes",
                "csistoragecapacities",
                "storageclasses",
                "volumeattachments",
                "volumeattachments/status",
                "volumeattributesclasses"
            ]
        );
    }
}
