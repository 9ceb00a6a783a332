//! What the stats fallback of [`super::cri_stats`] carries from one
//! collection to the next (upstream `pkg/kubelet/stats/cri_stats_provider.go`
//! has no per-item fallback; this bounds ours): after `ListContainerStats` or
//! `ListPodSandboxStats` fails, the list call is skipped for
//! [`BATCH_BACKOFF`] and each item is asked directly, each under
//! [`ITEM_TIMEOUT`] and all of one collection within [`FALLBACK_BUDGET`].
//! A failure is logged at `warn` the first time and at `debug` while it
//! repeats, until the list call works again.

use std::collections::HashSet;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long a failed list call is not tried again.
pub const BATCH_BACKOFF: Duration = Duration::from_secs(5 * 60);

/// The deadline of one `ContainerStats` or `PodSandboxStats` call.
pub const ITEM_TIMEOUT: Duration = Duration::from_secs(2);

/// All per-item calls of one collection end by then; the items not asked
/// are left out and counted as failed.
pub const FALLBACK_BUDGET: Duration = Duration::from_secs(10);

/// The state of one list call and its per-item fallback.
#[derive(Default)]
struct BatchState {
    /// The list call is not made before this.
    skip_until: Option<Instant>,
    /// Its failure was logged at `warn` since it last worked.
    warned: bool,
    /// Items whose failure was logged at `warn` at the previous fallback.
    failing: HashSet<String>,
}

/// One list call's backoff and log state.
#[derive(Default)]
pub struct Batch(Mutex<BatchState>);

impl Batch {
    /// Whether the list call should be made now.
    pub fn try_batch(&self) -> bool {
        self.0.lock().skip_until.is_none_or(|t| Instant::now() >= t)
    }

    /// The list call worked: back to list calls, and warn again on the next
    /// failure. True when it had failed before (worth saying it recovered).
    pub fn succeeded(&self) -> bool {
        let mut st = self.0.lock();
        let was = st.warned;
        *st = BatchState::default();
        was
    }

    /// The list call failed: skip it for [`BATCH_BACKOFF`]. True when this
    /// failure is to be logged at `warn` (the first since it worked).
    pub fn failed(&self) -> bool {
        let mut st = self.0.lock();
        st.skip_until = Some(Instant::now() + BATCH_BACKOFF);
        !std::mem::replace(&mut st.warned, true)
    }

    /// Whether the failure of the item `id` is to be logged at `warn`: it
    /// did not fail at the previous fallback.
    pub fn first_item_failure(&self, id: &str) -> bool {
        !self.0.lock().failing.contains(id)
    }

    /// The items that failed at this fallback, for the next one.
    pub fn items_failed(&self, ids: HashSet<String>) {
        self.0.lock().failing = ids;
    }
}

/// The state of the stats fallback that outlives one collection.
#[derive(Default)]
pub struct StatsFallback {
    /// `ListContainerStats`.
    pub containers: Batch,
    /// `ListPodSandboxStats`.
    pub sandboxes: Batch,
}

/// The time left of one collection's per-item calls; it starts with the
/// first of them.
#[derive(Default)]
pub struct Budget {
    until: Option<Instant>,
}

impl Budget {
    /// The deadline of the next per-item call, or `None` when the budget is
    /// spent.
    pub fn next_timeout(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let until = *self.until.get_or_insert(now + FALLBACK_BUDGET);
        let left = until.saturating_duration_since(now);
        (!left.is_zero()).then(|| left.min(ITEM_TIMEOUT))
    }
}

/// Logs at `warn` when `$first`, else at `debug`.
macro_rules! warn_once {
    ($first:expr, $($arg:tt)+) => {
        if $first {
            tracing::warn!($($arg)+)
        } else {
            tracing::debug!($($arg)+)
        }
    };
}
pub(super) use warn_once;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn warns_once_per_failure_and_again_after_recovery() {
        let b = Batch::default();
        assert!(b.try_batch());
        assert!(b.failed(), "the first failure warns");
        assert!(!b.try_batch(), "backing off");
        tokio::time::advance(BATCH_BACKOFF).await;
        assert!(b.try_batch());
        assert!(!b.failed(), "a repeat is debug");
        assert!(b.first_item_failure("c1"));
        b.items_failed(HashSet::from(["c1".to_string()]));
        assert!(!b.first_item_failure("c1"), "a repeating item is debug");
        assert!(b.succeeded(), "recovery is reported");
        assert!(b.first_item_failure("c1"));
        assert!(b.failed(), "warns again after recovering");
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_starts_with_the_first_call() {
        let mut budget = Budget::default();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(budget.next_timeout(), Some(ITEM_TIMEOUT));
        tokio::time::advance(FALLBACK_BUDGET - Duration::from_secs(1)).await;
        assert_eq!(budget.next_timeout(), Some(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(budget.next_timeout(), None);
    }
}
