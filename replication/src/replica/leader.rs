//! The leader's side: appends, fetch answers, the commit point, the in-sync set, acks.

use std::collections::{BTreeMap, BTreeSet};

use super::{validate, AppendRequest, Replica, Role};
use crate::config::ACK_WAITERS_MAX;
use crate::controller::IsrProposal;
use crate::error::AppendError;
use crate::log::SeqCheck;
use crate::message::{Message, Output};
use crate::types::{AckMode, AppendId, Batch, Epoch, Offset, ReplicaNumber, Time};

/// What a leader keeps for its epoch.
pub(super) struct LeaderState {
    pub(super) epoch: Epoch,
    /// The log end when it became leader: every batch committed before this epoch lies below.
    epoch_start: Offset,
    /// When it became leader.
    led_since: Time,
    followers: BTreeMap<ReplicaNumber, Progress>,
    pub(super) waiters: Vec<Waiter>,
}

/// What the leader knows of one follower.
struct Progress {
    /// Its log end, from its last fetch.
    log_end: Offset,
    /// Its fdatasync'd end, from its last fetch.
    durable_end: Offset,
    /// The last time its durable end had reached the leader's log end of that time.
    caught_up_at: Time,
    /// The leader's log end at `mark_at`: reaching it durably makes the follower caught up as
    /// of `mark_at`.
    mark_end: Offset,
    mark_at: Time,
    /// A fetch waiting for news (long poll): since when.
    parked_since: Option<Time>,
    /// The committed offset last sent to it.
    told_committed: Offset,
    /// The leader answered it at this time and has heard nothing from it since: a live
    /// follower fetches again within a round trip of a reply (see `follower_silence_ms`).
    answered_at: Option<Time>,
}

/// What a leader knows of one follower ([`crate::Replica::followers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerView {
    /// The follower.
    pub node: ReplicaNumber,
    /// Its log end, from its last fetch.
    pub log_end: Offset,
    /// Its fdatasync'd end, from its last fetch.
    pub durable_end: Offset,
    /// Whether the controller's in-sync set holds it.
    pub in_sync: bool,
}

impl LeaderState {
    /// The smallest durable end the other replicas of the group reported this epoch (0 for one
    /// not heard from); `None` without other replicas.
    pub(super) fn followers_durable(&self) -> Option<Offset> {
        self.followers.values().map(|p| p.durable_end).min()
    }

    /// What this leader knows of each follower; `isr` is the controller's in-sync set.
    pub(super) fn follower_views(
        &self,
        isr: &std::collections::BTreeSet<ReplicaNumber>,
    ) -> Vec<FollowerView> {
        self.followers
            .iter()
            .map(|(&node, p)| FollowerView {
                node,
                log_end: p.log_end,
                durable_end: p.durable_end,
                in_sync: isr.contains(&node),
            })
            .collect()
    }
}

/// An append waiting for its acknowledgement.
pub(super) struct Waiter {
    pub(super) request: AppendId,
    base: Offset,
    records: u32,
    mode: AckMode,
}

impl Waiter {
    pub(super) fn end(&self) -> Offset {
        Offset(self.base.0 + u64::from(self.records))
    }
}

impl Replica {
    pub(super) fn become_leader(&mut self, now: Time) {
        let group = self.group.as_ref().expect("leadership comes from a group record");
        let end = self.log.end();
        let followers = group
            .replicas
            .iter()
            .filter(|&&n| n != self.id)
            .map(|&n| (n, Progress::new(now, end)))
            .collect();
        let state = LeaderState {
            epoch: group.epoch,
            epoch_start: end,
            led_since: now,
            followers,
            waiters: Vec::new(),
        };
        self.step_down(Role::Leader(state));
        self.committed = self.committed.min(end);
        self.stats.leaderships += 1;
    }

    /// The group record changed while this replica still leads the same epoch.
    pub(super) fn leader_group_changed(&mut self, now: Time) {
        self.advance_commit(now);
        self.process_waiters(now);
    }

    pub(super) fn try_append(
        &mut self,
        now: Time,
        append: &AppendRequest,
    ) -> Result<(), AppendError> {
        validate(append)?;
        let Role::Leader(state) = &self.role else {
            let leader = self.group.as_ref().and_then(|g| g.leader).filter(|&l| l != self.id);
            return Err(AppendError::NotLeader { leader });
        };
        if !self.lease_holds(now) {
            self.stats.lease_refusals += 1;
            return Err(AppendError::LeaseExpired);
        }
        let insync = self.quorum().len();
        if append.mode == AckMode::Durable && insync < self.config.min_insync {
            return Err(AppendError::NotEnoughReplicas {
                insync,
                min_insync: self.config.min_insync,
            });
        }
        if state.waiters.len() >= ACK_WAITERS_MAX {
            return Err(AppendError::Busy);
        }
        let epoch = state.epoch;
        let (base, records) =
            match append.producer.map(|tag| self.log.check_seq(tag, append.oldest_pending)) {
                Some(SeqCheck::Duplicate { base, records }) if !self.bugs.skip_dedup => {
                    if records != append.records {
                        return Err(AppendError::SequenceMismatch {
                            stored: records,
                            retry: append.records,
                        });
                    }
                    self.stats.duplicates += 1;
                    (base, records)
                }
                Some(SeqCheck::TooOld) => return Err(AppendError::SequenceTooOld),
                Some(SeqCheck::OutOfOrder) => return Err(AppendError::OutOfOrderSequence),
                _ => self.append_batch(epoch, append),
            };
        let waiter = Waiter { request: append.request, base, records, mode: append.mode };
        if let Role::Leader(state) = &mut self.role {
            state.waiters.push(waiter);
        }
        self.wake_parked(now);
        self.process_waiters(now);
        Ok(())
    }

    /// Appends a new batch of `epoch` to the log and the disk; returns its offsets.
    fn append_batch(&mut self, epoch: Epoch, append: &AppendRequest) -> (Offset, u32) {
        let batch = Batch {
            epoch,
            base: self.log.end(),
            records: append.records,
            producer: append.producer,
            time_ms: append.time_ms,
            payload: append.payload.clone(),
        };
        let base = batch.base;
        let op = self.disk.write(vec![batch.clone()]);
        // Cannot fail: the batch starts at the log end, has records and the leader's epoch is
        // the newest the log has seen.
        let appended = self.log.append(batch);
        debug_assert!(appended.is_ok(), "leader append: {appended:?}");
        self.outbox.push_back(Output::Disk(op));
        self.sync_if_needed();
        (base, append.records)
    }

    pub(super) fn on_epoch_query(&mut self, from: ReplicaNumber, epoch: Epoch, asked: Epoch) {
        let Role::Leader(state) = &mut self.role else { return };
        if epoch != state.epoch {
            return;
        }
        if let Some(progress) = state.followers.get_mut(&from) {
            progress.answered_at = None;
        }
        let (answer_epoch, end) = self.log.epoch_answer(asked, state.epoch);
        self.send(from, Message::EpochAnswer { epoch, asked, answer_epoch, end });
    }

    pub(super) fn on_fetch(
        &mut self,
        now: Time,
        from: ReplicaNumber,
        epoch: Epoch,
        offset: Offset,
        durable: Offset,
    ) {
        let log_end = self.log.end();
        if offset > log_end || !self.log.is_boundary(offset) {
            return; // not a prefix of this log: a follower that skipped truncation, or stale
        }
        if offset < self.log.start() {
            // What it asks for may be deleted (retention). The protocol never lets this
            // happen (`apply_retention`); count it rather than answer with a gap.
            self.stats.fetches_below_start += 1;
            return;
        }
        let Role::Leader(state) = &mut self.role else { return };
        let Some(progress) = state.followers.get_mut(&from) else { return };
        if epoch != state.epoch {
            return;
        }
        progress.answered_at = None;
        progress.log_end = offset;
        progress.durable_end = durable.min(offset);
        if progress.durable_end >= progress.mark_end {
            progress.caught_up_at = progress.mark_at;
            progress.mark_end = log_end;
            progress.mark_at = now;
        }
        progress.parked_since = Some(now);
        self.maybe_expand_isr(now, from);
        self.advance_commit(now);
        self.wake_parked(now);
    }

    /// Answers every parked fetch that has news: batches after its offset, or a newer commit.
    pub(super) fn wake_parked(&mut self, now: Time) {
        let Role::Leader(state) = &mut self.role else { return };
        let (committed, end) = (self.committed, self.log.end());
        let mut due = Vec::new();
        for (&node, progress) in &mut state.followers {
            let news = progress.log_end < end || progress.told_committed < committed;
            if progress.parked_since.is_some() && news {
                progress.parked_since = None;
                progress.told_committed = committed;
                due.push((node, progress.log_end));
            }
        }
        for (node, from) in due {
            self.send_fetch_reply(now, node, from);
        }
    }

    /// Sends `node` the batches after `from` (bounded by `fetch_bytes_max`) and the commit.
    fn send_fetch_reply(&mut self, now: Time, node: ReplicaNumber, from: Offset) {
        let Role::Leader(state) = &mut self.role else { return };
        if let Some(progress) = state.followers.get_mut(&node) {
            progress.answered_at.get_or_insert(now);
        }
        let (epoch, log_start) = (state.epoch, self.log.start());
        if from < self.log.archived_end() {
            let (upto, committed) = (self.log.archived_end(), self.committed);
            let bytes_max = self.config.fetch_bytes_max;
            let fetch = Output::FetchFromLog {
                to: node,
                epoch,
                from,
                upto,
                committed,
                log_start,
                bytes_max,
            };
            self.outbox.push_back(fetch);
            self.stats.fetches_from_log += 1;
            return;
        }
        let batches = self.log.read_from(from, self.config.fetch_bytes_max);
        self.stats.fetch_bytes_sent += batches.iter().map(Batch::size_bytes).sum::<u64>();
        let committed = self.committed;
        self.send(node, Message::FetchReply { epoch, from, batches, committed, log_start });
    }

    /// The in-sync replicas a commit needs now: the confirmed set, plus the proposed one while a
    /// proposal is pending (a shrink takes effect only once confirmed, an expansion at once).
    /// A pending proposal counts whichever leadership of this replica sent it.
    pub(super) fn quorum(&self) -> BTreeSet<ReplicaNumber> {
        let mut quorum = self.group.as_ref().map(|g| g.isr.clone()).unwrap_or_default();
        if let Some((p, _)) = &self.proposal {
            quorum.extend(p.isr.iter().copied());
        }
        quorum.insert(self.id);
        quorum
    }

    /// Moves the committed offset to the smallest durable end of the quorum.
    pub(super) fn advance_commit(&mut self, now: Time) {
        let quorum = self.quorum();
        let Role::Leader(state) = &self.role else { return };
        let own = self.disk.durable_end();
        let durable_of = |n: &ReplicaNumber| match state.followers.get(n) {
            _ if *n == self.id => own,
            Some(p) => p.durable_end,
            None => Offset(0),
        };
        let mut candidate = quorum.iter().map(durable_of).min().unwrap_or(own);
        if self.bugs.commit_without_quorum {
            candidate = own;
        }
        if candidate > self.committed {
            self.committed = candidate;
            self.wake_parked(now);
            self.process_waiters(now);
        }
    }

    /// Acknowledges every waiter whose mode is met, while the lease holds.
    pub(super) fn process_waiters(&mut self, now: Time) {
        // While it hands its leadership on, a leader acks nothing: the next record names
        // another leader, and appends waiting then are answered `OutcomeUnknown`.
        if self.proposal.as_ref().is_some_and(|(p, _)| p.transfer_to.is_some()) {
            return;
        }
        let lease_holds = self.lease_holds(now);
        let insync_ok = self.quorum().len() >= self.config.min_insync;
        let (committed, written) = (self.committed, self.disk.written_end());
        let Role::Leader(state) = &mut self.role else { return };
        if !lease_holds {
            return;
        }
        let epoch = state.epoch;
        let done = |w: &Waiter| match w.mode {
            AckMode::Durable => insync_ok && w.end() <= committed,
            AckMode::Written => w.end() <= written,
            AckMode::None => true,
        };
        if !state.waiters.iter().any(done) {
            return;
        }
        // Keeps the order of arrival among the acks and among those left waiting.
        let (ready, waiting): (Vec<Waiter>, Vec<Waiter>) =
            std::mem::take(&mut state.waiters).into_iter().partition(done);
        state.waiters = waiting;
        for w in ready {
            let ack = Output::Ack { request: w.request, epoch, base: w.base, records: w.records };
            self.outbox.push_back(ack);
        }
    }

    pub(super) fn leader_tick(&mut self, now: Time) {
        let park_max_ms = self.config.fetch_park_max_ms;
        let Role::Leader(state) = &mut self.role else { return };
        let committed = self.committed;
        let mut expired = Vec::new();
        for (&node, progress) in &mut state.followers {
            if progress.parked_since.is_some_and(|t| now.since_ms(t) >= park_max_ms) {
                progress.parked_since = None;
                progress.told_committed = committed;
                expired.push((node, progress.log_end));
            }
        }
        for (node, from) in expired {
            self.send_fetch_reply(now, node, from);
        }
        self.maybe_shrink_isr(now);
        self.maybe_hand_to_preferred(now);
        self.retry_proposal(now);
        self.process_waiters(now);
    }

    /// Proposes removing the in-sync followers that hold the commit back and are either slow
    /// (not durably caught up for `isr_lag_max_ms`) or silent (answered more than
    /// `follower_silence_ms` ago and not heard from since: gone, as far as commits can tell).
    fn maybe_shrink_isr(&mut self, now: Time) {
        let (lag_max_ms, silence_ms) =
            (self.config.isr_lag_max_ms, self.config.follower_silence_ms);
        let end = self.log.end();
        let Some(group) = &self.group else { return };
        let Role::Leader(state) = &self.role else { return };
        let lagging = |p: &Progress| {
            let slow = now.since_ms(p.caught_up_at) > lag_max_ms;
            let silent = p.answered_at.is_some_and(|t| now.since_ms(t) > silence_ms);
            slow || (silent && p.durable_end < end)
        };
        let laggards: Vec<ReplicaNumber> = state
            .followers
            .iter()
            .filter(|(n, p)| group.isr.contains(n) && lagging(p))
            .map(|(&n, _)| n)
            .collect();
        if !laggards.is_empty() {
            let isr = group.isr.iter().filter(|n| !laggards.contains(n)).copied().collect();
            self.propose(now, isr);
        }
    }

    /// Proposes adding `follower` once it durably holds everything committed and everything
    /// this epoch started with.
    fn maybe_expand_isr(&mut self, now: Time, follower: ReplicaNumber) {
        let Some(group) = &self.group else { return };
        let Role::Leader(state) = &self.role else { return };
        let Some(progress) = state.followers.get(&follower) else { return };
        let floor = self.committed.max(state.epoch_start);
        if !group.isr.contains(&follower) && progress.durable_end >= floor {
            let mut isr = group.isr.clone();
            isr.insert(follower);
            self.propose(now, isr);
        }
    }

    /// Leader balance: hands the leadership to the shard's preferred replica (the first of its
    /// replicas) once this replica has led for `preferred_leader_after_ms` and the preferred
    /// one is in sync, answering, durably holds everything committed and was caught up with
    /// the log end within a long poll and a silence (`fetch_park_max_ms` +
    /// `follower_silence_ms`: an idle shard's follower fetches that often), so that few
    /// appends in flight are lost to the change (those are refused `OutcomeUnknown` and sent
    /// again by their clients).
    fn maybe_hand_to_preferred(&mut self, now: Time) {
        let Some(after_ms) = self.config.preferred_leader_after_ms else { return };
        let recent_ms = self.config.fetch_park_max_ms + self.config.follower_silence_ms;
        let Some(group) = &self.group else { return };
        let Role::Leader(state) = &self.role else { return };
        let Some(&preferred) = group.replicas.first() else { return };
        if preferred == self.id || now.since_ms(state.led_since) < after_ms {
            return;
        }
        let Some(p) = state.followers.get(&preferred) else { return };
        let silent =
            p.answered_at.is_some_and(|t| now.since_ms(t) > self.config.follower_silence_ms);
        let ready = group.isr.contains(&preferred)
            && !silent
            && p.durable_end >= self.committed
            && now.since_ms(p.caught_up_at) <= recent_ms;
        if !ready && !self.bugs.transfer_out_of_sync {
            return;
        }
        let isr = group.isr.clone();
        self.propose_change(now, isr, Some(preferred));
    }

    /// Sends an in-sync-set proposal unless one is pending.
    fn propose(&mut self, now: Time, isr: BTreeSet<ReplicaNumber>) {
        self.propose_change(now, isr, None);
    }

    /// Sends an in-sync-set proposal, or with `transfer_to` a leadership transfer, unless a
    /// proposal is pending.
    fn propose_change(
        &mut self,
        now: Time,
        isr: BTreeSet<ReplicaNumber>,
        transfer_to: Option<ReplicaNumber>,
    ) {
        let Some(group) = &self.group else { return };
        let Role::Leader(state) = &self.role else { return };
        if self.proposal.is_some() {
            return;
        }
        let proposal = IsrProposal {
            expected_version: group.version,
            leader: self.id,
            epoch: state.epoch,
            isr,
            transfer_to,
        };
        self.proposal = Some((proposal.clone(), now));
        self.stats.isr_proposals += 1;
        self.outbox.push_back(Output::Propose(proposal));
    }

    fn retry_proposal(&mut self, now: Time) {
        let retry_ms = self.config.propose_retry_ms;
        if !matches!(self.role, Role::Leader(_)) {
            return;
        }
        let Some((p, sent)) = &mut self.proposal else { return };
        if now.since_ms(*sent) < retry_ms {
            return;
        }
        if p.transfer_to.is_some() {
            // A transfer unanswered for that long is given up (the target's lease may have
            // changed): the leader acks again and tries later.
            self.proposal = None;
            if let Role::Leader(state) = &mut self.role {
                state.led_since = now;
            }
            self.process_waiters(now);
            return;
        }
        *sent = now;
        let again = p.clone();
        self.outbox.push_back(Output::Propose(again));
    }
}

impl Progress {
    fn new(now: Time, leader_end: Offset) -> Progress {
        Progress {
            log_end: Offset(0),
            durable_end: Offset(0),
            caught_up_at: now,
            mark_end: leader_end,
            mark_at: now,
            parked_since: None,
            told_committed: Offset(0),
            answered_at: None,
        }
    }
}
