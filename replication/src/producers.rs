//! The idempotent-producer table of one replica's log: the last [`PRODUCER_SEQ_WINDOW`]
//! sequence numbers of each producer, with their offsets, and the bounds that keep it small.
//!
//! Every replica builds the table from its own log, batch by batch, and decides what to forget
//! from the log alone, so replicas holding the same batches hold the same table:
//! - the **log clock** is the largest batch time (`Batch::time_ms`, the leader's clock when it
//!   appended the batch) seen so far; it never goes back;
//! - a producer whose last batch is more than [`ProducerLimits::expiry_ms`] older than the log
//!   clock is forgotten (expired);
//! - beyond [`ProducerLimits::max`] producers, the one whose last batch is oldest is forgotten.
//!
//! A forgotten producer is unknown again: its next batch is taken as a new producer's
//! (`ReplicaLog::check_seq`), so a retry of a batch it sent before it was forgotten can be
//! stored twice. That is the limit of exactly-once (docs/client.md).

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::config::PRODUCER_SEQ_WINDOW;
use crate::types::{Batch, Offset, ProducerId, Seq};

/// Default of [`ProducerLimits::expiry_ms`]: 7 days, as Kafka's `producer.id.expiration.ms`
/// (1 day) and transactional id expiry (7 days).
pub const PRODUCER_EXPIRY_MS: u64 = 7 * 24 * 3600 * 1000;
/// Default of [`ProducerLimits::max`]: producers remembered per shard.
pub const PRODUCERS_PER_SHARD_MAX: usize = 4096;

/// How long and how many producers a shard remembers. Every replica of a shard must use the
/// same limits, or they may disagree on which producers they know (which only changes whether
/// a late retry is recognised, never what is stored or acked otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerLimits {
    /// A producer idle longer than this (by the log clock) is forgotten.
    pub expiry_ms: u64,
    /// At most this many producers are remembered (at least 1).
    pub max: usize,
}

impl Default for ProducerLimits {
    fn default() -> Self {
        Self { expiry_ms: PRODUCER_EXPIRY_MS, max: PRODUCERS_PER_SHARD_MAX }
    }
}

/// One producer's recent batches.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// `(seq, base offset, records)`, oldest first, at most [`PRODUCER_SEQ_WINDOW`].
    pub(crate) recent: VecDeque<(Seq, Offset, u32)>,
    /// Its key in `by_age`.
    pub(crate) stamp: u64,
    /// The log clock at its last batch.
    pub(crate) last_ms: u64,
}

/// The producer table (see the module).
#[derive(Clone, Debug, Default)]
pub(crate) struct ProducerTable {
    pub(crate) producers: HashMap<ProducerId, Entry>,
    /// Producers by their last batch, oldest first (keys are `stamp`s, increasing).
    pub(crate) by_age: BTreeMap<u64, ProducerId>,
    /// Counts tagged batches remembered; orders `by_age`.
    pub(crate) stamps: u64,
    /// The largest batch time seen.
    pub(crate) clock_ms: u64,
    pub(crate) limits: ProducerLimits,
    /// Producers forgotten so far, by expiry and by the count bound.
    pub(crate) expired: u64,
    pub(crate) evicted: u64,
}

impl ProducerTable {
    pub(crate) fn new(limits: ProducerLimits) -> Self {
        Self { limits: ProducerLimits { max: limits.max.max(1), ..limits }, ..Self::default() }
    }

    pub(crate) fn limits(&self) -> ProducerLimits {
        self.limits
    }

    /// Producers remembered.
    pub(crate) fn len(&self) -> usize {
        self.producers.len()
    }

    /// The log clock: the largest batch time seen.
    pub(crate) fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// Producers forgotten by expiry and by the count bound.
    pub(crate) fn forgotten(&self) -> (u64, u64) {
        (self.expired, self.evicted)
    }

    /// The recent batches of `producer`, oldest first, if it is remembered.
    pub(crate) fn recent(&self, producer: ProducerId) -> Option<&VecDeque<(Seq, Offset, u32)>> {
        self.producers.get(&producer).map(|e| &e.recent)
    }

    /// The producers remembered, in no order (for checks).
    pub(crate) fn ids(&self) -> impl Iterator<Item = ProducerId> + '_ {
        self.producers.keys().copied()
    }

    /// Takes `batch` in: advances the clock, records its tag, forgets what the limits say.
    pub(crate) fn remember(&mut self, batch: &Batch) {
        self.clock_ms = self.clock_ms.max(batch.time_ms);
        if let Some(tag) = batch.producer {
            self.stamps += 1;
            let stamp = self.stamps;
            let entry = self.producers.entry(tag.producer).or_insert_with(|| Entry {
                recent: VecDeque::new(),
                stamp,
                last_ms: 0,
            });
            self.by_age.remove(&entry.stamp);
            entry.stamp = stamp;
            entry.last_ms = self.clock_ms;
            entry.recent.push_back((tag.seq, batch.base, batch.records));
            if entry.recent.len() > PRODUCER_SEQ_WINDOW {
                entry.recent.pop_front();
            }
            self.by_age.insert(stamp, tag.producer);
        }
        self.enforce();
    }

    /// Forgets expired producers and the oldest beyond the count bound.
    fn enforce(&mut self) {
        let horizon = self.clock_ms.saturating_sub(self.limits.expiry_ms);
        while let Some((&stamp, &id)) = self.by_age.first_key_value() {
            let last_ms = self.producers.get(&id).map_or(0, |e| e.last_ms);
            let expired = last_ms < horizon;
            if !expired && self.producers.len() <= self.limits.max {
                break;
            }
            self.by_age.remove(&stamp);
            self.producers.remove(&id);
            if expired {
                self.expired += 1;
            } else {
                self.evicted += 1;
            }
        }
        debug_assert_eq!(self.by_age.len(), self.producers.len(), "by_age indexes every producer");
    }

    /// Panics if the age index disagrees with the producers (checked in debug builds by
    /// `ReplicaLog::debug_assert_invariants`).
    pub(crate) fn debug_assert_invariants(&self) {
        assert_eq!(self.by_age.len(), self.producers.len(), "by_age indexes every producer");
        assert!(self.producers.len() <= self.limits.max, "more producers than the limit");
        for (&stamp, id) in &self.by_age {
            let e = self.producers.get(id).expect("by_age names a remembered producer");
            assert_eq!(e.stamp, stamp, "{id:?}'s stamp");
            assert!(stamp <= self.stamps, "a stamp from the future");
            assert!(!e.recent.is_empty() && e.recent.len() <= PRODUCER_SEQ_WINDOW);
            assert!(e.last_ms <= self.clock_ms, "a producer's last batch after the clock");
        }
    }

    /// Bytes the table holds, about (for the gauge).
    pub(crate) fn bytes(&self) -> u64 {
        let per_producer = std::mem::size_of::<(ProducerId, Entry)>()
            + std::mem::size_of::<(u64, ProducerId)>()
            + PRODUCER_SEQ_WINDOW * std::mem::size_of::<(Seq, Offset, u32)>();
        (self.producers.len() * per_producer) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Epoch, ProducerSeq};
    use bytes::Bytes;

    fn tagged(base: u64, time_ms: u64, producer: u64, seq: u32) -> Batch {
        Batch {
            epoch: Epoch(1),
            base: Offset(base),
            records: 1,
            producer: Some(ProducerSeq { producer: ProducerId(producer), seq: Seq(seq) }),
            time_ms,
            payload: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn an_idle_producer_expires_by_the_log_clock() {
        let mut t = ProducerTable::new(ProducerLimits { expiry_ms: 1_000, max: 100 });
        t.remember(&tagged(0, 10_000, 1, 0));
        t.remember(&tagged(1, 10_500, 2, 0));
        assert_eq!(t.len(), 2);
        // 1,000 ms after producer 1's batch: not yet more than the expiry.
        t.remember(&tagged(2, 11_000, 2, 1));
        assert!(t.recent(ProducerId(1)).is_some());
        t.remember(&tagged(3, 11_001, 2, 2));
        assert!(t.recent(ProducerId(1)).is_none(), "idle 1,001 ms > 1,000 ms");
        assert!(t.recent(ProducerId(2)).is_some());
        assert_eq!(t.forgotten(), (1, 0));
    }

    #[test]
    fn a_clock_going_back_does_not_revive_or_expire_anyone() {
        let mut t = ProducerTable::new(ProducerLimits { expiry_ms: 1_000, max: 100 });
        t.remember(&tagged(0, 10_000, 1, 0));
        // A leader whose clock is behind: the log clock stays at 10,000.
        t.remember(&tagged(1, 5_000, 2, 0));
        assert_eq!(t.clock_ms(), 10_000);
        t.remember(&tagged(2, 10_900, 3, 0));
        assert_eq!(t.len(), 3, "producer 2 was stamped with the log clock, not its own");
        t.remember(&tagged(3, 11_500, 3, 1));
        let ids: Vec<u64> = t.ids().map(|p| p.0).collect();
        assert_eq!(ids, vec![3], "producers 1 and 2 (last at 10,000) expire together");
    }

    #[test]
    fn beyond_the_count_bound_the_oldest_idle_goes_first() {
        let mut t = ProducerTable::new(ProducerLimits { expiry_ms: u64::MAX, max: 3 });
        for p in 0..3 {
            t.remember(&tagged(p, 1, p, 0));
        }
        // Producer 0 appends again: producer 1 is now the oldest idle.
        t.remember(&tagged(3, 1, 0, 1));
        t.remember(&tagged(4, 1, 9, 0));
        let mut ids: Vec<u64> = t.ids().map(|p| p.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![0, 2, 9]);
        assert_eq!(t.forgotten(), (0, 1));
    }

    #[test]
    fn the_window_keeps_the_last_sequence_numbers() {
        let mut t = ProducerTable::new(ProducerLimits::default());
        for s in 0..(PRODUCER_SEQ_WINDOW as u32 + 3) {
            t.remember(&tagged(u64::from(s), 1, 7, s));
        }
        let recent = t.recent(ProducerId(7)).unwrap();
        assert_eq!(recent.len(), PRODUCER_SEQ_WINDOW);
        assert_eq!(recent.front().unwrap().0, Seq(3));
    }
}
