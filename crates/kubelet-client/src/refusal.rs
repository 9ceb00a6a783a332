//! Lists and watches the apiserver refuses (client-go's reflector logs each
//! failed list at error level): a 4xx on a list or watch does not go away by
//! waiting (a field selector or API an older apiserver lacks, RBAC, the Node
//! authorizer), so it must never turn into a silent wait. [`Refusals`]
//! decides when a watcher says so: at the first refusal, at a new status
//! code, and again every [`REPORT_PERIOD`] while it lasts; transient failures
//! (timeouts, 5xx, a lost connection) keep their quieter logging.

use std::time::Duration;

use kube::runtime::watcher;
use tokio::time::Instant;

/// How often a refusal that keeps coming is reported again.
pub const REPORT_PERIOD: Duration = Duration::from_secs(300);

/// The apiserver's status code when it refused the list or watch itself
/// (a 4xx other than 410 Gone, which a watcher handles by listing again).
pub fn refused(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
            if (400..500).contains(&s.code) && s.code != 410 =>
        {
            Some(s.code)
        }
        watcher::Error::WatchError(s) if (400..500).contains(&s.code) && s.code != 410 => {
            Some(s.code)
        }
        _ => None,
    }
}

/// When to report refusals of one list and watch.
#[derive(Debug, Default)]
pub struct Refusals {
    last: Option<(u16, Instant)>,
}

impl Refusals {
    /// Whether the refusal with `code` is to be reported now.
    pub fn report(&mut self, code: u16) -> bool {
        let now = Instant::now();
        let due = self
            .last
            .is_none_or(|(c, at)| c != code || now.duration_since(at) >= REPORT_PERIOD);
        if due {
            self.last = Some((code, now));
        }
        due
    }

    /// The list or watch works again.
    pub fn recovered(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Forbidden").with_code(code),
        )))
    }

    #[test]
    fn only_the_apiservers_own_refusals_count() {
        assert_eq!(refused(&api(403)), Some(403));
        assert_eq!(refused(&api(400)), Some(400));
        assert_eq!(refused(&api(410)), None, "a watcher lists again");
        assert_eq!(refused(&api(503)), None, "transient");
        assert_eq!(refused(&watcher::Error::NoResourceVersion), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lasting_refusal_is_reported_again_every_period_and_a_new_code_at_once() {
        let mut r = Refusals::default();
        assert!(r.report(403), "the first one");
        assert!(!r.report(403));
        tokio::time::advance(REPORT_PERIOD - Duration::from_secs(1)).await;
        assert!(!r.report(403));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(r.report(403), "still refused after the period");
        assert!(r.report(400), "another answer");
        r.recovered();
        assert!(r.report(400), "refused again after working");
    }
}
