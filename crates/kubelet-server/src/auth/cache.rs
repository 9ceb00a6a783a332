//! A bounded TTL cache for review results (upstream's `LRUExpireCache`
//! behind the webhook token authenticator and authorizer). Tokio time, so
//! tests run it under paused time.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Entries kept at most; past it, expired entries go first, then the
/// soonest to expire.
const MAX_ENTRIES: usize = 4096;

pub(crate) struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub(crate) fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The value for `key` if it has not expired.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let mut m = self.entries.lock();
        match m.get(key) {
            Some((v, until)) if Instant::now() < *until => Some(v.clone()),
            Some(_) => {
                m.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `ttl` (a zero TTL keeps nothing).
    pub(crate) fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut m = self.entries.lock();
        if m.len() >= MAX_ENTRIES && !m.contains_key(&key) {
            m.retain(|_, (_, until)| *until > now);
            if m.len() >= MAX_ENTRIES {
                let soonest = m
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    m.remove(&k);
                }
            }
        }
        m.insert(key, (value, now + ttl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_their_ttl() {
        let c = TtlCache::new();
        c.insert("a", 1, Duration::from_secs(30));
        c.insert("b", 2, Duration::from_secs(300));
        c.insert("z", 3, Duration::ZERO);
        assert_eq!(c.get(&"a"), Some(1));
        assert_eq!(c.get(&"z"), None);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(c.get(&"a"), None);
        assert_eq!(c.get(&"b"), Some(2));
        tokio::time::advance(Duration::from_secs(270)).await;
        assert_eq!(c.get(&"b"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn full_cache_drops_the_soonest_to_expire() {
        let c = TtlCache::new();
        for i in 0..MAX_ENTRIES {
            c.insert(i, i, Duration::from_secs(100 + i as u64));
        }
        c.insert(usize::MAX, 0, Duration::from_secs(1000));
        assert_eq!(c.get(&0), None);
        assert_eq!(c.get(&1), Some(1));
        assert_eq!(c.get(&usize::MAX), Some(0));
    }
}
