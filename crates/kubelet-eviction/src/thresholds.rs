//! Which thresholds are met, for how long, and which node conditions they
//! raise (upstream `thresholdsMet`, `mergeThresholds`,
//! `thresholdsFirstObservedAt`, `thresholdsMetGracePeriod`,
//! `nodeConditions`, `nodeConditionsLastObservedAt`,
//! `nodeConditionsObservedSince`, `thresholdsUpdatedStats`).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::{NodeCondition, Threshold};
use crate::stats::{Observation, Observations};

/// The quantity a threshold stands for given its observation, plus its
/// minimum reclaim when `with_min_reclaim`.
pub fn threshold_quantity(t: &Threshold, o: &Observation, with_min_reclaim: bool) -> i64 {
    let format = t.signal.resource().format();
    let mut q = t.value.quantity(o.capacity, format).value();
    if with_min_reclaim && let Some(m) = &t.min_reclaim {
        q = q.saturating_add(m.quantity(o.capacity, format).value());
    }
    q
}

/// Upstream `thresholdsMet`: the thresholds whose signal is below them
/// (plus minimum reclaim when `enforce_min_reclaim`), grace periods aside.
pub fn met(
    thresholds: &[Threshold],
    obs: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            obs.get(&t.signal)
                .is_some_and(|o| threshold_quantity(t, o, enforce_min_reclaim) > o.available)
        })
        .copied()
        .collect()
}

/// Upstream `mergeThresholds`.
pub fn merge(mut a: Vec<Threshold>, b: Vec<Threshold>) -> Vec<Threshold> {
    for t in b {
        if !a.iter().any(|x| x.same(&t)) {
            a.push(t);
        }
    }
    a
}

/// When each threshold was first met (upstream `thresholdsObservedAt`).
pub type FirstObserved = Vec<(Threshold, Instant)>;

/// Upstream `thresholdsFirstObservedAt`.
pub fn first_observed(
    thresholds: &[Threshold],
    last: &FirstObserved,
    now: Instant,
) -> FirstObserved {
    thresholds
        .iter()
        .map(|t| {
            let at = last
                .iter()
                .find(|(l, _)| l.same(t))
                .map_or(now, |(_, at)| *at);
            (*t, at)
        })
        .collect()
}

/// Upstream `thresholdsMetGracePeriod`.
pub fn met_grace_period(observed: &FirstObserved, now: Instant) -> Vec<Threshold> {
    observed
        .iter()
        .filter(|(t, at)| now.duration_since(*at) >= t.grace_period)
        .map(|(t, _)| *t)
        .collect()
}

/// Upstream `nodeConditions`.
pub fn node_conditions(thresholds: &[Threshold]) -> Vec<NodeCondition> {
    let mut out: Vec<NodeCondition> = Vec::new();
    for t in thresholds {
        let c = t.signal.node_condition();
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// When each condition was last observed.
pub type LastObserved = BTreeMap<NodeCondition, Instant>;

/// Upstream `nodeConditionsLastObservedAt`.
pub fn last_observed(
    conditions: &[NodeCondition],
    last: &LastObserved,
    now: Instant,
) -> LastObserved {
    let mut out = last.clone();
    for c in conditions {
        out.insert(*c, now);
    }
    out
}

/// Upstream `nodeConditionsObservedSince`: conditions observed within the
/// pressure transition period.
pub fn observed_since(last: &LastObserved, period: Duration, now: Instant) -> Vec<NodeCondition> {
    last.iter()
        .filter(|(_, at)| now.duration_since(**at) < period)
        .map(|(c, _)| *c)
        .collect()
}

/// Upstream `thresholdsUpdatedStats`: thresholds whose signal was read
/// again since the last synchronize.
pub fn updated_stats(
    thresholds: &[Threshold],
    obs: &Observations,
    last: &Observations,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = obs.get(&t.signal) else {
                return false;
            };
            match (last.get(&t.signal), o.time) {
                (None, _) | (_, None) => true,
                (Some(l), Some(now)) => l.time.is_none_or(|lt| now > lt),
            }
        })
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Signal, ThresholdValue};
    use kubelet_types::quantity::Quantity;

    fn hard(signal: Signal, q: &str) -> Threshold {
        Threshold {
            signal,
            value: ThresholdValue::Quantity(Quantity::parse(q).expect("q")),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        }
    }

    fn obs(signal: Signal, available: i64, capacity: i64) -> Observations {
        [(
            signal,
            Observation {
                available,
                capacity,
                time: None,
            },
        )]
        .into()
    }

    #[test]
    fn met_below_and_with_min_reclaim() {
        let mut t = hard(Signal::MemoryAvailable, "100");
        assert!(met(&[t], &obs(Signal::MemoryAvailable, 100, 1000), false).is_empty());
        assert_eq!(
            met(&[t], &obs(Signal::MemoryAvailable, 99, 1000), false).len(),
            1
        );
        t.min_reclaim = Some(ThresholdValue::Percentage(0.05));
        assert_eq!(
            met(&[t], &obs(Signal::MemoryAvailable, 120, 1000), true).len(),
            1,
            "100 + 5% of 1000 = 150 > 120"
        );
        assert!(met(&[t], &obs(Signal::MemoryAvailable, 150, 1000), true).is_empty());
        assert!(
            met(&[t], &Observations::new(), false).is_empty(),
            "no observation, not met"
        );
    }

    #[test]
    fn percentage_threshold() {
        let t = Threshold {
            signal: Signal::NodeFsAvailable,
            value: ThresholdValue::Percentage(0.1),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        assert!(met(&[t], &obs(Signal::NodeFsAvailable, 100, 1000), false).is_empty());
        assert_eq!(
            met(&[t], &obs(Signal::NodeFsAvailable, 99, 1000), false).len(),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn grace_period_counts_from_first_observation() {
        let mut t = hard(Signal::MemoryAvailable, "1Gi");
        t.grace_period = Duration::from_secs(30);
        let t0 = Instant::now();
        let first = first_observed(&[t], &Vec::new(), t0);
        assert!(met_grace_period(&first, t0).is_empty());
        tokio::time::advance(Duration::from_secs(29)).await;
        let again = first_observed(&[t], &first, Instant::now());
        assert_eq!(again[0].1, t0, "kept from the first observation");
        assert!(met_grace_period(&again, Instant::now()).is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(met_grace_period(&again, Instant::now()).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn conditions_stay_for_the_transition_period() {
        let period = Duration::from_secs(300);
        let t0 = Instant::now();
        let last = last_observed(&[NodeCondition::MemoryPressure], &LastObserved::new(), t0);
        tokio::time::advance(Duration::from_secs(299)).await;
        let last = last_observed(&[], &last, Instant::now());
        assert_eq!(
            observed_since(&last, period, Instant::now()),
            vec![NodeCondition::MemoryPressure]
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(observed_since(&last, period, Instant::now()).is_empty());
    }
}
