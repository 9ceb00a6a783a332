//! Cluster-mode fixtures: the apiserver double, a kubelet that bootstraps
//! against it, and an admin client.

use std::time::Duration;

use apiserver_double::{ApiServer, BOOTSTRAP_TOKEN, Options};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use crate::{BUSYBOX, Node};

/// A kubelet joined to an apiserver double.
pub struct Joined {
    /// The double.
    pub api: ApiServer,
    /// The kubelet.
    pub node: Node,
    /// Admin client.
    pub admin: kube::Client,
}

impl Joined {
    /// Starts a double, then a kubelet with only a bootstrap kubeconfig (TLS bootstrap).
    pub async fn start(options: Options) -> Joined {
        Self::start_with(options, |_, _| {}).await
    }

    /// [`Joined::start`] with `tweak` applied to the kubelet's flags last
    /// (it sees the running double, e.g. to write a config file naming its CA).
    pub async fn start_with(
        options: Options,
        tweak: impl FnOnce(&mut kubelet_config::Flags, &ApiServer),
    ) -> Joined {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = ApiServer::start(options).await.expect("double");
        let conf = tempfile::tempdir().expect("tmp").keep();
        let bootstrap = conf.join("bootstrap-kubelet.conf");
        api.write_token_kubeconfig(&bootstrap, BOOTSTRAP_TOKEN)
            .expect("bootstrap kubeconfig");
        let admin_conf = conf.join("admin.conf");
        api.write_admin_kubeconfig(&admin_conf)
            .expect("admin kubeconfig");
        let node = Node::start(|f| {
            f.kubeconfig = Some(conf.join("kubelet.conf"));
            f.bootstrap_kubeconfig = Some(bootstrap.clone());
            f.cert_dir = Some(conf.join("pki"));
            tweak(f, &api);
        })
        .await;
        let admin = kubelet_client::from_kubeconfig(&admin_conf, 1000.0, 1000)
            .await
            .expect("admin client")
            .0;
        Joined { api, node, admin }
    }

    /// The name an API pod gets in tests: suffixed with the node name, so the
    /// harness finds and cleans up its containers like static pods'.
    pub fn pod_name(&self, name: &str) -> String {
        self.node.pod_name(name)
    }

    /// The events about pod `name` as `(type, reason, message)`.
    pub fn pod_events(&self, name: &str) -> Vec<(String, String, String)> {
        let full = self.pod_name(name);
        self.api
            .list("events")
            .iter()
            .filter(|e| e["involvedObject"]["name"] == full.as_str())
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                (s("type"), s("reason"), s("message"))
            })
            .collect()
    }

    /// Waits up to `within` for an event about pod `name` that `want` accepts
    /// (events are posted apart from the pod's status, so either may land
    /// first); returns the pod's events either way, for the caller's assert.
    pub async fn wait_pod_event(
        &self,
        name: &str,
        within: Duration,
        want: impl Fn(&str, &str, &str) -> bool,
    ) -> Vec<(String, String, String)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let events = self.pod_events(name);
            if events.iter().any(|(t, r, m)| want(t, r, m))
                || tokio::time::Instant::now() >= deadline
            {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The node's condition `ty` as `(status, reason, message)`.
    pub fn node_condition(&self, ty: &str) -> Option<(String, String, String)> {
        let n = self.api.get("nodes", "", &self.node.name)?;
        let c = n["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == ty)?
            .clone();
        let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
        Some((s("status"), s("reason"), s("message")))
    }

    /// Creates a pod bound to this node from a spec fragment.
    pub async fn create_pod(&self, name: &str, spec: Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!(self.node.name);
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": self.pod_name(name), "namespace": "default"},
            "spec": spec,
        }))
        .expect("pod");
        Api::<Pod>::namespaced(self.admin.clone(), "default")
            .create(&PostParams::default(), &p)
            .await
            .expect("create pod")
    }

    /// A pod's object in the apiserver.
    pub fn api_pod(&self, name: &str) -> Option<Value> {
        self.api.get("pods", "default", &self.pod_name(name))
    }

    /// Waits until `pred` holds for the stored object of pod `name` (or its absence).
    pub async fn wait_api(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(Option<&Value>) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let p = self.api_pod(name);
            if pred(p.as_ref()) {
                return p;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {name}: not {what} within {timeout:?}; last: {}",
                serde_json::to_string_pretty(&p).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the kubelet and removes its pods' sandboxes, then checks that
    /// every request the kubelet sent is in `docs/api-compatibility.md`.
    pub async fn cleanup(self) {
        self.node.cleanup().await;
        crate::api_compat::assert_documented(&self.api.requests());
    }
}

/// A long-running busybox container spec with a short grace period.
pub fn sleeper(cmd: &str) -> Value {
    json!({
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", cmd]}]
    })
}

/// The phase in a stored pod.
pub fn phase(p: Option<&Value>) -> Option<&str> {
    p.and_then(|p| p["status"]["phase"].as_str())
}

/// Whether the stored pod's condition `t` is True.
pub fn condition(p: Option<&Value>, t: &str) -> bool {
    p.and_then(|p| p["status"]["conditions"].as_array())
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
}
