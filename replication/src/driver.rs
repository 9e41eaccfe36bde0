//! The replication driver's decisions, sans-IO: one core's set of [`Replica`]s and everything
//! between them and the world that is not I/O.
//!
//! The broker (`broker/src/app/replication/`) is a thin glommio shell around a [`Driver`]: it
//! feeds the cluster view, the lease, peer messages, client appends, disk completions and the
//! time in, and carries out the [`Action`]s that come out of [`Driver::poll`] (send this frame,
//! queue this disk operation, answer this append, feed these batches to the subscribers' tail,
//! hand this proposal to the agent, open or stop a replica). The simulator
//! ([`crate::sim`]) drives the same `Driver` with its etcd model, network and disks, so every
//! decision here is checked by its invariants:
//!
//! - **adoption**: a replica starts only for a placed stream whose group names this broker; one
//!   whose group's replicas changed is stopped, and opened again only if its log is empty
//!   ([`adoption`]); one that failed to start is tried again after [`Limits::retry_open_ms`];
//! - **appends answered once**: each append handed in is answered exactly once, by an ack, a
//!   refusal, or `OutcomeUnknown` when the lease runs out or the replica stops; a late answer of
//!   the state machine to one already answered is dropped;
//! - **proposal gating**: at most one in-sync-set proposal per shard is on its way to the
//!   controller; one made while the previous is unanswered is dropped and counted (the state
//!   machine resends it);
//! - **what subscribers may read**: the tail is fed committed batches below
//!   [`ShardDriver::visible_end`] (the commit point, where storage holds it), in order, each
//!   once; a truncation below what was fed stops the replica rather than take back delivered
//!   records;
//! - **the resident/archive policy**: payloads of committed batches beyond the newest
//!   `resident_bytes` leave memory; the batches leave it too, but for an index, and a
//!   checkpoint of that archive is written; fetches of released payloads are answered from
//!   storage.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::rc::Rc;

use crate::config::{InjectedBugs, ReplicaConfig};
use crate::controller::GroupState;
use crate::disk::{DiskOp, DiskOpId};
use crate::error::AppendError;
use crate::log::ReplicaLog;
use crate::message::{Message, Output};
use crate::replica::{AppendRequest, Replica, RoleView};
use crate::types::{AppendId, Batch, Epoch, LeaseId, Offset, ReplicaNumber, Time};

/// Appends one shard's driver holds unanswered at most (the state machine's own bound on the
/// acks it waits for, plus room for the appends it answers at once).
pub const PENDING_MAX: usize = crate::config::ACK_WAITERS_MAX * 2;

/// One replicated shard: its stream and shard number. The stream name is shared, so a key is
/// cloned without an allocation on every output.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardKey {
    /// The stream.
    pub stream: Rc<str>,
    /// The shard.
    pub shard: u32,
}

impl ShardKey {
    /// The key of `shard` of `stream`.
    pub fn new(stream: &str, shard: u32) -> ShardKey {
        ShardKey { stream: Rc::from(stream), shard }
    }
}

/// The driver's own limits and timings (the replicas' are in [`ReplicaConfig`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Payload bytes of the newest committed batches each replica keeps in memory; older
    /// payloads are read back from storage when needed (`--replica-resident-bytes`).
    pub resident_bytes: u64,
    /// How long after a replica failed to start it is tried again, ms.
    pub retry_open_ms: u64,
    /// In-sync replicas a durable append needs (0: a majority of the replicas).
    pub min_insync: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { resident_bytes: 64 << 20, retry_open_ms: 5_000, min_insync: 0 }
    }
}

/// One group record of the cluster view, as the driver needs it.
#[derive(Clone, Debug)]
pub struct GroupView<'a, N> {
    /// The shard.
    pub key: &'a ShardKey,
    /// Whether the stream's placement is in the view (before it, a group record may be a
    /// deposed controller's partial set, overwritten with other replicas).
    pub placed: bool,
    /// The broker of each replica number.
    pub replicas: &'a [N],
    /// The record's state (`None` if it does not parse).
    pub state: Option<GroupState>,
}

/// Why a replica stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Its group's replicas changed and its log is empty: it is opened again with the new
    /// ones once the shell reports it stopped ([`Driver::stopped`]).
    Reopen,
    /// Its group's replicas changed and its log holds batches of the old group, whose epochs a
    /// new group may repeat with another leader: not opened again until the broker restarts.
    Refused,
    /// It failed (a storage error, a protocol violation): it stays stopped until the broker
    /// restarts; the other replicas carry on.
    Failed(String),
    /// Its stream was deleted ([`Driver::handle_deleted`]): the shell drops it; the stream's
    /// data goes with it.
    Deleted,
}

/// What the driver asks its shell to do, one shard at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action<N> {
    /// Start the replica of `key`: recover its log from storage, then call
    /// [`Driver::opened`] (or [`Driver::open_failed`]).
    Open {
        /// The shard.
        key: ShardKey,
        /// Its replica number in the group.
        me: ReplicaNumber,
        /// The broker of each replica number.
        nodes: Vec<N>,
    },
    /// The replica of `key` stopped; its disk operations already queued may finish. Answered
    /// appends were answered by `Reject`s before this. With [`StopReason::Reopen`], call
    /// [`Driver::stopped`] once its disk task has ended.
    Stop {
        /// The shard.
        key: ShardKey,
        /// Why.
        reason: StopReason,
    },
    /// Send `message` from this replica (`from`) of `key` to the broker `to`; every batch's
    /// payload is in it.
    Send {
        /// The shard.
        key: ShardKey,
        /// The destination broker.
        to: N,
        /// This broker's replica number.
        from: ReplicaNumber,
        /// The message.
        message: Message,
    },
    /// As `Send`, a fetch reply whose released payloads (empty) are read back from storage
    /// first: each must match the batch's offsets, epoch and producer tag; the reply is cut at
    /// the first that cannot be read (nothing is sent if the first cannot).
    SendReadingPayloads {
        /// The shard.
        key: ShardKey,
        /// The destination broker.
        to: N,
        /// This broker's replica number.
        from: ReplicaNumber,
        /// The fetch reply.
        message: Message,
    },
    /// Send `to` the fetch reply of archived batches described by [`Output::FetchFromLog`],
    /// read from storage.
    SendFromLog {
        /// The shard.
        key: ShardKey,
        /// The destination broker.
        to: N,
        /// This broker's replica number.
        from: ReplicaNumber,
        /// The leader epoch.
        epoch: Epoch,
        /// The first batch's base offset.
        start: Offset,
        /// No batch past this offset.
        upto: Offset,
        /// The leader's committed offset.
        committed: Offset,
        /// The leader's log start.
        log_start: Offset,
        /// Bytes of batches at most (at least one batch).
        bytes_max: u64,
    },
    /// Execute `op` on `key`'s log, in order with its other operations, then call
    /// [`Driver::handle_disk_done`].
    Disk {
        /// The shard.
        key: ShardKey,
        /// The operation.
        op: DiskOp,
    },
    /// The append `request` is acknowledged.
    Ack {
        /// The shard.
        key: ShardKey,
        /// The append ([`Driver::handle_append`]'s id).
        request: AppendId,
        /// The acknowledging leader's epoch.
        epoch: Epoch,
        /// Offset of its first record.
        base: Offset,
        /// Its record count.
        records: u32,
    },
    /// The append `request` is refused.
    Reject {
        /// The shard.
        key: ShardKey,
        /// The append.
        request: AppendId,
        /// Why.
        error: AppendError,
    },
    /// Hand this in-sync-set proposal (or leadership transfer) to the controller, then call
    /// [`Driver::proposal_done`] once it is answered (or given up).
    Propose {
        /// The shard.
        key: ShardKey,
        /// The record version it expects.
        expected_version: u64,
        /// The leader's epoch.
        epoch: Epoch,
        /// The in-sync set it proposes, as brokers.
        isr: Vec<N>,
        /// A leadership transfer to this broker instead ([`crate::GroupState::apply_transfer`]):
        /// `isr` is then the current in-sync set.
        transfer_to: Option<N>,
    },
    /// Give the subscribers' tail these committed batches (in order, each once; released
    /// payloads are skipped: readers read them from storage).
    Tail {
        /// The shard.
        key: ShardKey,
        /// The batches.
        batches: Vec<Batch>,
    },
    /// Write this checkpoint of the log's archived prefix beside the log.
    Checkpoint {
        /// The shard.
        key: ShardKey,
        /// [`ReplicaLog::checkpoint`]'s bytes.
        bytes: Vec<u8>,
    },
    /// The replica's role changed (for the log).
    RoleChanged {
        /// The shard.
        key: ShardKey,
        /// The new role.
        role: RoleView,
        /// Its log end.
        log_end: Offset,
        /// Its commit point.
        committed: Offset,
    },
}

/// One replicated shard on this core: its state machine, the appends it has not answered, and
/// what its subscribers were given.
pub struct ShardDriver<N> {
    key: ShardKey,
    nodes: Vec<N>,
    me: ReplicaNumber,
    replica: Replica,
    /// Appends handed in and not answered yet.
    pending: HashSet<AppendId>,
    next_request: u64,
    /// The subscribers' tail has every committed batch below this.
    fed: Offset,
    failed: bool,
    proposing: bool,
    proposals_dropped: u64,
    resident_bytes: u64,
    bugs: InjectedBugs,
}

impl<N: Clone + PartialEq + Debug> ShardDriver<N> {
    /// Its shard.
    pub fn key(&self) -> &ShardKey {
        &self.key
    }

    /// The replica, for reading.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The broker of each replica number.
    pub fn nodes(&self) -> &[N] {
        &self.nodes
    }

    /// This broker's replica number.
    pub fn me(&self) -> ReplicaNumber {
        self.me
    }

    /// Whether it stopped after a failure.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Appends not answered yet.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The subscribers were given every committed batch below this.
    pub fn fed(&self) -> Offset {
        self.fed
    }

    /// Subscribers may read below this offset: the commit point, where storage holds it
    /// ([`Replica::visible_end`]), and no further than the tail was fed.
    pub fn visible_end(&self) -> Offset {
        if self.bugs.tail_past_written {
            return self.fed.min(self.replica.committed());
        }
        self.fed.min(self.replica.visible_end())
    }

    /// The driver's invariants (debug builds): what was fed is committed and in the log;
    /// answers are bounded.
    pub fn debug_assert_invariants(&self) {
        if !cfg!(debug_assertions) || self.failed {
            return;
        }
        if self.bugs == InjectedBugs::default() {
            // The commit point only goes down with a truncation below it, which the protocol
            // never makes (claim C) and `drain` refuses below `fed`.
            debug_assert!(
                self.fed <= self.replica.committed(),
                "{:?}: fed {} past the commit point {}",
                self.key,
                self.fed,
                self.replica.committed()
            );
        }
        debug_assert!(
            self.pending.len() <= PENDING_MAX,
            "{:?}: {} appends pending",
            self.key,
            self.pending.len()
        );
        debug_assert!((self.me.0 as usize) < self.nodes.len());
    }

    fn node(&self, n: ReplicaNumber) -> Option<N> {
        self.nodes.get(n.0 as usize).cloned()
    }

    /// Takes every output of the state machine into `out`, then feeds the tail and applies the
    /// resident/archive policy.
    fn drain(&mut self, role_before: RoleView, out: &mut VecDeque<Action<N>>) {
        if self.failed {
            return;
        }
        let role = self.replica.role();
        if role != role_before {
            out.push_back(Action::RoleChanged {
                key: self.key.clone(),
                role,
                log_end: self.replica.log().end(),
                committed: self.replica.committed(),
            });
        }
        let key = &self.key;
        while let Some(output) = self.replica.poll() {
            match output {
                Output::Send { to, message } => {
                    let Some(node) = self.node(to) else { continue };
                    let from = self.me;
                    let reading = matches!(&message, Message::FetchReply { batches, .. }
                        if batches.iter().any(|b| b.payload.is_empty()));
                    out.push_back(if reading {
                        Action::SendReadingPayloads { key: key.clone(), to: node, from, message }
                    } else {
                        Action::Send { key: key.clone(), to: node, from, message }
                    });
                }
                Output::FetchFromLog { to, epoch, from, upto, committed, log_start, bytes_max } => {
                    let Some(node) = self.node(to) else { continue };
                    out.push_back(Action::SendFromLog {
                        key: key.clone(),
                        to: node,
                        from: self.me,
                        epoch,
                        start: from,
                        upto,
                        committed,
                        log_start,
                        bytes_max,
                    });
                }
                Output::Disk(DiskOp::Truncate { to, .. })
                    if to < self.fed && !self.bugs.truncate_below_fed =>
                {
                    // The protocol never cuts below the commit point (claim C in
                    // docs/replication.md), and subscribers were given everything below `fed`:
                    // cutting there would take back delivered records. Stop the replica rather
                    // than serve a history that forks from what was read.
                    let why = format!(
                        "a truncation to {to} goes below what subscribers were given ({})",
                        self.fed
                    );
                    self.fail(why, out);
                    return;
                }
                Output::Disk(op) => out.push_back(Action::Disk { key: key.clone(), op }),
                Output::Ack { request, epoch, base, records } => {
                    if self.pending.remove(&request) {
                        out.push_back(Action::Ack {
                            key: key.clone(),
                            request,
                            epoch,
                            base,
                            records,
                        });
                    }
                }
                Output::Reject { request, error } => {
                    if self.pending.remove(&request) {
                        out.push_back(Action::Reject { key: key.clone(), request, error });
                    }
                }
                Output::Propose(p) => {
                    if self.proposing && !self.bugs.propose_unbounded {
                        // The previous one is on its way; the state machine resends this.
                        self.proposals_dropped += 1;
                        continue;
                    }
                    self.proposing = true;
                    out.push_back(Action::Propose {
                        key: key.clone(),
                        expected_version: p.expected_version,
                        epoch: p.epoch,
                        isr: p.isr.iter().filter_map(|n| self.node(*n)).collect(),
                        transfer_to: p.transfer_to.and_then(|n| self.node(n)),
                    });
                }
                Output::Failed(error) => {
                    self.fail(
                        format!("{error}; restart the broker to recover it from its log"),
                        out,
                    );
                    return;
                }
            }
        }
        self.feed_tail(out);
        let committed = self.replica.committed();
        let keep_from = self.replica.log().keeping_last_bytes(committed, self.resident_bytes);
        self.replica.release_payloads(keep_from);
        // Batches whose payloads left memory leave it too, but for a small index.
        if self.replica.archive(keep_from) > 0 {
            if let Some(bytes) = self.replica.log().checkpoint() {
                out.push_back(Action::Checkpoint { key: self.key.clone(), bytes });
            }
        }
        self.debug_assert_invariants();
    }

    /// Feeds the subscribers' tail every batch that became committed and is in storage.
    fn feed_tail(&mut self, out: &mut VecDeque<Action<N>>) {
        let end = if self.bugs.tail_past_written {
            self.replica.committed()
        } else {
            self.replica.visible_end()
        };
        let end = end.min(self.replica.log().end());
        if end <= self.fed {
            return;
        }
        let batches = self.replica.log().batches();
        let start = batches.partition_point(|b| b.end() <= self.fed);
        let fed: Vec<Batch> = batches[start..]
            .iter()
            .take_while(|b| b.base < end)
            .filter(|b| !b.payload.is_empty())
            .cloned()
            .collect();
        if !fed.is_empty() {
            out.push_back(Action::Tail { key: self.key.clone(), batches: fed });
        }
        self.fed = end;
    }

    /// Answers every pending append with `OutcomeUnknown`: each may be in this log, and a new
    /// leader may keep it.
    fn refuse_pending(&mut self, out: &mut VecDeque<Action<N>>) {
        let mut pending: Vec<AppendId> = self.pending.drain().collect();
        pending.sort();
        for request in pending {
            out.push_back(Action::Reject {
                key: self.key.clone(),
                request,
                error: AppendError::OutcomeUnknown { leader: None },
            });
        }
    }

    fn fail(&mut self, why: String, out: &mut VecDeque<Action<N>>) {
        if self.failed {
            return;
        }
        self.failed = true;
        self.refuse_pending(out);
        out.push_back(Action::Stop { key: self.key.clone(), reason: StopReason::Failed(why) });
    }
}

/// The outcome of a client append handed to [`Driver::handle_append`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// Handed to the replica: its answer comes as an [`Action::Ack`] or [`Action::Reject`]
    /// naming this id.
    Pending(AppendId),
    /// No replica of that shard runs here (not adopted yet, stopped, or failed).
    NoReplica,
}

/// What [`Driver`] does with one group record of the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// Nothing: this broker is not a replica, or the stream is not placed yet (its groups may
    /// be a deposed controller's partial set, which the next controller overwrites with other
    /// replicas: docs/replication.md, "The controller on etcd").
    Skip,
    /// The running replica has this group's replicas: it goes on.
    Keep,
    /// Start the replica, with this replica number.
    Open(ReplicaNumber),
    /// The running replica was opened with other replicas (its numbers name other brokers)
    /// and its log is empty: stop it and open it again with these.
    Reopen,
    /// As `Reopen`, but its log holds batches: stop it and do not reopen it. Those batches'
    /// epochs come from another record of the group; a new record starts again at epoch 1,
    /// maybe with another leader, and log matching (one leader per epoch) would not hold.
    Refuse,
}

/// The decision for a group of `replicas` on broker `me`: `placed` says whether the stream is
/// placed; `running`, the replicas the running replica was opened with and where its log ends,
/// if one runs.
pub fn adoption<N: PartialEq>(
    placed: bool,
    replicas: &[N],
    me: &N,
    running: Option<(&[N], Offset)>,
) -> Adoption {
    let number = replicas.iter().position(|n| n == me).map(|i| ReplicaNumber(i as u32));
    match (running, placed, number) {
        (None, true, Some(n)) => Adoption::Open(n),
        (None, _, _) => Adoption::Skip,
        (Some((nodes, _)), _, _) if nodes == replicas => Adoption::Keep,
        (Some((_, Offset(0))), _, _) => Adoption::Reopen,
        (Some(_), _, _) => Adoption::Refuse,
    }
}

/// The driver's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// In-sync-set proposals dropped because the shard's previous one was on its way.
    pub proposals_dropped: u64,
    /// Appends answered `OutcomeUnknown` because the lease ran out while they waited.
    pub refused_without_lease: u64,
}

/// One core's replication driver: the replicas it runs, by shard, and the decisions around
/// them. `N` names a broker (the cluster's node id; the simulator's node number).
pub struct Driver<N> {
    me: N,
    config: ReplicaConfig,
    limits: Limits,
    /// The replicas, by stream and shard (looked up by `&str`, with no allocation).
    shards: HashMap<Rc<str>, HashMap<u32, ShardDriver<N>>>,
    /// Replicas being opened (the shell recovers their logs) or being stopped to reopen.
    opening: HashSet<ShardKey>,
    /// Replicas that could not start, and when they may be tried again.
    retry_at: HashMap<ShardKey, Time>,
    /// Replicas stopped because their group's replicas changed under a log with batches.
    refused: HashSet<ShardKey>,
    /// Shards whose proposal is on its way while their replica is not running (stopped to be
    /// reopened): the reopened replica waits for it too, so one shard never has two.
    proposing: HashSet<ShardKey>,
    /// This broker's lease and until when it holds, as last confirmed.
    lease: Option<(LeaseId, Time)>,
    out: VecDeque<Action<N>>,
    stats: DriverStats,
    bugs: InjectedBugs,
}

impl<N: Clone + PartialEq + Debug> Driver<N> {
    /// The driver of broker `me`; each replica it opens gets `config` (its `min_insync` from
    /// `limits` where set, and its defaults for the group's size otherwise).
    pub fn new(me: N, config: ReplicaConfig, limits: Limits) -> Driver<N> {
        Driver {
            me,
            config,
            limits,
            shards: HashMap::new(),
            opening: HashSet::new(),
            retry_at: HashMap::new(),
            refused: HashSet::new(),
            proposing: HashSet::new(),
            lease: None,
            out: VecDeque::new(),
            stats: DriverStats::default(),
            bugs: InjectedBugs::default(),
        }
    }

    /// Injects deliberate bugs into this driver and the replicas it opens (the simulator's
    /// checker tests).
    pub fn inject_bugs(&mut self, bugs: InjectedBugs) {
        self.bugs = bugs;
    }

    /// The next action, if any.
    pub fn poll(&mut self) -> Option<Action<N>> {
        self.out.pop_front()
    }

    /// Actions waiting to be polled.
    pub fn queued(&self) -> usize {
        self.out.len()
    }

    /// The replica of `shard` of `stream`, if one runs (or failed) here.
    pub fn shard(&self, stream: &str, shard: u32) -> Option<&ShardDriver<N>> {
        self.shards.get(stream).and_then(|s| s.get(&shard))
    }

    /// Every replica here.
    pub fn shards(&self) -> impl Iterator<Item = &ShardDriver<N>> {
        self.shards.values().flat_map(|s| s.values())
    }

    /// The driver's counters.
    pub fn stats(&self) -> DriverStats {
        let dropped: u64 = self.shards().map(|s| s.proposals_dropped).sum();
        DriverStats { proposals_dropped: self.stats.proposals_dropped + dropped, ..self.stats }
    }

    /// The lease and its end, as last confirmed.
    pub fn lease(&self) -> Option<(LeaseId, Time)> {
        self.lease
    }

    /// Starts, keeps or stops replicas as the groups of the view say ([`adoption`]); each
    /// running replica gets its group's record.
    pub fn handle_groups<'a>(
        &mut self,
        now: Time,
        groups: impl IntoIterator<Item = GroupView<'a, N>>,
    ) where
        N: 'a,
    {
        for group in groups {
            self.handle_group(now, group);
        }
    }

    /// [`handle_groups`](Self::handle_groups) for one group record.
    pub fn handle_group(&mut self, now: Time, group: GroupView<'_, N>) {
        let key = group.key;
        let running =
            self.shard(&key.stream, key.shard).map(|s| (s.nodes.as_slice(), s.replica.log().end()));
        let placed = group.placed || self.bugs.open_unplaced;
        let decision = match adoption(placed, group.replicas, &self.me, running) {
            Adoption::Reopen | Adoption::Refuse if self.bugs.open_unplaced => Adoption::Keep,
            d => d,
        };
        match decision {
            Adoption::Skip => {}
            Adoption::Keep => {
                if let Some(state) = group.state {
                    self.with_shard(key, |s| s.replica.handle_controller(now, state));
                }
            }
            Adoption::Open(me) => {
                if self.refused.contains(key)
                    || self.retry_at.get(key).is_some_and(|at| now < *at)
                    || !self.opening.insert(key.clone())
                {
                    return;
                }
                self.out.push_back(Action::Open {
                    key: key.clone(),
                    me,
                    nodes: group.replicas.to_vec(),
                });
            }
            d @ (Adoption::Reopen | Adoption::Refuse) => {
                let Some(mut old) = self.remove(key) else { return };
                if old.proposing {
                    self.proposing.insert(key.clone());
                }
                if !old.failed {
                    old.refuse_pending(&mut self.out);
                }
                let reason = if d == Adoption::Reopen {
                    self.opening.insert(key.clone());
                    StopReason::Reopen
                } else {
                    self.refused.insert(key.clone());
                    StopReason::Refused
                };
                self.out.push_back(Action::Stop { key: key.clone(), reason });
            }
        }
    }

    /// The replica of `key` (announced by [`Action::Open`]) recovered `log`: it starts.
    pub fn opened(
        &mut self,
        now: Time,
        key: ShardKey,
        me: ReplicaNumber,
        nodes: Vec<N>,
        log: ReplicaLog,
    ) {
        if !self.opening.remove(&key) {
            // Its stream was deleted while the shell recovered it.
            self.out.push_back(Action::Stop { key, reason: StopReason::Deleted });
            return;
        }
        let replicas = nodes.len();
        let mut config = ReplicaConfig { ..self.config.clone() };
        let defaults = ReplicaConfig::for_replicas(replicas);
        config.min_insync = match self.limits.min_insync {
            0 => defaults.min_insync,
            n => n.min(replicas),
        };
        let mut replica = Replica::new(me, config, log);
        replica.inject_bugs(self.bugs);
        let shard = ShardDriver {
            key: key.clone(),
            nodes,
            me,
            replica,
            pending: HashSet::new(),
            next_request: 1,
            // Nothing is visible until the replica knows what is committed: a recovered log
            // may end in batches a new leader takes back.
            fed: Offset(0),
            failed: false,
            proposing: self.proposing.contains(&key),
            proposals_dropped: 0,
            resident_bytes: self.limits.resident_bytes,
            bugs: self.bugs,
        };
        self.shards.entry(key.stream.clone()).or_default().insert(key.shard, shard);
        if let Some((lease, until)) = self.lease {
            self.with_shard(&key, |s| s.replica.handle_lease(now, lease, until));
        }
    }

    /// `stream` was deleted: every replica of it stops ([`StopReason::Deleted`], appends
    /// waiting on them refused), and one being opened is stopped once it is. Nothing of it is
    /// opened again unless the cluster places a stream of that name anew.
    pub fn handle_deleted(&mut self, stream: &str) {
        let keys: Vec<ShardKey> =
            self.keys().into_iter().filter(|k| &*k.stream == stream).collect();
        for key in keys {
            let Some(mut old) = self.remove(&key) else { continue };
            if !old.failed {
                old.refuse_pending(&mut self.out);
            }
            self.out.push_back(Action::Stop { key, reason: StopReason::Deleted });
        }
        self.opening.retain(|k| &*k.stream != stream);
        self.retry_at.retain(|k, _| &*k.stream != stream);
        self.refused.retain(|k| &*k.stream != stream);
        self.proposing.retain(|k| &*k.stream != stream);
    }

    /// The replica of `key` could not start: it is tried again after
    /// [`Limits::retry_open_ms`].
    pub fn open_failed(&mut self, now: Time, key: ShardKey) {
        self.opening.remove(&key);
        self.retry_at.insert(key, now.plus_ms(self.limits.retry_open_ms));
    }

    /// The replica of `key` stopped with [`StopReason::Reopen`] has finished its disk
    /// operations: it may be opened again.
    pub fn stopped(&mut self, key: &ShardKey) {
        self.opening.remove(key);
    }

    /// This broker's lease, `None` while it is not confirmed. Replicas get it at once.
    pub fn handle_lease(&mut self, now: Time, lease: Option<(LeaseId, Time)>) {
        self.lease = lease;
        if let Some((lease, until)) = lease {
            for key in self.keys() {
                self.with_shard(&key, |s| s.replica.handle_lease(now, lease, until));
            }
        }
    }

    /// A timer tick: appends waiting while the lease is not confirmed are answered
    /// `OutcomeUnknown` (none can be acked here until it is, if ever), and every replica ticks.
    pub fn handle_tick(&mut self, now: Time) {
        let lease_gone = self.lease.is_none_or(|(_, until)| now >= until);
        for key in self.keys() {
            if lease_gone && !self.bugs.ignore_lease {
                let out = &mut self.out;
                if let Some(s) =
                    self.shards.get_mut(&*key.stream).and_then(|s| s.get_mut(&key.shard))
                {
                    self.stats.refused_without_lease += s.pending.len() as u64;
                    s.refuse_pending(out);
                }
            }
            self.with_shard(&key, |s| s.replica.handle_tick(now));
        }
    }

    /// Retention of every shard this core leads, each with its stream's limits
    /// (`retention_of`) at `now_ms` ([`Replica::apply_retention`]); followers take their
    /// leaders' starts from fetch replies. Each replica's start is then
    /// `shard(..).replica().log_start()`: storage may delete below it.
    pub fn apply_retention(
        &mut self,
        now_ms: u64,
        retention_of: impl Fn(&str) -> crate::config::Retention,
    ) {
        for key in self.keys() {
            let retention = retention_of(&key.stream);
            if retention == crate::config::Retention::default() {
                continue;
            }
            self.with_shard(&key, |s| {
                s.replica.apply_retention(retention, now_ms);
            });
        }
    }

    /// One round as the broker runs it every tick: the view's groups (adoption and records),
    /// the lease, then a tick.
    pub fn handle_view<'a>(
        &mut self,
        now: Time,
        lease: Option<(LeaseId, Time)>,
        groups: impl IntoIterator<Item = GroupView<'a, N>>,
    ) where
        N: 'a,
    {
        self.handle_lease(now, lease);
        self.handle_groups(now, groups);
        self.handle_tick(now);
    }

    /// A message from replica `from` of `shard` of `stream` on another broker.
    pub fn handle_message(
        &mut self,
        now: Time,
        stream: &str,
        shard: u32,
        from: ReplicaNumber,
        message: Message,
    ) {
        self.with(stream, shard, |s| s.replica.handle_message(now, from, message));
    }

    /// A client's append to `key`: handed to its replica, answered later by an
    /// [`Action::Ack`] or [`Action::Reject`] with the returned id.
    pub fn handle_append(
        &mut self,
        now: Time,
        stream: &str,
        shard: u32,
        mut append: AppendRequest,
    ) -> Submitted {
        let Some(s) = self.shards.get_mut(stream).and_then(|s| s.get_mut(&shard)) else {
            return Submitted::NoReplica;
        };
        if s.failed {
            return Submitted::NoReplica;
        }
        let request = AppendId(s.next_request);
        s.next_request += 1;
        append.request = request;
        s.pending.insert(request);
        self.with(stream, shard, |s| s.replica.handle_append(now, append));
        Submitted::Pending(request)
    }

    /// The disk operation `id` of `key` completed.
    pub fn handle_disk_done(&mut self, now: Time, key: &ShardKey, id: DiskOpId) {
        self.with_shard(key, |s| s.replica.handle_disk_done(now, id));
    }

    /// The proposal of `key` handed over with [`Action::Propose`] was answered (or given up):
    /// the next one may go.
    pub fn proposal_done(&mut self, key: &ShardKey) {
        self.proposing.remove(key);
        if let Some(s) = self.get_mut(key) {
            s.proposing = false;
        }
    }

    /// The replica of `key` stops after a failure the shell met (storage, a full disk queue):
    /// its pending appends are refused, and it stays stopped until the broker restarts.
    pub fn fail(&mut self, key: &ShardKey, why: String) {
        let out = &mut self.out;
        if let Some(s) = self.shards.get_mut(&*key.stream).and_then(|s| s.get_mut(&key.shard)) {
            s.fail(why, out);
        }
    }

    /// Runs `f` on `key`'s state machine (unless it failed), then takes its outputs.
    fn with_shard(&mut self, key: &ShardKey, f: impl FnOnce(&mut ShardDriver<N>)) {
        self.with(&key.stream, key.shard, f);
    }

    fn with(&mut self, stream: &str, shard: u32, f: impl FnOnce(&mut ShardDriver<N>)) {
        let Some(s) = self.shards.get_mut(stream).and_then(|s| s.get_mut(&shard)) else {
            return;
        };
        if s.failed {
            return;
        }
        let role = s.replica.role();
        f(s);
        s.drain(role, &mut self.out);
    }

    fn get_mut(&mut self, key: &ShardKey) -> Option<&mut ShardDriver<N>> {
        self.shards.get_mut(&*key.stream).and_then(|s| s.get_mut(&key.shard))
    }

    fn keys(&self) -> Vec<ShardKey> {
        self.shards.values().flat_map(|s| s.values().map(|s| s.key.clone())).collect()
    }

    fn remove(&mut self, key: &ShardKey) -> Option<ShardDriver<N>> {
        let shards = self.shards.get_mut(&*key.stream)?;
        let removed = shards.remove(&key.shard);
        if shards.is_empty() {
            self.shards.remove(&*key.stream);
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adoption_waits_for_the_placement_and_follows_a_changed_group() {
        let (b1, b2, b3, b4, b5) = ("b1", "b2", "b3", "b4", "b5");
        let deposed = [b1, b2, b3];
        let placed = [b2, b3, b4];
        assert_eq!(adoption(false, &deposed, &b2, None), Adoption::Skip, "unplaced: not started");
        assert_eq!(adoption(false, &placed, &b2, None), Adoption::Skip);
        assert_eq!(adoption(true, &placed, &b2, None), Adoption::Open(ReplicaNumber(0)));
        assert_eq!(adoption(true, &placed, &b5, None), Adoption::Skip, "not a replica");
        assert_eq!(adoption(true, &placed, &b2, Some((&placed[..], Offset(40)))), Adoption::Keep);
        assert_eq!(adoption(true, &placed, &b2, Some((&deposed[..], Offset(0)))), Adoption::Reopen);
        assert_eq!(adoption(true, &placed, &b2, Some((&deposed[..], Offset(3)))), Adoption::Refuse);
        assert_eq!(adoption(true, &placed, &b5, Some((&deposed[..], Offset(0)))), Adoption::Reopen);
    }

    /// A deleted stream's replicas stop, one being opened is stopped once its log is
    /// recovered, and the other streams' replicas carry on.
    #[test]
    fn a_deleted_stream_stops_its_replicas_and_one_being_opened() {
        let mut d = Driver::new("b1", ReplicaConfig::default(), Limits::default());
        let nodes = ["b1", "b2", "b3"];
        let (gone0, gone1, kept) = (
            ShardKey::new("a/b/gone", 0),
            ShardKey::new("a/b/gone", 1),
            ShardKey::new("a/b/kept", 0),
        );
        for key in [&gone0, &gone1, &kept] {
            let view = GroupView { key, placed: true, replicas: &nodes, state: None };
            d.handle_group(Time(0), view);
        }
        let opens: Vec<_> = std::iter::from_fn(|| d.poll()).collect();
        assert_eq!(opens.len(), 3, "{opens:?}");
        d.opened(Time(1), gone0.clone(), ReplicaNumber(0), nodes.to_vec(), ReplicaLog::default());
        d.opened(Time(1), kept.clone(), ReplicaNumber(0), nodes.to_vec(), ReplicaLog::default());
        while d.poll().is_some() {}
        // gone1 is still being recovered when the stream is deleted.
        d.handle_deleted("a/b/gone");
        let stops: Vec<_> = std::iter::from_fn(|| d.poll()).collect();
        assert_eq!(stops, [Action::Stop { key: gone0.clone(), reason: StopReason::Deleted }]);
        assert!(d.shard("a/b/gone", 0).is_none());
        assert!(d.shard("a/b/kept", 0).is_some(), "another stream's replica carries on");
        d.opened(Time(2), gone1.clone(), ReplicaNumber(0), nodes.to_vec(), ReplicaLog::default());
        assert_eq!(d.poll(), Some(Action::Stop { key: gone1, reason: StopReason::Deleted }));
        assert!(d.shard("a/b/gone", 1).is_none(), "not started after the delete");
    }
}
