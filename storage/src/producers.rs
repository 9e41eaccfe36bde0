//! The producer table of one shard: which tagged batches (`ProducerTag`) the shard holds, so
//! that a retry of a stored batch is answered with its original offsets instead of being
//! stored twice (idempotent appends).
//!
//! Pure and in memory, like the index: built at enqueue time, rebuilt by recovery from the
//! tags in the log, never persisted on its own. Rules, bounds and crash behaviour:
//! docs/storage-format.md, "Producer table".
//!
//! Call order per tagged append: [`ProducerTable::check`] (what the tag means, no change),
//! then, if the batch is appended, [`ProducerTable::record`]. [`ProducerTable::forget_after`]
//! drops what a failed write or a truncation took back.

use std::collections::{BTreeMap, HashMap, VecDeque};

use felix_proto::{ProducerId, ProducerTag};

/// Batches remembered per producer: a retry of one of its last this many batches is a
/// duplicate; an older one gets `SequenceTooOld`.
pub const PRODUCER_SEQ_WINDOW: usize = 8;
/// Default of `StorageConfig::producers_per_shard_max`: producers remembered per shard
/// before the one whose last append is oldest is forgotten.
pub const PRODUCERS_PER_SHARD_MAX: usize = 4096;
/// Default of `StorageConfig::producer_expiry_ms`: a producer idle this long (by the shard's
/// batch times) is forgotten. 7 days.
pub const PRODUCER_EXPIRY_MS: u64 = 7 * 24 * 3600 * 1000;

const _: () = assert!(PRODUCER_SEQ_WINDOW > 0 && PRODUCER_SEQ_WINDOW < (1 << 31));

/// One stored batch of a producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SeqEntry {
    pub(crate) seq: u32,
    pub(crate) base_offset: u64,
    pub(crate) record_count: u32,
}

impl SeqEntry {
    fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
}

/// What a tag means to the shard ([`ProducerTable::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// Append it: the producer is unknown, or this is its next sequence number.
    Append,
    /// A retry of a stored batch with the same record count: append nothing, answer this.
    Duplicate(SeqEntry),
    /// A retry of a stored batch with another record count.
    Mismatch(SeqEntry),
    /// Ahead of the next sequence number: batches in between are missing.
    OutOfOrder {
        /// The sequence number that would have been appended.
        expected: u32,
    },
    /// Older than every remembered batch of the producer.
    TooOld {
        /// The oldest sequence number remembered.
        oldest_kept: u32,
    },
}

/// The last batches of one producer and when it last appended.
struct Producer {
    /// Consecutive sequence numbers (wrapping), oldest first, at most `PRODUCER_SEQ_WINDOW`.
    entries: VecDeque<SeqEntry>,
    /// The table's append counter at its last append (its key in `by_age`).
    last_append: u64,
    /// The table's clock at its last append.
    last_ms: u64,
}

/// Producers a [`ProducerTable::record`] made the table forget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Forgotten {
    /// Idle longer than the expiry.
    pub(crate) expired: u64,
    /// The oldest idle, for room (the table was full).
    pub(crate) evicted: u64,
}

/// The producer table of one shard.
pub(crate) struct ProducerTable {
    producers: HashMap<ProducerId, Producer>,
    /// Producers by their last append, oldest first: the eviction order.
    by_age: BTreeMap<u64, ProducerId>,
    /// Counts `record` calls; orders `by_age`.
    appends: u64,
    /// Most producers kept (`StorageConfig::producers_per_shard_max`).
    producers_max: usize,
    /// A producer idle longer than this is forgotten (`StorageConfig::producer_expiry_ms`).
    expiry_ms: u64,
    /// The largest batch time recorded: the clock expiry runs on (it never goes back).
    clock_ms: u64,
}

impl ProducerTable {
    /// An empty table that keeps at most `producers_max` producers (> 0), each for at most
    /// `expiry_ms` after its last batch.
    pub(crate) fn new(producers_max: usize, expiry_ms: u64) -> Self {
        debug_assert!(producers_max > 0, "validated by StorageConfig::validate");
        Self {
            producers: HashMap::new(),
            by_age: BTreeMap::new(),
            appends: 0,
            producers_max: producers_max.max(1),
            expiry_ms,
            clock_ms: 0,
        }
    }

    /// Producers remembered.
    pub(crate) fn len(&self) -> usize {
        self.producers.len()
    }

    /// What a batch of `record_count` records tagged `tag` is. Changes nothing.
    pub(crate) fn check(&self, tag: ProducerTag, record_count: u32) -> Check {
        let Some(p) = self.producers.get(&tag.producer) else { return Check::Append };
        let (Some(first), Some(last)) = (p.entries.front(), p.entries.back()) else {
            return Check::Append;
        };
        if let Some(e) = p.entries.iter().find(|e| e.seq == tag.seq) {
            return if e.record_count == record_count {
                Check::Duplicate(*e)
            } else {
                Check::Mismatch(*e)
            };
        }
        let expected = last.seq.wrapping_add(1);
        let ahead_by = tag.seq.wrapping_sub(expected);
        if ahead_by == 0 {
            Check::Append
        } else if ahead_by < 1 << 31 {
            Check::OutOfOrder { expected }
        } else {
            Check::TooOld { oldest_kept: first.seq }
        }
    }

    /// Remember that the batch tagged `tag` holds `record_count` records from `base_offset`.
    /// If `tag.seq` does not follow the producer's last one (only recovery sees that: the
    /// producer was forgotten when this batch was stored), its window starts again here.
    /// Returns whether another producer was evicted to make room.
    ///
    /// `time_ms` is the batch's time: the table's clock moves to it (never back), and producers
    /// idle longer than the expiry by that clock are forgotten.
    pub(crate) fn record(
        &mut self,
        tag: ProducerTag,
        base_offset: u64,
        record_count: u32,
        time_ms: u64,
    ) -> Forgotten {
        let entry = SeqEntry { seq: tag.seq, base_offset, record_count };
        self.appends += 1;
        let now = self.appends;
        self.clock_ms = self.clock_ms.max(time_ms);
        let clock_ms = self.clock_ms;
        let mut forgotten = Forgotten { expired: self.expire(), evicted: 0 };
        if let Some(p) = self.producers.get_mut(&tag.producer) {
            if p.entries.back().is_some_and(|l| l.seq.wrapping_add(1) == tag.seq) {
                if p.entries.len() == PRODUCER_SEQ_WINDOW {
                    p.entries.pop_front();
                }
            } else {
                p.entries.clear();
            }
            p.entries.push_back(entry);
            self.by_age.remove(&p.last_append);
            p.last_append = now;
            p.last_ms = clock_ms;
            self.by_age.insert(now, tag.producer);
            return forgotten;
        }
        if self.producers.len() >= self.producers_max {
            if let Some((_, oldest)) = self.by_age.pop_first() {
                self.producers.remove(&oldest);
                forgotten.evicted += 1;
            }
        }
        let mut entries = VecDeque::with_capacity(PRODUCER_SEQ_WINDOW);
        entries.push_back(entry);
        let producer = Producer { entries, last_append: now, last_ms: clock_ms };
        self.producers.insert(tag.producer, producer);
        self.by_age.insert(now, tag.producer);
        debug_assert_eq!(self.producers.len(), self.by_age.len());
        forgotten
    }

    /// Forgets the producers idle longer than the expiry by the clock (the oldest appends
    /// have the oldest times: the clock never goes back); returns how many.
    fn expire(&mut self) -> u64 {
        let horizon = self.clock_ms.saturating_sub(self.expiry_ms);
        let mut expired = 0;
        while let Some((&at, &id)) = self.by_age.first_key_value() {
            if self.producers.get(&id).is_some_and(|p| p.last_ms >= horizon) {
                break;
            }
            self.by_age.remove(&at);
            self.producers.remove(&id);
            expired += 1;
        }
        expired
    }

    /// Forget the batches that reach past `offset` (all of their records are no longer
    /// stored: a failed write handed the offsets out again, or a truncation cut there), and
    /// the producers left with none.
    pub(crate) fn forget_after(&mut self, offset: u64) {
        let by_age = &mut self.by_age;
        self.producers.retain(|_, p| {
            while p.entries.back().is_some_and(|e| e.next_offset() > offset) {
                p.entries.pop_back();
            }
            if p.entries.is_empty() {
                by_age.remove(&p.last_append);
            }
            !p.entries.is_empty()
        });
        debug_assert_eq!(self.producers.len(), self.by_age.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Forgotten = Forgotten { expired: 0, evicted: 0 };
    const EVICTED: Forgotten = Forgotten { expired: 0, evicted: 1 };

    #[test]
    fn an_idle_producer_expires_by_the_batch_times() {
        let mut t = ProducerTable::new(16, 1_000);
        assert_eq!(NONE, t.record(tag(1, 0), 0, 1, 10_000));
        assert_eq!(NONE, t.record(tag(2, 0), 1, 1, 10_600));
        // A batch time behind the clock moves nothing.
        assert_eq!(NONE, t.record(tag(2, 1), 2, 1, 9_000));
        assert_eq!(NONE, t.record(tag(2, 2), 3, 1, 11_000), "idle exactly the expiry: kept");
        assert_eq!(t.check(tag(1, 1), 1), Check::Append);
        let expired = Forgotten { expired: 1, evicted: 0 };
        assert_eq!(expired, t.record(tag(2, 3), 4, 1, 11_001));
        assert_eq!(t.len(), 1);
        // It starts again wherever it says, as an unknown producer does.
        assert_eq!(t.check(tag(1, 0), 1), Check::Append, "its old batch is not known any more");
        assert_eq!(t.check(tag(1, 9), 1), Check::Append);
    }

    fn tag(producer: u64, seq: u32) -> ProducerTag {
        ProducerTag { producer: ProducerId(producer), seq }
    }

    #[test]
    fn sequence_rules() {
        let mut t = ProducerTable::new(16, u64::MAX);
        assert_eq!(t.check(tag(1, 500), 3), Check::Append, "an unknown producer starts anywhere");
        let mut next = 0u64;
        for seq in 500..520u32 {
            assert_eq!(t.check(tag(1, seq), 3), Check::Append);
            t.record(tag(1, seq), next, 3, 0);
            next += 3;
        }
        // The window holds 512..=519.
        let e = SeqEntry { seq: 515, base_offset: 45, record_count: 3 };
        assert_eq!(t.check(tag(1, 515), 3), Check::Duplicate(e));
        assert_eq!(t.check(tag(1, 515), 2), Check::Mismatch(e));
        assert_eq!(t.check(tag(1, 521), 3), Check::OutOfOrder { expected: 520 });
        assert_eq!(t.check(tag(1, 511), 3), Check::TooOld { oldest_kept: 512 });
        assert_eq!(t.check(tag(1, 520 + (1 << 31) - 1), 3), Check::OutOfOrder { expected: 520 });
        assert_eq!(t.check(tag(1, 520 + (1 << 31)), 3), Check::TooOld { oldest_kept: 512 });
        assert_eq!(t.check(tag(2, 7), 3), Check::Append);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut t = ProducerTable::new(16, u64::MAX);
        for (i, seq) in [u32::MAX - 1, u32::MAX, 0, 1].into_iter().enumerate() {
            assert_eq!(t.check(tag(1, seq), 1), Check::Append, "{seq}");
            t.record(tag(1, seq), i as u64, 1, 0);
        }
        assert!(matches!(t.check(tag(1, u32::MAX), 1), Check::Duplicate(e) if e.base_offset == 1));
        assert_eq!(t.check(tag(1, 2), 1), Check::Append);
        assert_eq!(t.check(tag(1, 5), 1), Check::OutOfOrder { expected: 2 });
        assert_eq!(t.check(tag(1, u32::MAX - 2), 1), Check::TooOld { oldest_kept: u32::MAX - 1 });
    }

    #[test]
    fn the_producer_whose_last_append_is_oldest_is_evicted() {
        let mut t = ProducerTable::new(3, u64::MAX);
        assert_eq!(NONE, t.record(tag(1, 0), 0, 1, 0));
        assert_eq!(NONE, t.record(tag(2, 0), 1, 1, 0));
        assert_eq!(NONE, t.record(tag(3, 0), 2, 1, 0));
        assert_eq!(NONE, t.record(tag(1, 1), 3, 1, 0), "a known producer takes no new room");
        assert_eq!(EVICTED, t.record(tag(4, 0), 4, 1, 0), "producer 2 appended longest ago");
        assert_eq!(t.len(), 3);
        assert_eq!(t.check(tag(2, 0), 1), Check::Append, "2 is unknown again");
        assert!(matches!(t.check(tag(1, 1), 1), Check::Duplicate(_)));
        assert!(matches!(t.check(tag(3, 0), 1), Check::Duplicate(_)));
    }

    #[test]
    fn forgetting_drops_batches_that_reach_past_the_offset() {
        let mut t = ProducerTable::new(16, u64::MAX);
        t.record(tag(1, 0), 0, 5, 0);
        t.record(tag(2, 0), 5, 5, 0);
        t.record(tag(1, 1), 10, 5, 0);
        t.forget_after(12);
        assert_eq!(t.check(tag(1, 1), 5), Check::Append, "cut inside it: forgotten");
        assert!(matches!(t.check(tag(1, 0), 5), Check::Duplicate(_)));
        assert!(matches!(t.check(tag(2, 0), 5), Check::Duplicate(_)));
        t.forget_after(5);
        assert_eq!(t.len(), 1);
        assert_eq!(t.check(tag(2, 0), 5), Check::Append);
        t.forget_after(0);
        assert_eq!(t.len(), 0);
        assert!(t.by_age.is_empty());
    }

    #[test]
    fn a_seq_that_does_not_follow_restarts_the_window() {
        let mut t = ProducerTable::new(16, u64::MAX);
        t.record(tag(1, 0), 0, 1, 0);
        t.record(tag(1, 1), 1, 1, 0);
        t.record(tag(1, 40), 2, 1, 0);
        assert_eq!(t.check(tag(1, 1), 1), Check::TooOld { oldest_kept: 40 });
        assert_eq!(t.check(tag(1, 41), 1), Check::Append);
    }
}
