//! What the stats fallback of [`super::cri_stats`] carries from one
//! collection to the next (upstream `pkg/kubelet/stats/cri_stats_provider.go`
//! has no per-item fallback; this bounds ours): after `ListContainerStats` or
//! `ListPodSandboxStats` fails, the list call is skipped for
//! [`BATCH_BACKOFF`] and each item is asked directly, each under
//! [`ITEM_TIMEOUT`] and all of one collection within [`FALLBACK_BUDGET`].
//! So that the budget does not leave out the same items every time, the
//! items are asked least recently asked first and those that failed last
//! time after the others, and an item that timed out is not asked for
//! [`ITEM_BACKOFF`] ([`Batch::plan`]). A failure is logged at `warn` the
//! first time and at `debug` while it repeats: an item's until it answers,
//! the list call's and the fallback's own (out of time, stopped by the
//! runtime) until the list call works again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long a failed list call is not tried again.
pub const BATCH_BACKOFF: Duration = Duration::from_secs(5 * 60);

/// The deadline of one `ContainerStats` or `PodSandboxStats` call.
pub const ITEM_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an item whose call timed out is not asked again.
pub const ITEM_BACKOFF: Duration = Duration::from_secs(60);

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
    /// The fallbacks made since it last worked.
    round: u64,
    /// What the fallbacks learned of the items given to the latest one.
    items: HashMap<String, ItemState>,
    /// The fallback's own conditions logged at `warn` since it last worked.
    conditions: HashSet<&'static str>,
}

/// What the fallbacks learned of one item.
#[derive(Default)]
struct ItemState {
    /// The round it was last asked in (0: never).
    asked: u64,
    /// Its latest call failed or timed out.
    failed: bool,
    /// Its failure was logged at `warn` since it last answered.
    warned: bool,
    /// It timed out: it is not asked before this.
    skip_until: Option<Instant>,
}

/// How one item's call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// With stats or none.
    Answered,
    /// With an error.
    Failed,
    /// Past its deadline.
    TimedOut,
}

/// The items of one fallback: the ones to ask, in order, and the ones left
/// out because they timed out within [`ITEM_BACKOFF`].
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The items to ask, in this order.
    pub ask: Vec<String>,
    /// The items backing off after a timeout.
    pub skipped: Vec<String>,
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

    /// Starts a fallback over `ids` (forgetting items no longer among
    /// them). Those that timed out within [`ITEM_BACKOFF`] are skipped; the
    /// others are asked those whose latest call worked (or that were never
    /// asked) first, and within each group the least recently asked first,
    /// so the ones the budget left out last time come early this time.
    pub fn plan(&self, ids: Vec<String>) -> Plan {
        let mut st = self.0.lock();
        st.round += 1;
        let mut old = std::mem::take(&mut st.items);
        st.items = ids
            .iter()
            .map(|id| (id.clone(), old.remove(id).unwrap_or_default()))
            .collect();
        let now = Instant::now();
        let (skipped, mut ask): (Vec<_>, Vec<_>) = ids.into_iter().partition(|id| {
            st.items
                .get(id)
                .and_then(|s| s.skip_until)
                .is_some_and(|t| now < t)
        });
        ask.sort_by_key(|id| st.items.get(id).map(|s| (s.failed, s.asked)));
        Plan { ask, skipped }
    }

    /// Records how the call of the item `id` ended; an item that timed out
    /// is skipped for [`ITEM_BACKOFF`]. True when its failure is to be
    /// logged at `warn`: the first since it last answered.
    pub fn asked(&self, id: &str, outcome: Outcome) -> bool {
        let mut st = self.0.lock();
        let round = st.round;
        let s = st.items.entry(id.to_string()).or_default();
        s.asked = round;
        s.failed = outcome != Outcome::Answered;
        s.skip_until = (outcome == Outcome::TimedOut).then(|| Instant::now() + ITEM_BACKOFF);
        let first = s.failed && !s.warned;
        s.warned = s.failed;
        first
    }

    /// Whether the fallback's own `condition` is to be logged at `warn`:
    /// the first time since the list call last worked.
    pub fn first_condition(&self, condition: &'static str) -> bool {
        self.0.lock().conditions.insert(condition)
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

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn warns_once_per_failure_and_again_after_recovery() {
        let b = Batch::default();
        assert!(b.try_batch());
        assert!(b.failed(), "the first failure warns");
        assert!(!b.try_batch(), "backing off");
        tokio::time::advance(BATCH_BACKOFF).await;
        assert!(b.try_batch());
        assert!(!b.failed(), "a repeat is debug");
        b.plan(ids(&["c1"]));
        assert!(b.asked("c1", Outcome::Failed));
        assert!(b.first_condition("out of time"));
        b.plan(ids(&["c1"]));
        assert!(!b.asked("c1", Outcome::Failed), "a repeating item is debug");
        assert!(!b.first_condition("out of time"), "so is a condition");
        b.plan(ids(&["c1"]));
        assert!(!b.asked("c1", Outcome::Answered));
        b.plan(ids(&["c1"]));
        assert!(b.asked("c1", Outcome::Failed), "warns after answering");
        assert!(b.succeeded(), "recovery is reported");
        b.plan(ids(&["c1"]));
        assert!(b.asked("c1", Outcome::Failed));
        assert!(b.first_condition("out of time"));
        assert!(b.failed(), "warns again after recovering");
    }

    #[tokio::test(start_paused = true)]
    async fn items_left_out_or_answering_are_asked_first_and_timed_out_ones_wait() {
        let b = Batch::default();
        let all = ids(&["a", "b", "c", "d", "e"]);
        let plan = b.plan(all.clone());
        assert_eq!(plan.ask, all, "the given order at first");
        b.asked("a", Outcome::TimedOut);
        b.asked("b", Outcome::Failed);
        b.asked("c", Outcome::Answered);
        // d and e: not asked in time.
        let plan = b.plan(all.clone());
        assert_eq!(plan.ask, ids(&["d", "e", "c", "b"]));
        assert_eq!(plan.skipped, ids(&["a"]), "timed out: backing off");
        b.asked("d", Outcome::Answered);
        // e, c, b: not asked in time.
        tokio::time::advance(ITEM_BACKOFF).await;
        let plan = b.plan(all.clone());
        assert_eq!(plan.ask, ids(&["e", "c", "d", "a", "b"]));
        assert!(plan.skipped.is_empty(), "asked again after the backoff");
        b.asked("e", Outcome::Answered);
        let plan = b.plan(ids(&["e", "f"]));
        assert_eq!(plan.ask, ids(&["f", "e"]), "gone items are forgotten");
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
