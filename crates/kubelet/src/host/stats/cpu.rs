//! The previous CPU sample of each container, sandbox and the node, from
//! which `usageNanoCores` is derived when the runtime does not fill it
//! (upstream `criStatsProvider.getAndUpdateContainerUsageNanoCores` and its
//! cache cleanup).

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long a CPU sample is kept for a container, sandbox or node that is no
/// longer reported (upstream cleans its cache after the same period).
const CPU_SAMPLE_TTL: Duration = Duration::from_secs(5 * 60);

/// One cumulative CPU sample and the rate derived from it.
#[derive(Clone, Copy, Debug)]
struct CpuSample {
    timestamp_ns: i64,
    core_ns: u64,
    nano_cores: Option<u64>,
    seen: Instant,
}

/// The previous CPU sample of each container, sandbox and the node, to derive
/// `usageNanoCores` from two cumulative samples.
#[derive(Debug, Default)]
pub struct CpuUsageCache {
    samples: Mutex<HashMap<String, CpuSample>>,
}

impl CpuUsageCache {
    /// Records `core_ns` taken at `timestamp_ns` for `key` and returns the
    /// average rate in nanocores since the previous sample; a repeated sample
    /// returns the rate already derived; the first sample, or a counter that
    /// went back, returns none.
    pub(crate) fn update(&self, key: &str, timestamp_ns: i64, core_ns: u64) -> Option<u64> {
        let mut samples = self.samples.lock();
        let now = Instant::now();
        let prev = samples.get(key).copied();
        let nano_cores = match prev {
            Some(p) if p.timestamp_ns == timestamp_ns && p.core_ns == core_ns => {
                if let Some(s) = samples.get_mut(key) {
                    s.seen = now;
                }
                return p.nano_cores;
            }
            Some(p) if timestamp_ns > p.timestamp_ns && core_ns >= p.core_ns => {
                let elapsed = (timestamp_ns - p.timestamp_ns) as u128;
                let used = u128::from(core_ns - p.core_ns);
                u64::try_from(used * 1_000_000_000 / elapsed).ok()
            }
            Some(p) if timestamp_ns < p.timestamp_ns => return None,
            _ => None,
        };
        samples.insert(
            key.to_string(),
            CpuSample {
                timestamp_ns,
                core_ns,
                nano_cores,
                seen: now,
            },
        );
        nano_cores
    }

    /// Forgets samples not updated within [`CPU_SAMPLE_TTL`].
    pub(crate) fn prune(&self) {
        self.samples
            .lock()
            .retain(|_, s| s.seen.elapsed() < CPU_SAMPLE_TTL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_cores_from_two_samples() {
        let cache = CpuUsageCache::default();
        assert_eq!(
            cache.update("c", 1_000_000_000, 5_000_000_000),
            None,
            "first sample"
        );
        // 1.5 cores over 2 s.
        assert_eq!(
            cache.update("c", 3_000_000_000, 8_000_000_000),
            Some(1_500_000_000)
        );
        // The same sample again keeps the rate.
        assert_eq!(
            cache.update("c", 3_000_000_000, 8_000_000_000),
            Some(1_500_000_000)
        );
        // An older sample is ignored and does not replace the newer one.
        assert_eq!(cache.update("c", 2_000_000_000, 6_000_000_000), None);
        assert_eq!(
            cache.update("c", 4_000_000_000, 8_250_000_000),
            Some(250_000_000)
        );
        // A counter that went back (a new cgroup under the same key) starts over.
        assert_eq!(cache.update("c", 5_000_000_000, 1_000), None);
        assert_eq!(
            cache.update("c", 6_000_000_000, 500_001_000),
            Some(500_000_000)
        );
        // Keys are independent.
        assert_eq!(cache.update("d", 6_000_000_000, 1), None);
    }

    #[tokio::test(start_paused = true)]
    async fn forgets_samples_not_seen_for_five_minutes() {
        let cache = CpuUsageCache::default();
        cache.update("old", 1, 1);
        tokio::time::advance(CPU_SAMPLE_TTL - Duration::from_secs(1)).await;
        cache.update("new", 1, 1);
        cache.prune();
        assert_eq!(cache.samples.lock().len(), 2);
        tokio::time::advance(Duration::from_secs(2)).await;
        cache.prune();
        let keys: Vec<String> = cache.samples.lock().keys().cloned().collect();
        assert_eq!(keys, ["new"]);
        // A forgotten key starts over: no rate from its first new sample.
        assert_eq!(cache.update("old", 1_000_000_000, 1_000), None);
    }
}
