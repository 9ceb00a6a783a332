//! CSI start-up benchmark: `csi_bench [N]` (default 30) runs a kubelet
//! joined to the apiserver double (in this process, on real containerd, as
//! the integration tests do), then binds N pods without volumes at once and
//! prints the milliseconds until all are Running; deletes them; then
//! registers the test host-path CSI driver, binds N pods each with its own
//! claim bound to a CSI PV (staged and published by the driver) and prints
//! the milliseconds until all are Running. Output: `<no-volume ms> <csi ms>`.

use std::time::Duration;

use anyhow::{Context, bail};
use apiserver_double::Options;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::Joined;
use kubelet_test_util::csi_driver::api::{DriverSpec, create_csi_driver, csi_pv};
use kubelet_test_util::csi_driver::{CsiDriver, DriverConfig};
use serde_json::{Value, json};
use tokio::time::Instant;

const DRIVER: &str = "bench.csi.kubelet-rs.test";
const LIMIT: Duration = Duration::from_secs(300);

fn spec(volume: Option<&str>) -> Value {
    let mut s = json!({"terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"]}]});
    if let Some(claim) = volume {
        s["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
        s["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    }
    s
}

/// Creates the pods at once; the milliseconds until all are Running.
async fn burst(j: &Joined, names: &[String], claims: bool) -> anyhow::Result<u128> {
    let start = Instant::now();
    let creates = names.iter().map(|n| {
        let claim = claims.then(|| format!("claim-{n}"));
        j.create_pod(n, spec(claim.as_deref()))
    });
    futures::future::join_all(creates).await;
    loop {
        let running = names
            .iter()
            .filter(|n| {
                j.api_pod(n)
                    .is_some_and(|p| p["status"]["phase"] == "Running")
            })
            .count();
        if running == names.len() {
            return Ok(start.elapsed().as_millis());
        }
        if start.elapsed() > LIMIT {
            bail!(
                "only {running}/{} pods Running after {LIMIT:?}",
                names.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn delete_all(j: &Joined, names: &[String]) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(j.admin.clone(), "default");
    for n in names {
        pods.delete(&j.pod_name(n), &DeleteParams::default())
            .await?;
    }
    let start = Instant::now();
    while names.iter().any(|n| j.api_pod(n).is_some()) {
        if start.elapsed() > LIMIT {
            bail!("pods not gone after {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A claim `claim-<name>` bound to a CSI PV of volume `vol-<name>`.
async fn bound_claim(j: &Joined, driver: &CsiDriver, name: &str) -> anyhow::Result<()> {
    let (claim, pv, handle) = (
        format!("claim-{name}"),
        format!("pv-{name}"),
        format!("vol-{name}"),
    );
    std::fs::create_dir_all(driver.volume_path(&handle))?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(j.admin.clone(), "default");
    let c: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}}}
    }))?;
    let c = claims.create(&PostParams::default(), &c).await?;
    let mut v = csi_pv(
        &pv,
        DRIVER,
        &handle,
        ("default", &claim),
        None,
        None,
        "Filesystem",
    );
    v["spec"]["claimRef"]["uid"] = json!(c.metadata.uid);
    let v: PersistentVolume = serde_json::from_value(v)?;
    Api::<PersistentVolume>::all(j.admin.clone())
        .create(&PostParams::default(), &v)
        .await?;
    claims
        .patch_status(
            &claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound",
                "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}})),
        )
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(30);
    let j = Joined::start(Options::default()).await;
    // Let the node settle (first status, lease) before the burst.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let plain: Vec<String> = (0..n).map(|i| format!("plain{i}")).collect();
    let plain_ms = burst(&j, &plain, false).await?;
    delete_all(&j, &plain).await?;

    create_csi_driver(
        &j.admin,
        DRIVER,
        &DriverSpec {
            attach_required: Some(false),
            ..DriverSpec::default()
        },
    )
    .await?;
    let data = tempfile::tempdir()?;
    let driver = CsiDriver::start_in_root(
        DriverConfig::new(DRIVER, &j.node.name, data.path()),
        &j.node.root_dir(),
    )
    .await?;
    let status = driver
        .wait_registration(Duration::from_secs(60))
        .await
        .context("the driver never registered")?;
    if !status.registered {
        bail!("registration refused: {}", status.error);
    }
    let csi: Vec<String> = (0..n).map(|i| format!("csi{i}")).collect();
    for name in &csi {
        bound_claim(&j, &driver, name).await?;
    }
    let csi_ms = burst(&j, &csi, true).await?;
    delete_all(&j, &csi).await?;
    println!("{plain_ms} {csi_ms}");
    drop(driver);
    j.node.cleanup().await;
    Ok(())
}
