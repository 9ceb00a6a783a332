//! The status resync's memory of its last comparisons (issue 21; upstream's
//! status manager keeps `apiStatusVersions` to the same end): a pod whose
//! generated status and API object (by resourceVersion) are those of the
//! last comparison that found the apiserver up to date is up to date still,
//! so a quiet resync compares nothing (no status rendered to JSON twice per
//! pod every 10 s).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PodStatus;

/// The last comparison found up to date, per pod UID.
#[derive(Default)]
pub(crate) struct Compared {
    last: HashMap<String, (PodStatus, String)>,
}

impl Compared {
    /// Whether the apiserver has `ours` for `uid`: from memory when neither
    /// `ours` nor the API object's `version` changed since a comparison
    /// found it up to date, else by `compare` (remembered when true).
    pub(crate) fn up_to_date(
        &mut self,
        uid: &str,
        ours: &PodStatus,
        version: Option<&str>,
        compare: impl FnOnce() -> bool,
    ) -> bool {
        if let Some(v) = version
            && self
                .last
                .get(uid)
                .is_some_and(|(s, seen)| seen == v && s == ours)
        {
            return true;
        }
        let current = compare();
        match version {
            Some(v) if current => {
                self.last
                    .insert(uid.to_string(), (ours.clone(), v.to_string()));
            }
            _ => {
                self.last.remove(uid);
            }
        }
        current
    }

    /// Forgets pods `keep` does not want.
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.last.retain(|uid, _| keep(uid));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn status(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_quiet_resync_compares_nothing_and_a_change_compares_again() {
        let mut c = Compared::default();
        let compares = Cell::new(0);
        let check = |c: &mut Compared, s: &PodStatus, v: Option<&str>, answer: bool| {
            c.up_to_date("u1", s, v, || {
                compares.set(compares.get() + 1);
                answer
            })
        };
        let running = status("Running");
        assert!(check(&mut c, &running, Some("5"), true));
        assert_eq!(compares.get(), 1);
        // Resyncs with nothing changed: up to date from memory.
        for _ in 0..3 {
            assert!(check(&mut c, &running, Some("5"), false));
        }
        assert_eq!(compares.get(), 1);
        // Someone wrote the pod (new resourceVersion): compared again.
        assert!(!check(&mut c, &running, Some("6"), false));
        assert_eq!(compares.get(), 2);
        // Not up to date is never remembered.
        assert!(!check(&mut c, &running, Some("6"), false));
        assert_eq!(compares.get(), 3);
        assert!(check(&mut c, &running, Some("7"), true));
        // Our status changed: compared again.
        assert!(!check(&mut c, &status("Succeeded"), Some("7"), false));
        assert_eq!(compares.get(), 5);
        // No resourceVersion: always compared.
        assert!(check(&mut c, &running, None, true));
        assert!(check(&mut c, &running, None, true));
        assert_eq!(compares.get(), 7);
        // A pod forgotten is compared again.
        assert!(check(&mut c, &running, Some("8"), true));
        c.retain(|_| false);
        assert!(check(&mut c, &running, Some("8"), true));
        assert_eq!(compares.get(), 9);
    }
}
