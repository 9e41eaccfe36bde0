//! [`Replica`]: one shard's replica on one broker, as a sans-IO state machine.

mod follower;
mod leader;

use std::collections::VecDeque;

use bytes::Bytes;

use crate::config::{InjectedBugs, ReplicaConfig, BATCH_PAYLOAD_BYTES_MAX, BATCH_RECORDS_MAX};
use crate::controller::GroupState;
use crate::controller::IsrProposal;
use crate::disk::{DiskOpId, DiskTracker};
use crate::error::AppendError;
use crate::log::ReplicaLog;
use crate::message::{Message, Output};
use crate::types::{AckMode, AppendId, Epoch, LeaseId, Offset, ProducerSeq, ReplicaNumber, Time};

use follower::FollowerState;
pub use leader::FollowerView;
use leader::LeaderState;

/// A client's append, as the broker hands it to the shard's replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    /// Correlates the answer ([`Output::Ack`] or [`Output::Reject`]).
    pub request: AppendId,
    /// The idempotence tag, if the producer is idempotent.
    pub producer: Option<ProducerSeq>,
    /// Record count (1..=`BATCH_RECORDS_MAX`).
    pub records: u32,
    /// The producer has no earlier batch unresolved (every batch it sent before this one was
    /// acked or failed): a shard that does not know the producer (it never did, or forgot it)
    /// takes this batch at its sequence number instead of waiting for sequence 0.
    pub oldest_pending: bool,
    /// The leader's clock when it took the batch, ms since the Unix epoch (the batch's time:
    /// the producer table's expiry clock, `ReplicaLog`).
    pub time_ms: u64,
    /// The encoded records (at most `BATCH_PAYLOAD_BYTES_MAX` bytes).
    pub payload: Bytes,
    /// When to acknowledge.
    pub mode: AckMode,
}

/// What a replica is doing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleView {
    /// No usable leader known (none elected, or the group names this node under an old lease).
    Idle,
    /// Following `leader` in `epoch`.
    Follower {
        /// The leader.
        leader: ReplicaNumber,
        /// Its epoch.
        epoch: Epoch,
    },
    /// Leading `epoch`.
    Leader {
        /// The epoch.
        epoch: Epoch,
    },
}

/// Counters of one replica (the broker exports them per core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Batches removed by truncation to a new leader's log.
    pub batches_truncated: u64,
    /// Retried idempotent batches answered with their original offsets.
    pub duplicates: u64,
    /// Appends refused because the lease was not confirmed.
    pub lease_refusals: u64,
    /// In-sync-set proposals sent (first sends, not retries).
    pub isr_proposals: u64,
    /// Bytes of batches sent in fetch replies.
    pub fetch_bytes_sent: u64,
    /// Times this replica became leader.
    pub leaderships: u64,
    /// Batches moved out of memory by [`Replica::archive`].
    pub batches_archived: u64,
    /// Fetch replies the driver read from storage ([`Output::FetchFromLog`]).
    pub fetches_from_log: u64,
    /// Fetches from below this leader's log start, left unanswered: stale ones (delayed or
    /// repeated by the network). No live follower needs what lies there: no leader starts
    /// its log past a replica's durable end (the simulator checks that none does).
    pub fetches_below_start: u64,
}

impl std::ops::Add for ReplicaStats {
    type Output = ReplicaStats;

    /// Counters summed field by field (over replicas, or over a replica's incarnations).
    fn add(self, b: ReplicaStats) -> ReplicaStats {
        ReplicaStats {
            batches_truncated: self.batches_truncated + b.batches_truncated,
            duplicates: self.duplicates + b.duplicates,
            lease_refusals: self.lease_refusals + b.lease_refusals,
            isr_proposals: self.isr_proposals + b.isr_proposals,
            fetch_bytes_sent: self.fetch_bytes_sent + b.fetch_bytes_sent,
            leaderships: self.leaderships + b.leaderships,
            batches_archived: self.batches_archived + b.batches_archived,
            fetches_from_log: self.fetches_from_log + b.fetches_from_log,
            fetches_below_start: self.fetches_below_start + b.fetches_below_start,
        }
    }
}

enum Role {
    Idle,
    Follower(FollowerState),
    Leader(LeaderState),
}

/// One shard's replica on one broker: leader or follower, decided by the controller.
///
/// Sans-IO, like quinn-proto's `Connection`: it performs no I/O and reads no clock. The driver
/// feeds it inputs, each with `now`:
/// - [`handle_controller`](Self::handle_controller): the group's record from etcd (a watch),
///   including the result of this replica's own proposals;
/// - [`handle_lease`](Self::handle_lease): this broker's lease and until when it is confirmed;
/// - [`handle_message`](Self::handle_message): a message from another replica;
/// - [`handle_append`](Self::handle_append): a client's batch;
/// - [`handle_disk_done`](Self::handle_disk_done): disk operations up to an id completed;
/// - [`handle_tick`](Self::handle_tick): time passed (call every few ms; timers are coarse);
///
/// and after each call drains [`poll`](Self::poll) until it returns `None`: messages to send,
/// disk operations to execute in order, acks and rejections for clients, controller proposals.
pub struct Replica {
    id: ReplicaNumber,
    config: ReplicaConfig,
    bugs: InjectedBugs,
    log: ReplicaLog,
    disk: DiskTracker,
    group: Option<GroupState>,
    lease: Option<LeaseId>,
    lease_valid_until: Time,
    committed: Offset,
    role: Role,
    /// The in-sync-set change last sent to the controller and not yet known to be applied or
    /// refused (no group record newer than the version it expects has arrived), with when it
    /// was last sent. While it is pending, a leader's commits need both the old and the
    /// proposed set. It outlives the leadership that sent it: the controller may have applied
    /// it, and a replica that steps down and leads the same epoch again (its lease changed
    /// and came back) must not commit on the old set alone.
    proposal: Option<(IsrProposal, Time)>,
    outbox: VecDeque<Output>,
    stats: ReplicaStats,
}

impl Replica {
    /// A replica whose log was recovered from disk as `log` (all of it durable). It knows no
    /// group and no lease yet: it neither leads nor follows until told.
    /// `log` should keep to `config.producers` (`ReplicaLog::from_batches_with`); an empty one
    /// is made to.
    pub fn new(id: ReplicaNumber, config: ReplicaConfig, mut log: ReplicaLog) -> Replica {
        if log.producer_limits() != config.producers && log.end() == Offset(0) {
            log = ReplicaLog::with_producer_limits(config.producers);
        }
        debug_assert_eq!(log.producer_limits(), config.producers, "recovered with other limits");
        let end = log.end();
        Replica {
            id,
            config,
            bugs: InjectedBugs::default(),
            log,
            disk: DiskTracker::recovered(end),
            group: None,
            lease: None,
            lease_valid_until: Time(0),
            committed: Offset(0),
            role: Role::Idle,
            proposal: None,
            outbox: VecDeque::new(),
            stats: ReplicaStats::default(),
        }
    }

    /// Turns on deliberate bugs (only the simulator's checker tests do this).
    pub fn inject_bugs(&mut self, bugs: InjectedBugs) {
        self.bugs = bugs;
    }

    /// The next thing for the driver to do, if any.
    pub fn poll(&mut self) -> Option<Output> {
        self.outbox.pop_front()
    }

    /// Panics (debug builds) if the replica's state breaks what every input must keep: the
    /// disk's ends in order (durable <= written <= emitted = the log end), the commit point a
    /// batch boundary of the log and no further than its end, the archive durable, a leader's
    /// epoch at least its log's last and its waiters inside its log and bounded; and the
    /// log's own bookkeeping. Called after every input and by the simulator after every event.
    /// Off while bugs are injected: then the simulator's checker, not these, must find them.
    pub fn debug_assert_invariants(&self) {
        if !cfg!(debug_assertions) || self.bugs != InjectedBugs::default() {
            return;
        }
        self.disk.debug_assert_invariants();
        self.log.debug_assert_invariants();
        let end = self.log.end();
        assert_eq!(
            self.disk.emitted_end(),
            end,
            "{}: the disk was told of another log end",
            self.id
        );
        assert!(
            self.committed <= end,
            "{}: committed {} past the log end {end}",
            self.id,
            self.committed
        );
        assert!(self.log.is_boundary(self.committed), "{}: committed inside a batch", self.id);
        assert!(
            self.log.archived_end() <= self.disk.durable_end(),
            "{}: archived past the durable end",
            self.id
        );
        assert!(
            self.log.start() <= self.disk.durable_end().max(self.log.origin()),
            "{}: log start {} past the durable end",
            self.id,
            self.log.start()
        );
        if let Role::Leader(l) = &self.role {
            assert!(
                l.epoch >= self.log.last_epoch(),
                "{}: a leader behind its log's epoch",
                self.id
            );
            assert!(
                l.waiters.len() <= crate::config::ACK_WAITERS_MAX,
                "{}: waiters unbounded",
                self.id
            );
            assert!(
                l.waiters.iter().all(|w| w.end() <= end),
                "{}: a waiter past the log end",
                self.id
            );
        }
    }

    /// A new record of the group from the controller. Older versions than the one known are
    /// ignored, so notifications may arrive late, twice or out of order.
    pub fn handle_controller(&mut self, now: Time, group: GroupState) {
        if self.group.as_ref().is_some_and(|g| g.version >= group.version) {
            return;
        }
        // A newer record than the proposal expected: it was applied or can no longer be.
        if self.proposal.as_ref().is_some_and(|(p, _)| p.expected_version < group.version) {
            self.proposal = None;
        }
        self.group = Some(group);
        self.follow_group(now);
        self.debug_assert_invariants();
    }

    /// This broker's controller lease is `lease`, confirmed until `valid_until`. A leader acks
    /// nothing at or after `valid_until` (the controller may have replaced it by then).
    pub fn handle_lease(&mut self, now: Time, lease: LeaseId, valid_until: Time) {
        let changed = self.lease != Some(lease);
        self.lease = Some(lease);
        self.lease_valid_until = valid_until;
        if changed {
            self.follow_group(now);
        }
        self.process_waiters(now);
        self.debug_assert_invariants();
    }

    /// A message from replica `from`.
    pub fn handle_message(&mut self, now: Time, from: ReplicaNumber, message: Message) {
        match message {
            Message::EpochQuery { epoch, last_epoch } => {
                self.on_epoch_query(from, epoch, last_epoch)
            }
            Message::Fetch { epoch, from: offset, durable_end } => {
                self.on_fetch(now, from, epoch, offset, durable_end)
            }
            Message::EpochAnswer { epoch, asked, answer_epoch, end } => {
                self.on_epoch_answer(now, from, epoch, asked, answer_epoch, end)
            }
            Message::FetchReply { epoch, from: offset, batches, committed, log_start } => {
                self.on_fetch_reply(now, from, epoch, offset, batches, (committed, log_start))
            }
        }
        self.debug_assert_invariants();
    }

    /// A client's append. The answer comes out of [`poll`](Self::poll).
    pub fn handle_append(&mut self, now: Time, append: AppendRequest) {
        if let Err(error) = self.try_append(now, &append) {
            self.outbox.push_back(Output::Reject { request: append.request, error });
        }
        self.debug_assert_invariants();
    }

    /// Every disk operation up to `id` completed.
    pub fn handle_disk_done(&mut self, now: Time, id: DiskOpId) {
        self.disk.complete(id);
        match self.role {
            Role::Leader(_) => {
                self.advance_commit(now);
                self.process_waiters(now);
            }
            Role::Follower(_) => self.maybe_fetch(now),
            Role::Idle => {}
        }
        self.sync_if_needed();
        self.debug_assert_invariants();
    }

    /// Time passed: retries, long-poll expiries, lag checks.
    pub fn handle_tick(&mut self, now: Time) {
        match self.role {
            Role::Leader(_) => self.leader_tick(now),
            Role::Follower(_) => self.follower_tick(now),
            Role::Idle => {}
        }
        self.debug_assert_invariants();
    }

    /// This replica's node id.
    pub fn id(&self) -> ReplicaNumber {
        self.id
    }

    /// Its log (in memory; the disk may lag, see [`durable_end`](Self::durable_end)).
    pub fn log(&self) -> &ReplicaLog {
        &self.log
    }

    /// Releases the in-memory payloads of committed batches that end at or below `below`
    /// ([`ReplicaLog::release_payloads`]); never those above the commit point, which a
    /// truncation could still need to replay, nor those not yet written (storage, where a
    /// released payload is read back from, may still hold a truncated batch at that offset).
    /// Returns the bytes released.
    pub fn release_payloads(&mut self, below: Offset) -> u64 {
        self.log.release_payloads(below.min(self.visible_end()))
    }

    /// Archives the batches that end at or below `below`, the commit point and the durable end
    /// ([`ReplicaLog::archive`], at least `archive_min_batches` at a time, and at least as
    /// many as stay in memory): on a long log the replica then keeps a bounded number of
    /// batches in memory, and a follower that fetches from the archived prefix is answered
    /// from storage ([`Output::FetchFromLog`]). Returns the batches archived.
    pub fn archive(&mut self, below: Offset) -> usize {
        let below = below.min(self.committed).min(self.disk.durable_end());
        // At least as many as stay, so moving those costs a constant per batch archived.
        let (going, staying) = self.log.split_at(below);
        if going == 0 || going < staying.max(self.config.archive_min_batches) {
            return 0;
        }
        let archived = self.log.archive(below);
        self.stats.batches_archived += archived as u64;
        self.debug_assert_invariants();
        archived
    }

    /// Retention: on a leader, moves the log start up to where `retention` would start it at
    /// `now_ms` (the clock batch times are in), but never past the commit point, its own
    /// durable end, or the durable end any other replica of the group reported to it this
    /// epoch (one not heard from yet counts as 0): every replica holds the log from the start
    /// on, so no follower ever needs what retention deleted. Followers take the start from
    /// the leader's fetch replies. Returns the log start; storage may delete below it.
    pub fn apply_retention(&mut self, retention: crate::config::Retention, now_ms: u64) -> Offset {
        let Role::Leader(state) = &self.role else { return self.log.start() };
        let mut bound = self.committed.min(self.disk.durable_end());
        if let Some(others) =
            state.followers_durable().filter(|_| !self.bugs.retention_past_followers)
        {
            bound = bound.min(others);
        }
        let point = self.log.retention_point(retention, now_ms).min(bound);
        if point > self.log.start() {
            self.log.raise_start(point);
            self.debug_assert_invariants();
        }
        self.log.start()
    }

    /// The log start ([`ReplicaLog::start`]): storage may delete what lies below it.
    pub fn log_start(&self) -> Offset {
        self.log.start()
    }

    /// On a leader, what it knows of each follower (for lag metrics); empty otherwise.
    pub fn followers(&self) -> Vec<FollowerView> {
        match (&self.role, &self.group) {
            (Role::Leader(l), Some(g)) => l.follower_views(&g.isr),
            _ => Vec::new(),
        }
    }

    /// The committed offset (high watermark): batches below it are durable on every in-sync
    /// replica and are the only ones subscribers may read.
    pub fn committed(&self) -> Offset {
        self.committed
    }

    /// Readers of the stored log (subscribers) may read below this: the committed offset, but
    /// no further than the disk operations have completed. A follower cuts its log in memory at
    /// once and learns a commit point past the cut in the same round trip, while the truncation
    /// is still queued for storage, which holds the old, never committed suffix until then.
    pub fn visible_end(&self) -> Offset {
        if self.bugs.visible_past_written {
            return self.committed;
        }
        self.committed.min(self.disk.written_end())
    }

    /// Its log is fdatasync'd up to here.
    pub fn durable_end(&self) -> Offset {
        self.disk.durable_end()
    }

    /// Its counters.
    pub fn stats(&self) -> ReplicaStats {
        self.stats
    }

    /// The group record it last saw.
    pub fn group(&self) -> Option<&GroupState> {
        self.group.as_ref()
    }

    /// Leader, follower or idle.
    pub fn role(&self) -> RoleView {
        match &self.role {
            Role::Idle => RoleView::Idle,
            Role::Follower(f) => RoleView::Follower { leader: f.leader, epoch: f.epoch },
            Role::Leader(l) => RoleView::Leader { epoch: l.epoch },
        }
    }

    /// Becomes what the group record says: leader (only under the lease it was elected with),
    /// follower of the named leader, or idle.
    fn follow_group(&mut self, now: Time) {
        let Some(group) = &self.group else { return };
        let (epoch, leader) = (group.epoch, group.leader);
        let leads =
            leader == Some(self.id) && self.lease.is_some() && group.leader_lease == self.lease;
        match (&self.role, leader) {
            (Role::Leader(l), _) if leads && l.epoch == epoch => self.leader_group_changed(now),
            _ if leads => self.become_leader(now),
            (Role::Follower(f), Some(l)) if f.leader == l && f.epoch == epoch => {}
            (_, Some(l)) if l != self.id => self.become_follower(now, l, epoch),
            _ => self.step_down(Role::Idle),
        }
    }

    /// Leaves the current role for `next`, failing every append still waiting for its ack
    /// with `OutcomeUnknown`: each is in this log, and the next leader may keep it.
    fn step_down(&mut self, next: Role) {
        if let Role::Leader(state) = std::mem::replace(&mut self.role, next) {
            let leader = self.group.as_ref().and_then(|g| g.leader).filter(|&l| l != self.id);
            for waiter in state.waiters {
                let error = AppendError::OutcomeUnknown { leader };
                self.outbox.push_back(Output::Reject { request: waiter.request, error });
            }
        }
    }

    /// Emits a sync if written data is not yet covered by one.
    fn sync_if_needed(&mut self) {
        if let Some(op) = self.disk.sync_if_needed() {
            self.outbox.push_back(Output::Disk(op));
        }
    }

    fn lease_holds(&self, now: Time) -> bool {
        now < self.lease_valid_until || self.bugs.ignore_lease
    }

    fn send(&mut self, to: ReplicaNumber, message: Message) {
        self.outbox.push_back(Output::Send { to, message });
    }
}

/// Checks an append's shape (not its producer sequence).
fn validate(append: &AppendRequest) -> Result<(), AppendError> {
    if append.records == 0 || append.records > BATCH_RECORDS_MAX {
        return Err(AppendError::InvalidBatch("record count out of range"));
    }
    if append.payload.len() > BATCH_PAYLOAD_BYTES_MAX {
        return Err(AppendError::InvalidBatch("payload too large"));
    }
    Ok(())
}
