//! The simulated network: addresses, events, packets, and the faults applied to them.

use std::collections::BTreeSet;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use felix_replication::controller::{GroupState, IsrProposal};
use felix_replication::message::{Message, Output};
use felix_replication::types::{LeaseId, ReplicaNumber, Time};
use felix_replication::AppendRequest;

/// Largest message delay a seed may draw, ms.
pub const DELAY_MAX_MS: u64 = 30;
/// Largest drop probability a seed may draw.
pub const DROP_P_MAX: f64 = 0.10;
/// Largest duplication probability a seed may draw.
pub const DUP_P_MAX: f64 = 0.05;

/// Who sends or receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    /// A replica's broker.
    Node(ReplicaNumber),
    /// The etcd model.
    Etcd,
    /// A producer (by index).
    Producer(usize),
}

/// What travels.
#[derive(Clone, Debug)]
pub enum Packet {
    /// Replica to replica.
    Replica(Message),
    /// Node to etcd: renew `lease` (or grant one); `sent_at` comes back in the answer.
    KeepAlive { lease: Option<LeaseId>, sent_at: Time },
    /// Node to etcd: an in-sync-set compare-and-swap; `token` comes back in `Proposed`.
    Propose { proposal: IsrProposal, token: u64 },
    /// etcd to node: the proposal `token` was applied or refused (the agent's call returned).
    Proposed { token: u64 },
    /// Node to etcd: read the group record (after a restart).
    ReadGroup,
    /// etcd to node: the node holds `lease`, renewed by the keep-alive sent at `sent_at`.
    Lease { lease: LeaseId, sent_at: Time },
    /// etcd to node: the group record (watch), whether the stream is placed, and the node of
    /// each replica number.
    /// `revision` orders the records as etcd's watch does: a node never goes back to an older
    /// one (a deposed controller's record the placement overwrote, delivered late).
    /// `at`: when etcd sent it (a node's agent counts its view loaded for a session by a
    /// record sent since the session started).
    Group { state: GroupState, placed: bool, replicas: Vec<ReplicaNumber>, revision: u64, at: Time },
    /// Producer to node.
    Append(AppendRequest),
    /// Node to producer: an `Ack` or a `Reject`.
    Answer(Output),
}

/// Something that happens at a time.
#[derive(Debug)]
pub enum Event {
    /// A packet arrives (`incarnation`: the destination process it was sent to; for a packet
    /// to etcd, the process that sent it, which etcd answers).
    Deliver { from: Addr, to: Addr, incarnation: u32, packet: Packet },
    /// A node's oldest disk operation completes.
    DiskDone { node: usize, incarnation: u32 },
    /// A node's timer.
    NodeTick { node: usize, incarnation: u32 },
    /// A node's proposal `token` has had no answer for the agent's request timeout.
    ProposalTimeout { node: usize, incarnation: u32, token: u64 },
    /// etcd's timer.
    EtcdTick,
    /// A producer's timer.
    ProducerTick(usize),
    /// Maybe inject a fault.
    Fault,
}

/// An event in the queue, ordered by time, then by scheduling order (deterministic).
#[derive(Debug)]
pub struct Scheduled {
    pub at: Time,
    pub seq: u64,
    pub event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The network faults of one seed.
#[derive(Default, Debug)]
pub struct Faults {
    drop_p: f64,
    dup_p: f64,
    delay_max_ms: u64,
    /// Per node: its side of a partition (etcd and producers are on side 0 and reach both).
    sides: Vec<u8>,
    /// Which side etcd is on.
    etcd_side: u8,
    /// Nodes cut from etcd (their leases run out).
    etcd_cut: BTreeSet<ReplicaNumber>,
}

impl Faults {
    /// Rates drawn for one seed.
    pub fn random(rng: &mut ChaCha8Rng) -> Faults {
        Faults {
            drop_p: rng.gen_range(0.0..DROP_P_MAX),
            dup_p: rng.gen_range(0.0..DUP_P_MAX),
            delay_max_ms: rng.gen_range(1..=DELAY_MAX_MS),
            ..Faults::default()
        }
    }

    /// The delays of the copies of one packet: none (dropped), one, or two (duplicated).
    pub fn delays(&self, rng: &mut ChaCha8Rng) -> Vec<u64> {
        if rng.gen_bool(self.drop_p) {
            return Vec::new();
        }
        let copies = if rng.gen_bool(self.dup_p) { 2 } else { 1 };
        (0..copies).map(|_| rng.gen_range(1..=self.delay_max_ms)).collect()
    }

    /// Whether a packet from `from` to `to` is lost to a partition now.
    pub fn blocked(&self, from: Addr, to: Addr) -> bool {
        let side = |a: Addr| match a {
            Addr::Node(n) => self.sides.get(n.0 as usize).copied(),
            Addr::Etcd => Some(self.etcd_side),
            Addr::Producer(_) => None,
        };
        let cut = |a: Addr, b: Addr| matches!((a, b), (Addr::Node(n), Addr::Etcd) if self.etcd_cut.contains(&n));
        if cut(from, to) || cut(to, from) {
            return true;
        }
        matches!((side(from), side(to)), (Some(a), Some(b)) if a != b)
    }

    /// A random two-sided partition of `nodes` nodes and etcd.
    pub fn partition(&mut self, rng: &mut ChaCha8Rng, nodes: usize) {
        self.sides = (0..nodes).map(|_| rng.gen_range(0..2u8)).collect();
        self.etcd_side = rng.gen_range(0..2u8);
    }

    /// Ends the partition.
    pub fn heal_partition(&mut self) {
        self.sides.clear();
    }

    /// Cuts `node` from etcd.
    pub fn cut_from_etcd(&mut self, node: ReplicaNumber) {
        self.etcd_cut.insert(node);
    }

    /// Reconnects every node to etcd.
    pub fn restore_etcd(&mut self) {
        self.etcd_cut.clear();
    }

    /// No partitions, cuts, drops or duplicates from now on (delays stay).
    pub fn heal_all(&mut self) {
        self.heal_partition();
        self.restore_etcd();
        self.drop_p = 0.0;
        self.dup_p = 0.0;
    }
}
