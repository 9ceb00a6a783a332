//! Spec flows several upstream files share: "optional updates should be
//! reflected in volume" (configMap, secret, and both projected) and the
//! `[Slow]` "Should fail non-optional pod creation" specs.

use serde_json::{Value, json};

use super::{NS, POD_TIMEOUT, Suite, UPDATE_TIMEOUT, Want, mount, mounttest};

/// The object behind the volumes of an "optional updates" spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A configMap.
    ConfigMap,
    /// A secret.
    Secret,
}

/// One of upstream's "optional updates should be reflected in volume"
/// specs: three optional volumes (object deleted, updated, created later),
/// each read in a loop by its own container.
pub struct OptionalUpdates<'a> {
    /// The It text.
    pub spec: &'a str,
    /// The pod.
    pub short: &'a str,
    /// ConfigMaps or secrets.
    pub kind: Kind,
    /// Projected volumes (one source each) instead of configMap/secret volumes.
    pub projected: bool,
    /// Where the volumes are mounted (`<base>/delete`, `/update`, `/create`).
    pub base: &'a str,
    /// Objects: deleted, updated, created.
    pub objects: [&'a str; 3],
    /// Volumes, in the same order.
    pub volumes: [&'a str; 3],
    /// Containers, in the same order.
    pub containers: [&'a str; 3],
}

impl Suite {
    async fn put(&self, kind: Kind, name: &str, key: &str, value: &str) {
        match kind {
            Kind::ConfigMap => self.config_map(NS, name, &[(key, value)], &[]).await,
            Kind::Secret => self.secret(NS, name, &[(key, value.as_bytes())]).await,
        }
    }

    /// Runs an [`OptionalUpdates`] spec as upstream does.
    pub async fn optional_updates(&self, c: OptionalUpdates<'_>) {
        let [del, upd, create] = c.objects;
        let [dv, uv, cv] = c.volumes;
        let [dc, uc, cc] = c.containers;
        let (spec, short, base) = (c.spec, c.short, c.base);
        self.put(c.kind, del, "data-1", "value-1").await;
        self.put(c.kind, upd, "data-1", "value-1").await;
        let volume = |name: &str, obj: &str| {
            let src = match c.kind {
                Kind::ConfigMap => json!({"configMap": {"name": obj, "optional": true}}),
                Kind::Secret if c.projected => json!({"secret": {"name": obj, "optional": true}}),
                Kind::Secret => json!({"secret": {"secretName": obj, "optional": true}}),
            };
            let mut v = json!({"name": name});
            let obj = v.as_object_mut().expect("object");
            if c.projected {
                obj.insert("projected".into(), json!({"sources": [src]}));
            } else if let Some((k, s)) = src.as_object().and_then(|m| m.iter().next()) {
                obj.insert(k.clone(), s.clone());
            }
            v
        };
        let container = |name: &str, vol: &str, dir: &str, file: &str| {
            mounttest(
                name,
                &[
                    "--break_on_expected_content=false",
                    "--retry_time=120",
                    &format!("--file_content_in_loop={base}/{dir}/{file}"),
                ],
                json!([mount(vol, &format!("{base}/{dir}"), true)]),
            )
        };
        let pod = json!({"spec": {
            "volumes": [volume(dv, del), volume(uv, upd), volume(cv, create)],
            "containers": [
                container(dc, dv, "delete", "data-1"),
                container(uc, uv, "update", "data-3"),
                container(cc, cv, "create", "data-1"),
            ],
            "restartPolicy": "Never",
        }});
        if !self.pod(spec, short, pod).await || !self.wait_running(spec, short, POD_TIMEOUT).await {
            return;
        }
        let t = UPDATE_TIMEOUT;
        let ok = self
            .eventually_log(
                spec,
                short,
                cc,
                Want::has(format!("Error reading file {base}/create/data-1")),
                t,
            )
            .await
            & self
                .eventually_log(
                    spec,
                    short,
                    uc,
                    Want::has(format!("Error reading file {base}/update/data-3")),
                    t,
                )
                .await
            & self
                .eventually_log(spec, short, dc, Want::has("value-1"), t)
                .await;
        if !ok {
            return;
        }
        match c.kind {
            Kind::ConfigMap => {
                self.delete_config_map(NS, del).await;
                self.update_config_map(NS, upd, &[("data-3", "value-3")])
                    .await;
            }
            Kind::Secret => {
                self.delete_secret(NS, del).await;
                self.update_secret(NS, upd, &[("data-3", b"value-3")]).await;
            }
        }
        self.put(c.kind, create, "data-1", "value-1").await;
        self.eventually_log(spec, short, cc, Want::has("value-1"), t)
            .await;
        self.eventually_log(spec, short, uc, Want::has("value-3"), t)
            .await;
        self.eventually_log(
            spec,
            short,
            dc,
            Want::has(format!("Error reading file {base}/delete/data-1")),
            t,
        )
        .await;
    }
}

/// One of the `[Slow]` "Should fail non-optional pod creation" specs
/// (`createNonOptionalConfigMapPod`, `createNonOptionalSecretPod`, and their
/// `...WithConfig`/`...WithSecret` variants): the pod must stay Pending with
/// the kubelet's FailedMount event.
pub struct NonOptional<'a> {
    /// The It text.
    pub spec: &'a str,
    /// The pod.
    pub short: &'a str,
    /// A configMap or a secret volume.
    pub kind: Kind,
    /// The object (missing, or without the item's key).
    pub object: &'a str,
    /// Upstream's `volumeMountPath` (the volume is mounted at `<it>/create`).
    pub mount_dir: &'a str,
    /// Items naming a key the object lacks, if any.
    pub items: Option<Value>,
    /// What the FailedMount event's message contains.
    pub want: &'a str,
}

impl Suite {
    /// Runs a [`NonOptional`] spec up to the FailedMount event; check
    /// [`Suite::still_pending`] again at the end of the file's run.
    pub async fn non_optional(&self, c: NonOptional<'_>) {
        let looped = |dir: &str| format!("--file_content_in_loop={dir}/create/data-1");
        let (volume, mut pod) = match c.kind {
            Kind::ConfigMap => {
                let v = "createcm-volume";
                let args = [
                    "--break_on_expected_content=false",
                    "--retry_time=120",
                    &looped("/etc/configmap-volumes"),
                ];
                let pod = json!({"spec": {
                    "volumes": [{"name": v, "configMap": {"name": c.object, "optional": false}}],
                    "containers": [mounttest("agnhost-container", &args, json!([mount(v, &format!("{}/create", c.mount_dir), true)]))],
                    "securityContext": {},
                    "terminationGracePeriodSeconds": 0,
                    "restartPolicy": "Never",
                }});
                (v, pod)
            }
            Kind::Secret => {
                let v = "creates-volume";
                let args = [
                    "--break_on_expected_content=false",
                    "--retry_time=120",
                    &looped("/etc/secret-volumes"),
                ];
                let pod = json!({"spec": {
                    "volumes": [{"name": v, "secret": {"secretName": c.object, "optional": false}}],
                    "containers": [mounttest("creates-volume-test", &args, json!([mount(v, &format!("{}/create", c.mount_dir), true)]))],
                    "restartPolicy": "Never",
                }});
                (v, pod)
            }
        };
        if let Some(items) = c.items {
            let key = if c.kind == Kind::ConfigMap {
                "configMap"
            } else {
                "secret"
            };
            pod["spec"]["volumes"][0][key]["items"] = items;
        }
        if self.pod(c.spec, c.short, pod).await {
            self.expect_failed_mount(c.spec, c.short, volume, c.want)
                .await;
        }
    }
}
