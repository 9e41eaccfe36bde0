//! Ids, times and the replicated batch: the vocabulary every other module uses.

use std::fmt;

use bytes::Bytes;
/// The client's ack modes and producer ids are the protocol's: one name per concept.
pub use felix_proto::{AckMode, Offset, ProducerId};

/// A replica's number in its shard's group: its position in the group record's `replicas` (the
/// driver maps it to the broker, the cluster's `ReplicaNumber`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ReplicaNumber(pub u32);

/// A leader epoch. Every leadership change (a controller compare-and-swap) increments it; one
/// node at most leads a given epoch. `Epoch::NONE` (0) precedes the first election.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(pub u64);

impl Epoch {
    /// No epoch: before the first election, or "no batch" in an epoch query.
    pub const NONE: Epoch = Epoch(0);
}

/// A controller (etcd) lease: one per broker process incarnation. A restarted process gets a
/// new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LeaseId(pub u64);

/// A producer's per-shard batch sequence number: its first batch to a shard is 0, each next
/// batch is one more; a retry reuses the number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Seq(pub u32);

/// The driver's correlation id of a client append; answers carry it back (not the client's
/// `felix_proto::AppendId`: the driver numbers the appends it hands each replica).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AppendId(pub u64);

/// A point in time, in milliseconds from an origin the driver chooses (the state machine never
/// reads a clock; every handler takes `now`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    /// `self + ms`, saturating.
    pub fn plus_ms(self, ms: u64) -> Time {
        Time(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self` (0 if `earlier` is later).
    pub fn since_ms(self, earlier: Time) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// The idempotence tag of a batch: who sent it, and its per-shard sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProducerSeq {
    /// The producer.
    pub producer: ProducerId,
    /// Its sequence number for this shard.
    pub seq: Seq,
}

/// One replicated batch: the unit the leader appends, ships and the followers store.
///
/// The producer tag is part of the batch, so every replica rebuilds the idempotence table from
/// its own log and a new leader drops retries of batches its predecessor accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The epoch of the leader that appended it.
    pub epoch: Epoch,
    /// Offset of its first record.
    pub base: Offset,
    /// Record count, at least 1.
    pub records: u32,
    /// Idempotence tag, if the producer is idempotent.
    pub producer: Option<ProducerSeq>,
    /// The leader's clock when it appended the batch, ms since the Unix epoch (0: unknown).
    /// The producer table's expiry runs on the largest batch time in the log, so every replica
    /// expires the same producers at the same batch.
    pub time_ms: u64,
    /// The encoded records (opaque here).
    pub payload: Bytes,
}

impl Batch {
    /// The batch with `time_ms` read from its payload, which by the broker's encoding begins
    /// with the batch's time (u64, big-endian, ms since the Unix epoch); 0 when the payload is
    /// shorter. The batch time does not travel on its own on the wire: the payload has it.
    pub fn with_time_from_payload(mut self) -> Batch {
        if let Some(head) = self.payload.get(..8) {
            let mut be = [0u8; 8];
            be.copy_from_slice(head);
            self.time_ms = u64::from_be_bytes(be);
        }
        self
    }

    /// Offset one past its last record.
    pub fn end(&self) -> Offset {
        Offset(self.base.0 + u64::from(self.records))
    }

    /// Bytes it costs in a fetch reply (payload plus a fixed header estimate).
    pub fn size_bytes(&self) -> u64 {
        self.payload.len() as u64 + crate::config::BATCH_HEADER_BYTES
    }
}

/// A time plus a duration (whole milliseconds): so the cluster agent's lease bookkeeping
/// (`felix_cluster::agent_state`) runs on simulated time too.
impl std::ops::Add<std::time::Duration> for Time {
    type Output = Time;

    fn add(self, d: std::time::Duration) -> Time {
        Time(self.0.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }
}

impl fmt::Display for ReplicaNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}
