//! The kubelet host as the summary provider (upstream `SummaryProvider`
//! over the CRI stats provider): where a collection reads from, and which
//! collections a reader may share ([`super::SummaryCache`]).

use std::path::Path;

use kubelet_server::stats::{StatsError, StatsProvider, Summary};

use super::{Collector, volumes};
use crate::host::KubeletHost;

impl KubeletHost {
    fn collector(&self) -> Collector<'_> {
        Collector {
            rt: &self.remote,
            metrics: &self.metrics,
            pod_cache: &self.pod_cache,
            cpu_usage: &self.cpu_usage,
            fallback: self.summary_cache.fallback(),
            node_name: &self.node_name,
            root_dir: &self.root_dir,
            pod_logs_dir: &self.pod_logs_dir,
            cgroup_root: Path::new("/sys/fs/cgroup"),
            proc_root: Path::new("/proc"),
            pod_cgroups: Some(self.pod_cgroups.clone()),
        }
    }
}

impl KubeletHost {
    /// A full summary whose collection started at `not_before` or later
    /// (eviction: pod stats no older than its pass).
    pub async fn summary_since(
        &self,
        not_before: tokio::time::Instant,
    ) -> Result<Summary, StatsError> {
        self.summary_cache
            .get_or_collect_since(true, not_before, || self.collect_full())
            .await
    }

    async fn collect_full(&self) -> Result<Summary, StatsError> {
        let s = self.collector().collect(true).await?;
        Ok(volumes::with_csi_volume_stats(self.csi.as_deref(), s).await)
    }
}

#[async_trait::async_trait]
impl StatsProvider for KubeletHost {
    async fn summary(&self) -> Result<Summary, StatsError> {
        self.summary_cache
            .get_or_collect(true, || self.collect_full())
            .await
    }

    async fn cpu_and_memory_stats(&self) -> Result<Summary, StatsError> {
        // A full summary collected moments ago serves as well.
        let s = self
            .summary_cache
            .get_or_collect(false, || self.collector().collect(false))
            .await?;
        Ok(s.cpu_and_memory_only())
    }
}
