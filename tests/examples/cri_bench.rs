//! Helper for hack/bench.sh, talking CRI directly to containerd.
//!
//! `cri_bench floor N SUFFIX`: creates N sandboxes, each with one container,
//! concurrently, with exactly the configs kubelet-rs generates (what a kubelet
//! must do at minimum) and prints the time until
//! all are started, in ms. `cri_bench wait-running N SUFFIX`: polls until N
//! running containers belong to pods whose name ends in SUFFIX, prints ms.
//! `cri_bench cleanup SUFFIX`: stops and removes those pods' sandboxes.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use cri::{ImageService, RemoteRuntime, RuntimeService, pb};
use kubelet_podconfig::parse_pod_document;
use kubelet_runtime::{RuntimeConfig, generate_container_config, generate_sandbox_config};
use kubelet_types::Source;

const IMAGE: &str = "localhost:5000/busybox:1.35";

fn mine(labels: &HashMap<String, String>, suffix: &str) -> bool {
    labels
        .get("io.kubernetes.pod.name")
        .is_some_and(|n| n.ends_with(suffix))
}

async fn floor(rt: &RemoteRuntime, n: usize, suffix: &str) -> anyhow::Result<u128> {
    let image_ref = rt.pull_image(IMAGE, None, None).await?;
    // Exactly the sandboxes and containers kubelet-rs creates for the bench manifests.
    let cfg = RuntimeConfig::default();
    let mut pods = Vec::new();
    for i in 0..n {
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers: [{{name: c, image: \"{IMAGE}\", command: [sleep, \"3600\"]}}]\n"
        );
        let pod = parse_pod_document(
            &yaml,
            Source::File,
            &format!("/floor/p{i}.yaml"),
            suffix.trim_start_matches('-'),
        )?;
        pods.push(pod);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for pod in pods {
        let rt = rt.clone();
        let image_ref = image_ref.clone();
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            let sb_cfg = generate_sandbox_config(&cfg, &pod, 0);
            std::fs::create_dir_all(format!("{}/c", sb_cfg.log_directory))?;
            let sb = rt.run_pod_sandbox(sb_cfg.clone(), "").await?;
            let c = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .cloned()
                .unwrap_or_default();
            let mut c_cfg = generate_container_config(&cfg, &pod, &c, 0, &image_ref);
            // The kubelet also mounts a termination message file into each container.
            let msg = format!("/tmp/kubelet-rs-floor-{}", sb);
            std::fs::write(&msg, "")?;
            c_cfg.mounts.push(pb::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: msg,
                ..Default::default()
            });
            let id = rt.create_container(&sb, c_cfg, sb_cfg).await?;
            rt.start_container(&id).await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed().as_millis())
}

async fn wait_running(rt: &RemoteRuntime, n: usize, suffix: &str) -> anyhow::Result<u128> {
    let start = Instant::now();
    loop {
        let running = rt
            .list_containers(Some(pb::ContainerFilter {
                state: Some(pb::ContainerStateValue {
                    state: pb::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }))
            .await?
            .iter()
            .filter(|c| mine(&c.labels, suffix))
            .count();
        if running >= n {
            return Ok(start.elapsed().as_millis());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "only {running} of {n} running after 300s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cleanup(rt: &RemoteRuntime, suffix: &str) -> anyhow::Result<()> {
    for s in rt.list_pod_sandbox(None).await? {
        if mine(&s.labels, suffix) {
            // Gone already is fine: cleanup is idempotent.
            for r in [
                rt.stop_pod_sandbox(&s.id).await,
                rt.remove_pod_sandbox(&s.id).await,
            ] {
                if let Err(e) = r
                    && !e.is_not_found()
                {
                    return Err(e.into());
                }
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rt = RemoteRuntime::new(
        "unix:///run/containerd/containerd.sock",
        None,
        Duration::from_secs(120),
    )?;
    match args.get(1).map(String::as_str) {
        Some("floor") => {
            let n: usize = args.get(2).map_or(Ok(30), |s| s.parse())?;
            let suffix = args.get(3).cloned().unwrap_or_else(|| "bench".into());
            println!("{}", floor(&rt, n, &suffix).await?);
        }
        Some("wait-running") => {
            let n: usize = args.get(2).map_or(Ok(30), |s| s.parse())?;
            let suffix = args.get(3).cloned().unwrap_or_else(|| "bench".into());
            println!("{}", wait_running(&rt, n, &suffix).await?);
        }
        Some("cleanup") => cleanup(&rt, args.get(2).map_or("bench", String::as_str)).await?,
        _ => anyhow::bail!(
            "usage: cri_bench floor N SUFFIX | wait-running N SUFFIX | cleanup SUFFIX"
        ),
    }
    Ok(())
}
