//! The wall clock behind heartbeat and renew times, as a seam (upstream
//! `clock.Clock`): the system clock in production; in tests, a clock that
//! moves with tokio's (paused) time.

use jiff::{SignedDuration, Timestamp};

/// Source of wall-clock time.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// Wall time that advances with tokio time (virtual under `start_paused`).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    wall: Timestamp,
    origin: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        Self {
            wall: Timestamp::now(),
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed =
            SignedDuration::try_from(self.origin.elapsed()).unwrap_or(SignedDuration::ZERO);
        self.wall.checked_add(elapsed).unwrap_or(self.wall)
    }
}
