//! Per-key exponential backoff for container restarts and image pulls
//! (upstream `k8s.io/client-go/util/flowcontrol.Backoff`): 10s doubling to a
//! 300s cap; an entry idle for twice the cap starts over.
//!
//! Times are wall-clock values passed in by the caller (container finish
//! times come from the runtime), so the logic is deterministic under test.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

/// Upstream initial container and image backoff.
pub const INITIAL: Duration = Duration::from_secs(10);
/// Upstream `MaxContainerBackOff`.
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
struct Entry {
    backoff: Duration,
    last_update: SystemTime,
}

/// Backoff state for many keys.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL, MAX)
    }
}

fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or(Duration::ZERO)
}

impl Backoff {
    /// Backoff starting at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn expired(&self, event: SystemTime, e: &Entry) -> bool {
        since(event, e.last_update) > self.max * 2
    }

    /// Records an attempt at `now` for an event (exit) at `event`: the first
    /// attempt, or one after a long quiet spell, starts at the initial delay;
    /// each further one doubles it.
    pub fn next(&self, key: &str, event: SystemTime, now: SystemTime) {
        let mut entries = self.entries.lock();
        let backoff = match entries.get(key) {
            Some(e) if !self.expired(event, e) => (e.backoff * 2).min(self.max),
            _ => self.initial,
        };
        entries.insert(
            key.to_string(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// Time left before an event at `event` may be acted on, or `None` when it may now.
    /// (Upstream `IsInBackOffSince`: in backoff while `now - event < backoff`.)
    pub fn remaining_since(
        &self,
        key: &str,
        event: SystemTime,
        now: SystemTime,
    ) -> Option<Duration> {
        let entries = self.entries.lock();
        let e = entries.get(key)?;
        if self.expired(event, e) {
            return None;
        }
        let elapsed = since(now, event);
        (elapsed < e.backoff).then(|| e.backoff - elapsed)
    }

    /// Time left since the last recorded attempt (upstream `IsInBackOffSinceUpdate`), for pulls.
    pub fn remaining_since_update(&self, key: &str, now: SystemTime) -> Option<Duration> {
        let entries = self.entries.lock();
        let e = entries.get(key)?;
        if self.expired(now, e) {
            return None;
        }
        let elapsed = since(now, e.last_update);
        (elapsed < e.backoff).then(|| e.backoff - elapsed)
    }

    /// The current delay for `key`, if any.
    pub fn get(&self, key: &str) -> Option<Duration> {
        self.entries.lock().get(key).map(|e| e.backoff)
    }

    /// Forgets `key` (a successful pull).
    pub fn reset(&self, key: &str) {
        self.entries.lock().remove(key);
    }

    /// Drops entries idle for more than twice the cap (upstream `GC`).
    pub fn gc(&self, now: SystemTime) {
        let max = self.max;
        self.entries
            .lock()
            .retain(|_, e| since(now, e.last_update) <= max * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn crash_loop_gaps_double_to_the_cap() {
        let b = Backoff::default();
        let k = "pod_ns_uid_c";
        // First exit: no entry, restart at once.
        assert_eq!(b.remaining_since(k, t(0), t(0)), None);
        b.next(k, t(0), t(0));
        // Second exit right after: 10s to wait.
        assert_eq!(
            b.remaining_since(k, t(1), t(1)),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            b.remaining_since(k, t(1), t(6)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(b.remaining_since(k, t(1), t(11)), None);
        let mut gaps = vec![];
        for now in 11..19 {
            b.next(k, t(now), t(now));
            gaps.push(b.get(k).map(|d| d.as_secs()).unwrap_or(0));
        }
        assert_eq!(gaps, vec![20, 40, 80, 160, 300, 300, 300, 300]);
    }

    #[test]
    fn quiet_for_twice_the_cap_starts_over() {
        let b = Backoff::default();
        b.next("k", t(0), t(0));
        b.next("k", t(1), t(1));
        assert_eq!(b.get("k"), Some(Duration::from_secs(20)));
        b.next("k", t(1 + 601), t(1 + 601));
        assert_eq!(b.get("k"), Some(INITIAL));
        b.gc(t(2000));
        assert_eq!(b.get("k"), None);
    }

    #[test]
    fn pulls_back_off_since_the_last_attempt() {
        let b = Backoff::default();
        assert_eq!(b.remaining_since_update("img", t(0)), None);
        b.next("img", t(0), t(0));
        assert_eq!(
            b.remaining_since_update("img", t(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(b.remaining_since_update("img", t(10)), None);
        b.reset("img");
        assert_eq!(b.get("img"), None);
    }
}
