//! CSR approval and signing as kube-controller-manager does it for kubelets:
//! the `csrapproving` controller approves `kubernetes.io/kube-apiserver-client-kubelet`
//! requests only when they look exactly like a kubelet client certificate
//! (upstream `pkg/apis/certificates/helpers.go` `IsKubeletClientCSR`), and the
//! signer issues the certificate for approved requests.
//!
//! `kubernetes.io/kubelet-serving` requests are never auto-approved (as
//! upstream, which has no approver for them); once approved, the signer
//! validates them as upstream's `ValidateKubeletServingCSR` does and issues a
//! server certificate with the requested SANs, or marks them `Failed`.

use base64::Engine;
use serde_json::{Value, json};

use rcgen::SanType;

use crate::Shared;
use crate::pki::csr_subject;

/// The kubelet client signer.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The kubelet serving signer.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

fn usages(obj: &Value) -> Vec<&str> {
    let mut u: Vec<&str> = obj
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    u.sort_unstable();
    u.dedup();
    u
}

/// Why an approved `kubernetes.io/kubelet-serving` CSR cannot be signed, if
/// it cannot (upstream `ValidateKubeletServingCSR`, run by the signer). Up
/// to 1.24 the usages must be exactly the three below
/// (`pkg/apis/certificates/helpers.go` at release-1.19); from 1.25 key
/// encipherment may be left out (kubernetes/kubernetes#111061).
pub fn kubelet_serving_problem(obj: &Value, profile: crate::profile::Profile) -> Option<String> {
    let Some(pem) = request_pem(obj) else {
        return Some("spec.request is not a base64 PEM".into());
    };
    let subject = match csr_subject(&pem) {
        Ok(s) => s,
        Err(e) => return Some(format!("invalid request: {e}")),
    };
    if subject.organizations != ["system:nodes"] {
        return Some("subject organization is not system:nodes".into());
    }
    let sans = match rcgen::CertificateSigningRequestParams::from_pem(&pem) {
        Ok(r) => r.params.subject_alt_names,
        Err(e) => return Some(format!("invalid request: {e}")),
    };
    if !sans
        .iter()
        .any(|s| matches!(s, SanType::DnsName(_) | SanType::IpAddress(_)))
    {
        return Some("DNS or IP subjectAltName is required".into());
    }
    if sans.iter().any(|s| matches!(s, SanType::Rfc822Name(_))) {
        return Some("Email subjectAltNames are not allowed".into());
    }
    if sans.iter().any(|s| matches!(s, SanType::URI(_))) {
        return Some("URI subjectAltNames are not allowed".into());
    }
    let u = usages(obj);
    if u != ["digital signature", "key encipherment", "server auth"]
        && (u != ["digital signature", "server auth"] || !profile.at_least(25))
    {
        return Some(
            "usages did not match [digital signature key encipherment server auth]".into(),
        );
    }
    if !subject.common_name.starts_with("system:node:") {
        return Some("subject common name does not begin with system:node:".into());
    }
    None
}

/// Why a serving CSR was not requested by the node it names, if it was not
/// (what an approver checks before approving: `spec.username` is the
/// subject's common name and `spec.groups` has `system:nodes`).
pub fn kubelet_serving_requester_problem(obj: &Value) -> Option<String> {
    let cn = request_pem(obj)
        .and_then(|p| csr_subject(&p).ok())
        .map(|s| s.common_name)
        .unwrap_or_default();
    let user = obj
        .pointer("/spec/username")
        .and_then(Value::as_str)
        .unwrap_or("");
    let in_nodes = obj
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .is_some_and(|g| g.iter().any(|g| g == "system:nodes"));
    if user != cn || !in_nodes {
        return Some(format!(
            "requested by {user:?}, not by the node {cn:?} in system:nodes"
        ));
    }
    None
}

fn request_pem(obj: &Value) -> Option<String> {
    let b64 = obj.pointer("/spec/request").and_then(Value::as_str)?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

/// Why a CSR is not a kubelet client request, if it is not.
pub fn kubelet_client_problem(obj: &Value) -> Option<String> {
    if obj.pointer("/spec/signerName").and_then(Value::as_str) != Some(KUBELET_CLIENT_SIGNER) {
        return Some("signerName is not kubernetes.io/kube-apiserver-client-kubelet".into());
    }
    let Some(pem) = request_pem(obj) else {
        return Some("spec.request is not a base64 PEM".into());
    };
    let subject = match csr_subject(&pem) {
        Ok(s) => s,
        Err(e) => return Some(format!("invalid request: {e}")),
    };
    if subject.organizations != ["system:nodes"] {
        return Some(format!(
            "organization must be exactly [system:nodes], got {:?}",
            subject.organizations
        ));
    }
    if !subject.common_name.starts_with("system:node:") {
        return Some(format!(
            "common name must start with system:node:, got {:?}",
            subject.common_name
        ));
    }
    if subject.has_sans {
        return Some("subject alternative names are not allowed".into());
    }
    let usages = usages(obj);
    if usages != ["client auth", "digital signature", "key encipherment"] {
        return Some(format!(
            "usages must be exactly digital signature, key encipherment, client auth; got {usages:?}"
        ));
    }
    None
}

/// On create: approves kubelet client requests from bootstrappers (nodeclient)
/// and from the node itself (selfnodeclient), then signs them.
pub fn auto_approve(shared: &Shared, obj: &mut Value) {
    if !shared.options.auto_approve || kubelet_client_problem(obj).is_some() {
        return;
    }
    let groups: Vec<&str> = obj
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .map(|g| g.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let user = obj
        .pointer("/spec/username")
        .and_then(Value::as_str)
        .unwrap_or("");
    let cn = request_pem(obj)
        .and_then(|p| csr_subject(&p).ok())
        .map(|s| s.common_name)
        .unwrap_or_default();
    let bootstrapper = groups.contains(&"system:bootstrappers");
    let self_renewal = groups.contains(&"system:nodes") && user == cn;
    if !(bootstrapper || self_renewal) {
        return;
    }
    obj["status"]["conditions"] = json!([{
        "type": "Approved", "status": "True", "reason": "AutoApproved",
        "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
        "lastUpdateTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    }]);
    sign_if_approved(shared, obj);
}

/// Issues the certificate of an approved kubelet client or serving request.
pub fn sign_if_approved(shared: &Shared, obj: &mut Value) {
    let approved = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Approved" && c["status"] == "True")
                && !c.iter().any(|c| c["type"] == "Denied")
        });
    if !approved || obj.pointer("/status/certificate").is_some() {
        return;
    }
    let signer = obj.pointer("/spec/signerName").and_then(Value::as_str);
    let serving = signer == Some(KUBELET_SERVING_SIGNER);
    if signer != Some(KUBELET_CLIENT_SIGNER) && !serving {
        return;
    }
    let Some(pem) = request_pem(obj) else { return };
    let lifetime = *shared.cert_lifetime.read();
    let signed = if serving {
        match kubelet_serving_problem(obj, shared.options.profile) {
            Some(problem) => Err(crate::pki::PkiError::Invalid(problem)),
            None => shared.ca.sign_serving_csr(
                &pem,
                usages(obj).contains(&"key encipherment"),
                lifetime,
                shared.options.backdate,
            ),
        }
    } else {
        shared
            .ca
            .sign_client_csr(&pem, lifetime, shared.options.backdate)
    };
    match signed {
        Ok(cert) => {
            obj["status"]["certificate"] =
                json!(base64::engine::general_purpose::STANDARD.encode(cert.as_bytes()));
        }
        Err(e) => {
            if let Some(c) = obj["status"]["conditions"].as_array_mut() {
                c.push(json!({"type": "Failed", "status": "True", "reason": "SignerValidationFailure", "message": e.to_string()}));
            }
        }
    }
}
