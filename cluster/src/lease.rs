//! The membership lease's keep-alive bookkeeping, without I/O: which keep-alives are
//! unanswered, until when the lease is known to hold, and when the session must give etcd up.
//!
//! Call order (the agent's session loop): [`KeepAlives::new`] with the validity the lease was
//! granted or resumed with; [`KeepAlives::handle_sent`] for every keep-alive sent (the first
//! one is sent when the keep-alive stream opens); [`KeepAlives::handle_answer`] for every
//! answer; the session ends at [`KeepAlives::poll_deadline`].

use std::collections::VecDeque;
use std::time::Duration;
#[cfg(test)]
use std::time::Instant;

/// A point in time the agent's bookkeeping computes with: `Instant` in the agent, simulated
/// milliseconds in the simulator (`felix_replication::Time`).
pub trait Moment: Copy + Ord + std::ops::Add<Duration, Output = Self> {}

impl<T: Copy + Ord + std::ops::Add<Duration, Output = T>> Moment for T {}

/// Keep-alives that may be unanswered at once. The session gives etcd up long before this
/// many are sent (one every TTL/3, given up after TTL/2 without an answer); a full queue is
/// treated as overdue all the same.
pub(crate) const KEEPALIVES_UNANSWERED_MAX: usize = 8;

/// One session's keep-alives on one lease.
#[derive(Debug)]
pub(crate) struct KeepAlives<T> {
    /// How long a keep-alive may go unanswered before the connection is given up: half the
    /// TTL, so that a new connection can renew the lease before etcd lets it expire.
    answer_wait: Duration,
    /// Send times of the unanswered keep-alives, oldest first. etcd answers the requests of
    /// one keep-alive stream in order, so each answer is for the oldest of them.
    sent: VecDeque<T>,
    /// Until when the lease is known to hold: the send time of the last answered keep-alive
    /// plus the TTL etcd answered with (never later than etcd's own expiry).
    valid_until: T,
}

impl<T: Moment> KeepAlives<T> {
    /// Bookkeeping for a lease of `ttl` known to hold until `valid_until`.
    pub(crate) fn new(ttl: Duration, valid_until: T) -> Self {
        Self {
            answer_wait: ttl / 2,
            sent: VecDeque::with_capacity(KEEPALIVES_UNANSWERED_MAX),
            valid_until,
        }
    }

    /// A keep-alive was sent at `now`. Returns false (and records nothing) when
    /// [`KEEPALIVES_UNANSWERED_MAX`] are unanswered already: the session must end.
    pub(crate) fn handle_sent(&mut self, now: T) -> bool {
        if self.sent.len() >= KEEPALIVES_UNANSWERED_MAX {
            return false;
        }
        self.sent.push_back(now);
        true
    }

    /// An answer granting `ttl` (positive) arrived: it is for the oldest unanswered
    /// keep-alive, so the lease holds until that one's send time plus `ttl`. Returns the new
    /// validity, or `None` for an answer to nothing this session sent (nothing is credited).
    pub(crate) fn handle_answer(&mut self, ttl: Duration) -> Option<T> {
        let sent_at = self.sent.pop_front()?;
        // Sends are in time order, so validity only grows; `max` keeps that true should a
        // clock step ever say otherwise.
        self.valid_until = self.valid_until.max(sent_at + ttl);
        Some(self.valid_until)
    }

    /// Until when the lease is known to hold.
    pub(crate) fn valid_until(&self) -> T {
        self.valid_until
    }

    /// When the session must give etcd up unless an answer comes first: the oldest unanswered
    /// keep-alive's send time plus half the TTL, or the lease's validity, whichever is
    /// earlier. Past it, etcd (or the connection to it) is not answering: a new session, on a
    /// new connection, may still find it or another member answering.
    /// A full queue is overdue at once (its oldest send's time, which is past).
    pub(crate) fn poll_deadline(&self) -> T {
        let overdue = match self.sent.front() {
            Some(oldest) if self.sent.len() >= KEEPALIVES_UNANSWERED_MAX => return *oldest,
            Some(oldest) => *oldest + self.answer_wait,
            None => self.valid_until,
        };
        overdue.min(self.valid_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(6);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn each_answer_is_credited_to_the_oldest_unanswered_send() {
        let t0 = Instant::now();
        let mut k = KeepAlives::new(TTL, t0 + TTL);
        assert!(k.handle_sent(t0 + ms(100)));
        // The loop stalled: the answer to the first send waits while two more are sent.
        assert!(k.handle_sent(t0 + ms(2_100)));
        assert!(k.handle_sent(t0 + ms(4_100)));
        assert_eq!(k.handle_answer(TTL), Some(t0 + ms(100) + TTL));
        assert_eq!(k.handle_answer(TTL), Some(t0 + ms(2_100) + TTL));
        assert_eq!(k.handle_answer(TTL), Some(t0 + ms(4_100) + TTL));
        // An answer to nothing sent credits nothing.
        assert_eq!(k.handle_answer(TTL), None);
        assert_eq!(k.valid_until(), t0 + ms(4_100) + TTL);
    }

    #[test]
    fn an_unanswered_send_is_given_up_after_half_the_ttl() {
        let t0 = Instant::now();
        let mut k = KeepAlives::new(TTL, t0 + TTL);
        assert_eq!(k.poll_deadline(), t0 + TTL, "nothing unanswered: the validity");
        k.handle_sent(t0 + ms(1_000));
        assert_eq!(k.poll_deadline(), t0 + ms(1_000) + TTL / 2);
        k.handle_sent(t0 + ms(3_000));
        assert_eq!(k.poll_deadline(), t0 + ms(1_000) + TTL / 2, "the oldest counts");
        k.handle_answer(TTL);
        assert_eq!(k.poll_deadline(), t0 + ms(3_000) + TTL / 2);
        k.handle_answer(TTL);
        assert_eq!(k.poll_deadline(), t0 + ms(3_000) + TTL, "all answered: the validity");
    }

    #[test]
    fn the_deadline_is_never_past_the_validity() {
        let t0 = Instant::now();
        // A resumed lease with one second left.
        let mut k = KeepAlives::new(TTL, t0 + ms(1_000));
        k.handle_sent(t0 + ms(500));
        assert_eq!(k.poll_deadline(), t0 + ms(1_000));
    }

    #[test]
    fn a_full_queue_of_unanswered_sends_is_overdue_at_once() {
        let t0 = Instant::now();
        let mut k = KeepAlives::new(TTL, t0 + TTL);
        for i in 0..KEEPALIVES_UNANSWERED_MAX as u64 {
            assert!(k.handle_sent(t0 + ms(i)));
        }
        assert!(!k.handle_sent(t0 + ms(100)));
        assert!(k.poll_deadline() <= Instant::now());
    }
}
