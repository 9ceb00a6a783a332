//! Start-up and teardown shared by the cluster-mode benchmarks (`api_bench`,
//! `churn_bench`): the apiserver double in this process, the kubelet-rs
//! binary as its own process (TLS bootstrap with the bootstrap token, then
//! registration), an admin client, and afterwards the removal of whatever
//! sandboxes of the node's pods the runtime still has.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use apiserver_double::{ApiServer, BOOTSTRAP_TOKEN, Options};
use tokio::time::Instant;

/// A running apiserver double with one registered kubelet-rs node.
pub struct Cluster {
    /// The apiserver double (in this process).
    pub api: ApiServer,
    /// A `system:masters` client of the double.
    pub admin: kube::Client,
    /// The kubelet-rs process (killed when dropped).
    pub kubelet: tokio::process::Child,
    /// The node's name (`<prefix>-<6 hex digits>`).
    pub node: String,
    /// Kubeconfigs, certificates, the kubelet's root dir and its log.
    pub work: tempfile::TempDir,
}

/// What to start.
pub struct Start<'a> {
    /// Path of the kubelet-rs binary.
    pub bin: &'a str,
    /// Prefix of the node name.
    pub node_prefix: &'a str,
    /// `--read-only-port` (0: off).
    pub read_only_port: u16,
    /// Further kubelet flags, after the harness's own.
    pub extra: &'a [String],
    /// Options of the apiserver double.
    pub options: Options,
    /// More flags, made once the double runs (e.g. a `--config` file that
    /// names its CA), given the work directory.
    pub config: Option<&'a ConfigFn>,
}

/// Writes files naming the running double into the work directory and
/// returns the flags that point the kubelet at them.
pub type ConfigFn = dyn Fn(&ApiServer, &std::path::Path) -> anyhow::Result<Vec<String>>;

impl Cluster {
    /// Starts the double and the kubelet and waits (60 s at most) until the
    /// Node is registered, then 2 s more for the node to settle (first
    /// status, lease).
    pub async fn start(s: Start<'_>) -> anyhow::Result<Self> {
        let api = ApiServer::start(s.options).await?;
        let work = tempfile::tempdir()?;
        let bootstrap = work.path().join("bootstrap.conf");
        api.write_token_kubeconfig(&bootstrap, BOOTSTRAP_TOKEN)?;
        let admin_conf = work.path().join("admin.conf");
        api.write_admin_kubeconfig(&admin_conf)?;
        let node = format!(
            "{}-{:06x}",
            s.node_prefix,
            rand::random::<u32>() & 0xff_ffff
        );
        let log = std::fs::File::create(work.path().join("kubelet.log"))?;
        let config = match s.config {
            Some(f) => f(&api, work.path())?,
            None => vec![],
        };
        let kubelet = tokio::process::Command::new(s.bin)
            .arg(format!(
                "--kubeconfig={}",
                work.path().join("kubelet.conf").display()
            ))
            .arg(format!("--bootstrap-kubeconfig={}", bootstrap.display()))
            .arg(format!("--cert-dir={}", work.path().join("pki").display()))
            .arg(format!("--root-dir={}", work.path().join("root").display()))
            .arg(format!("--hostname-override={node}"))
            .arg("--healthz-port=0")
            .arg("--address=127.0.0.1")
            .arg(format!("--read-only-port={}", s.read_only_port))
            .args(config)
            .args(s.extra)
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("start kubelet-rs")?;
        let admin = kubelet_client::from_kubeconfig(&admin_conf, 1000.0, 1000)
            .await?
            .0;
        let c = Cluster {
            api,
            admin,
            kubelet,
            node,
            work,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.api.get("nodes", "", &c.node).is_none() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(c.log()).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                bail!(
                    "node did not register; the kubelet's log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(c)
    }

    /// The kubelet's `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.work.path().join("root")
    }

    /// The kubelet's log file.
    pub fn log(&self) -> PathBuf {
        self.work.path().join("kubelet.log")
    }

    /// The kubelet's process id.
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.kubelet.id().context("kubelet pid")
    }

    /// Stops the kubelet, then stops and removes the sandboxes of this
    /// node's pods that the runtime at `endpoint` still has.
    pub async fn cleanup(&mut self, endpoint: &str) -> anyhow::Result<()> {
        use cri::RuntimeService;
        let _ = self.kubelet.start_kill();
        let _ = self.kubelet.wait().await;
        let rt = cri::RemoteRuntime::new(endpoint, None, Duration::from_secs(30))?;
        for s in rt.list_pod_sandbox(None).await? {
            if s.labels
                .get("io.kubernetes.pod.name")
                .is_some_and(|p| p.ends_with(&self.node))
            {
                let _ = rt.stop_pod_sandbox(&s.id).await;
                let _ = rt.remove_pod_sandbox(&s.id).await;
            }
        }
        Ok(())
    }
}

/// Gives the pod spec's first container the density shape's volumes: a
/// projected service-account token (the `kube-api-access` shape: token,
/// `ca.crt` from `kube-root-ca.crt`, the namespace), the ConfigMap
/// `configmap` at `/etc/cm` and an emptyDir at `/scratch`.
pub fn add_volumes(spec: &mut serde_json::Value, configmap: &str) {
    use serde_json::json;
    spec["containers"][0]["volumeMounts"] = json!([
        {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
        {"name": "cm", "mountPath": "/etc/cm"},
        {"name": "scratch", "mountPath": "/scratch"}]);
    spec["volumes"] = json!([
        {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}},
        {"name": "cm", "configMap": {"name": configmap}},
        {"name": "scratch", "emptyDir": {}}]);
}
