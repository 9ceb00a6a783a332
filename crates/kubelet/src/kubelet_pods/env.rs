//! A container's environment (upstream `kubelet_pods.go`
//! `makeEnvironmentVariables` and `podFieldSelectorRuntimeValue`): `envFrom`
//! ConfigMaps and Secrets (with `prefix`; invalid names skipped with
//! upstream's event), then `env` in order (values expanded against earlier
//! variables and the service variables; `valueFrom` field, resource,
//! ConfigMap and Secret references), then the service variables not
//! already defined.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_types::fieldpath::{self, FieldPathError};
use kubelet_types::pod;
use kubelet_volume::{ObjectError, VolumeHost};

/// The environment could not be built; the message is upstream's and
/// becomes the container's `CreateContainerConfigError`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EnvError {
    /// A referenced ConfigMap or Secret could not be read.
    #[error("{0}")]
    Object(ObjectError),
    /// There is no apiserver to read it from.
    #[error("couldn't get {kind} {namespace}/{name}, no kubeClient defined")]
    NoClient {
        /// `configMap` or `secret`.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A key the container asks for is missing.
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        /// The key.
        key: String,
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A field or resource selector that does not resolve.
    #[error(transparent)]
    FieldPath(#[from] FieldPathError),
    /// Services were never listed (a pod from the apiserver would miss
    /// `KUBERNETES_SERVICE_HOST`).
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotSynced,
}

/// What the environment is built from besides the pod.
pub struct EnvInputs<'a> {
    /// ConfigMaps and Secrets.
    pub objects: &'a dyn VolumeHost,
    /// Service variables (`service_env_var_map`); `None` until the service
    /// lister has synced (static pods go ahead without them).
    pub service_env: Option<&'a BTreeMap<String, String>>,
    /// The sandbox's IPs.
    pub pod_ips: &'a [String],
    /// The node's IPs.
    pub host_ips: &'a [String],
    /// Node allocatable, for `resourceFieldRef` without limits.
    pub allocatable: &'a BTreeMap<String, Quantity>,
}

/// The environment, and the warnings upstream records as
/// `InvalidEnvironmentVariableNames` events.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Environment {
    /// Name and value, in order.
    pub vars: Vec<(String, String)>,
    /// Messages of `InvalidEnvironmentVariableNames` events.
    pub invalid_names: Vec<String>,
}

/// Upstream `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "-._".contains(c))
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

/// Insertion-ordered variables, a later definition replacing an earlier one in place.
#[derive(Default)]
struct Vars {
    order: Vec<String>,
    values: HashMap<String, String>,
}

impl Vars {
    fn set(&mut self, k: String, v: String) {
        if self.values.insert(k.clone(), v).is_none() {
            self.order.push(k);
        }
    }
}

struct Cache<'a> {
    inputs: &'a EnvInputs<'a>,
    namespace: &'a str,
    config_maps: HashMap<String, ConfigMap>,
    secrets: HashMap<String, Secret>,
}

impl Cache<'_> {
    /// The ConfigMap, or `None` when it is missing and `optional`.
    async fn config_map(
        &mut self,
        name: &str,
        optional: bool,
    ) -> Result<Option<&ConfigMap>, EnvError> {
        if !self.config_maps.contains_key(name) {
            match self
                .inputs
                .objects
                .get_config_map(self.namespace, name)
                .await
            {
                Ok(cm) => {
                    self.config_maps.insert(name.to_string(), cm);
                }
                Err(e) if e.is_not_found() && optional => return Ok(None),
                Err(ObjectError::NoClient { .. }) => {
                    return Err(EnvError::NoClient {
                        kind: "configMap",
                        namespace: self.namespace.to_string(),
                        name: name.to_string(),
                    });
                }
                Err(e) => return Err(EnvError::Object(e)),
            }
        }
        Ok(self.config_maps.get(name))
    }

    async fn secret(&mut self, name: &str, optional: bool) -> Result<Option<&Secret>, EnvError> {
        if !self.secrets.contains_key(name) {
            match self.inputs.objects.get_secret(self.namespace, name).await {
                Ok(s) => {
                    self.secrets.insert(name.to_string(), s);
                }
                Err(e) if e.is_not_found() && optional => return Ok(None),
                Err(ObjectError::NoClient { .. }) => {
                    return Err(EnvError::NoClient {
                        kind: "secret",
                        namespace: self.namespace.to_string(),
                        name: name.to_string(),
                    });
                }
                Err(e) => return Err(EnvError::Object(e)),
            }
        }
        Ok(self.secrets.get(name))
    }
}

/// Upstream `podFieldSelectorRuntimeValue`.
fn field_value(p: &Pod, field_path: &str, inputs: &EnvInputs<'_>) -> Result<String, EnvError> {
    let spec = p.spec.as_ref();
    Ok(match field_path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => inputs.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => inputs.host_ips.join(","),
        "status.podIP" => inputs.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => inputs.pod_ips.join(","),
        "spec.terminationGracePeriodSeconds" => spec
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .to_string(),
        other => fieldpath::extract_field_path_as_string(p, other)?,
    })
}

/// Upstream `makeEnvironmentVariables`.
pub async fn make_environment_variables(
    p: &Pod,
    c: &Container,
    inputs: &EnvInputs<'_>,
) -> Result<Environment, EnvError> {
    let static_pod = kubelet_types::pod::is_static(p);
    let no_services = BTreeMap::new();
    let service_env = match inputs.service_env {
        Some(s) => s,
        None if static_pod => &no_services,
        None => return Err(EnvError::ServicesNotSynced),
    };
    let namespace = pod::namespace(p);
    let mut cache = Cache {
        inputs,
        namespace,
        config_maps: HashMap::new(),
        secrets: HashMap::new(),
    };
    let mut vars = Vars::default();
    let mut invalid_names = Vec::new();
    // envFrom first; `env` overrides it.
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, data): (&str, String, Vec<(String, String)>) =
            if let Some(r) = &from.config_map_ref {
                let Some(cm) = cache.config_map(&r.name, r.optional == Some(true)).await? else {
                    continue;
                };
                let data = cm.data.clone().unwrap_or_default().into_iter().collect();
                ("configMap", r.name.clone(), data)
            } else if let Some(r) = &from.secret_ref {
                let Some(s) = cache.secret(&r.name, r.optional == Some(true)).await? else {
                    continue;
                };
                let data = s
                    .data
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect();
                ("secret", r.name.clone(), data)
            } else {
                continue;
            };
        let mut invalid = Vec::new();
        for (k, v) in data {
            let k = format!("{prefix}{k}");
            if is_env_var_name(&k) {
                vars.set(k, v);
            } else {
                invalid.push(k);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            invalid_names.push(format!(
                "Keys [{}] from the EnvFrom {kind} {namespace}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", ")
            ));
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (e.value.as_deref().filter(|v| !v.is_empty()), &e.value_from) {
            (Some(v), _) => kubelet_runtime::expansion::expand_with(v, |name| {
                vars.values
                    .get(name)
                    .or_else(|| service_env.get(name))
                    .cloned()
            }),
            (None, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_value(p, &f.field_path, inputs)?
                } else if let Some(r) = &from.resource_field_ref {
                    fieldpath::extract_resource_value(r, p, c, inputs.allocatable)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional == Some(true);
                    let Some(cm) = cache.config_map(&r.name, optional).await? else {
                        continue;
                    };
                    match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(v) => v.clone(),
                        None if optional => continue,
                        None => {
                            return Err(EnvError::MissingKey {
                                key: r.key.clone(),
                                kind: "ConfigMap",
                                namespace: namespace.to_string(),
                                name: r.name.clone(),
                            });
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional == Some(true);
                    let Some(s) = cache.secret(&r.name, optional).await? else {
                        continue;
                    };
                    match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                        None if optional => continue,
                        None => {
                            return Err(EnvError::MissingKey {
                                key: r.key.clone(),
                                kind: "Secret",
                                namespace: namespace.to_string(),
                                name: r.name.clone(),
                            });
                        }
                    }
                } else {
                    String::new()
                }
            }
            (None, None) => String::new(),
        };
        vars.set(e.name.clone(), value);
    }
    let mut out: Vec<(String, String)> = vars
        .order
        .iter()
        .map(|k| (k.clone(), vars.values.get(k).cloned().unwrap_or_default()))
        .collect();
    for (k, v) in service_env {
        if !vars.values.contains_key(k) {
            out.push((k.clone(), v.clone()));
        }
    }
    Ok(Environment {
        vars: out,
        invalid_names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kubelet_volume::host::TokenRequest;

    struct Objects {
        standalone: bool,
    }

    #[async_trait::async_trait]
    impl VolumeHost for Objects {
        async fn get_config_map(&self, ns: &str, name: &str) -> Result<ConfigMap, ObjectError> {
            if self.standalone {
                return Err(ObjectError::NoClient {
                    resource: "configmap",
                    namespace: ns.into(),
                    name: name.into(),
                });
            }
            match name {
                "cm" => Ok(serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "cm"},
                    "data": {"data-1": "value-1", "bad key": "x", "1bad": "y", "REF": "$(A)"}
                }))
                .expect("cm")),
                _ => Err(ObjectError::NotFound {
                    resource: "configmap",
                    name: name.into(),
                }),
            }
        }
        async fn get_secret(&self, _: &str, name: &str) -> Result<Secret, ObjectError> {
            match name {
                "s" => Ok(Secret {
                    data: Some([("pw".to_string(), ByteString(b"hunter2".to_vec()))].into()),
                    ..Default::default()
                }),
                _ => Err(ObjectError::NotFound {
                    resource: "secret",
                    name: name.into(),
                }),
            }
        }
        async fn get_service_account_token(&self, _: &TokenRequest) -> Result<String, ObjectError> {
            Err(ObjectError::Other("no tokens".into()))
        }
        async fn get_persistent_volume_claim(
            &self,
            _: &str,
            name: &str,
        ) -> Result<PersistentVolumeClaim, ObjectError> {
            Err(ObjectError::NotFound {
                resource: "persistentvolumeclaims",
                name: name.into(),
            })
        }
        async fn get_persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
            Err(ObjectError::NotFound {
                resource: "persistentvolumes",
                name: name.into(),
            })
        }
        fn node_name(&self) -> String {
            "n1".into()
        }
        fn node_labels(&self) -> BTreeMap<String, String> {
            BTreeMap::new()
        }
        fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
            BTreeMap::new()
        }
    }

    fn pod(container: serde_json::Value) -> (Pod, Container) {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": [container]}
        }))
        .expect("pod");
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        (p, c)
    }

    async fn env(container: serde_json::Value, standalone: bool) -> Result<Environment, EnvError> {
        let (p, c) = pod(container);
        let services: BTreeMap<String, String> = [
            (
                "KUBERNETES_SERVICE_HOST".to_string(),
                "10.96.0.1".to_string(),
            ),
            ("A".to_string(), "from-service".to_string()),
        ]
        .into();
        let alloc: BTreeMap<String, Quantity> =
            [("memory".to_string(), Quantity("1Gi".into()))].into();
        let objects = Objects { standalone };
        let inputs = EnvInputs {
            objects: &objects,
            service_env: Some(&services),
            pod_ips: &["10.1.0.5".to_string(), "fd00::5".to_string()],
            host_ips: &["192.168.1.2".to_string()],
            allocatable: &alloc,
        };
        make_environment_variables(&p, &c, &inputs).await
    }

    #[tokio::test]
    async fn env_from_env_value_from_and_services_in_upstreams_order() {
        let got = env(
            serde_json::json!({"name": "c", "image": "i",
                "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "p_"}, {"secretRef": {"name": "missing", "optional": true}}],
                "env": [
                    {"name": "p_data-1", "value": "overridden"},
                    {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
                    {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "data-1"}}},
                    {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
                    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope", "optional": true}}},
                    {"name": "EXPANDED", "value": "$(NAME)-$(A)-$(KUBERNETES_SERVICE_HOST)-$(UNDEFINED)"}
                ]}),
            false,
        )
        .await
        .expect("env");
        let v: Vec<(&str, &str)> = got
            .vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            v,
            vec![
                ("p_1bad", "y"),
                ("p_REF", "$(A)"),
                ("p_data-1", "overridden"),
                ("NAME", "web"),
                ("LABEL", "web"),
                ("NODE", "n1"),
                ("SA", "sa"),
                ("POD_IP", "10.1.0.5"),
                ("POD_IPS", "10.1.0.5,fd00::5"),
                ("HOST_IP", "192.168.1.2"),
                ("MEM", "1024"),
                ("CM", "value-1"),
                ("PW", "hunter2"),
                ("EXPANDED", "web-from-service-10.96.0.1-$(UNDEFINED)"),
                ("A", "from-service"),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ]
        );
        assert_eq!(
            got.invalid_names,
            vec!["Keys [p_bad key] from the EnvFrom configMap ns/cm were skipped since they are considered invalid environment variable names.".to_string()]
        );
    }

    #[tokio::test]
    async fn missing_references_give_upstreams_messages() {
        let cases = [
            (
                serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]),
                "configmap \"gone\" not found",
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]),
                "couldn't find key k in ConfigMap ns/cm",
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
                "couldn't find key k in Secret ns/s",
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}]),
                "secret \"gone\" not found",
            ),
        ];
        for (e, want) in cases {
            let err = env(
                serde_json::json!({"name": "c", "image": "i", "env": e}),
                false,
            )
            .await
            .expect_err(want);
            assert_eq!(err.to_string(), want);
        }
        let err = env(
            serde_json::json!({"name": "c", "image": "i", "envFrom": [{"configMapRef": {"name": "cm"}}]}),
            true,
        )
        .await
        .expect_err("standalone");
        assert_eq!(
            err.to_string(),
            "couldn't get configMap ns/cm, no kubeClient defined"
        );
    }

    #[test]
    fn env_var_names() {
        for ok in ["A", "a_b", "-x", ".y", "X1.2-3"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1a", "a b", "a=b", "ä"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
