//! Identifier newtypes shared by every crate.

use std::fmt;

/// A shard of a stream. Shard ids are dense: `0..shard_count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ShardId(pub u32);

/// A core of a broker process (the index of its executor, not the CPU number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CoreId(pub u16);

/// The offset of a record within a shard. Offsets are dense and start at 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub u64);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard-{}", self.0)
    }
}

impl fmt::Display for CoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "core-{}", self.0)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A producer's identity for idempotent publishing: chosen at random by the client, one per
/// sequence space (see [`ProducerTag`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ProducerId(pub u64);

/// The tag of an idempotent batch: it is batch number `seq` of `producer`, whose batches all
/// go to one shard. The shard's owner stores a batch once: a retry of a stored `seq` gets the
/// original offsets back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProducerTag {
    /// The producer.
    pub producer: ProducerId,
    /// The batch's sequence number; each batch of a producer takes the next one (wrapping).
    pub seq: u32,
}

impl fmt::Display for ProducerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "producer-{:016x}", self.0)
    }
}
