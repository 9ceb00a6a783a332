//! Unit tests of the security-context mappings against upstream's
//! `security_context_test.go`, `helpers_linux_test.go` and
//! `security_context_others_test.go` cases.

use std::path::Path;

use cri::pb;
use cri::pb::security_profile::ProfileType;
use k8s_openapi::api::core::v1::Pod;
use kubelet_types::pod;

use super::*;

fn pod_of(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

fn one(psc: serde_json::Value, sc: serde_json::Value) -> Pod {
    pod_of(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"securityContext": psc, "containers": [{"name": "c", "image": "i", "securityContext": sc}]}
    }))
}

fn verify(p: &Pod, uid: Option<i64>, user: &str) -> Result<(), String> {
    verify_run_as_non_root(p, &pod::containers(p)[0], uid, user).map_err(|e| e.to_string())
}

#[test]
fn run_as_non_root_uses_upstream_messages() {
    let p = one(
        serde_json::json!({}),
        serde_json::json!({"runAsNonRoot": true}),
    );
    assert_eq!(
        verify(&p, Some(0), ""),
        Err(r#"container has runAsNonRoot and image will run as root (pod: "p_ns(u1)", container: c)"#.into())
    );
    assert_eq!(
        verify(&p, None, "nobody"),
        Err(r#"container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: "p_ns(u1)", container: c)"#.into())
    );
    assert_eq!(verify(&p, Some(1234), ""), Ok(()));
    assert!(
        verify(&p, Some(i64::from(i32::MAX) + 1), "")
            .expect_err("invalid uid")
            .starts_with("container has runAsNonRoot and image has an invalid user id (2147483648). (Must be 1-(2147483647))")
    );
    // runAsUser decides over the image.
    let p = one(
        serde_json::json!({"runAsNonRoot": true}),
        serde_json::json!({"runAsUser": 0}),
    );
    assert_eq!(
        verify(&p, Some(1000), ""),
        Err(
            r#"container's runAsUser breaks non-root policy (pod: "p_ns(u1)", container: c)"#
                .into()
        )
    );
    let p = one(
        serde_json::json!({"runAsNonRoot": true, "runAsUser": 1000}),
        serde_json::json!({}),
    );
    assert_eq!(verify(&p, Some(0), ""), Ok(()));
    // The container's false overrides the pod's true.
    let p = one(
        serde_json::json!({"runAsNonRoot": true}),
        serde_json::json!({"runAsNonRoot": false}),
    );
    assert_eq!(verify(&p, Some(0), ""), Ok(()));
}

#[tokio::test]
async fn the_image_user_comes_from_image_status() {
    let rt = std::sync::Arc::new(cri::fake::FakeRuntime::new());
    rt.add_image("img");
    let images = crate::images::ImageManager::new(rt.clone());
    // The fake's image names no user: upstream treats it as root.
    assert_eq!(
        images.image_user("img").await.expect("status"),
        (Some(0), String::new())
    );
    let p = one(
        serde_json::json!({"runAsNonRoot": true}),
        serde_json::json!({}),
    );
    let c = &pod::containers(&p)[0];
    let err = check_non_root(&images, &p, c, "img")
        .await
        .expect_err("root image");
    assert!(matches!(err, NonRootError::ImageRoot { .. }), "{err}");
    let p = one(serde_json::json!({}), serde_json::json!({}));
    let c = &pod::containers(&p)[0];
    assert!(check_non_root(&images, &p, c, "img").await.is_ok());
}

#[test]
fn container_fields_and_pod_fallbacks() {
    let p = one(
        serde_json::json!({"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [4000]}),
        serde_json::json!({"runAsUser": 2000, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
            "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}),
    );
    let sc = security_context(
        &p,
        &pod::containers(&p)[0],
        Path::new("/var/lib/kubelet"),
        false,
    );
    assert_eq!(sc.run_as_user.map(|v| v.value), Some(2000));
    assert_eq!(sc.run_as_group.map(|v| v.value), Some(3000));
    assert_eq!(sc.supplemental_groups, vec![4000]);
    assert!(sc.readonly_rootfs);
    assert!(sc.no_new_privs);
    // Upstream passes capability names as given.
    let caps = sc.capabilities.expect("caps");
    assert_eq!(caps.add_capabilities, vec!["NET_ADMIN"]);
    assert_eq!(caps.drop_capabilities, vec!["ALL"]);
    assert_eq!(sc.masked_paths.len(), 11);
    assert_eq!(sc.readonly_paths.len(), 5);
    // allowPrivilegeEscalation unset or true: no no_new_privs (upstream AddNoNewPrivileges).
    for v in [
        serde_json::json!({}),
        serde_json::json!({"allowPrivilegeEscalation": true}),
    ] {
        let p = one(serde_json::json!({}), v);
        assert!(!security_context(&p, &pod::containers(&p)[0], Path::new("/"), false).no_new_privs);
    }
    let p = one(
        serde_json::json!({}),
        serde_json::json!({"procMount": "Unmasked"}),
    );
    let sc = security_context(&p, &pod::containers(&p)[0], Path::new("/"), false);
    assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
}

#[test]
fn seccomp_container_over_pod_and_localhost_under_root_dir() {
    let root = Path::new("/var/lib/kubelet");
    let p = one(
        serde_json::json!({"seccompProfile": {"type": "RuntimeDefault"}}),
        serde_json::json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/audit.json"}}),
    );
    let sc = security_context(&p, &pod::containers(&p)[0], root, false);
    assert_eq!(
        sc.seccomp,
        Some(pb::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: "/var/lib/kubelet/seccomp/profiles/audit.json".into(),
        })
    );
    let sb = sandbox_security_context(&p);
    assert_eq!(
        sb.seccomp.map(|s| s.profile_type),
        Some(ProfileType::RuntimeDefault as i32)
    );
    let p = one(serde_json::json!({}), serde_json::json!({}));
    let sc = security_context(&p, &pod::containers(&p)[0], root, false);
    assert_eq!(
        sc.seccomp.map(|s| s.profile_type),
        Some(ProfileType::Unconfined as i32)
    );
}

#[test]
fn apparmor_field_then_annotation_then_pod() {
    let mut p = one(
        serde_json::json!({"appArmorProfile": {"type": "RuntimeDefault"}}),
        serde_json::json!({}),
    );
    let c = pod::containers(&p)[0].clone();
    assert_eq!(
        apparmor(&p, &c).map(|a| a.profile_type),
        Some(ProfileType::RuntimeDefault as i32)
    );
    p.metadata.annotations = Some(
        [(
            "container.apparmor.security.beta.kubernetes.io/c".to_string(),
            "localhost/k8s-deny-write".to_string(),
        )]
        .into(),
    );
    assert_eq!(
        apparmor(&p, &c),
        Some(pb::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: "k8s-deny-write".into(),
        })
    );
    let p2 = one(
        serde_json::json!({}),
        serde_json::json!({"appArmorProfile": {"type": "Unconfined"}}),
    );
    let mut p2 = p2;
    p2.metadata.annotations = p.metadata.annotations.clone();
    let c2 = pod::containers(&p2)[0].clone();
    assert_eq!(
        apparmor(&p2, &c2).map(|a| a.profile_type),
        Some(ProfileType::Unconfined as i32)
    );
    let none = one(serde_json::json!({}), serde_json::json!({}));
    assert_eq!(apparmor(&none, &pod::containers(&none)[0]), None);
}

#[test]
fn supplemental_groups_policy_reaches_sandbox_and_container() {
    let p = one(
        serde_json::json!({"supplementalGroupsPolicy": "Strict"}),
        serde_json::json!({}),
    );
    let strict = pb::SupplementalGroupsPolicy::Strict as i32;
    let sc = security_context(&p, &pod::containers(&p)[0], Path::new("/"), false);
    assert_eq!(sc.supplemental_groups_policy, strict);
    assert_eq!(
        sandbox_security_context(&p).supplemental_groups_policy,
        strict
    );
    let p = one(serde_json::json!({}), serde_json::json!({}));
    let sc = security_context(&p, &pod::containers(&p)[0], Path::new("/"), false);
    assert_eq!(
        sc.supplemental_groups_policy,
        pb::SupplementalGroupsPolicy::Merge as i32
    );
}

/// Issue 28: the security fields kubelet-rs used to drop.
#[test]
fn seccomp_default_applies_only_where_nothing_is_asked() {
    let root = Path::new("/var/lib/kubelet");
    let profile = |p: &Pod, default: bool| {
        security_context(p, &pod::containers(p)[0], root, default)
            .seccomp
            .map(|s| s.profile_type)
    };
    let none = one(serde_json::json!({}), serde_json::json!({}));
    assert_eq!(
        profile(&none, true),
        Some(ProfileType::RuntimeDefault as i32)
    );
    assert_eq!(profile(&none, false), Some(ProfileType::Unconfined as i32));
    let unconfined = one(
        serde_json::json!({"seccompProfile": {"type": "Unconfined"}}),
        serde_json::json!({}),
    );
    assert_eq!(
        profile(&unconfined, true),
        Some(ProfileType::Unconfined as i32)
    );
}

#[test]
fn a_nameless_localhost_profile_fails_the_container_never_unconfined() {
    let p = one(
        serde_json::json!({"seccompProfile": {"type": "Localhost"}}),
        serde_json::json!({}),
    );
    let c = &pod::containers(&p)[0];
    assert_eq!(
        check_seccomp(&p, c),
        Err("localhostProfile must be set if seccompProfile type is Localhost.".into())
    );
    // Should it get that far anyway: the runtime's default, not unconfined.
    assert_eq!(
        security_context(&p, c, Path::new("/"), false)
            .seccomp
            .map(|s| s.profile_type),
        Some(ProfileType::RuntimeDefault as i32)
    );
    let ok = one(
        serde_json::json!({}),
        serde_json::json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "a.json"}}),
    );
    assert_eq!(check_seccomp(&ok, &pod::containers(&ok)[0]), Ok(()));
}

#[test]
fn localhost_profiles_join_as_go_filepath_join() {
    let root = Path::new("/var/lib/kubelet");
    let at = |name: &str| {
        let p = one(
            serde_json::json!({}),
            serde_json::json!({"seccompProfile": {"type": "Localhost", "localhostProfile": name}}),
        );
        security_context(&p, &pod::containers(&p)[0], root, false)
            .seccomp
            .map(|s| s.localhost_ref)
            .unwrap_or_default()
    };
    assert_eq!(at("/abs/p.json"), "/var/lib/kubelet/seccomp/abs/p.json");
    assert_eq!(at("./a//b.json"), "/var/lib/kubelet/seccomp/a/b.json");
    assert_eq!(at("../x.json"), "/var/lib/kubelet/x.json");
}

#[test]
fn selinux_options_reach_the_sandbox_and_the_container_which_overrides_the_pod() {
    let p = one(
        serde_json::json!({"seLinuxOptions": {"user": "system_u", "role": "system_r", "type": "spc_t", "level": "s0:c1,c2"}}),
        serde_json::json!({}),
    );
    let want = pb::SeLinuxOption {
        user: "system_u".into(),
        role: "system_r".into(),
        r#type: "spc_t".into(),
        level: "s0:c1,c2".into(),
    };
    assert_eq!(
        sandbox_security_context(&p).selinux_options,
        Some(want.clone())
    );
    assert_eq!(
        security_context(&p, &pod::containers(&p)[0], Path::new("/"), false).selinux_options,
        Some(want)
    );
    let p = one(
        serde_json::json!({"seLinuxOptions": {"level": "s0:c1,c2"}}),
        serde_json::json!({"seLinuxOptions": {"level": "s0:c3,c4"}}),
    );
    let sc = security_context(&p, &pod::containers(&p)[0], Path::new("/"), false);
    assert_eq!(sc.selinux_options.map(|o| o.level), Some("s0:c3,c4".into()));
    assert_eq!(
        sandbox_security_context(&p)
            .selinux_options
            .map(|o| o.level),
        Some("s0:c1,c2".into())
    );
}
