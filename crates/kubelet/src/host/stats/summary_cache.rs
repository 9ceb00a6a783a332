//! One stats collection at a time (upstream reads stats cAdvisor collected
//! every 10 s; the summary provider itself keeps none): concurrent scrapes
//! share a summary younger than [`SUMMARY_REUSE`]. It also keeps what the
//! stats fallback carries between collections ([`StatsFallback`]).

use kubelet_server::stats::{StatsError, Summary};

use super::StatsFallback;

/// How long a collected summary answers further scrapes.
pub const SUMMARY_REUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// One stats collection at a time, shared by concurrent scrapes: a summary
/// younger than [`SUMMARY_REUSE`] is served again instead of asking the
/// runtime (metrics-server, Prometheus and `kubectl top` scraping at once
/// cost one collection). Upstream reads stats cAdvisor collected every 10 s.
#[derive(Default)]
pub struct SummaryCache {
    /// When the last collection started, whether it was full, and its result.
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, bool, Summary)>>,
    fallback: StatsFallback,
}

impl SummaryCache {
    /// The stats fallback's state across collections.
    pub fn fallback(&self) -> &StatsFallback {
        &self.fallback
    }

    /// The cached summary when fresh enough (and full when `full` is asked),
    /// else a new one from `collect`.
    pub async fn get_or_collect<F, Fut>(
        &self,
        full: bool,
        collect: F,
    ) -> Result<Summary, StatsError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Summary, StatsError>>,
    {
        let not_before = tokio::time::Instant::now()
            .checked_sub(SUMMARY_REUSE)
            .unwrap_or_else(tokio::time::Instant::now);
        self.get_or_collect_since(full, not_before, collect).await
    }

    /// The cached summary when its collection started at `not_before` or
    /// later, else a new one from `collect`. Eviction asks for one started
    /// when its pass starts, so it never ranks pods by stats taken
    /// before they ran.
    pub async fn get_or_collect_since<F, Fut>(
        &self,
        full: bool,
        not_before: tokio::time::Instant,
        collect: F,
    ) -> Result<Summary, StatsError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Summary, StatsError>>,
    {
        let mut last = self.last.lock().await;
        if let Some((started, was_full, s)) = last.as_ref()
            && *started >= not_before
            && (*was_full || !full)
        {
            return Ok(s.clone());
        }
        // The time the collection starts: what it reads is at least this new.
        let started = tokio::time::Instant::now();
        let s = collect().await?;
        *last = Some((started, full, s.clone()));
        Ok(s)
    }
}
