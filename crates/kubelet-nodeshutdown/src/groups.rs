//! The shutdown groups (upstream `migrateConfig` and `groupByPriority`):
//! pods are split by priority into the ranges of
//! `shutdownGracePeriodByPodPriority`, each range with its own grace period.
//! Without that setting, `shutdownGracePeriod` and
//! `shutdownGracePeriodCriticalPods` make two ranges: every pod below
//! `system-cluster-critical` gets the difference, the critical ones get
//! `shutdownGracePeriodCriticalPods`.

use std::time::Duration;

use crate::logind::ShutdownPod;

/// The lowest priority of the default range (upstream
/// `DefaultPriorityWhenNoDefaultClassExists`).
pub const DEFAULT_PRIORITY: i32 = 0;
/// The lowest priority of the critical range (upstream
/// `SystemCriticalPriority`, `system-cluster-critical`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One range: pods at `priority` or above, up to the next range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityGrace {
    /// The lowest priority of the range.
    pub priority: i32,
    /// Seconds the range's pods get, in all.
    pub grace_period_seconds: i64,
}

/// The ranges `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods`
/// stand for (upstream `migrateConfig`); empty (graceful shutdown off) when
/// the grace period is 0 or shorter than the critical pods' share.
pub fn migrate_config(grace_period: Duration, critical: Duration) -> Vec<PriorityGrace> {
    if grace_period.is_zero() {
        return vec![];
    }
    let Some(default_share) = grace_period.checked_sub(critical) else {
        return vec![];
    };
    let critical_share = grace_period - default_share;
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    vec![
        PriorityGrace {
            priority: DEFAULT_PRIORITY,
            grace_period_seconds: secs(default_share),
        },
        PriorityGrace {
            priority: SYSTEM_CRITICAL_PRIORITY,
            grace_period_seconds: secs(critical_share),
        },
    ]
}

/// The ranges in effect: `by_priority` when set, else those of the two
/// durations; sorted by priority, lowest first.
pub fn effective(
    grace_period: Duration,
    critical: Duration,
    by_priority: &[PriorityGrace],
) -> Vec<PriorityGrace> {
    let mut out = if by_priority.is_empty() {
        migrate_config(grace_period, critical)
    } else {
        by_priority.to_vec()
    };
    out.sort_by_key(|g| g.priority);
    out
}

/// What logind must wait for in all: the sum of the ranges' grace periods
/// (upstream `periodRequested`).
pub fn period_requested(ranges: &[PriorityGrace]) -> Duration {
    let secs: i64 = ranges.iter().map(|g| g.grace_period_seconds.max(0)).sum();
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// One range and its pods.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The range.
    pub range: PriorityGrace,
    /// Its pods.
    pub pods: Vec<ShutdownPod>,
}

/// Splits `pods` over `ranges` (sorted, lowest first): a pod goes to the
/// highest range whose priority is at or below its own; pods below the
/// lowest range go to the lowest, as upstream's `groupByPriority`.
pub fn group_by_priority(ranges: &[PriorityGrace], pods: Vec<ShutdownPod>) -> Vec<Group> {
    let mut groups: Vec<Group> = ranges
        .iter()
        .map(|r| Group {
            range: *r,
            pods: vec![],
        })
        .collect();
    if groups.is_empty() {
        return groups;
    }
    let last = groups.len() - 1;
    for p in pods {
        // As upstream's `sort.Search`: the first range at or above the pod's
        // priority; when it is above, the range before it (if any); past
        // the highest, the highest. Of two ranges with one priority, a pod
        // of that priority goes to the first.
        let i = groups.partition_point(|g| g.range.priority < p.priority);
        let i = if i > last {
            last
        } else if i > 0 && groups[i].range.priority > p.priority {
            i - 1
        } else {
            i
        };
        groups[i].pods.push(p);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: i32) -> ShutdownPod {
        ShutdownPod {
            uid: name.to_string(),
            name: name.to_string(),
            priority,
            termination_grace_period_seconds: None,
        }
    }

    fn names(g: &Group) -> Vec<&str> {
        g.pods.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn the_two_durations_make_a_default_and_a_critical_range() {
        assert_eq!(
            migrate_config(Duration::from_secs(10), Duration::from_secs(4)),
            vec![
                PriorityGrace {
                    priority: 0,
                    grace_period_seconds: 6
                },
                PriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace_period_seconds: 4
                },
            ]
        );
        assert_eq!(
            migrate_config(Duration::from_secs(30), Duration::ZERO)[0].grace_period_seconds,
            30
        );
        assert!(migrate_config(Duration::ZERO, Duration::ZERO).is_empty());
        assert!(migrate_config(Duration::from_secs(5), Duration::from_secs(6)).is_empty());
        assert_eq!(
            period_requested(&migrate_config(
                Duration::from_secs(10),
                Duration::from_secs(4)
            )),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn pods_go_to_the_highest_range_at_or_below_their_priority() {
        let ranges = effective(
            Duration::ZERO,
            Duration::ZERO,
            &[
                PriorityGrace {
                    priority: 100_000,
                    grace_period_seconds: 10,
                },
                PriorityGrace {
                    priority: 1,
                    grace_period_seconds: 20,
                },
                PriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace_period_seconds: 30,
                },
            ],
        );
        assert_eq!(ranges[0].priority, 1, "sorted lowest first");
        let groups = group_by_priority(
            &ranges,
            vec![
                pod("below-all", -10),
                pod("zero", 0),
                pod("one", 1),
                pod("mid", 99_999),
                pod("boundary", 100_000),
                pod("high", 1_000_000),
                pod("node-critical", 2_000_001_000),
                pod("cluster-critical", SYSTEM_CRITICAL_PRIORITY),
            ],
        );
        assert_eq!(names(&groups[0]), vec!["below-all", "zero", "one", "mid"]);
        assert_eq!(names(&groups[1]), vec!["boundary", "high"]);
        assert_eq!(names(&groups[2]), vec!["node-critical", "cluster-critical"]);
        assert!(group_by_priority(&[], vec![pod("a", 1)]).is_empty());
    }

    #[test]
    fn of_two_ranges_with_one_priority_the_first_gets_that_priority() {
        let range = |priority, grace_period_seconds| PriorityGrace {
            priority,
            grace_period_seconds,
        };
        let ranges = [range(0, 1), range(10, 2), range(10, 3), range(20, 4)];
        let groups = group_by_priority(
            &ranges,
            vec![pod("ten", 10), pod("fifteen", 15), pod("five", 5)],
        );
        assert_eq!(names(&groups[0]), vec!["five"]);
        assert_eq!(names(&groups[1]), vec!["ten"]);
        // Above both: the range before the next higher one (upstream's
        // `index-1`), i.e. the second of the two.
        assert_eq!(names(&groups[2]), vec!["fifteen"]);
        assert!(groups[3].pods.is_empty());
    }
}
