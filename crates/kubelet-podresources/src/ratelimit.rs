//! The request rate limit of the pod-resources server (upstream
//! `podresources/grpc/ratelimit.go`): a token bucket of `burst` tokens
//! refilled at `qps` per second; a request finding it empty is refused with
//! `ResourceExhausted` "rejected by rate limit".

use parking_lot::Mutex;
use tokio::time::Instant;

/// Requests per second (upstream `DefaultQPS`).
pub const DEFAULT_QPS: u32 = 100;
/// Bucket size (upstream `DefaultBurstTokens`).
pub const DEFAULT_BURST_TOKENS: u32 = 10;

/// The message of a refused request (upstream `ErrorLimitExceeded`).
pub(crate) const LIMIT_EXCEEDED: &str = "rejected by rate limit";

/// A token bucket; `qps` of 0 lets nothing through once the burst is spent.
#[derive(Debug)]
pub struct RateLimit {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    /// A full bucket of `burst` tokens refilled at `qps`.
    pub fn new(qps: u32, burst: u32) -> Self {
        Self {
            qps: f64::from(qps),
            burst: f64::from(burst),
            state: Mutex::new(Bucket {
                tokens: f64::from(burst),
                last: Instant::now(),
            }),
        }
    }

    /// Takes a token if there is one (upstream `Limiter.Allow`).
    pub fn allow(&self) -> bool {
        let now = Instant::now();
        let mut bucket = self.state.lock();
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.last = now;
        bucket.tokens = (bucket.tokens + elapsed * self.qps).min(self.burst);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new(DEFAULT_QPS, DEFAULT_BURST_TOKENS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn burst_then_refill_at_qps() {
        let limit = RateLimit::new(100, 10);
        for i in 0..10 {
            assert!(limit.allow(), "request {i} of the burst");
        }
        assert!(!limit.allow(), "the 11th request at once is refused");
        // 100 per second: one token every 10 ms.
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(limit.allow());
        assert!(!limit.allow());
        // A long pause refills no more than the burst.
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..10 {
            assert!(limit.allow());
        }
        assert!(!limit.allow());
    }
}
