//! Rate-limited warnings: a condition that persists (a stream the controller cannot place,
//! retried every 500 ms) is logged once per interval per subject, not at every retry.
//! No I/O: the caller brings `now`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Subjects remembered at most; past this, those not warned about within the interval are
/// forgotten first, and if all were, the whole table is cleared (a warning repeated early is
/// better than memory that grows with the number of names).
pub const WARN_SUBJECTS_MAX: usize = 1024;

/// Remembers when each subject was last warned about.
#[derive(Debug)]
pub struct WarnEvery {
    interval: Duration,
    last: HashMap<String, Instant>,
}

impl WarnEvery {
    /// Warnings about one subject at most once per `interval`.
    pub fn new(interval: Duration) -> WarnEvery {
        WarnEvery { interval, last: HashMap::new() }
    }

    /// Whether a warning about `subject` is due at `now` (and if so, records it).
    pub fn should_warn(&mut self, subject: &str, now: Instant) -> bool {
        if let Some(at) = self.last.get(subject) {
            if now.saturating_duration_since(*at) < self.interval {
                return false;
            }
        }
        if self.last.len() >= WARN_SUBJECTS_MAX && !self.last.contains_key(subject) {
            let interval = self.interval;
            self.last.retain(|_, at| now.saturating_duration_since(*at) < interval);
            if self.last.len() >= WARN_SUBJECTS_MAX {
                self.last.clear();
            }
        }
        self.last.insert(subject.to_owned(), now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_is_warned_about_once_per_interval() {
        let mut w = WarnEvery::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(w.should_warn("s", t0));
        // Every 500 ms for a minute: no repeat.
        for i in 1..120 {
            assert!(!w.should_warn("s", t0 + Duration::from_millis(500 * i)));
        }
        assert!(w.should_warn("other", t0 + Duration::from_secs(1)));
        assert!(w.should_warn("s", t0 + Duration::from_secs(60)));
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut w = WarnEvery::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..(WARN_SUBJECTS_MAX * 3) {
            assert!(w.should_warn(&format!("s{i}"), t0));
            assert!(w.last.len() <= WARN_SUBJECTS_MAX);
        }
    }
}
