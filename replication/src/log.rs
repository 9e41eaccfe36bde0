//! A replica's view of its shard log: the batches in offset order, the leader-epoch boundaries
//! derived from them, and the idempotent-producer table rebuilt from them.
//!
//! This is the state machine's in-memory copy; the driver mirrors every change to storage
//! through [`crate::DiskOp`]s. Offsets are dense from 0 (no retention yet).

use std::collections::{HashMap, VecDeque};

use crate::config::PRODUCER_SEQ_WINDOW;
use crate::error::LogError;
use crate::types::{Batch, Epoch, Offset, ProducerId, ProducerSeq, Seq};

/// The batches of one shard on one replica.
#[derive(Clone, Debug, Default)]
pub struct ReplicaLog {
    batches: Vec<Batch>,
    /// Payload bytes of the log up to and including each batch (kept when payloads are
    /// released), for lag in bytes.
    bytes_through: Vec<u64>,
    generation: u64,
    producers: HashMap<ProducerId, VecDeque<(Seq, Offset, u32)>>,
    /// The first `released` batches have had their payloads released ([`Self::release_payloads`]).
    released: usize,
}

/// What the idempotence table says about an incoming producer batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqCheck {
    /// Not seen: append it.
    New,
    /// A retry of a batch in the log at `base` with `records` records.
    Duplicate {
        /// Offset of the original's first record.
        base: Offset,
        /// The original's record count.
        records: u32,
    },
    /// Older than the remembered window: cannot tell, refuse.
    TooOld,
    /// A gap after the producer's last sequence.
    OutOfOrder,
}

impl ReplicaLog {
    /// A log holding `batches` (as recovered from disk). Fails if they are not dense from 0 or
    /// their epochs decrease.
    pub fn from_batches(batches: Vec<Batch>) -> Result<ReplicaLog, LogError> {
        let mut log = ReplicaLog::default();
        for batch in batches {
            log.append(batch)?;
        }
        Ok(log)
    }

    /// Offset one past the last record.
    pub fn end(&self) -> Offset {
        self.batches.last().map_or(Offset(0), Batch::end)
    }

    /// The epoch of the last batch (`Epoch::NONE` if empty).
    pub fn last_epoch(&self) -> Epoch {
        self.batches.last().map_or(Epoch::NONE, |b| b.epoch)
    }

    /// Incremented by every truncation that removed something: while it is unchanged, the log
    /// only grew, so a reader may cache what it verified of a prefix.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every batch, in offset order.
    pub fn batches(&self) -> &[Batch] {
        &self.batches
    }

    /// Appends `batch`, which must start at [`end`](Self::end) and not lower the epoch.
    pub fn append(&mut self, batch: Batch) -> Result<(), LogError> {
        let bytes = batch.payload.len() as u64;
        self.append_sized(batch, bytes)
    }

    /// [`append`](Self::append) for a batch whose payload of `payload_bytes` is not in memory
    /// (its payload is empty: released, as by [`release_payloads`](Self::release_payloads);
    /// a driver recovering a long log from its storage keeps only the newest payloads).
    pub fn append_sized(&mut self, batch: Batch, payload_bytes: u64) -> Result<(), LogError> {
        if batch.base != self.end() {
            return Err(LogError::NotContiguous { expected: self.end(), got: batch.base });
        }
        if batch.records == 0 {
            return Err(LogError::EmptyBatch { base: batch.base });
        }
        if batch.epoch < self.last_epoch() {
            return Err(LogError::EpochDecreased { last: self.last_epoch(), got: batch.epoch });
        }
        remember(&mut self.producers, &batch);
        let before = self.bytes_through.last().copied().unwrap_or(0);
        self.bytes_through.push(before + payload_bytes);
        self.batches.push(batch);
        Ok(())
    }

    /// Removes every batch at or after `to` (which must be a batch boundary or past the end)
    /// and rebuilds the producer table from what is left.
    pub fn truncate(&mut self, to: Offset) {
        let keep = self.batches.partition_point(|b| b.base < to);
        if keep == self.batches.len() {
            return;
        }
        debug_assert!(self.batches[keep].base == to, "truncation inside a batch");
        self.batches.truncate(keep);
        self.bytes_through.truncate(keep);
        self.released = self.released.min(keep);
        self.generation += 1;
        self.producers.clear();
        for batch in &self.batches {
            remember(&mut self.producers, batch);
        }
    }

    /// The batch boundary from which the batches that end at or below `below` hold about
    /// `keep` payload bytes (at least `keep`, less than one batch more): the payloads below it
    /// can be released keeping the newest `keep` bytes. A binary search on the byte positions.
    pub fn keeping_last_bytes(&self, below: Offset, keep: u64) -> Offset {
        let upto = self.batches.partition_point(|b| b.end() <= below);
        let Some(&total) = upto.checked_sub(1).and_then(|i| self.bytes_through.get(i)) else {
            return Offset(0);
        };
        let floor = total.saturating_sub(keep);
        let i = self.bytes_through[..upto].partition_point(|&c| c <= floor);
        i.checked_sub(1).map_or(Offset(0), |i| self.batches[i].end())
    }

    /// Payload bytes from offset `from` (a batch boundary, or the end) to the log end.
    pub fn bytes_after(&self, from: Offset) -> u64 {
        let total = self.bytes_through.last().copied().unwrap_or(0);
        let i = self.batches.partition_point(|b| b.base < from);
        let before = i.checked_sub(1).map_or(0, |i| self.bytes_through[i]);
        total.saturating_sub(before)
    }

    /// The offset where epoch `epoch` ends in this log: the base of the first batch of a later
    /// epoch, or the log end.
    pub fn end_of_epoch(&self, epoch: Epoch) -> Offset {
        let first_later = self.batches.partition_point(|b| b.epoch <= epoch);
        self.batches.get(first_later).map_or(self.end(), |b| b.base)
    }

    /// The largest epoch `<= epoch` that has batches here, if any.
    pub fn largest_epoch_at_most(&self, epoch: Epoch) -> Option<Epoch> {
        let first_later = self.batches.partition_point(|b| b.epoch <= epoch);
        first_later.checked_sub(1).map(|i| self.batches[i].epoch)
    }

    /// The leader's side of the epoch handshake: the largest epoch `<= asked` this log has (the
    /// leader's `current` epoch counts even before its first batch) and the offset where that
    /// epoch ends here; `(None, 0)` if there is none.
    pub fn epoch_answer(&self, asked: Epoch, current: Epoch) -> (Option<Epoch>, Offset) {
        if asked >= current {
            return (Some(current), self.end());
        }
        let answer = self.largest_epoch_at_most(asked);
        (answer, answer.map_or(Offset(0), |e| self.end_of_epoch(e)))
    }

    /// The follower's side: where to truncate given the leader's answer `(answer_epoch, end)`
    /// about this log's last epoch. After truncating there, the handshake is done if the log is
    /// empty or its last epoch is `answer_epoch`; otherwise ask again about the new last epoch.
    pub fn truncation_point(&self, answer_epoch: Option<Epoch>, end: Offset) -> Offset {
        answer_epoch.map_or(Offset(0), |a| end.min(self.end_of_epoch(a)))
    }

    /// Batches from offset `from` (a batch boundary) on, at least one and at most `bytes_max`
    /// bytes otherwise.
    pub fn read_from(&self, from: Offset, bytes_max: u64) -> Vec<Batch> {
        let start = self.batches.partition_point(|b| b.base < from);
        let mut bytes = 0;
        let mut out = Vec::new();
        for batch in &self.batches[start..] {
            bytes += batch.size_bytes();
            if !out.is_empty() && bytes > bytes_max {
                break;
            }
            out.push(batch.clone());
        }
        out
    }

    /// Drops the payloads of the batches that end at or below `below` (keeping their offsets,
    /// epochs and producer tags), so a long log does not keep every payload in memory: a
    /// released batch's payload is empty, and a driver that sends it (a `FetchReply`) reads it
    /// back from its storage first. Returns the payload bytes released.
    pub fn release_payloads(&mut self, below: Offset) -> u64 {
        let mut freed = 0;
        while let Some(b) = self.batches.get_mut(self.released) {
            if b.end() > below {
                break;
            }
            freed += b.payload.len() as u64;
            b.payload = bytes::Bytes::new();
            self.released += 1;
        }
        freed
    }

    /// Offsets below this have released payloads ([`Self::release_payloads`]).
    pub fn released_end(&self) -> Offset {
        self.released.checked_sub(1).map_or(Offset(0), |i| self.batches[i].end())
    }

    /// Whether `offset` is a batch boundary of this log (or its end).
    pub fn is_boundary(&self, offset: Offset) -> bool {
        offset == self.end() || self.batches.binary_search_by_key(&offset, |b| b.base).is_ok()
    }

    /// What the idempotence table says about `tag`.
    pub fn check_seq(&self, tag: ProducerSeq) -> SeqCheck {
        let Some(recent) = self.producers.get(&tag.producer) else {
            // An unknown producer starts at 0. A later sequence number first means its earlier
            // batches are still on their way (retried out of order after a failover): refused
            // until they arrive, so the producer's batches are stored in order.
            return if tag.seq == Seq(0) { SeqCheck::New } else { SeqCheck::OutOfOrder };
        };
        if let Some(&(_, base, records)) = recent.iter().find(|(seq, _, _)| *seq == tag.seq) {
            return SeqCheck::Duplicate { base, records };
        }
        let (last, _, _) = *recent.back().expect("a producer entry is never empty");
        if tag.seq.0 == last.0.wrapping_add(1) {
            SeqCheck::New
        } else if tag.seq < last {
            SeqCheck::TooOld
        } else {
            SeqCheck::OutOfOrder
        }
    }
}

/// Records `batch`'s producer tag (if any) in `producers`, keeping the last
/// [`PRODUCER_SEQ_WINDOW`] sequence numbers per producer.
fn remember(producers: &mut HashMap<ProducerId, VecDeque<(Seq, Offset, u32)>>, batch: &Batch) {
    if let Some(tag) = batch.producer {
        let recent = producers.entry(tag.producer).or_default();
        recent.push_back((tag.seq, batch.base, batch.records));
        if recent.len() > PRODUCER_SEQ_WINDOW {
            recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn batch(epoch: u64, base: u64, records: u32, tag: Option<(u64, u32)>) -> Batch {
        Batch {
            epoch: Epoch(epoch),
            base: Offset(base),
            records,
            producer: tag.map(|(p, s)| ProducerSeq { producer: ProducerId(p), seq: Seq(s) }),
            payload: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn epochs_and_truncation() {
        let mut log = ReplicaLog::from_batches(vec![
            batch(1, 0, 2, None),
            batch(1, 2, 3, None),
            batch(3, 5, 1, None),
        ])
        .unwrap();
        assert_eq!(log.end(), Offset(6));
        assert_eq!(log.end_of_epoch(Epoch(1)), Offset(5));
        assert_eq!(log.end_of_epoch(Epoch(2)), Offset(5));
        assert_eq!(log.end_of_epoch(Epoch(3)), Offset(6));
        assert_eq!(log.largest_epoch_at_most(Epoch(2)), Some(Epoch(1)));
        assert_eq!(log.largest_epoch_at_most(Epoch(0)), None);
        log.truncate(Offset(2));
        assert_eq!(log.end(), Offset(2));
        assert_eq!(log.last_epoch(), Epoch(1));
        assert!(log.append(batch(1, 3, 1, None)).is_err());
        assert!(log.append(batch(0, 2, 1, None)).is_err());
    }

    #[test]
    fn producer_table_follows_truncation() {
        let mut log = ReplicaLog::default();
        log.append(batch(1, 0, 2, Some((7, 0)))).unwrap();
        log.append(batch(1, 2, 1, Some((7, 1)))).unwrap();
        let tag = |s| ProducerSeq { producer: ProducerId(7), seq: Seq(s) };
        assert_eq!(log.check_seq(tag(1)), SeqCheck::Duplicate { base: Offset(2), records: 1 });
        assert_eq!(log.check_seq(tag(2)), SeqCheck::New);
        assert_eq!(log.check_seq(tag(4)), SeqCheck::OutOfOrder);
        log.truncate(Offset(2));
        assert_eq!(log.check_seq(tag(1)), SeqCheck::New);
        assert_eq!(log.check_seq(tag(0)), SeqCheck::Duplicate { base: Offset(0), records: 2 });
        log.truncate(Offset(0));
        assert_eq!(log.check_seq(tag(1)), SeqCheck::OutOfOrder, "an unknown producer starts at 0");
        assert_eq!(log.check_seq(tag(0)), SeqCheck::New);
    }

    #[test]
    fn lag_in_bytes_survives_released_payloads_and_truncation() {
        let mut log = ReplicaLog::from_batches(vec![
            batch(1, 0, 2, None),
            batch(1, 2, 1, None),
            batch(2, 3, 4, None),
        ])
        .unwrap();
        // Each test payload is one byte.
        assert_eq!((log.bytes_after(Offset(0)), log.bytes_after(Offset(3))), (3, 1));
        assert_eq!(log.bytes_after(Offset(7)), 0);
        log.release_payloads(Offset(3));
        assert_eq!(log.bytes_after(Offset(0)), 3, "released payloads still count");
        log.truncate(Offset(2));
        assert_eq!((log.bytes_after(Offset(0)), log.bytes_after(Offset(2))), (1, 0));
        log.append(batch(3, 2, 1, None)).unwrap();
        assert_eq!(log.bytes_after(Offset(0)), 2);
    }

    #[test]
    fn keeping_the_newest_bytes() {
        // Five one-byte batches at 0, 2, 3, 7, 8.
        let log = ReplicaLog::from_batches(vec![
            batch(1, 0, 2, None),
            batch(1, 2, 1, None),
            batch(1, 3, 4, None),
            batch(1, 7, 1, None),
            batch(1, 8, 1, None),
        ])
        .unwrap();
        assert_eq!(log.keeping_last_bytes(Offset(9), 2), Offset(7), "the last two batches kept");
        assert_eq!(log.keeping_last_bytes(Offset(7), 2), Offset(2), "below offset 7 only");
        assert_eq!(log.keeping_last_bytes(Offset(9), 10), Offset(0), "all of it fits");
        assert_eq!(log.keeping_last_bytes(Offset(9), 0), Offset(9), "nothing kept");
        assert_eq!(log.keeping_last_bytes(Offset(0), 1), Offset(0));
    }

    #[test]
    fn read_is_bounded_but_never_empty() {
        let log =
            ReplicaLog::from_batches(vec![batch(1, 0, 1, None), batch(1, 1, 1, None)]).unwrap();
        assert_eq!(log.read_from(Offset(0), 1).len(), 1);
        assert_eq!(log.read_from(Offset(0), 1 << 20).len(), 2);
        assert!(log.read_from(Offset(2), 1 << 20).is_empty());
    }
}
