//! The follower's side: truncation by leader epoch, then fetching with flow control.

use super::{Replica, Role};
use crate::message::{Message, Output};
use crate::types::{Batch, Epoch, Offset, ReplicaNumber, Time};

/// What a follower keeps while following one leader epoch.
pub(super) struct FollowerState {
    pub(super) leader: ReplicaNumber,
    pub(super) epoch: Epoch,
    phase: Phase,
    /// A query or fetch is outstanding since this time.
    awaiting_since: Option<Time>,
    /// The durable end reported in the last fetch.
    told_durable: Offset,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Finding where this log diverges from the leader's: waiting for the answer about `asked`.
    Truncating { asked: Epoch },
    /// The log is a prefix of the leader's: fetching what follows.
    Fetching,
}

impl Replica {
    pub(super) fn become_follower(&mut self, now: Time, leader: ReplicaNumber, epoch: Epoch) {
        let phase = if self.bugs.skip_truncation || self.log.is_empty() {
            Phase::Fetching
        } else {
            Phase::Truncating { asked: self.log.last_epoch() }
        };
        let state =
            FollowerState { leader, epoch, phase, awaiting_since: None, told_durable: Offset(0) };
        self.step_down(Role::Follower(state));
        self.send_request(now);
    }

    /// Sends the current phase's request: an epoch query or a fetch.
    fn send_request(&mut self, now: Time) {
        let (durable, end, last_epoch) =
            (self.disk.durable_end(), self.log.end(), self.log.last_epoch());
        let Role::Follower(state) = &mut self.role else { return };
        state.awaiting_since = Some(now);
        let (leader, epoch) = (state.leader, state.epoch);
        let message = match &mut state.phase {
            Phase::Truncating { asked } => {
                *asked = last_epoch;
                Message::EpochQuery { epoch, last_epoch }
            }
            Phase::Fetching => {
                state.told_durable = durable;
                Message::Fetch { epoch, from: end, durable_end: durable }
            }
        };
        self.send(leader, message);
    }

    pub(super) fn on_epoch_answer(
        &mut self,
        now: Time,
        from: ReplicaNumber,
        epoch: Epoch,
        asked: Epoch,
        answer_epoch: Option<Epoch>,
        end: Offset,
    ) {
        let Role::Follower(state) = &mut self.role else { return };
        let expected = Phase::Truncating { asked };
        if from != state.leader || epoch != state.epoch || state.phase != expected {
            return;
        }
        let to = self.log.truncation_point(answer_epoch, end);
        if to < self.log.end() && !self.truncate(to) {
            return;
        }
        // Converged when the logs agree on the last epoch (log matching: same epoch and offset,
        // same batch and same prefix), or when the leader has no such epoch and the log ends
        // at or below its start (committed history), else ask again about the now earlier
        // last epoch.
        let done = self.log.is_empty()
            || Some(self.log.last_epoch()) == answer_epoch
            || (answer_epoch.is_none() && self.log.end() <= end);
        if let Role::Follower(state) = &mut self.role {
            if done {
                state.phase = Phase::Fetching;
            }
        }
        self.send_request(now);
    }

    /// Drops the log's suffix from `to` on, in memory and on disk. False (and the replica is
    /// idle and reports [`Output::Failed`]) if `to` is inside the archived prefix.
    fn truncate(&mut self, to: Offset) -> bool {
        let before = self.log.batches().len();
        if let Err(error) = self.log.truncate(to) {
            self.step_down(Role::Idle);
            self.outbox.push_back(Output::Failed(error));
            return false;
        }
        self.stats.batches_truncated += (before - self.log.batches().len()) as u64;
        self.committed = self.committed.min(to);
        let op = self.disk.truncate(to);
        self.outbox.push_back(Output::Disk(op));
        true
    }

    pub(super) fn on_fetch_reply(
        &mut self,
        now: Time,
        from: ReplicaNumber,
        epoch: Epoch,
        offset: Offset,
        batches: Vec<Batch>,
        (committed, log_start): (Offset, Offset),
    ) {
        let Role::Follower(state) = &mut self.role else { return };
        let fetching = state.phase == Phase::Fetching;
        if from != state.leader || epoch != state.epoch || !fetching || offset != self.log.end() {
            return; // another epoch's, a duplicate, or overtaken by a newer reply
        }
        state.awaiting_since = None;
        let mut appended = Vec::new();
        for batch in batches {
            if batch.epoch > epoch || self.log.append(batch.clone()).is_err() {
                break; // not from this leader's log: refetch from our end
            }
            appended.push(batch);
        }
        if !appended.is_empty() {
            let op = self.disk.write(appended);
            self.outbox.push_back(Output::Disk(op));
            self.sync_if_needed();
        }
        self.committed = self.committed.max(committed.min(self.log.end()));
        // The leader's start, as far as this log is committed and durable (the rest follows
        // with a later reply).
        let start = log_start.min(self.committed).min(self.disk.durable_end());
        if start > self.log.start() && self.log.is_boundary(start) {
            self.log.raise_start(start);
        }
        self.maybe_fetch(now);
    }

    /// Fetches again if nothing is outstanding and the unwritten bytes allow it, or to report a
    /// durable end the leader has not heard of.
    pub(super) fn maybe_fetch(&mut self, now: Time) {
        let (durable, unwritten) = (self.disk.durable_end(), self.disk.unwritten_bytes());
        let room = unwritten < self.config.follower_unwritten_bytes_max;
        let Role::Follower(state) = &self.role else { return };
        if state.phase != Phase::Fetching {
            return;
        }
        let idle = state.awaiting_since.is_none() && room;
        if idle || durable > state.told_durable {
            self.send_request(now);
        }
    }

    pub(super) fn follower_tick(&mut self, now: Time) {
        let retry_ms = self.config.fetch_retry_ms;
        let Role::Follower(state) = &self.role else { return };
        match state.awaiting_since {
            Some(since) if now.since_ms(since) >= retry_ms => self.send_request(now),
            Some(_) => {}
            None => self.maybe_fetch(now),
        }
    }
}
