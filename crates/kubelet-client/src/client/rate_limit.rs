//! Client-side rate limiting (client-go's token bucket `flowcontrol`,
//! configured by `kubeAPIQPS`/`kubeAPIBurst` and `eventRecordQPS`/`eventBurst`):
//! `burst` tokens, refilled at `qps` per second; a caller without a token waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

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

/// Makes each request wait for a token of a shared bucket (client-go's
/// `tryThrottle`, which runs before the request's deadline starts).
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Arc<TokenBucket>,
}

impl RateLimitLayer {
    /// Requests take tokens from `limiter`.
    pub fn new(limiter: Arc<TokenBucket>) -> Self {
        Self { limiter }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// A service whose requests wait for a token first.
#[derive(Debug, Clone)]
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<TokenBucket>,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness is awaited after the token, in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: R) -> Self::Future {
        let inner = self.inner.clone();
        let limiter = self.limiter.clone();
        Box::pin(async move {
            limiter.acquire().await;
            inner.oneshot(req).await
        })
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
