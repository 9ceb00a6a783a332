//! Shared parts of the CSI tests: a kubelet joined to the double with the
//! test driver registered, the control plane's objects, pod specs and waits.

use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubelet_rs_integration::cluster::Joined;
use kubelet_rs_integration::*;
use kubelet_test_util::csi_driver::api::{DriverSpec, create_csi_driver, csi_pv};
use kubelet_test_util::csi_driver::{CsiDriver, DriverConfig, Request};
use serde_json::{Value, json};
use tonic::Code;

pub(crate) const T: Duration = Duration::from_secs(60);
pub(crate) const DRIVER: &str = "hostpath.csi.kubelet-rs.test";

/// A kubelet joined to the double, with the test driver registered.
pub(crate) struct Env {
    pub(crate) j: Joined,
    pub(crate) driver: CsiDriver,
    pub(crate) _data: tempfile::TempDir,
}

impl Env {
    /// [`Env::start`] with the driver configured by `cfg` before it
    /// registers, and without a CSIDriver object when `spec` is `None`
    /// (upstream csi_mock's `registerDriver: false`).
    pub(crate) async fn start_with(
        spec: Option<DriverSpec>,
        cfg: impl FnOnce(&mut DriverConfig),
    ) -> Env {
        let j = Joined::start_with(Options::default(), |f, _| {
            f.node_status_update_frequency = Some("1s".into());
        })
        .await;
        if let Some(spec) = &spec {
            create_csi_driver(&j.admin, DRIVER, spec)
                .await
                .expect("CSIDriver");
        }
        let data = tempfile::tempdir().expect("data dir");
        let mut config = DriverConfig::new(DRIVER, &j.node.name, data.path());
        cfg(&mut config);
        let driver = CsiDriver::start_in_root(config, &j.node.root_dir())
            .await
            .expect("driver");
        let status = driver.wait_registration(T).await.expect("registration");
        assert!(status.registered, "registration refused: {}", status.error);
        let env = Env {
            j,
            driver,
            _data: data,
        };
        env.wait_csi_node_lists_driver().await;
        env
    }

    /// Replaces the driver's CSIDriver object with one of `spec`, or
    /// removes it (the driver's deployment changed).
    pub(crate) async fn set_csi_driver(&self, spec: Option<&DriverSpec>) {
        use k8s_openapi::api::storage::v1::CSIDriver;
        let api = Api::<CSIDriver>::all(self.j.admin.clone());
        if api.get_opt(DRIVER).await.expect("get CSIDriver").is_some() {
            api.delete(DRIVER, &Default::default())
                .await
                .expect("delete CSIDriver");
        }
        if let Some(spec) = spec {
            create_csi_driver(&self.j.admin, DRIVER, spec)
                .await
                .expect("CSIDriver");
        }
    }

    /// Upstream csi_mock's `compareCSICalls`: the driver's calls of the
    /// `tracked` methods, repeats of one method and code squashed into one,
    /// must be a prefix of `expected`; how many matched, or what differs.
    pub(crate) fn compare_calls(
        &self,
        tracked: &[&str],
        expected: &[(&str, Code)],
    ) -> Result<usize, String> {
        let mut got: Vec<(&str, Code)> = Vec::new();
        for c in self.driver.calls() {
            if tracked.contains(&c.method) && got.last() != Some(&(c.method, c.code)) {
                got.push((c.method, c.code));
            }
        }
        for (i, call) in got.iter().enumerate() {
            match expected.get(i) {
                Some(want) if want == call => {}
                Some(want) => {
                    return Err(format!(
                        "unexpected CSI call {i}: expected {want:?}, got {call:?}; calls {got:?}"
                    ));
                }
                None => {
                    return Err(format!(
                        "{} unexpected CSI driver calls: {got:?}",
                        got.len() - expected.len()
                    ));
                }
            }
        }
        Ok(got.len())
    }

    /// Waits until the first `upto` calls of `expected` came (see
    /// [`Env::compare_calls`]); panics at an unexpected call.
    pub(crate) async fn wait_calls(
        &self,
        tracked: &[&str],
        expected: &[(&str, Code)],
        upto: usize,
    ) {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            match self.compare_calls(tracked, expected) {
                Ok(n) if n >= upto => return,
                Ok(n) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "only {n} of the expected calls {expected:?} came"
                ),
                Err(e) => panic!("{e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The claim `name`'s stored object.
    pub(crate) fn claim(&self, name: &str) -> Option<Value> {
        self.j.api.get("persistentvolumeclaims", "default", name)
    }

    pub(crate) async fn start(spec: DriverSpec) -> Env {
        Self::start_with(Some(spec), |_| {}).await
    }

    pub(crate) async fn wait_csi_node_lists_driver(&self) {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let node = self.j.api.get("csinodes", "", &self.j.node.name);
            let listed = node.as_ref().is_some_and(|n| {
                n["spec"]["drivers"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d["name"] == DRIVER))
            });
            if listed {
                let d = &node.as_ref().expect("csinode")["spec"]["drivers"][0];
                assert_eq!(d["nodeID"], self.j.node.name.as_str());
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "CSINode never listed the driver: {node:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A claim `claim` bound to a CSI PV `pv` of volume `handle`, whose
    /// data directory holds `hello` with `content`.
    pub(crate) async fn bound_claim(&self, claim: &str, pv: &str, handle: &str, content: &str) {
        let dir = self.driver.volume_path(handle);
        std::fs::create_dir_all(&dir).expect("volume dir");
        std::fs::write(dir.join("hello"), content).expect("volume file");
        self.bind(claim, pv, handle, "Filesystem").await;
    }

    /// A claim `claim` with `volumeMode` `mode` bound to a CSI PV `pv` of
    /// volume `handle` with the same mode.
    pub(crate) async fn bind(&self, claim: &str, pv: &str, handle: &str, mode: &str) {
        let claims = Api::<PersistentVolumeClaim>::namespaced(self.j.admin.clone(), "default");
        let c: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv, "volumeMode": mode,
                "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("pvc");
        let c = claims
            .create(&PostParams::default(), &c)
            .await
            .expect("create pvc");
        let mut v = csi_pv(pv, DRIVER, handle, ("default", claim), None, None, mode);
        v["spec"]["claimRef"]["uid"] = json!(c.metadata.uid);
        let v: PersistentVolume = serde_json::from_value(v).expect("pv");
        Api::<PersistentVolume>::all(self.j.admin.clone())
            .create(&PostParams::default(), &v)
            .await
            .expect("create pv");
        claims
            .patch_status(
                claim,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound",
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}})),
            )
            .await
            .expect("bind");
    }

    pub(crate) async fn delete_pod(&self, name: &str) {
        Api::<Pod>::namespaced(self.j.admin.clone(), "default")
            .delete(&self.j.pod_name(name), &Default::default())
            .await
            .expect("delete pod");
        self.j.wait_api(name, T, "gone", |p| p.is_none()).await;
    }

    pub(crate) async fn call(&self, method: &str) -> Request {
        self.driver
            .wait_for_call(method, Code::Ok, T)
            .await
            .unwrap_or_else(|| panic!("no successful {method}: {:?}", self.driver.calls()))
            .request
    }

    pub(crate) fn ok_calls(&self, method: &str) -> usize {
        self.driver
            .calls_of(method)
            .iter()
            .filter(|c| c.code == Code::Ok)
            .count()
    }

    /// Waits until the Node object's `status.volumesInUse` lists the
    /// device `handle` of the test driver (`listed`), or no longer does.
    pub(crate) async fn wait_volume_in_use(&self, handle: &str, listed: bool) {
        let want = format!("kubernetes.io/csi/{DRIVER}^{handle}");
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let node = self.j.api.get("nodes", "", &self.j.node.name);
            let in_use: Vec<String> = node
                .as_ref()
                .and_then(|n| n["status"]["volumesInUse"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            if in_use.contains(&want) == listed {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "status.volumesInUse {in_use:?} never {} {want}",
                if listed { "listed" } else { "dropped" }
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
    pub(crate) fn staging(&self, handle: &str) -> PathBuf {
        self.j
            .node
            .root_dir()
            .join("plugins/kubernetes.io/csi")
            .join(DRIVER)
            .join(kubelet_csi::paths::sha256_hex(handle))
            .join("globalmount")
    }

    pub(crate) fn pods_dir(&self) -> PathBuf {
        self.j.node.root_dir().join("pods")
    }
}

pub(crate) fn uid(p: &Option<Value>) -> String {
    p.as_ref()
        .and_then(|p| p["metadata"]["uid"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// What container `main` of the pod printed.
pub(crate) fn log_of(j: &Joined, name: &str, uid: &str) -> String {
    let path = kubelet_rs_integration::pod_logs_dir()
        .join(format!("default_{}_{uid}", j.pod_name(name)))
        .join("main/0.log");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) async fn wait_log(j: &Joined, name: &str, uid: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + T;
    while !log_of(j, name, uid).contains(want) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "log never had {want:?}: {:?}",
            log_of(j, name, uid)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn wait_gone(path: &Path) {
    let deadline = tokio::time::Instant::now() + T;
    while path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} stayed",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn claim_pod(claim: &str) -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX,
            "command": ["sh", "-c", "cat /data/hello; echo; echo from-pod > /data/written; sleep 3600"],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    })
}

pub(crate) fn inline_pod() -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX,
            "command": ["sh", "-c", "echo inline > /data/file; cat /data/file; sleep 3600"],
            "volumeMounts": [{"name": "scratch", "mountPath": "/data"}]}],
        "volumes": [{"name": "scratch", "csi": {"driver": DRIVER,
            "volumeAttributes": {"size": "1Mi"}}}]
    })
}

pub(crate) fn ephemeral_spec() -> DriverSpec {
    DriverSpec {
        attach_required: Some(false),
        pod_info_on_mount: Some(true),
        volume_lifecycle_modes: vec!["Persistent".into(), "Ephemeral".into()],
        ..DriverSpec::default()
    }
}
