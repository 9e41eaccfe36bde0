//! The simulated cluster: replicas with their disks and leases, the etcd model, producers, and
//! the network between them, all driven by one event queue and one seeded PRNG.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::Duration;

use felix_cluster::agent_state::AgentState;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::check::Checker;
use super::disk::SimDisk;
use super::etcd::Etcd;
use super::net::{Addr, Event, Faults, Packet, Scheduled};
use super::producer::Producer;
use super::{SeedReport, SimOptions};
use felix_replication::config::{ReplicaConfig, Retention};
use felix_replication::controller::IsrProposal;
use felix_replication::driver::{
    Action, Driver, GroupView, Limits, ShardKey, StopReason, Submitted,
};
use felix_replication::error::AppendError;
use felix_replication::log::ReplicaLog;
use felix_replication::message::{Message, Output};
use felix_replication::producers::ProducerLimits;
use felix_replication::types::{
    AppendId, Batch, Epoch, LeaseId, Offset, ProducerId, ProducerSeq, ReplicaNumber, Seq, Time,
};
use felix_replication::{Replica, ReplicaStats, RoleView};

/// Controller lease TTL in the simulation, ms.
pub const LEASE_TTL_MS: u64 = 200;
/// A node renews its lease this often, ms.
pub const KEEPALIVE_EVERY_MS: u64 = 50;
/// Node timer period, ms.
pub const NODE_TICK_MS: u64 = 10;
/// etcd's timer period (lease expiry, elections), ms.
pub const ETCD_TICK_MS: u64 = 10;
/// etcd re-sends the group record to every node this often (a watch resync), ms.
pub const GROUP_RESYNC_MS: u64 = 100;
/// Producer timer period, ms.
pub const PRODUCER_TICK_MS: u64 = 5;
/// A fault is considered this often while faults are on, ms.
pub const FAULT_EVERY_MS: u64 = 60;
/// Producers idle this long expire (a producer that finished early expires while the others
/// still publish), ms.
pub const SIM_PRODUCER_EXPIRY_MS: u64 = 400;
/// Probability that a producer other than the first is idempotent and durable (checked).
pub const PRODUCER_CHECKED_P: f64 = 0.75;
/// Events per seed at most (a livelock guard).
pub const EVENTS_MAX: u64 = 2_000_000;
/// The cluster agent gives up an etcd call unanswered for this long, ms.
pub const AGENT_REQUEST_TIMEOUT_MS: u64 = 150;
/// Disk operations queued per replica at most (the broker's `DISK_OPS_MAX`, scaled down).
pub const DISK_OPS_MAX: usize = 4_096;
/// The stream every node replicates one shard of.
const STREAM: &str = "s";

/// One simulated broker: its replication driver (running the shard's replica once adopted)
/// and its disk.
struct SimNode {
    id: ReplicaNumber,
    /// The process: `None` while the node is down.
    driver: Option<Driver<ReplicaNumber>>,
    /// The driver's ids of the appends it was handed, and the producers' request each is.
    requests: HashMap<AppendId, AppendId>,
    /// Proposals handed to etcd and not answered (tokens).
    proposals: HashSet<u64>,
    /// The newest group record revision this process has seen.
    revision: u64,
    /// Disk operations of a stopped replica still to complete before the shard may reopen.
    draining: usize,
    /// Restart from the checkpoint when the replica opens (chosen at the restart).
    from_checkpoint: Option<Vec<u8>>,
    incarnation: u32,
    disk: SimDisk,
    lease: Option<LeaseId>,
    lease_sent_at: Time,
    next_keepalive: Time,
    /// The cluster agent's lease bookkeeping (felix-cluster's, as the broker runs it).
    agent: AgentState<Time>,
    /// When the agent's current session started (its view is loaded by a record sent since).
    session_at: Time,
    paused_until: Time,
    /// The checkpoint of its log's archive the driver last asked to write: a restart starts
    /// from it half the time.
    checkpoint: Option<Vec<u8>>,
    /// Retention deleted its stored batches below this (its replica's log start): reading
    /// them is a violation, and a restart recovers the log from here. The image keeps them,
    /// so the checker's batch numbering stays that of the whole history.
    deleted_below: Offset,
}

/// The whole simulated cluster.
pub(super) struct World {
    seed: u64,
    rng: ChaCha8Rng,
    now: Time,
    opts: SimOptions,
    config: ReplicaConfig,
    limits: Limits,
    key: ShardKey,
    next_token: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    next_seq: u64,
    nodes: Vec<SimNode>,
    etcd: Etcd,
    producers: Vec<Producer>,
    requests: HashMap<AppendId, (usize, Seq)>,
    /// (node, request) of the appends whose batch the node's log took and that it has not
    /// answered yet (invariant 8).
    taken: HashSet<(usize, AppendId)>,
    /// The append delivery a node is handling now, and whether its log took the batch.
    delivering: Option<(AppendId, bool)>,
    next_request: u64,
    checker: Checker,
    faults: Faults,
    pub(super) events: u64,
    crashes: u32,
    /// Sessions the nodes' agents gave up (a silent connection).
    agent_giveups: u64,
    /// Restarts from a checkpoint.
    checkpoint_restarts: u64,
    /// When each idempotent batch was first sent.
    first_sent: HashMap<ProducerSeq, Time>,
    /// Counters of replicas that crashed.
    retired: ReplicaStats,
    /// A node lost for good (crashed, never restarted), if any.
    lost: Option<usize>,
    /// The stream's retention, chosen by the seed.
    retention: Retention,
    /// Replicas opened from storage retention had cut.
    recovered_past_deletion: u64,
    /// Each node's replica's role when its last input was done (an ack is checked against
    /// the role it had when the input began, or has after).
    roles: Vec<Option<RoleView>>,
}

impl World {
    pub(super) fn new(
        seed: u64,
        rng: ChaCha8Rng,
        opts: SimOptions,
        replicas: usize,
        producers: usize,
    ) -> World {
        let ids: Vec<ReplicaNumber> = (0..replicas as u32).map(ReplicaNumber).collect();
        let mut config = sim_config(replicas);
        // Archive 1 to 16 batches at a time, chosen by the seed (not the PRNG, so its stream is
        // what it was before replicas archived).
        config.archive_min_batches = (seed % 16) as usize + 1;
        // Keep 0 to 300 bytes of committed payloads in memory, chosen by the seed: fetches and
        // the tail then meet released payloads and archived batches.
        let limits = Limits { resident_bytes: (seed / 16 % 4) * 100, ..Limits::default() };
        // Retention by size, by age, both or none, chosen by the seed: leaders start their
        // logs past old batches and every replica deletes below the start.
        let retention = match seed / 64 % 4 {
            0 => Retention::default(),
            1 => Retention { bytes_max: Some(200 + seed / 256 % 8 * 100), age_ms_max: None },
            2 => Retention { bytes_max: None, age_ms_max: Some(100 + seed / 256 % 8 * 100) },
            _ => Retention { bytes_max: Some(300), age_ms_max: Some(400) },
        };
        let mut world = World {
            retention,
            recovered_past_deletion: 0,
            roles: vec![None; replicas],
            seed,
            config,
            limits,
            key: ShardKey::new(STREAM, 0),
            next_token: 0,
            faults: Faults::default(),
            queue: BinaryHeap::new(),
            next_seq: 0,
            nodes: Vec::new(),
            etcd: Etcd::new(ids.clone(), LEASE_TTL_MS),
            producers: Vec::new(),
            requests: HashMap::new(),
            taken: HashSet::new(),
            delivering: None,
            next_request: 0,
            checker: Checker::new(replicas),
            events: 0,
            crashes: 0,
            agent_giveups: 0,
            checkpoint_restarts: 0,
            first_sent: HashMap::new(),
            retired: ReplicaStats::default(),
            lost: None,
            now: Time(0),
            rng,
            opts,
        };
        world.faults = Faults::random(&mut world.rng);
        // Half the seeds start before the stream is placed, with a deposed controller's record
        // naming the nodes in another order (replicas must not start from it).
        if world.rng.gen_bool(0.5) {
            let placed_at = Time(world.rng.gen_range(20..300));
            let mut order = ids.clone();
            order.rotate_left(1);
            world.etcd.with_deposed_record(order, placed_at);
        }
        for &id in &ids {
            world.nodes.push(SimNode {
                id,
                driver: None,
                requests: HashMap::new(),
                proposals: HashSet::new(),
                revision: 0,
                draining: 0,
                from_checkpoint: None,
                checkpoint: None,
                incarnation: 0,
                disk: SimDisk::default(),
                lease: None,
                lease_sent_at: Time(0),
                next_keepalive: Time(0),
                agent: AgentState::new(Duration::from_millis(LEASE_TTL_MS)),
                session_at: Time(0),
                paused_until: Time(0),
                deleted_below: Offset(0),
            });
            world.start_node(id.0 as usize);
        }
        for p in 0..producers {
            let total = world.rng.gen_range(5..=world.opts.batches_per_producer_max);
            let target = super::pick(&mut world.rng, &ids).expect("at least one replica");
            let checked = p == 0 || world.rng.gen_bool(PRODUCER_CHECKED_P);
            let id = ProducerId(p as u64 + 1);
            world.producers.push(Producer::new(id, checked, total, target));
            world.schedule(Time(0), Event::ProducerTick(p));
        }
        world.schedule(Time(0), Event::EtcdTick);
        world.schedule(Time(FAULT_EVERY_MS), Event::Fault);
        world
    }

    /// Runs the seed to its end: faults for `fault_phase_ms`, then heal and wait for every
    /// producer to finish.
    pub(super) fn run(mut self) -> Result<SeedReport, (u64, String)> {
        self.run_events().map_err(|what| (self.events, what))
    }

    fn run_events(&mut self) -> Result<SeedReport, String> {
        let deadline = Time(self.opts.fault_phase_ms + self.opts.heal_deadline_ms);
        let mut healed = false;
        while let Some(Reverse(next)) = self.queue.pop() {
            self.now = next.at;
            self.events += 1;
            if !healed && self.now.0 >= self.opts.fault_phase_ms {
                healed = true;
                self.heal()?;
            }
            if healed && self.producers.iter().all(Producer::done) {
                return Ok(self.report());
            }
            if self.now >= deadline && self.isr_lost() {
                return Ok(SeedReport { unavailable: true, ..self.report() });
            }
            if self.now >= deadline || self.events >= EVENTS_MAX {
                return Err(self.stuck());
            }
            self.step(next.event)?;
        }
        Err("the event queue ran dry".into())
    }

    fn report(&self) -> SeedReport {
        let live = (0..self.nodes.len()).filter_map(|n| self.replica(n).map(Replica::stats));
        let stats = live.fold(self.retired, |a, b| a + b);
        SeedReport {
            stats,
            seed: self.seed,
            replicas: self.nodes.len(),
            events: self.events,
            sim_ms: self.now.0,
            acked_batches: self.checker.acked_batches() as u64,
            committed_batches: self.checker.committed_batches() as u64,
            epochs: self.etcd.group.epoch.0,
            crashes: self.crashes,
            checkpoint_restarts: self.checkpoint_restarts,
            agent_giveups: self.agent_giveups,
            transfers: self.etcd.transfers,
            unavailable: false,
            log_start_max: (0..self.nodes.len())
                .map(|n| self.nodes[n].deleted_below.0)
                .max()
                .unwrap_or(0),
            recovered_past_deletion: self.recovered_past_deletion,
            producers_expired: (0..self.nodes.len())
                .filter_map(|n| self.replica(n).map(|r| r.log().producers_forgotten().0))
                .max()
                .unwrap_or(0),
        }
    }

    /// Node `n`'s replica of the shard, if its process is up and runs one.
    fn replica(&self, n: usize) -> Option<&Replica> {
        let driver = self.nodes[n].driver.as_ref()?;
        driver.shard(STREAM, 0).map(|s| s.replica())
    }

    /// Whether every in-sync replica is the lost node: then the shard may not serve again, by
    /// design (no unclean election), and a stall is not a liveness failure.
    fn isr_lost(&self) -> bool {
        let isr = &self.etcd.group.isr;
        self.lost.is_some_and(|n| isr.iter().all(|m| m.0 as usize == n))
    }

    fn stuck(&self) -> String {
        let done: Vec<u32> = self.producers.iter().map(Producer::acked).collect();
        let roles: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match self.replica(i) {
                Some(r) => format!(
                    "{}:{:?} end {} committed {}",
                    n.id,
                    r.role(),
                    r.log().end(),
                    r.committed()
                ),
                None => format!("{}: down", n.id),
            })
            .collect();
        format!("liveness: producers not done after healing (acked per producer {done:?}; group {:?}; {roles:?})", self.etcd.group)
    }

    fn step(&mut self, event: Event) -> Result<(), String> {
        if self.opts.trace {
            eprintln!("t={} {:?}", self.now.0, event);
        }
        match event {
            Event::Deliver { from, to, incarnation, packet } => {
                self.deliver(from, to, incarnation, packet)
            }
            Event::DiskDone { node, incarnation } => self.disk_done(node, incarnation),
            Event::NodeTick { node, incarnation } => self.node_tick(node, incarnation),
            Event::ProposalTimeout { node, incarnation, token } => {
                if self.nodes[node].incarnation == incarnation {
                    self.proposal_done(node, token);
                }
                Ok(())
            }
            Event::EtcdTick => {
                if self.etcd.tick(self.now, &mut self.rng) {
                    self.broadcast_group();
                    self.check_isr_images()?;
                }
                if self.now.0.is_multiple_of(GROUP_RESYNC_MS) {
                    self.broadcast_group();
                }
                self.schedule(self.now.plus_ms(ETCD_TICK_MS), Event::EtcdTick);
                Ok(())
            }
            Event::ProducerTick(p) => self.producer_tick(p),
            Event::Fault => self.fault(),
        }
    }

    fn deliver(
        &mut self,
        from: Addr,
        to: Addr,
        incarnation: u32,
        packet: Packet,
    ) -> Result<(), String> {
        if self.faults.blocked(from, to) {
            return Ok(());
        }
        match to {
            Addr::Etcd => {
                self.etcd_receive(from, incarnation, packet);
                Ok(())
            }
            Addr::Producer(p) => {
                self.producer_receive(p, packet);
                Ok(())
            }
            Addr::Node(id) => {
                let n = id.0 as usize;
                if self.nodes[n].driver.is_none() || self.nodes[n].incarnation != incarnation {
                    return Ok(()); // sent to a process that has died since
                }
                if self.nodes[n].paused_until > self.now {
                    let at = self.nodes[n].paused_until;
                    self.schedule(at, Event::Deliver { from, to, incarnation, packet });
                    return Ok(());
                }
                self.node_receive(n, from, packet)
            }
        }
    }

    fn node_receive(&mut self, n: usize, from: Addr, packet: Packet) -> Result<(), String> {
        let now = self.now;
        let key = self.key.clone();
        let node = &mut self.nodes[n];
        let driver = node.driver.as_mut().expect("checked by the caller");
        match (from, packet) {
            (Addr::Node(peer), Packet::Replica(message)) => {
                driver.handle_message(now, STREAM, 0, peer, message)
            }
            (_, Packet::Group { state, placed, replicas, revision, at }) => {
                // The agent's view only moves forward (etcd's watch is ordered).
                if revision < node.revision {
                    return Ok(());
                }
                node.revision = revision;
                let view = GroupView { key: &key, placed, replicas: &replicas, state: Some(state) };
                // A record etcd sent since the session started: the view is loaded for this
                // session's lease, which the driver may now act on. The lease first, then the
                // record, as the broker hands a view over (`Driver::handle_view`).
                if at >= node.session_at && node.agent.in_session() {
                    node.agent.view_loaded();
                    if let (Some(lease), Some(until)) = (node.lease, node.agent.lease_valid_until())
                    {
                        if std::env::var_os("FELIX_SIM_TRACE_LEASE").is_some() {
                            eprintln!(
                                "t={} {} lease {lease:?} valid until {until:?} (view loaded)",
                                now.0, node.id
                            );
                        }
                        driver.handle_lease(now, Some((lease, until)));
                    }
                }
                driver.handle_group(now, view);
            }
            (_, Packet::Lease { lease, sent_at }) => {
                // One keep-alive stream: answers come in order, once (an older or repeated
                // one is what the stream would not deliver).
                if sent_at <= node.lease_sent_at && node.lease_sent_at != Time(0) {
                    return Ok(());
                }
                node.lease_sent_at = sent_at;
                let ttl = Duration::from_millis(LEASE_TTL_MS);
                if node.lease != Some(lease) || !node.agent.in_session() {
                    // The first answer on a new connection (the lease resumed, or granted
                    // anew because the old one expired): a session starts on it, its view to
                    // be loaded again.
                    node.agent.session_ended();
                    node.agent.session_started(sent_at + ttl);
                    node.session_at = now;
                    node.lease = Some(lease);
                    let id = node.id;
                    self.send(Addr::Node(id), Addr::Etcd, Packet::ReadGroup);
                    return self.drain(n);
                }
                // An answer to a keep-alive sent before this session started belongs to the
                // connection the session replaced: the broker's agent never reads it on its new
                // keep-alive stream, and crediting it to this session's oldest send would stretch
                // the lease past etcd's expiry (seed 20,664,296: n1 acked 40 ms after etcd let its
                // lease go).
                if sent_at < node.session_at {
                    return Ok(());
                }
                match node.agent.keepalive_answered(Some(ttl)) {
                    Ok(Some(until)) => {
                        if std::env::var_os("FELIX_SIM_TRACE_LEASE").is_some() {
                            eprintln!("t={} {} lease {lease:?} valid until {until:?} (answer to {sent_at:?})", now.0, node.id);
                        }
                        driver.handle_lease(now, Some((lease, until)))
                    }
                    Ok(None) => {}
                    Err(_) => node.agent.session_ended(),
                }
            }
            (_, Packet::Proposed { token }) => self.proposal_done(n, token),
            (Addr::Producer(_), Packet::Append(mut append)) => {
                // The leader's clock stamps the batch (the producer table's expiry clock).
                append.time_ms = now.0;
                // A copy arriving later than the expiry after the batch was first sent (retried
                // late, or delayed or repeated by the network) may find its producer forgotten
                // and be stored again: the documented limit, which the checker then allows.
                if let Some(&first) = append.producer.and_then(|t| self.first_sent.get(&t)) {
                    if now.0.saturating_sub(first.0) > self.config.producers.expiry_ms {
                        self.checker.retried_after_expiry(append.producer.expect("looked up"));
                    }
                }
                // A log recovered from where retention deleted to knows no producer state of
                // the batches below: a retry of one of those may be stored again.
                let origin = driver.shard(STREAM, 0).map(|s| s.replica().log().origin());
                if let (Some(tag), Some(origin)) = (append.producer, origin) {
                    if self.checker.committed_below(tag, origin) {
                        self.checker.retried_after_expiry(tag);
                    }
                }
                let (request, tag) = (append.request, append.producer);
                let from = driver.shard(STREAM, 0).map(|s| s.replica().log().end());
                let id = self.nodes[n].id;
                let driver = self.nodes[n].driver.as_mut().expect("checked by the caller");
                let Submitted::Pending(mine) = driver.handle_append(now, STREAM, 0, append) else {
                    // No replica here (not adopted yet, or stopped): nothing stored.
                    let error = AppendError::NotLeader { leader: None };
                    self.answer(id, request, Output::Reject { request, error });
                    return Ok(());
                };
                self.nodes[n].requests.insert(mine, request);
                // Invariant 8: whether this delivery made the node's log take the batch (the
                // network may deliver one request twice: the second is answered on its own).
                let took = tag.is_some()
                    && self.replica(n).is_some_and(|r| {
                        let from = from.unwrap_or(Offset(0));
                        r.log().batches().iter().any(|b| b.base >= from && b.producer == tag)
                    });
                if took {
                    self.taken.insert((n, request));
                }
                self.delivering = Some((request, took));
                let drained = self.drain(n);
                self.delivering = None;
                return drained;
            }
            _ => return Ok(()),
        }
        self.drain(n)
    }

    /// The proposal `token` of node `n` was answered or timed out: the driver may hand over
    /// the next.
    fn proposal_done(&mut self, n: usize, token: u64) {
        if self.opts.trace {
            eprintln!("t={} n{n}: proposal {token} done", self.now.0);
        }
        if self.nodes[n].proposals.remove(&token) {
            let key = self.key.clone();
            if let Some(driver) = self.nodes[n].driver.as_mut() {
                driver.proposal_done(&key);
            }
        }
    }

    /// Invariant 8: a refusal other than `OutcomeUnknown` stored nothing: the refusing node's
    /// log did not take the append's batch (when it arrived, or since, as a leader's waiter).
    fn check_refusal(
        &mut self,
        n: usize,
        request: AppendId,
        error: &AppendError,
    ) -> Result<(), String> {
        // Answering the delivery being handled: what that delivery did; answering later (a
        // waiter refused when its leader stepped down): whether the batch was taken at all.
        let took = match self.delivering {
            Some((now_handling, took)) if now_handling == request => took,
            _ => self.taken.contains(&(n, request)),
        };
        self.taken.remove(&(n, request));
        if took && !error.outcome_unknown() {
            return Err(format!(
                "invariant 8: {} refused request {} with {error:?}, which says nothing was \
                 stored, but its log took the batch",
                self.nodes[n].id, request.0
            ));
        }
        Ok(())
    }

    /// Carries out everything node `n`'s driver asked for, then checks it.
    fn drain(&mut self, n: usize) -> Result<(), String> {
        let id = self.nodes[n].id;
        let mut acks = Vec::new();
        let mut fed = Vec::new();
        let mut actions = 0usize;
        loop {
            let Some(action) = self.nodes[n].driver.as_mut().and_then(Driver::poll) else { break };
            actions += 1;
            match action {
                Action::Open { key, me, nodes } => self.open(n, key, me, nodes)?,
                Action::Stop { key, reason } => match reason {
                    StopReason::Failed(why) => return Err(format!("{id} failed: {why}")),
                    StopReason::Refused => {}
                    // The simulated cluster deletes no stream.
                    StopReason::Deleted => return Err(format!("{id} stopped {key:?}: deleted")),
                    StopReason::Reopen => {
                        self.nodes[n].draining = self.nodes[n].disk.in_flight();
                        if self.nodes[n].draining == 0 {
                            self.nodes[n].driver.as_mut().expect("it acted").stopped(&key);
                        }
                    }
                },
                Action::Send { to, message, .. } => {
                    self.check_reply_size(n, &message)?;
                    self.send(Addr::Node(id), Addr::Node(to), Packet::Replica(message))
                }
                Action::SendReadingPayloads { to, message, .. } => {
                    let deleted = self.nodes[n].deleted_below;
                    if let Message::FetchReply { batches, .. } = &message {
                        if let Some(b) = batches.iter().find(|b| b.payload.is_empty()) {
                            if b.base < deleted {
                                return Err(format!(
                                    "{id} reads the batch at {} for a follower, retention \
                                     deleted below {deleted}",
                                    b.base
                                ));
                            }
                        }
                    }
                    if let Some(message) = fill_payloads(self.nodes[n].disk.stored(), message) {
                        self.check_reply_size(n, &message)?;
                        self.send(Addr::Node(id), Addr::Node(to), Packet::Replica(message))
                    }
                }
                Action::SendFromLog {
                    to,
                    epoch,
                    start,
                    upto,
                    committed,
                    log_start,
                    bytes_max,
                    ..
                } => {
                    let deleted = self.nodes[n].deleted_below;
                    if start < deleted {
                        return Err(format!(
                            "{id} reads from {start} for a follower, retention deleted below \
                             {deleted}"
                        ));
                    }
                    let batches = read_image(self.nodes[n].disk.durable(), start, upto, bytes_max)
                        .map_err(|e| format!("{id}: a fetch of its archived prefix: {e}"))?;
                    let message =
                        Message::FetchReply { epoch, from: start, batches, committed, log_start };
                    self.send(Addr::Node(id), Addr::Node(to), Packet::Replica(message))
                }
                Action::Disk { op, .. } => {
                    if self.nodes[n].disk.in_flight() >= DISK_OPS_MAX {
                        return Err(format!(
                            "{id}: more than {DISK_OPS_MAX} disk operations queued"
                        ));
                    }
                    let at = self.nodes[n].disk.submit(self.now, op, &mut self.rng);
                    let incarnation = self.nodes[n].incarnation;
                    self.schedule(at, Event::DiskDone { node: n, incarnation });
                }
                Action::Propose { expected_version, epoch, isr, transfer_to, .. } => {
                    let Some(leader) = self.replica(n).map(Replica::id) else { continue };
                    self.propose(
                        n,
                        IsrProposal {
                            expected_version,
                            leader,
                            epoch,
                            isr: isr.into_iter().collect(),
                            transfer_to,
                        },
                    )?;
                }
                Action::Ack { request, epoch, base, records, .. } => {
                    let Some(request) = self.nodes[n].requests.remove(&request) else { continue };
                    self.taken.remove(&(n, request));
                    acks.push((request, epoch, base, records));
                    self.answer(id, request, Output::Ack { request, epoch, base, records });
                }
                Action::Reject { request, error, .. } => {
                    let Some(request) = self.nodes[n].requests.remove(&request) else { continue };
                    self.check_refusal(n, request, &error)?;
                    self.answer(id, request, Output::Reject { request, error })
                }
                Action::Tail { batches, .. } => fed.extend(batches),
                Action::Checkpoint { bytes, .. } => self.nodes[n].checkpoint = Some(bytes),
                Action::RoleChanged { role, .. } => {
                    if self.opts.trace {
                        eprintln!("t={} {id} is {role:?}", self.now.0);
                    }
                }
            }
        }
        self.check_node(n)?;
        self.check_acks(n, acks)?;
        self.checker.check_tail(id, &fed)?;
        self.roles[n] = self.replica(n).map(Replica::role);
        self.check_bounds(n, actions)
    }

    /// A fetch reply carries `fetch_bytes_max` bytes of batches at most, or one batch (a peer
    /// refuses a frame past its limit: released payloads once counted as nothing, and a
    /// follower behind them was sent replies it refused, for ever).
    fn check_reply_size(&self, n: usize, message: &Message) -> Result<(), String> {
        let Message::FetchReply { batches, .. } = message else { return Ok(()) };
        let bytes: u64 = batches.iter().map(Batch::size_bytes).sum();
        if batches.len() > 1 && bytes > self.config.fetch_bytes_max {
            return Err(format!(
                "{} sent a fetch reply of {bytes} bytes in {} batches (at most {}, or one batch)",
                self.nodes[n].id,
                batches.len(),
                self.config.fetch_bytes_max
            ));
        }
        Ok(())
    }

    /// The bounds every queue of node `n` keeps: appends waiting for an answer, proposals on
    /// their way to etcd (one per shard), the actions one input made.
    fn check_bounds(&self, n: usize, actions: usize) -> Result<(), String> {
        let node = &self.nodes[n];
        let pending =
            node.driver.as_ref().and_then(|d| d.shard(STREAM, 0)).map_or(0, |s| s.pending());
        if pending > felix_replication::driver::PENDING_MAX
            || node.requests.len() > felix_replication::driver::PENDING_MAX
        {
            return Err(format!("{}: {pending} appends wait for an answer", node.id));
        }
        if node.proposals.len() > 1 {
            return Err(format!(
                "{}: {} in-sync-set proposals of one shard on their way to etcd",
                node.id,
                node.proposals.len()
            ));
        }
        if actions > 4 * felix_replication::config::ACK_WAITERS_MAX {
            return Err(format!("{}: one input made {actions} actions", node.id));
        }
        Ok(())
    }

    /// Hands node `n`'s proposal to etcd; its answer (or the agent's timeout) frees the
    /// shard's slot.
    fn propose(&mut self, n: usize, proposal: IsrProposal) -> Result<(), String> {
        self.next_token += 1;
        let token = self.next_token;
        self.nodes[n].proposals.insert(token);
        if self.opts.trace {
            eprintln!(
                "t={} {} proposes {proposal:?} (token {token})",
                self.now.0, self.nodes[n].id
            );
        }
        let (id, incarnation) = (self.nodes[n].id, self.nodes[n].incarnation);
        self.send(Addr::Node(id), Addr::Etcd, Packet::Propose { proposal, token });
        let at = self.now.plus_ms(AGENT_REQUEST_TIMEOUT_MS);
        self.schedule(at, Event::ProposalTimeout { node: n, incarnation, token });
        Ok(())
    }

    /// Opens node `n`'s replica of `key` as the broker does: its log recovered from the durable
    /// image, or from its checkpoint and the image's batches after it.
    fn open(
        &mut self,
        n: usize,
        key: ShardKey,
        me: ReplicaNumber,
        nodes: Vec<ReplicaNumber>,
    ) -> Result<(), String> {
        // What storage holds: the image from where retention deleted to.
        let deleted = self.nodes[n].deleted_below;
        self.recovered_past_deletion += u64::from(deleted > Offset(0));
        let image: Vec<Batch> =
            self.nodes[n].disk.durable().iter().filter(|b| b.base >= deleted).cloned().collect();
        let producers = self.config.producers;
        let checkpoint = self.nodes[n].from_checkpoint.take();
        let log = match checkpoint {
            Some(bytes) if checkpoint_held(&bytes, producers, deleted) => {
                self.checkpoint_restarts += 1;
                let mut log = log_from_checkpoint(n, &bytes, image, producers)?;
                log.raise_start(deleted);
                log
            }
            // As the broker does when its checkpoint names a batch retention deleted, or it
            // has none: the whole stored log, from where storage starts.
            _ => {
                let mut log = ReplicaLog::starting_at(deleted, producers);
                for batch in image {
                    log.append(batch).map_err(|e| format!("recovery of n{n}: {e}"))?;
                }
                log
            }
        };
        let now = self.now;
        self.nodes[n].driver.as_mut().expect("it asked").opened(now, key, me, nodes, log);
        Ok(())
    }

    /// Sends a client answer to the producer that made `request`.
    fn answer(&mut self, node: ReplicaNumber, request: AppendId, answer: Output) {
        if let Some(&(p, _)) = self.requests.get(&request) {
            self.send(Addr::Node(node), Addr::Producer(p), Packet::Answer(answer));
        }
    }

    /// Invariants 3, 4 and 6 for the acks node `n` just emitted (after its committed prefix
    /// joined the history).
    fn check_acks(
        &mut self,
        n: usize,
        acks: Vec<(AppendId, Epoch, Offset, u32)>,
    ) -> Result<(), String> {
        let id = self.nodes[n].id;
        for (request, epoch, base, records) in acks {
            let Some(&(p, seq)) = self.requests.get(&request) else { continue };
            // It leads `epoch`, or led it when this input began: one input may let it commit
            // and then step down (a newer record or lease in the same view); the acks are
            // still fenced in time (below).
            let replica = self.replica(n).expect("it just acked");
            let leads = RoleView::Leader { epoch };
            if replica.role() != leads && self.roles[n] != Some(leads) {
                return Err(format!(
                    "{id} acked in {epoch} while {:?} (and {:?} before)",
                    replica.role(),
                    self.roles[n]
                ));
            }
            self.check_fenced_in_time(n, epoch)?;
            self.checker.check_ack_epoch(id, epoch)?;
            if self.producers[p].checked {
                let tag = ProducerSeq { producer: self.producers[p].id, seq };
                self.checker.check_ack(id, tag, base, records)?;
            }
        }
        Ok(())
    }

    /// Invariants 1-3 for node `n`, and 5 if it is in sync.
    fn check_node(&mut self, n: usize) -> Result<(), String> {
        let before = self.checker.committed_batches();
        let node = &self.nodes[n];
        let shard = node.driver.as_ref().and_then(|d| d.shard(STREAM, 0));
        if let Some(shard) = shard {
            let replica = shard.replica();
            // Invariant 12: no replica's durable log (up or down) ends below this start, so
            // none ever needs what retention deletes.
            let start = replica.log_start();
            let behind = self
                .nodes
                .iter()
                .find(|o| o.disk.durable().last().map_or(Offset(0), Batch::end) < start);
            if let Some(other) = behind {
                return Err(format!(
                    "{}: its log starts at {start}, {}'s durable log ends below (retention \
                     would delete what a replica needs)",
                    node.id, other.id
                ));
            }
            self.check_producers_agree(n)?;
            let durable = node.disk.durable();
            self.checker.check_committed(node.id, replica.log(), replica.committed(), durable)?;
            let (stored, generation) = (node.disk.stored(), node.disk.stored_generation());
            self.checker.check_readable(node.id, stored, generation, shard.visible_end())?;
        }
        if self.checker.committed_batches() != before {
            return self.check_isr_images();
        }
        if self.etcd.group.isr.contains(&node.id) {
            self.checker.check_image(node.id, node.disk.durable(), node.disk.generation())?;
        }
        Ok(())
    }

    /// Invariant 9: replicas holding the same log (the same end and last epoch: log matching)
    /// know the same producers, whatever expired or was evicted, recovered or truncated.
    fn check_producers_agree(&self, n: usize) -> Result<(), String> {
        let Some(mine) = self.replica(n).map(Replica::log) else { return Ok(()) };
        for (i, other) in self.nodes.iter().enumerate() {
            let Some(theirs) = self.replica(i).map(Replica::log) else { continue };
            if other.id == self.nodes[n].id
                || theirs.origin() != mine.origin()
                || theirs.end() != mine.end()
                || theirs.last_epoch() != mine.last_epoch()
            {
                continue;
            }
            let (a, b) = (mine.producer_ids(), theirs.producer_ids());
            if a != b {
                return Err(format!(
                    "{} and {} hold the same log (end {}) but know producers {a:?} and {b:?}",
                    self.nodes[n].id,
                    other.id,
                    mine.end()
                ));
            }
        }
        Ok(())
    }

    /// A node acks only while etcd still holds its lease and names it leader of `epoch` (or
    /// it handed `epoch` on by a leadership transfer and has not learned yet: what it commits
    /// the new leader holds): a leader whose lease is gone, or replaced by an election, has
    /// stopped acking.
    fn check_fenced_in_time(&self, n: usize, epoch: Epoch) -> Result<(), String> {
        let node = &self.nodes[n];
        let group = &self.etcd.group;
        let live = node.lease.is_some_and(|l| self.etcd.lease_live(l, self.now));
        let current = group.leader == Some(node.id) && group.epoch == epoch;
        if !live || !(current || self.etcd.handed_on(epoch, node.id)) {
            let expiry = node.lease.and_then(|l| self.etcd.lease_expiry(l));
            return Err(format!(
                "{} acked in {epoch} at t={} ms but etcd has lease live {live} ({:?}, expiring \
                 {expiry:?}), leader {:?} in {}",
                node.id, self.now.0, node.lease, group.leader, group.epoch
            ));
        }
        Ok(())
    }

    fn check_isr_images(&mut self) -> Result<(), String> {
        for &id in &self.etcd.group.isr {
            let disk = &self.nodes[id.0 as usize].disk;
            self.checker.check_image(id, disk.durable(), disk.generation())?;
        }
        Ok(())
    }

    fn disk_done(&mut self, n: usize, incarnation: u32) -> Result<(), String> {
        let (now, key) = (self.now, self.key.clone());
        let node = &mut self.nodes[n];
        if node.driver.is_none() || node.incarnation != incarnation {
            return Ok(());
        }
        if node.paused_until > now {
            let at = node.paused_until;
            self.schedule(at, Event::DiskDone { node: n, incarnation });
            return Ok(());
        }
        let Some(id) = node.disk.complete_next()? else { return Ok(()) };
        let driver = node.driver.as_mut().expect("checked above");
        if node.draining > 0 {
            // An operation of a stopped replica: the next one opens once all are done.
            node.draining -= 1;
            if node.draining == 0 {
                driver.stopped(&key);
            }
            return Ok(());
        }
        driver.handle_disk_done(now, &key, id);
        self.drain(n)
    }

    fn node_tick(&mut self, n: usize, incarnation: u32) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[n];
        if node.driver.is_none() || node.incarnation != incarnation {
            return Ok(());
        }
        self.schedule(now.plus_ms(NODE_TICK_MS), Event::NodeTick { node: n, incarnation });
        let node = &mut self.nodes[n];
        if node.paused_until > now {
            return Ok(());
        }
        let driver = node.driver.as_mut().expect("checked above");
        driver.handle_tick(now);
        let retention = self.retention;
        driver.apply_retention(now.0, |_| retention);
        if let Some(start) = driver.shard(STREAM, 0).map(|s| s.replica().log_start()) {
            node.deleted_below = node.deleted_below.max(start);
        }
        // The agent gives a silent connection up (no answer for half the TTL): the next
        // keep-alive goes on a new one and starts a new session.
        if node.agent.overdue(now) {
            node.agent.session_ended();
            self.agent_giveups += 1;
        }
        let node = &mut self.nodes[n];
        if now >= node.next_keepalive {
            node.next_keepalive = now.plus_ms(KEEPALIVE_EVERY_MS);
            if node.agent.in_session() && node.agent.keepalive_sent(now).is_err() {
                node.agent.session_ended();
            }
            let (id, lease) = (node.id, node.lease);
            self.send(Addr::Node(id), Addr::Etcd, Packet::KeepAlive { lease, sent_at: now });
        }
        self.drain(n)
    }

    /// A request from the process `incarnation` of node `from`. It is served even if that
    /// process has died since (it was on its way), but the answer goes to that process only:
    /// a restarted broker opens a new connection and never reads its predecessor's answers
    /// (without this, a restarted node adopted the lease its predecessor had just kept alive
    /// and led its old epoch again with a log that had lost its unsynced batches; seed
    /// 20,338,996).
    fn etcd_receive(&mut self, from: Addr, incarnation: u32, packet: Packet) {
        let Addr::Node(node) = from else { return };
        match packet {
            Packet::KeepAlive { lease, sent_at } => {
                let lease = self.etcd.keep_alive(self.now, node, lease);
                self.reply(from, incarnation, Packet::Lease { lease, sent_at });
            }
            Packet::Propose { proposal, token } => {
                if self.etcd.propose(self.now, &proposal, self.opts.bugs.transfer_out_of_sync) {
                    self.broadcast_group();
                } else {
                    self.reply(from, incarnation, self.group_packet());
                }
                self.reply(from, incarnation, Packet::Proposed { token });
            }
            Packet::ReadGroup => self.reply(from, incarnation, self.group_packet()),
            _ => {}
        }
    }

    /// Etcd's answer to process `incarnation` of `to`.
    fn reply(&mut self, to: Addr, incarnation: u32, packet: Packet) {
        for delay_ms in self.faults.delays(&mut self.rng) {
            let event =
                Event::Deliver { from: Addr::Etcd, to, incarnation, packet: packet.clone() };
            self.schedule(self.now.plus_ms(delay_ms), event);
        }
    }

    /// The group record the nodes see now (a deposed controller's before the placement).
    fn group_packet(&self) -> Packet {
        let (state, placed, replicas) = self.etcd.record(self.now);
        // A placed record overwrote the deposed one; within one, the version orders them.
        let revision = (u64::from(placed) << 32) | state.version;
        Packet::Group { state, placed, replicas, revision, at: self.now }
    }

    fn broadcast_group(&mut self) {
        let packet = self.group_packet();
        for n in 0..self.nodes.len() {
            let to = Addr::Node(self.nodes[n].id);
            self.send(Addr::Etcd, to, packet.clone());
        }
    }

    fn producer_tick(&mut self, p: usize) -> Result<(), String> {
        self.schedule(self.now.plus_ms(PRODUCER_TICK_MS), Event::ProducerTick(p));
        let ids: Vec<ReplicaNumber> = self.nodes.iter().map(|n| n.id).collect();
        let producer = &mut self.producers[p];
        if producer.retry_due(self.now)
            && producer.in_flight_seq().is_some()
            && self.rng.gen_bool(0.5)
        {
            producer.retarget(&ids, &mut self.rng);
        }
        let request = AppendId(self.next_request);
        if let Some((target, append)) = producer.tick(self.now, request, &mut self.rng) {
            let seq = producer.in_flight_seq().expect("it just sent its batch in flight");
            if let Some(tag) = append.producer {
                self.first_sent.entry(tag).or_insert(self.now);
            }
            self.next_request += 1;
            self.requests.insert(request, (p, seq));
            self.send(Addr::Producer(p), Addr::Node(target), Packet::Append(append));
        }
        Ok(())
    }

    fn producer_receive(&mut self, p: usize, packet: Packet) {
        let Packet::Answer(answer) = packet else { return };
        let ids: Vec<ReplicaNumber> = self.nodes.iter().map(|n| n.id).collect();
        match answer {
            Output::Ack { request, .. } => {
                if let Some(&(_, seq)) = self.requests.get(&request) {
                    self.producers[p].on_ack(seq);
                }
            }
            Output::Reject { request, error } => {
                if let Some(&(_, seq)) = self.requests.get(&request) {
                    self.producers[p].on_reject(self.now, seq, &error, &ids, &mut self.rng);
                }
            }
            _ => {}
        }
    }

    /// Starts node `n`'s process: a driver with no replica and no lease, which reads the group
    /// record; its replica opens (recovering the durable image) when the record adopts it.
    fn start_node(&mut self, n: usize) {
        self.roles[n] = None;
        let node = &mut self.nodes[n];
        let mut driver = Driver::new(node.id, self.config.clone(), self.limits.clone());
        driver.inject_bugs(self.opts.bugs);
        node.driver = Some(driver);
        node.requests.clear();
        node.proposals.clear();
        node.revision = 0;
        node.draining = 0;
        node.lease = None;
        node.lease_sent_at = Time(0);
        node.next_keepalive = self.now;
        node.agent = AgentState::new(Duration::from_millis(LEASE_TTL_MS));
        node.session_at = self.now;
        let (id, incarnation) = (node.id, node.incarnation);
        self.checker.node_restarted(id);
        self.send(Addr::Node(id), Addr::Etcd, Packet::ReadGroup);
        self.schedule(self.now, Event::NodeTick { node: n, incarnation });
    }

    fn crash(&mut self, n: usize) -> Result<(), String> {
        self.taken.retain(|(node, _)| *node != n);
        if let Some(stats) = self.replica(n).map(Replica::stats) {
            self.retired = self.retired + stats;
        }
        let node = &mut self.nodes[n];
        if node.driver.take().is_none() {
            return Ok(());
        }
        node.incarnation += 1;
        node.paused_until = Time(0);
        node.disk.crash(&mut self.rng)?;
        self.crashes += 1;
        if self.etcd.group.isr.contains(&node.id) {
            self.checker.check_image(node.id, node.disk.durable(), node.disk.generation())?;
        }
        Ok(())
    }

    fn restart(&mut self, n: usize) -> Result<(), String> {
        if self.nodes[n].driver.is_some() {
            return Ok(());
        }
        let checkpoint = self.nodes[n].checkpoint.clone().filter(|_| self.rng.gen_bool(0.5));
        self.nodes[n].from_checkpoint = checkpoint;
        self.start_node(n);
        Ok(())
    }

    /// One random fault (or none), while faults are on.
    fn fault(&mut self) -> Result<(), String> {
        if self.now.0 >= self.opts.fault_phase_ms {
            return Ok(());
        }
        self.schedule(self.now.plus_ms(FAULT_EVERY_MS), Event::Fault);
        let n = self.rng.gen_range(0..self.nodes.len() as u32) as usize;
        let id = self.nodes[n].id;
        let what = match self.rng.gen_range(0..100u32) {
            0..=9 => {
                self.crash(n)?;
                format!("crash {id}")
            }
            10..=29 if Some(n) != self.lost => {
                self.restart(n)?;
                format!("restart {id}")
            }
            30..=37 => {
                self.faults.partition(&mut self.rng, self.nodes.len());
                format!("partition {:?}", self.faults)
            }
            38..=49 => {
                self.faults.heal_partition();
                "heal partition".to_string()
            }
            50..=55 => {
                self.faults.cut_from_etcd(id);
                format!("cut {id} from etcd")
            }
            56..=65 => {
                self.faults.restore_etcd();
                "reconnect etcd".to_string()
            }
            72 if self.lost.is_none() => {
                self.crash(n)?;
                self.lost = Some(n);
                format!("{id} lost for good")
            }
            66..=71 => {
                let pause_ms = self.rng.gen_range(LEASE_TTL_MS / 2..=LEASE_TTL_MS * 2);
                self.nodes[n].paused_until = self.now.plus_ms(pause_ms);
                format!("pause {id} for {pause_ms} ms")
            }
            _ => return Ok(()),
        };
        if self.opts.trace {
            eprintln!("t={} fault: {what}", self.now.0);
        }
        Ok(())
    }

    /// Ends the fault phase: every node up, no partition, no drops or duplicates.
    /// Ends the fault phase: no partition, no drops or duplicates, every node up but a lost one.
    fn heal(&mut self) -> Result<(), String> {
        self.faults.heal_all();
        for n in 0..self.nodes.len() {
            self.nodes[n].paused_until = Time(0);
            if Some(n) != self.lost {
                self.restart(n)?;
            }
        }
        Ok(())
    }

    /// Sends `packet`, subject to drops, duplication, delay and partitions.
    fn send(&mut self, from: Addr, to: Addr, packet: Packet) {
        // To a node: the process that runs there now. To etcd: the process that sent it
        // (its answers go to that process only).
        let incarnation = match (to, from) {
            (Addr::Node(id), _) | (Addr::Etcd, Addr::Node(id)) => {
                self.nodes[id.0 as usize].incarnation
            }
            _ => 0,
        };
        for delay_ms in self.faults.delays(&mut self.rng) {
            let event = Event::Deliver { from, to, incarnation, packet: packet.clone() };
            self.schedule(self.now.plus_ms(delay_ms), event);
        }
    }

    fn schedule(&mut self, at: Time, event: Event) {
        self.next_seq += 1;
        self.queue.push(Reverse(Scheduled { at, seq: self.next_seq, event }));
    }
}

/// Node `n`'s log as the broker recovers it from a checkpoint: the log as of the checkpoint,
/// checked against the durable image (its last batch there as it says), then the image's
/// batches after it. Committed, durable batches are never truncated, so a mismatch is a
/// failure.
fn log_from_checkpoint(
    n: usize,
    bytes: &[u8],
    image: Vec<Batch>,
    producers: ProducerLimits,
) -> Result<ReplicaLog, String> {
    let (mut log, (base, records, epoch)) = ReplicaLog::from_checkpoint(bytes, producers)
        .map_err(|e| format!("n{n}'s own checkpoint: {e}"))?;
    let held = image.iter().find(|b| b.base == base);
    if held.is_none_or(|b| (b.records, b.epoch) != (records, epoch)) {
        return Err(format!(
            "n{n}'s checkpoint names a batch at {base} the durable image does not hold"
        ));
    }
    let end = log.end();
    for batch in image.into_iter().filter(|b| b.base >= end) {
        log.append(batch).map_err(|e| format!("recovery of n{n} from its checkpoint: {e}"))?;
    }
    Ok(log)
}

/// Whether the checkpoint `bytes` names a last batch storage still holds (at or above where
/// retention deleted to): else the broker reads its whole stored log instead.
fn checkpoint_held(bytes: &[u8], producers: ProducerLimits, deleted: Offset) -> bool {
    ReplicaLog::from_checkpoint(bytes, producers).is_ok_and(|(_, (base, _, _))| base >= deleted)
}

/// A fetch reply with its released payloads read from the stored image, as the broker reads
/// them from storage: each must be the same batch there (offsets, epoch, producer tag); the
/// reply is cut at the first that is not. `None` if not even the first is.
fn fill_payloads(stored: &[Batch], message: Message) -> Option<Message> {
    let Message::FetchReply { epoch, from, batches, committed, log_start } = message else {
        return Some(message);
    };
    let mut out = Vec::with_capacity(batches.len());
    for mut b in batches {
        if b.payload.is_empty() {
            let i = stored.partition_point(|s| s.base < b.base);
            match stored.get(i) {
                Some(s)
                    if s.base == b.base
                        && s.records == b.records
                        && s.epoch == b.epoch
                        && s.producer == b.producer =>
                {
                    b.payload = s.payload.clone();
                }
                _ => break,
            }
        }
        out.push(b);
    }
    if out.is_empty() {
        return None;
    }
    Some(Message::FetchReply { epoch, from, batches: out, committed, log_start })
}

/// The durable batches from `from` on that end at or below `upto`, at least one and at most
/// `bytes_max` bytes otherwise: what a broker reads from storage for
/// [`Output::FetchFromLog`]. Archived batches are durable, so `from` must start one.
fn read_image(
    image: &[Batch],
    from: Offset,
    upto: Offset,
    bytes_max: u64,
) -> Result<Vec<Batch>, String> {
    let start = image.partition_point(|b| b.base < from);
    if image.get(start).is_none_or(|b| b.base != from || b.end() > upto) {
        return Err(format!("no durable batch at {from} ending by {upto}"));
    }
    let mut bytes = 0;
    let mut out = Vec::new();
    for batch in image[start..].iter().take_while(|b| b.end() <= upto) {
        bytes += batch.size_bytes();
        if !out.is_empty() && bytes > bytes_max {
            break;
        }
        out.push(batch.clone());
    }
    Ok(out)
}

fn sim_config(replicas: usize) -> ReplicaConfig {
    ReplicaConfig {
        isr_lag_max_ms: 150,
        follower_silence_ms: 90,
        fetch_park_max_ms: 40,
        fetch_retry_ms: 80,
        propose_retry_ms: 80,
        fetch_bytes_max: 256,
        follower_unwritten_bytes_max: 1024,
        producers: ProducerLimits {
            expiry_ms: SIM_PRODUCER_EXPIRY_MS,
            ..ProducerLimits::default()
        },
        // Leader balance on the simulation's time scale: a leader hands a shard back to its
        // preferred replica after 300 ms, many times per seed.
        preferred_leader_after_ms: Some(300),
        ..ReplicaConfig::for_replicas(replicas)
    }
}
