//! The cluster agent's decisions about its lease, sans-IO: until when the broker may act on
//! its lease, when a silent etcd connection is given up, and when the view may carry the
//! lease's validity (only once it was loaded for that lease).
//!
//! The agent's session loop (`agent.rs`) feeds it what happens on its etcd connection; the
//! simulator (`felix-sim`) drives the same state with its etcd model, a network that drops,
//! delays and repeats, and simulated time. Call order per session: [`AgentState::session_started`]
//! with the validity the lease was granted or resumed with, [`AgentState::keepalive_sent`]
//! for every keep-alive (the first when the keep-alive stream opens),
//! [`AgentState::keepalive_answered`] for every answer, [`AgentState::view_loaded`] once
//! the cluster's keys were read for this lease, and [`AgentState::session_ended`] when the
//! session is given up (an error, [`AgentState::deadline`] passed with no answer, or the lease
//! lost). Keys that do not parse are skipped, never the end of a session
//! (`keyspace::apply_or_skip`).

use std::time::Duration;

use crate::lease::{KeepAlives, Moment};

/// Why a session must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// etcd (or the connection to it) stopped answering keep-alives: give the connection up
    /// and open another, in time to renew the lease if etcd answers there.
    Unresponsive,
    /// etcd answered that the lease is gone: a new session needs a new lease.
    LeaseLost,
}

/// The agent's lease and view bookkeeping across sessions.
#[derive(Debug)]
pub struct AgentState<T> {
    ttl: Duration,
    /// The current session's keep-alives, `None` between sessions.
    keep: Option<KeepAlives<T>>,
    /// The view was loaded for the current session's lease.
    loaded: bool,
}

impl<T: Moment> AgentState<T> {
    /// No session yet, for a lease of `ttl`.
    pub fn new(ttl: Duration) -> Self {
        AgentState { ttl, keep: None, loaded: false }
    }

    /// A session began on a lease known to hold until `valid_until` (granted, or resumed
    /// from the last session). Its view is not loaded yet: the view in hand may be a lost
    /// lease's (naming this broker leader of epochs elected on that lease), and published
    /// with this lease's validity it would let the broker act for them again.
    pub fn session_started(&mut self, valid_until: T) {
        self.keep = Some(KeepAlives::new(self.ttl, valid_until));
        self.loaded = false;
    }

    /// The cluster's keys were loaded for this session's lease.
    pub fn view_loaded(&mut self) {
        self.loaded = self.keep.is_some();
    }

    /// Whether a session is running.
    pub fn in_session(&self) -> bool {
        self.keep.is_some()
    }

    /// Until when the broker may act on its lease, as the view says: `None` until the view
    /// was loaded for the session's lease, or between sessions that never loaded one.
    pub fn lease_valid_until(&self) -> Option<T> {
        self.keep.as_ref().filter(|_| self.loaded).map(KeepAlives::valid_until)
    }

    /// A keep-alive was sent at `now`. Too many unanswered ones end the session.
    pub fn keepalive_sent(&mut self, now: T) -> Result<(), SessionEnd> {
        match self.keep.as_mut().map(|k| k.handle_sent(now)) {
            Some(true) => Ok(()),
            _ => Err(SessionEnd::Unresponsive),
        }
    }

    /// etcd answered a keep-alive with `ttl` (`None` or zero: the lease is gone). Returns
    /// the lease's new validity to publish, if the view is loaded and the answer is for a
    /// keep-alive this session sent.
    pub fn keepalive_answered(&mut self, ttl: Option<Duration>) -> Result<Option<T>, SessionEnd> {
        let Some(keep) = &mut self.keep else { return Ok(None) };
        match ttl.filter(|t| !t.is_zero()) {
            Some(ttl) => Ok(keep.handle_answer(ttl).filter(|_| self.loaded)),
            None => Err(SessionEnd::LeaseLost),
        }
    }

    /// When the session must give etcd up unless an answer comes first (the oldest unanswered
    /// keep-alive's send time plus half the TTL, or the lease's validity, whichever is
    /// earlier); `None` between sessions.
    pub fn deadline(&self) -> Option<T> {
        self.keep.as_ref().map(KeepAlives::poll_deadline)
    }

    /// Whether the session must end at `now`, no answer having come.
    pub fn overdue(&self, now: T) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }

    /// The session ended. Its lease may still hold until the validity last published (the
    /// broker goes on until then; the next session resumes the lease if etcd still holds
    /// it), but nothing more is credited to it.
    pub fn session_ended(&mut self) {
        self.keep = None;
        self.loaded = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const TTL: Duration = Duration::from_secs(6);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_validity_is_published_only_once_the_view_is_loaded() {
        let t0 = Instant::now();
        let mut a = AgentState::new(TTL);
        assert_eq!(a.lease_valid_until(), None);
        a.session_started(t0 + TTL);
        assert_eq!(a.lease_valid_until(), None, "the view in hand may be a lost lease's");
        a.keepalive_sent(t0 + ms(10)).unwrap();
        assert_eq!(a.keepalive_answered(Some(TTL)), Ok(None), "credited, not published");
        a.view_loaded();
        assert_eq!(a.lease_valid_until(), Some(t0 + ms(10) + TTL));
        a.keepalive_sent(t0 + ms(2_000)).unwrap();
        assert_eq!(a.keepalive_answered(Some(TTL)), Ok(Some(t0 + ms(2_000) + TTL)));
    }

    #[test]
    fn a_silent_connection_is_given_up_and_a_lost_lease_ends_the_session() {
        let t0 = Instant::now();
        let mut a = AgentState::new(TTL);
        a.session_started(t0 + TTL);
        a.view_loaded();
        a.keepalive_sent(t0 + ms(1_000)).unwrap();
        assert!(!a.overdue(t0 + ms(3_999)));
        assert!(a.overdue(t0 + ms(4_000)), "unanswered for half the TTL");
        assert_eq!(a.keepalive_answered(None), Err(SessionEnd::LeaseLost));
        assert_eq!(a.keepalive_answered(Some(Duration::ZERO)), Err(SessionEnd::LeaseLost));
        a.session_ended();
        assert_eq!(a.lease_valid_until(), None);
        assert_eq!(a.deadline(), None);
        assert_eq!(a.keepalive_sent(t0 + ms(5_000)), Err(SessionEnd::Unresponsive));
        // The next session starts unloaded again.
        a.session_started(t0 + ms(5_000) + TTL);
        assert_eq!(a.lease_valid_until(), None);
    }
}
