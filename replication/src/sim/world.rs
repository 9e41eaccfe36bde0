//! The simulated cluster: replicas with their disks and leases, the etcd model, producers, and
//! the network between them, all driven by one event queue and one seeded PRNG.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::check::Checker;
use super::disk::SimDisk;
use super::etcd::Etcd;
use super::net::{Addr, Event, Faults, Packet, Scheduled};
use super::producer::Producer;
use super::{SeedReport, SimOptions};
use crate::config::ReplicaConfig;
use crate::controller::GroupState;
use crate::error::AppendError;
use crate::log::ReplicaLog;
use crate::message::{Message, Output};
use crate::producers::ProducerLimits;
use crate::replica::{Replica, ReplicaStats, RoleView};
use crate::types::{
    Batch, Epoch, LeaseId, NodeId, Offset, ProducerId, ProducerSeq, RequestId, Seq, Time,
};

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

/// One simulated broker's replica of the shard.
struct SimNode {
    id: NodeId,
    replica: Option<Replica>,
    incarnation: u32,
    disk: SimDisk,
    lease: Option<LeaseId>,
    lease_sent_at: Time,
    next_keepalive: Time,
    paused_until: Time,
    /// The checkpoint of its log's archive as of its last crash (the broker writes one after
    /// each archive): a restart starts from it half the time.
    checkpoint: Option<Vec<u8>>,
}

/// The whole simulated cluster.
pub(super) struct World {
    seed: u64,
    rng: ChaCha8Rng,
    now: Time,
    opts: SimOptions,
    config: ReplicaConfig,
    queue: BinaryHeap<Reverse<Scheduled>>,
    next_seq: u64,
    nodes: Vec<SimNode>,
    etcd: Etcd,
    producers: Vec<Producer>,
    requests: HashMap<RequestId, (usize, Seq)>,
    /// (node, request) of the appends whose batch the node's log took and that it has not
    /// answered yet (invariant 8).
    taken: HashSet<(usize, RequestId)>,
    /// The append delivery a node is handling now, and whether its log took the batch.
    delivering: Option<(RequestId, bool)>,
    next_request: u64,
    checker: Checker,
    faults: Faults,
    pub(super) events: u64,
    crashes: u32,
    /// Restarts from a checkpoint.
    checkpoint_restarts: u64,
    /// When each idempotent batch was first sent.
    first_sent: HashMap<ProducerSeq, Time>,
    /// Counters of replicas that crashed.
    retired: ReplicaStats,
    /// A node lost for good (crashed, never restarted), if any.
    lost: Option<usize>,
}

impl World {
    pub(super) fn new(
        seed: u64,
        rng: ChaCha8Rng,
        opts: SimOptions,
        replicas: usize,
        producers: usize,
    ) -> World {
        let ids: Vec<NodeId> = (0..replicas as u32).map(NodeId).collect();
        let mut config = sim_config(replicas);
        // Archive 1 to 16 batches at a time, chosen by the seed (not the PRNG, so its stream is
        // what it was before replicas archived).
        config.archive_min_batches = (seed % 16) as usize + 1;
        let mut world = World {
            seed,
            config,
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
            checkpoint_restarts: 0,
            first_sent: HashMap::new(),
            retired: ReplicaStats::default(),
            lost: None,
            now: Time(0),
            rng,
            opts,
        };
        world.faults = Faults::random(&mut world.rng);
        for &id in &ids {
            world.nodes.push(SimNode {
                id,
                replica: None,
                checkpoint: None,
                incarnation: 0,
                disk: SimDisk::default(),
                lease: None,
                lease_sent_at: Time(0),
                next_keepalive: Time(0),
                paused_until: Time(0),
            });
            world.start_node(id.0 as usize, Vec::new()).expect("an empty log is valid");
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
        let live = self.nodes.iter().filter_map(|n| n.replica.as_ref().map(Replica::stats));
        let stats = live.fold(self.retired, super::add_stats);
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
            unavailable: false,
            producers_expired: self
                .nodes
                .iter()
                .filter_map(|n| n.replica.as_ref().map(|r| r.log().producers_forgotten().0))
                .max()
                .unwrap_or(0),
        }
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
            .map(|n| match &n.replica {
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
                if self.nodes[n].replica.is_none() || self.nodes[n].incarnation != incarnation {
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
        let node = &mut self.nodes[n];
        let replica = node.replica.as_mut().expect("checked by the caller");
        match (from, packet) {
            (Addr::Node(peer), Packet::Replica(message)) => {
                replica.handle_message(now, peer, message)
            }
            (_, Packet::Group(group)) => replica.handle_controller(now, group),
            (_, Packet::Lease { lease, sent_at }) => {
                if sent_at < node.lease_sent_at {
                    return Ok(());
                }
                node.lease = Some(lease);
                node.lease_sent_at = sent_at;
                replica.handle_lease(now, lease, sent_at.plus_ms(LEASE_TTL_MS));
            }
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
                let (request, tag, from) = (append.request, append.producer, replica.log().end());
                replica.handle_append(now, append);
                // Invariant 8: whether this delivery made the node's log take the batch (the
                // network may deliver one request twice: the second is answered on its own).
                let took = tag.is_some()
                    && replica.log().batches().iter().any(|b| b.base >= from && b.producer == tag);
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

    /// Invariant 8: a refusal other than `OutcomeUnknown` stored nothing: the refusing node's
    /// log did not take the append's batch (when it arrived, or since, as a leader's waiter).
    fn check_refusal(
        &mut self,
        n: usize,
        request: RequestId,
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

    /// Carries out everything node `n` asked for, then checks it.
    fn drain(&mut self, n: usize) -> Result<(), String> {
        let id = self.nodes[n].id;
        let mut outputs = Vec::new();
        if let Some(replica) = self.nodes[n].replica.as_mut() {
            while let Some(output) = replica.poll() {
                outputs.push(output);
            }
        }
        let mut acks = Vec::new();
        for output in outputs {
            match output {
                Output::Send { to, message } => {
                    self.send(Addr::Node(id), Addr::Node(to), Packet::Replica(message))
                }
                Output::FetchFromLog { to, epoch, from, upto, committed, bytes_max } => {
                    let batches =
                        read_image(self.nodes[n].disk.durable(), from, upto, bytes_max)
                            .map_err(|e| format!("{id}: a fetch of its archived prefix: {e}"))?;
                    let message = Message::FetchReply { epoch, from, batches, committed };
                    self.send(Addr::Node(id), Addr::Node(to), Packet::Replica(message))
                }
                Output::Failed(error) => return Err(format!("{id} failed: {error}")),
                Output::Disk(op) => {
                    let at = self.nodes[n].disk.submit(self.now, op, &mut self.rng);
                    let incarnation = self.nodes[n].incarnation;
                    self.schedule(at, Event::DiskDone { node: n, incarnation });
                }
                Output::Propose(proposal) => {
                    self.send(Addr::Node(id), Addr::Etcd, Packet::Propose(proposal))
                }
                Output::Ack { request, epoch, base, records } => {
                    self.taken.remove(&(n, request));
                    acks.push((request, epoch, base, records));
                    self.answer(id, request, Output::Ack { request, epoch, base, records });
                }
                Output::Reject { request, error } => {
                    self.check_refusal(n, request, &error)?;
                    self.answer(id, request, Output::Reject { request, error })
                }
            }
        }
        self.check_node(n)?;
        self.check_acks(n, acks)?;
        // After the checks, which have seen every committed batch: archive what they allow.
        if let Some(replica) = self.nodes[n].replica.as_mut() {
            let committed = replica.committed();
            replica.archive(committed);
        }
        Ok(())
    }

    /// Sends a client answer to the producer that made `request`.
    fn answer(&mut self, node: NodeId, request: RequestId, answer: Output) {
        if let Some(&(p, _)) = self.requests.get(&request) {
            self.send(Addr::Node(node), Addr::Producer(p), Packet::Answer(answer));
        }
    }

    /// Invariants 3, 4 and 6 for the acks node `n` just emitted (after its committed prefix
    /// joined the history).
    fn check_acks(
        &mut self,
        n: usize,
        acks: Vec<(RequestId, Epoch, Offset, u32)>,
    ) -> Result<(), String> {
        let id = self.nodes[n].id;
        for (request, epoch, base, records) in acks {
            let Some(&(p, seq)) = self.requests.get(&request) else { continue };
            let replica = self.nodes[n].replica.as_ref().expect("it just acked");
            if replica.role() != (RoleView::Leader { epoch }) {
                return Err(format!("{id} acked in {epoch} while {:?}", replica.role()));
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
        if let Some(replica) = &node.replica {
            self.check_producers_agree(n)?;
            self.checker.check_committed(node.id, replica.log(), replica.committed())?;
            let (stored, generation) = (node.disk.stored(), node.disk.stored_generation());
            self.checker.check_readable(node.id, stored, generation, replica.visible_end())?;
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
        let Some(mine) = self.nodes[n].replica.as_ref().map(Replica::log) else { return Ok(()) };
        for other in &self.nodes {
            let Some(theirs) = other.replica.as_ref().map(Replica::log) else { continue };
            if other.id == self.nodes[n].id
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

    /// A node acks only while etcd still holds its lease and names it leader of `epoch`: a
    /// leader whose lease or epoch is gone has stopped acking.
    fn check_fenced_in_time(&self, n: usize, epoch: Epoch) -> Result<(), String> {
        let node = &self.nodes[n];
        let group = &self.etcd.group;
        let live = node.lease.is_some_and(|l| self.etcd.lease_live(l, self.now));
        if !live || group.leader != Some(node.id) || group.epoch != epoch {
            return Err(format!(
                "{} acked in {epoch} at t={} ms but etcd has lease live {live}, leader {:?} in {}",
                node.id, self.now.0, group.leader, group.epoch
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
        let node = &mut self.nodes[n];
        if node.replica.is_none() || node.incarnation != incarnation {
            return Ok(());
        }
        if node.paused_until > self.now {
            let at = node.paused_until;
            self.schedule(at, Event::DiskDone { node: n, incarnation });
            return Ok(());
        }
        let Some(id) = node.disk.complete_next()? else { return Ok(()) };
        node.replica.as_mut().expect("checked above").handle_disk_done(self.now, id);
        self.drain(n)
    }

    fn node_tick(&mut self, n: usize, incarnation: u32) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[n];
        if node.replica.is_none() || node.incarnation != incarnation {
            return Ok(());
        }
        self.schedule(now.plus_ms(NODE_TICK_MS), Event::NodeTick { node: n, incarnation });
        let node = &mut self.nodes[n];
        if node.paused_until > now {
            return Ok(());
        }
        node.replica.as_mut().expect("checked above").handle_tick(now);
        if now >= node.next_keepalive {
            node.next_keepalive = now.plus_ms(KEEPALIVE_EVERY_MS);
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
            Packet::Propose(proposal) => {
                if self.etcd.propose(&proposal) {
                    self.broadcast_group();
                } else {
                    self.reply(from, incarnation, Packet::Group(self.etcd.group.clone()));
                }
            }
            Packet::ReadGroup => {
                self.reply(from, incarnation, Packet::Group(self.etcd.group.clone()))
            }
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

    fn broadcast_group(&mut self) {
        let group: GroupState = self.etcd.group.clone();
        for n in 0..self.nodes.len() {
            let to = Addr::Node(self.nodes[n].id);
            self.send(Addr::Etcd, to, Packet::Group(group.clone()));
        }
    }

    fn producer_tick(&mut self, p: usize) -> Result<(), String> {
        self.schedule(self.now.plus_ms(PRODUCER_TICK_MS), Event::ProducerTick(p));
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let producer = &mut self.producers[p];
        if producer.retry_due(self.now)
            && producer.in_flight_seq().is_some()
            && self.rng.gen_bool(0.5)
        {
            producer.retarget(&ids, &mut self.rng);
        }
        let request = RequestId(self.next_request);
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
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
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

    /// Restarts node `n` from `image` (its durable log): a new process with no lease.
    fn start_node(&mut self, n: usize, image: Vec<Batch>) -> Result<(), String> {
        let log = ReplicaLog::from_batches_with(image, self.config.producers)
            .map_err(|e| format!("recovery of n{n}: {e}"))?;
        self.start_with_log(n, log);
        Ok(())
    }

    /// Starts node `n`'s replica on `log`: a new process with no lease.
    fn start_with_log(&mut self, n: usize, log: ReplicaLog) {
        let node = &mut self.nodes[n];
        let mut replica = Replica::new(node.id, self.config.clone(), log);
        replica.inject_bugs(self.opts.bugs);
        node.replica = Some(replica);
        node.lease = None;
        node.lease_sent_at = Time(0);
        node.next_keepalive = self.now;
        let (id, incarnation) = (node.id, node.incarnation);
        self.send(Addr::Node(id), Addr::Etcd, Packet::ReadGroup);
        self.schedule(self.now, Event::NodeTick { node: n, incarnation });
    }

    fn crash(&mut self, n: usize) -> Result<(), String> {
        self.taken.retain(|(node, _)| *node != n);
        let node = &mut self.nodes[n];
        let Some(replica) = node.replica.take() else { return Ok(()) };
        node.checkpoint = replica.log().checkpoint();
        self.retired = super::add_stats(self.retired, replica.stats());
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
        if self.nodes[n].replica.is_some() {
            return Ok(());
        }
        let image = self.nodes[n].disk.durable().to_vec();
        if let Some(bytes) = self.nodes[n].checkpoint.take().filter(|_| self.rng.gen_bool(0.5)) {
            return self.start_from_checkpoint(n, &bytes, image);
        }
        self.start_node(n, image)
    }

    /// Restarts node `n` as the broker does with a checkpoint: the log as of the checkpoint,
    /// checked against the durable image (its last batch there as it says), then the image's
    /// batches after it. Committed, durable batches are never truncated, so a mismatch is a
    /// failure.
    fn start_from_checkpoint(
        &mut self,
        n: usize,
        bytes: &[u8],
        image: Vec<Batch>,
    ) -> Result<(), String> {
        let (mut log, (base, records, epoch)) =
            ReplicaLog::from_checkpoint(bytes, self.config.producers)
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
        self.start_with_log(n, log);
        self.checkpoint_restarts += 1;
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

/// Replica timings scaled to the simulation's short lease.
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
        ..ReplicaConfig::for_replicas(replicas)
    }
}
