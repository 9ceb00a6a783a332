//! The runtime's half of the stats provider (upstream
//! `pkg/kubelet/stats/cri_stats_provider.go`, read through the
//! instrumented runtime service): the sandboxes and containers to report,
//! and their stats from `ListContainerStats` and `ListPodSandboxStats`.
//!
//! One pod never takes the node's stats down. When a list call fails (as
//! containerd 1.6's `ListPodSandboxStats` does for everyone when it cannot
//! decode one sandbox's metrics), each chosen container and ready sandbox is
//! asked on its own (`ContainerStats`, `PodSandboxStats`) and only the ones
//! that fail are left out. The failed list call is then skipped for a while,
//! and the per-item calls are bounded (see [`super::batch_backoff`]): one
//! slow item costs a short deadline (and is then not asked for a minute),
//! one collection a few seconds, the items left out for lack of time are
//! asked first the next time, and a failure repeating every scrape is
//! logged at `warn` once. A pod without sandbox stats then reports the sum
//! of its containers, or its pod cgroup when its containers have none
//! either. A runtime older than CRI sandbox stats (`Unimplemented`, before
//! containerd 1.6) is handled the same way without the per-sandbox calls.
//! When a list call finds the runtime gone (unavailable, or past the
//! deadline), or an item call finds it unavailable, the rest is not asked:
//! the summary keeps what was read. Only the two lists of
//! sandboxes and containers are needed for a summary at all.
//!
//! Every call is counted as upstream's instrumented service counts it:
//! `kubelet_runtime_operations_total` and, for each failed call,
//! `kubelet_runtime_operations_errors_total{operation_type}` with
//! `list_container_stats`, `container_stats`, `list_podsandbox_stats`,
//! `podsandbox_stats`, `image_fs_info`, `list_podsandbox` or
//! `list_containers`; so a failing batch and each sandbox or container left
//! out (or not asked in time, or skipped after timing out) show there.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use cri::{CriError, RemoteRuntime, RuntimeService, pb};
use kubelet_metrics::KubeletMetrics;
use kubelet_runtime::instrumented::record;

use super::batch_backoff::{
    BATCH_BACKOFF, Batch, Budget, ITEM_BACKOFF, Outcome, Plan, StatsFallback, warn_once,
};
use super::{ChosenPod, choose};

/// The CRI calls a stats collection makes (upstream's `internalapi`
/// `RuntimeService` stats methods and `ImageFsInfo`).
#[async_trait::async_trait]
pub trait StatsRuntime: Send + Sync {
    /// Every sandbox (`ListPodSandbox`).
    async fn list_pod_sandbox(&self) -> Result<Vec<pb::PodSandbox>, CriError>;
    /// Every container (`ListContainers`).
    async fn list_containers(&self) -> Result<Vec<pb::Container>, CriError>;
    /// `ListContainerStats` without a filter.
    async fn list_container_stats(&self) -> Result<Vec<pb::ContainerStats>, CriError>;
    /// `ContainerStats` of one container.
    async fn container_stats(&self, id: &str) -> Result<Option<pb::ContainerStats>, CriError>;
    /// `ListPodSandboxStats` without a filter.
    async fn list_pod_sandbox_stats(&self) -> Result<Vec<pb::PodSandboxStats>, CriError>;
    /// `PodSandboxStats` of one sandbox.
    async fn pod_sandbox_stats(&self, id: &str) -> Result<Option<pb::PodSandboxStats>, CriError>;
    /// `ImageFsInfo`.
    async fn image_fs_info(&self) -> Result<pb::ImageFsInfoResponse, CriError>;
}

/// Runs one raw RPC of the generated client under the runtime's deadline.
macro_rules! with_deadline {
    ($op:expr, $timeout:expr, $call:expr) => {{
        let (op, timeout) = ($op, $timeout);
        match tokio::time::timeout(timeout, $call).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(CriError::from_status_with_deadline(op, status, timeout)),
            Err(_) => Err(CriError::Timeout { op, timeout }),
        }
    }};
}

#[async_trait::async_trait]
impl StatsRuntime for RemoteRuntime {
    async fn list_pod_sandbox(&self) -> Result<Vec<pb::PodSandbox>, CriError> {
        RuntimeService::list_pod_sandbox(self, None).await
    }

    async fn list_containers(&self) -> Result<Vec<pb::Container>, CriError> {
        RuntimeService::list_containers(self, None).await
    }

    async fn list_container_stats(&self) -> Result<Vec<pb::ContainerStats>, CriError> {
        let mut client = self.runtime_client();
        let req = pb::ListContainerStatsRequest { filter: None };
        let resp: pb::ListContainerStatsResponse = with_deadline!(
            "ListContainerStats",
            self.timeout(),
            client.list_container_stats(req)
        )?;
        Ok(resp.stats)
    }

    async fn container_stats(&self, id: &str) -> Result<Option<pb::ContainerStats>, CriError> {
        RemoteRuntime::container_stats(self, id).await
    }

    async fn list_pod_sandbox_stats(&self) -> Result<Vec<pb::PodSandboxStats>, CriError> {
        RemoteRuntime::list_pod_sandbox_stats(self, None).await
    }

    async fn pod_sandbox_stats(&self, id: &str) -> Result<Option<pb::PodSandboxStats>, CriError> {
        let mut client = self.runtime_client();
        let req = pb::PodSandboxStatsRequest {
            pod_sandbox_id: id.to_string(),
        };
        let resp: pb::PodSandboxStatsResponse = with_deadline!(
            "PodSandboxStats",
            self.timeout(),
            client.pod_sandbox_stats(req)
        )?;
        Ok(resp.stats)
    }

    async fn image_fs_info(&self) -> Result<pb::ImageFsInfoResponse, CriError> {
        RemoteRuntime::image_fs_info(self).await
    }
}

/// What the runtime told one collection.
pub(super) struct RuntimeSample {
    /// The pods to report, with their running containers.
    pub pods: Vec<ChosenPod>,
    /// Container stats by container ID (failed ones left out).
    pub containers: HashMap<String, pb::ContainerStats>,
    /// Sandbox stats by sandbox ID (failed ones left out).
    pub sandboxes: HashMap<String, pb::PodSandboxStats>,
    /// The image filesystem, when asked for and the runtime answered.
    pub image_fs: Option<pb::FilesystemUsage>,
}

/// The runtime is unavailable or past its deadline: asking it once per
/// sandbox or container would only wait longer.
fn runtime_gone(e: &CriError) -> bool {
    matches!(e, CriError::Unavailable { .. } | CriError::Timeout { .. })
}

fn unimplemented(e: &CriError) -> bool {
    matches!(
        e,
        CriError::Rpc {
            code: cri::Code::Unimplemented,
            ..
        }
    )
}

/// Reads the pods and their stats; fails only when the runtime cannot list
/// its sandboxes and containers. `full` adds the image filesystem.
pub(super) async fn gather(
    rt: &dyn StatsRuntime,
    metrics: &KubeletMetrics,
    fallback: &StatsFallback,
    pod_logs_dir: &Path,
    full: bool,
) -> Result<RuntimeSample, CriError> {
    let (sandboxes, containers) = tokio::try_join!(
        record(metrics, "list_podsandbox", rt.list_pod_sandbox()),
        record(metrics, "list_containers", rt.list_containers()),
    )?;
    let pods = choose(sandboxes, containers, pod_logs_dir);
    // One stats call at a time: containerd 1.6's stats calls race on its
    // sandbox store and can crash it ("concurrent map read and map write"
    // in getUsageNanoCores).
    let mut budget = Budget::default();
    let containers = container_stats(rt, metrics, &fallback.containers, &mut budget, &pods).await;
    let sandboxes = sandbox_stats(rt, metrics, &fallback.sandboxes, &mut budget, &pods).await;
    let image_fs = if full {
        match record(metrics, "image_fs_info", rt.image_fs_info()).await {
            Ok(r) => r.image_filesystems.into_iter().next(),
            Err(e) => {
                tracing::warn!(error = %e, "Unable to get image filesystem stats");
                None
            }
        }
    } else {
        None
    };
    Ok(RuntimeSample {
        pods,
        containers,
        sandboxes,
        image_fs,
    })
}

/// One of the two kinds of per-item stats calls.
#[derive(Clone, Copy)]
enum Item {
    Container,
    Sandbox,
}

impl Item {
    /// The CRI method and its `operation_type`.
    fn op(self) -> (&'static str, &'static str) {
        match self {
            Item::Container => ("ContainerStats", "container_stats"),
            Item::Sandbox => ("PodSandboxStats", "podsandbox_stats"),
        }
    }

    fn log_failure(self, first: bool, id: &str, e: &CriError) {
        match self {
            Item::Container => warn_once!(
                first,
                container.id = %id,
                error = %e,
                "Unable to get container stats; leaving them out"
            ),
            Item::Sandbox => warn_once!(
                first,
                sandbox.id = %id,
                error = %e,
                "Unable to get pod sandbox stats; leaving them out"
            ),
        }
    }
}

/// The fallback ran out of [`Budget`] (logged at `warn` once).
const OUT_OF_TIME: &str = "out of time";

/// An item call found the runtime unavailable or without the call (logged
/// at `warn` once).
const STOPPED: &str = "stopped";

/// Asks for the stats of each of `ids` (one call at a time, see [`gather`],
/// in the order of [`Batch::plan`]), each under
/// [`ITEM_TIMEOUT`](super::batch_backoff::ITEM_TIMEOUT) and all within the
/// collection's `budget`; the ones that fail, are not asked in time or are
/// skipped after timing out are left out and counted as failed.
async fn per_item<T, F, Fut>(
    metrics: &KubeletMetrics,
    batch: &Batch,
    budget: &mut Budget,
    item: Item,
    ids: Vec<String>,
    call: F,
) -> HashMap<String, T>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, CriError>>,
{
    let (op, op_type) = item.op();
    let Plan { ask, skipped } = batch.plan(ids);
    if !skipped.is_empty() {
        for _ in &skipped {
            metrics.record_runtime_operation(op_type, Duration::ZERO, true);
        }
        tracing::debug!(
            skipped = skipped.len(),
            operation = op,
            backoff = ?ITEM_BACKOFF,
            "Not asking for the stats of items that timed out recently"
        );
    }
    let mut out = HashMap::new();
    for (i, id) in ask.iter().enumerate() {
        let Some(timeout) = budget.next_timeout() else {
            let left = ask.len() - i;
            for _ in 0..left {
                metrics.record_runtime_operation(op_type, Duration::ZERO, true);
            }
            warn_once!(
                batch.first_condition(OUT_OF_TIME),
                left,
                operation = op,
                "Stats collection out of time; leaving out the rest"
            );
            break;
        };
        let call = tokio::time::timeout(timeout, call(id.clone()));
        let res = record(metrics, op_type, async {
            call.await.unwrap_or(Err(CriError::Timeout { op, timeout }))
        })
        .await;
        match res {
            Ok(s) => {
                batch.asked(id, Outcome::Answered);
                if let Some(s) = s {
                    out.insert(id.clone(), s);
                }
            }
            Err(e) if matches!(e, CriError::Unavailable { .. }) || unimplemented(&e) => {
                warn_once!(
                    batch.first_condition(STOPPED),
                    error = %e,
                    operation = op,
                    "Unable to get stats; leaving out the rest"
                );
                break;
            }
            Err(e) => {
                let outcome = match e {
                    CriError::Timeout { .. } => Outcome::TimedOut,
                    _ => Outcome::Failed,
                };
                item.log_failure(batch.asked(id, outcome), id, &e);
            }
        }
    }
    out
}

/// `ListContainerStats`, else (and for [`BATCH_BACKOFF`] after it failed)
/// `ContainerStats` of each chosen container.
async fn container_stats(
    rt: &dyn StatsRuntime,
    metrics: &KubeletMetrics,
    batch: &Batch,
    budget: &mut Budget,
    pods: &[ChosenPod],
) -> HashMap<String, pb::ContainerStats> {
    let by_id = |list: Vec<pb::ContainerStats>| {
        list.into_iter()
            .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
            .collect()
    };
    if batch.try_batch() {
        match record(metrics, "list_container_stats", rt.list_container_stats()).await {
            Ok(list) => {
                if batch.succeeded() {
                    tracing::info!("Listing container stats works again");
                }
                return by_id(list);
            }
            Err(e) if runtime_gone(&e) => {
                tracing::warn!(error = %e, "Unable to list container stats; reporting pods without them");
                return HashMap::new();
            }
            Err(e) => warn_once!(
                batch.failed(),
                error = %e,
                backoff = ?BATCH_BACKOFF,
                "Unable to list container stats; asking for each container"
            ),
        }
    }
    let ids = pods
        .iter()
        .flat_map(|p| &p.containers)
        .map(|c| c.container.id.clone())
        .collect();
    per_item(
        metrics,
        batch,
        budget,
        Item::Container,
        ids,
        |id| async move { rt.container_stats(&id).await },
    )
    .await
}

/// `ListPodSandboxStats`, else (and for [`BATCH_BACKOFF`] after it failed)
/// `PodSandboxStats` of each chosen ready sandbox; nothing from a runtime
/// without sandbox stats.
async fn sandbox_stats(
    rt: &dyn StatsRuntime,
    metrics: &KubeletMetrics,
    batch: &Batch,
    budget: &mut Budget,
    pods: &[ChosenPod],
) -> HashMap<String, pb::PodSandboxStats> {
    let by_id = |list: Vec<pb::PodSandboxStats>| {
        list.into_iter()
            .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
            .collect()
    };
    if batch.try_batch() {
        match record(
            metrics,
            "list_podsandbox_stats",
            rt.list_pod_sandbox_stats(),
        )
        .await
        {
            Ok(list) => {
                if batch.succeeded() {
                    tracing::info!("Listing pod sandbox stats works again");
                }
                return by_id(list);
            }
            Err(e) if unimplemented(&e) => {
                tracing::debug!(error = %e, "The runtime has no sandbox stats; pods report their containers");
                return HashMap::new();
            }
            Err(e) if runtime_gone(&e) => {
                tracing::warn!(error = %e, "Unable to list pod sandbox stats; reporting pods without them");
                return HashMap::new();
            }
            Err(e) => warn_once!(
                batch.failed(),
                error = %e,
                backoff = ?BATCH_BACKOFF,
                "Unable to list pod sandbox stats; asking for each sandbox"
            ),
        }
    }
    let ready = pb::PodSandboxState::SandboxReady as i32;
    let ids = pods
        .iter()
        .filter(|p| p.sandbox.state == ready)
        .map(|p| p.sandbox.id.clone())
        .collect();
    per_item(
        metrics,
        batch,
        budget,
        Item::Sandbox,
        ids,
        |id| async move { rt.pod_sandbox_stats(&id).await },
    )
    .await
}
