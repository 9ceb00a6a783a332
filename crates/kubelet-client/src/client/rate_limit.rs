//! Client-side rate limiting (client-go's token bucket `flowcontrol`,
//! configured by `kubeAPIQPS`/`kubeAPIBurst` and `eventRecordQPS`/`eventBurst`):
//! `burst` tokens, refilled at `qps` per second; a caller without a token waits.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// A token bucket.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: qps.max(f64::MIN_POSITIVE),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes a token now, or says how long until one is available.
    fn try_take(&self) -> Result<(), Duration> {
        let mut s = self.state.lock();
        let now = Instant::now();
        let refill = now.duration_since(s.1).as_secs_f64() * self.qps;
        s.0 = (s.0 + refill).min(self.burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - s.0) / self.qps))
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        while let Err(wait) = self.try_take() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let b = TokenBucket::new(5.0, 10);
        let start = Instant::now();
        for _ in 0..10 {
            b.acquire().await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a burst goes through at once"
        );
        for _ in 0..5 {
            b.acquire().await;
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(990) && took <= Duration::from_millis(1010),
            "5 more at 5 QPS take a second, took {took:?}"
        );
    }
}
