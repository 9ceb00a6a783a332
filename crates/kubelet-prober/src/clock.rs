//! The wall clock workers measure `initialDelaySeconds` against (upstream
//! `time.Since(startedAt)`). Tests anchor it to tokio's paused clock so the
//! delay advances with `tokio::time::advance`.

use jiff::Timestamp;
use tokio::time::Instant;

/// Where "now" comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Clock {
    /// The system clock.
    System,
    /// A fixed wall time plus the tokio time elapsed since `at` (paused-time tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Tokio {
        /// The wall time at `at`.
        wall: Timestamp,
        /// The tokio instant `wall` corresponds to.
        at: Instant,
    },
}

impl Clock {
    /// A clock anchored at `wall` now, advancing with tokio time.
    #[cfg(test)]
    pub(crate) fn tokio(wall: Timestamp) -> Self {
        Clock::Tokio {
            wall,
            at: Instant::now(),
        }
    }

    /// The current wall time.
    pub(crate) fn now(&self) -> Timestamp {
        match self {
            Clock::System => Timestamp::now(),
            Clock::Tokio { wall, at } => {
                let elapsed = jiff::SignedDuration::try_from(at.elapsed())
                    .unwrap_or(jiff::SignedDuration::MAX);
                wall.checked_add(elapsed).unwrap_or(Timestamp::MAX)
            }
        }
    }

    /// Whole seconds from `since` to now, truncated toward zero as upstream's
    /// `int32(time.Since(t).Seconds())`.
    pub(crate) fn seconds_since(&self, since: Timestamp) -> i64 {
        self.now().duration_since(since).as_secs()
    }
}
