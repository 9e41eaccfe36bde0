//! A replica's view of its shard log: the batches in offset order, the leader-epoch boundaries
//! derived from them, and the idempotent-producer table rebuilt from them.
//!
//! This is the state machine's in-memory copy; the driver mirrors every change to storage
//! through [`crate::DiskOp`]s. Offsets are dense from the log's origin (0, or the offset storage
//! started at when the log was recovered after retention). The log start
//! ([`ReplicaLog::start`]) is retention's: storage may have deleted what lies below it, which is
//! committed and durable, so no truncation reaches it and no follower fetches it.
//!
//! Memory stays bounded on a long log: the driver releases old payloads
//! ([`ReplicaLog::release_payloads`]) and archives old batches ([`ReplicaLog::archive`]). The
//! archived prefix is committed and durable, so no truncation reaches into it; of it the log
//! keeps only its end, its epoch boundaries (one entry per leader epoch), a byte position
//! about every [`ARCHIVE_MARK_BYTES`] (for lag in bytes) and the producer table as of its end.

use crate::error::LogError;
use crate::producers::{ProducerLimits, ProducerTable};
use crate::types::{Batch, Epoch, Offset, ProducerSeq, Seq};

/// The archive keeps a byte position about this often: [`ReplicaLog::bytes_after`] an offset
/// inside the archive counts up to this much (plus one batch) too many.
pub const ARCHIVE_MARK_BYTES: u64 = 1 << 20;

/// The batches of one shard on one replica.
#[derive(Clone, Debug, Default)]
pub struct ReplicaLog {
    /// The batches after the archive, in offset order.
    batches: Vec<Batch>,
    /// Payload bytes of the log up to and including each batch (kept when payloads are
    /// released), for lag in bytes.
    bytes_through: Vec<u64>,
    generation: u64,
    producers: ProducerTable,
    /// The first `released` of `batches` have had their payloads released
    /// ([`Self::release_payloads`]).
    released: usize,
    archive: Archive,
    /// Storage may have deleted the batches below this (retention): [`Self::start`].
    start: Offset,
}

/// What the log keeps of its archived prefix ([`ReplicaLog::archive`]); what a checkpoint
/// holds (`crate::checkpoint`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Archive {
    /// Where the log's batches begin: 0, or where storage started when the log was recovered
    /// after retention ([`ReplicaLog::starting_at`]). `batches` counts from here.
    pub(crate) origin: Offset,
    /// Batches archived.
    pub(crate) batches: u64,
    /// Offset one past the last archived record.
    pub(crate) end: Offset,
    /// Payload bytes archived.
    pub(crate) bytes: u64,
    /// The first offset of each epoch in the archive, in order.
    pub(crate) epochs: Vec<(Epoch, Offset)>,
    /// `(base, payload bytes before it, its time in ms)` of an archived batch, about every
    /// [`ARCHIVE_MARK_BYTES`], the first at the origin.
    pub(crate) marks: Vec<Mark>,
    /// The last archived batch: `(base, records, epoch)` (a checkpoint is checked against
    /// storage with it).
    pub(crate) last: Option<(Offset, u32, Epoch)>,
    /// The producer table as of `end` (a truncation rebuilds the table from it).
    pub(crate) producers: ProducerTable,
}

/// An archived batch's place: its base, the payload bytes before it, its time (ms).
pub(crate) type Mark = (Offset, u64, u64);

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
    /// An empty log whose producer table keeps to `limits` (the default log keeps to
    /// `ProducerLimits::default()`). Every replica of a shard must use the same limits.
    pub fn with_producer_limits(limits: ProducerLimits) -> ReplicaLog {
        let table = ProducerTable::new(limits);
        ReplicaLog {
            producers: table.clone(),
            archive: Archive { producers: table, ..Archive::default() },
            ..ReplicaLog::default()
        }
    }

    /// An empty log whose first batch will be at `start`: storage's first offset when retention
    /// deleted what lay below (a replica recovered from such storage appends what follows).
    /// What the log knows of epochs and producers begins there.
    pub fn starting_at(start: Offset, limits: ProducerLimits) -> ReplicaLog {
        let mut log = ReplicaLog::with_producer_limits(limits);
        log.archive.origin = start;
        log.archive.end = start;
        log.start = start;
        log
    }

    /// A log holding `batches` (as recovered from disk). Fails if they are not dense from 0 or
    /// their epochs decrease.
    pub fn from_batches(batches: Vec<Batch>) -> Result<ReplicaLog, LogError> {
        Self::from_batches_with(batches, ProducerLimits::default())
    }

    /// [`from_batches`](Self::from_batches) with a producer table keeping to `limits`.
    pub fn from_batches_with(
        batches: Vec<Batch>,
        limits: ProducerLimits,
    ) -> Result<ReplicaLog, LogError> {
        let mut log = ReplicaLog::with_producer_limits(limits);
        for batch in batches {
            log.append(batch)?;
        }
        Ok(log)
    }

    /// The checkpoint of its archived prefix (`crate::checkpoint`): a restarted replica
    /// starts from it ([`from_checkpoint`](Self::from_checkpoint)) and appends only the
    /// batches after [`archived_end`](Self::archived_end) read from storage. `None` while
    /// nothing is archived.
    pub fn checkpoint(&self) -> Option<Vec<u8>> {
        (self.archive.batches > 0).then(|| crate::checkpoint::encode(&self.archive))
    }

    /// A log whose archived prefix is the checkpoint `bytes` (made by
    /// [`checkpoint`](Self::checkpoint) with the same producer limits), holding no batch after
    /// it yet. Returns the log and the archived prefix's last batch `(base, records, epoch)`,
    /// which the caller checks against its storage before it trusts the checkpoint.
    pub fn from_checkpoint(
        bytes: &[u8],
        limits: ProducerLimits,
    ) -> Result<(ReplicaLog, (Offset, u32, Epoch)), crate::checkpoint::CheckpointError> {
        let archive = crate::checkpoint::decode(bytes, limits)?;
        let last = archive.last.ok_or(crate::checkpoint::CheckpointError::Malformed("empty"))?;
        let start = archive.origin;
        let log = ReplicaLog {
            producers: archive.producers.clone(),
            archive,
            start,
            ..ReplicaLog::default()
        };
        Ok((log, last))
    }

    /// The limits its producer table keeps to.
    pub fn producer_limits(&self) -> ProducerLimits {
        self.producers.limits()
    }

    /// Producers the table remembers.
    pub fn producers_known(&self) -> usize {
        self.producers.len()
    }

    /// About how many bytes the producer table holds (the live one and the archive's copy).
    pub fn producer_table_bytes(&self) -> u64 {
        self.producers.bytes() + self.archive.producers.bytes()
    }

    /// About how many bytes of memory the log's bookkeeping holds, payloads left out: each
    /// batch after the archive, the archive's epochs and marks, and the producer tables.
    pub fn index_bytes(&self) -> u64 {
        let per_batch = std::mem::size_of::<Batch>() + std::mem::size_of::<u64>();
        let archive = (self.archive.epochs.len() + self.archive.marks.len())
            * std::mem::size_of::<(Epoch, Offset)>();
        (self.batches.len() * per_batch + archive) as u64 + self.producer_table_bytes()
    }

    /// Producers forgotten so far: `(expired, evicted by the count bound)`.
    pub fn producers_forgotten(&self) -> (u64, u64) {
        self.producers.forgotten()
    }

    /// The ids of the producers the table remembers, sorted (for checks).
    pub fn producer_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.producers.ids().map(|p| p.0).collect();
        ids.sort_unstable();
        ids
    }

    /// The log clock: the largest batch time in the log (ms), which decides expiry.
    pub fn clock_ms(&self) -> u64 {
        self.producers.clock_ms()
    }

    /// Offset one past the last record.
    pub fn end(&self) -> Offset {
        self.batches.last().map_or(self.archive.end, Batch::end)
    }

    /// The epoch of the last batch (`Epoch::NONE` if empty).
    pub fn last_epoch(&self) -> Epoch {
        match self.batches.last() {
            Some(b) => b.epoch,
            None => self.archive.epochs.last().map_or(Epoch::NONE, |&(e, _)| e),
        }
    }

    /// Incremented by every truncation that removed something: while it is unchanged, the log
    /// only grew, so a reader may cache what it verified of a prefix.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The batches after the archived prefix ([`archived_end`](Self::archived_end)), in offset
    /// order: every batch while nothing is archived.
    pub fn batches(&self) -> &[Batch] {
        &self.batches
    }

    /// Where the archived prefix ends (the origin while nothing is archived).
    pub fn archived_end(&self) -> Offset {
        self.archive.end
    }

    /// Where its batches begin: 0, or the offset it was recovered from
    /// ([`starting_at`](Self::starting_at)); batch `i` of the log (archived ones counted) is the
    /// `i`-th from here.
    pub fn origin(&self) -> Offset {
        self.archive.origin
    }

    /// The log start: storage may have deleted the batches below it (retention). It only
    /// grows, stays a batch boundary, and never passes what the caller knows is committed and
    /// durable ([`raise_start`](Self::raise_start)).
    pub fn start(&self) -> Offset {
        self.start
    }

    /// Moves the log start up to `to`, a batch boundary the caller knows is committed and
    /// durable here (a lower `to` changes nothing). Returns the start.
    pub fn raise_start(&mut self, to: Offset) -> Offset {
        debug_assert!(to <= self.end() && self.is_boundary(to), "log start {to} not a boundary");
        self.start = self.start.max(to.min(self.end()));
        self.start
    }

    /// Whether it holds no batch (archived or not).
    pub fn is_empty(&self) -> bool {
        self.archive.batches == 0 && self.batches.is_empty()
    }

    /// Where retention would start the log: the first batch boundary from which the log holds
    /// at most `retention.bytes_max` payload bytes and whose batch is no older than
    /// `retention.age_ms_max` before `now_ms` (whichever cuts more). Inside the archive it is
    /// judged at its marks (about every [`ARCHIVE_MARK_BYTES`]), so it keeps up to that much
    /// more. Never below the log start; the caller bounds it by what is committed and durable.
    pub fn retention_point(&self, retention: crate::config::Retention, now_ms: u64) -> Offset {
        let mut point = self.start;
        let total = self.bytes_through.last().copied().unwrap_or(self.archive.bytes);
        if let Some(max) = retention.bytes_max {
            if let Some(floor) = total.checked_sub(max).filter(|&f| f > 0) {
                point = point.max(self.first_boundary(|before, _| before >= floor));
            }
        }
        if let Some(age) = retention.age_ms_max {
            if let Some(cutoff) = now_ms.checked_sub(age) {
                point = point.max(self.first_boundary(|_, time| time >= cutoff));
            }
        }
        point
    }

    /// The first batch boundary (archive marks, then batches, then the end) where `keep(payload
    /// bytes before it, its batch's time)` holds. The archive's boundaries between two marks
    /// are not known: where the first that holds follows a mark, the mark is the answer (it
    /// keeps more, never less).
    fn first_boundary(&self, keep: impl Fn(u64, u64) -> bool) -> Offset {
        // The previous candidate, and whether it was a mark.
        let mut prev: Option<(Offset, bool)> = None;
        let answer = |prev: Option<(Offset, bool)>, at: Offset| match prev {
            Some((mark, true)) => mark,
            _ => at,
        };
        for &(at, before, time) in &self.archive.marks {
            if keep(before, time) {
                return prev.map_or(at, |(mark, _)| mark);
            }
            prev = Some((at, true));
        }
        for (i, b) in self.batches.iter().enumerate() {
            let before = i.checked_sub(1).map_or(self.archive.bytes, |i| self.bytes_through[i]);
            if keep(before, b.time_ms) {
                return answer(prev, b.base);
            }
            prev = Some((b.base, false));
        }
        answer(prev, self.end())
    }

    /// How many batches are archived: [`batches`](Self::batches)`()[i]` is the log's batch
    /// number `archived_batches() + i`.
    pub fn archived_batches(&self) -> u64 {
        self.archive.batches
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
        self.producers.remember(&batch);
        let before = self.bytes_through.last().copied().unwrap_or(self.archive.bytes);
        self.bytes_through.push(before + payload_bytes);
        self.batches.push(batch);
        Ok(())
    }

    /// Removes every batch at or after `to` (which must be a batch boundary or past the end)
    /// and rebuilds the producer table from what is left. A `to` inside the archived prefix is
    /// refused and changes nothing.
    pub fn truncate(&mut self, to: Offset) -> Result<(), LogError> {
        if to < self.archive.end.max(self.start) {
            let archived = self.archive.end.max(self.start);
            return Err(LogError::TruncateBelowArchive { to, archived });
        }
        let keep = self.batches.partition_point(|b| b.base < to);
        if keep == self.batches.len() {
            return Ok(());
        }
        debug_assert!(self.batches[keep].base == to, "truncation inside a batch");
        self.batches.truncate(keep);
        self.bytes_through.truncate(keep);
        self.released = self.released.min(keep);
        self.generation += 1;
        self.producers = self.archive.producers.clone();
        for batch in &self.batches {
            self.producers.remember(batch);
        }
        Ok(())
    }

    /// How many batches end at or below `below`, and how many do not.
    pub fn split_at(&self, below: Offset) -> (usize, usize) {
        let k = self.batches.partition_point(|b| b.end() <= below);
        (k, self.batches.len() - k)
    }

    /// Archives the batches that end at or below `below`, which the caller knows are committed
    /// and durable here (no truncation can reach them, and a reader of them reads storage):
    /// their offsets, epochs, tags and payloads leave memory, but for what the archive keeps
    /// (see the module). Moving the batches that stay costs as much as moving them once, so a
    /// caller archives rarely ([`crate::Replica::archive`]). Returns the batches archived.
    pub fn archive(&mut self, below: Offset) -> usize {
        let (k, _) = self.split_at(below);
        let archive = &mut self.archive;
        for (batch, through) in self.batches.drain(..k).zip(self.bytes_through.drain(..k)) {
            let before = archive.bytes;
            let mark_due =
                archive.marks.last().is_none_or(|&(_, at, _)| before - at >= ARCHIVE_MARK_BYTES);
            if mark_due {
                archive.marks.push((batch.base, before, batch.time_ms));
            }
            if archive.epochs.last().is_none_or(|&(e, _)| e != batch.epoch) {
                archive.epochs.push((batch.epoch, batch.base));
            }
            archive.producers.remember(&batch);
            archive.last = Some((batch.base, batch.records, batch.epoch));
            archive.batches += 1;
            archive.end = batch.end();
            archive.bytes = through;
        }
        self.released = self.released.saturating_sub(k);
        k
    }

    /// The batch boundary from which the batches that end at or below `below` hold about
    /// `keep` payload bytes (at least `keep`, less than one batch more): the payloads below it
    /// can be released keeping the newest `keep` bytes. A binary search on the byte positions;
    /// never below the archived prefix's end.
    pub fn keeping_last_bytes(&self, below: Offset, keep: u64) -> Offset {
        let upto = self.batches.partition_point(|b| b.end() <= below);
        let Some(&total) = upto.checked_sub(1).and_then(|i| self.bytes_through.get(i)) else {
            return self.archive.end;
        };
        let floor = total.saturating_sub(keep);
        let i = self.bytes_through[..upto].partition_point(|&c| c <= floor);
        i.checked_sub(1).map_or(self.archive.end, |i| self.batches[i].end())
    }

    /// Payload bytes from offset `from` (a batch boundary, or the end) to the log end. Inside
    /// the archive it counts from the byte position marked at or before `from`: up to
    /// [`ARCHIVE_MARK_BYTES`] plus one batch too many.
    pub fn bytes_after(&self, from: Offset) -> u64 {
        let total = self.bytes_through.last().copied().unwrap_or(self.archive.bytes);
        if from < self.archive.end {
            let i = self.archive.marks.partition_point(|&(at, _, _)| at <= from);
            let before = i.checked_sub(1).map_or(0, |i| self.archive.marks[i].1);
            return total.saturating_sub(before);
        }
        let i = self.batches.partition_point(|b| b.base < from);
        let before = i.checked_sub(1).map_or(self.archive.bytes, |i| self.bytes_through[i]);
        total.saturating_sub(before)
    }

    /// The offset where epoch `epoch` ends in this log: the base of the first batch of a later
    /// epoch, or the log end.
    pub fn end_of_epoch(&self, epoch: Epoch) -> Offset {
        let epochs = &self.archive.epochs;
        if let Some(&(_, start)) = epochs.get(epochs.partition_point(|&(e, _)| e <= epoch)) {
            return start;
        }
        let first_later = self.batches.partition_point(|b| b.epoch <= epoch);
        self.batches.get(first_later).map_or(self.end(), |b| b.base)
    }

    /// The largest epoch `<= epoch` that has batches here, if any.
    pub fn largest_epoch_at_most(&self, epoch: Epoch) -> Option<Epoch> {
        let first_later = self.batches.partition_point(|b| b.epoch <= epoch);
        if let Some(i) = first_later.checked_sub(1) {
            return Some(self.batches[i].epoch);
        }
        let epochs = &self.archive.epochs;
        let i = epochs.partition_point(|&(e, _)| e <= epoch);
        i.checked_sub(1).map(|i| epochs[i].0)
    }

    /// The leader's side of the epoch handshake: the largest epoch `<= asked` this log has (the
    /// leader's `current` epoch counts even before its first batch) and the offset where that
    /// epoch ends here; `(None, start)` if there is none: the log start (0 without retention),
    /// below which the asker's log is the committed history (no replica's log ends below a
    /// leader's start, docs/replication.md "Retention").
    pub fn epoch_answer(&self, asked: Epoch, current: Epoch) -> (Option<Epoch>, Offset) {
        if asked >= current {
            return (Some(current), self.end());
        }
        let answer = self.largest_epoch_at_most(asked);
        (answer, answer.map_or(self.start, |e| self.end_of_epoch(e)))
    }

    /// The follower's side: where to truncate given the leader's answer `(answer_epoch, end)`
    /// about this log's last epoch (no further than its end). After truncating there, the
    /// handshake is done if the log's last epoch is `answer_epoch`, or if the leader had no
    /// such epoch and the log now ends at or below `end` (the leader's start: all of it is
    /// committed); otherwise ask again about the new last epoch.
    pub fn truncation_point(&self, answer_epoch: Option<Epoch>, end: Offset) -> Offset {
        let to = answer_epoch.map_or(end, |a| end.min(self.end_of_epoch(a)));
        to.min(self.end())
    }

    /// Batches from offset `from` (a batch boundary) on, at least one and at most `bytes_max`
    /// bytes otherwise. None from inside the archive (`from` below
    /// [`archived_end`](Self::archived_end)): those are read from storage.
    pub fn read_from(&self, from: Offset, bytes_max: u64) -> Vec<Batch> {
        if from < self.archive.end {
            return Vec::new();
        }
        let start = self.batches.partition_point(|b| b.base < from);
        let mut bytes = 0;
        let mut out = Vec::new();
        for (i, batch) in self.batches.iter().enumerate().skip(start) {
            // A released payload (empty here) counts as what it was: the driver reads it back
            // from storage before it sends the reply.
            bytes += self.payload_bytes(i) + crate::config::BATCH_HEADER_BYTES;
            if !out.is_empty() && bytes > bytes_max {
                break;
            }
            out.push(batch.clone());
        }
        out
    }

    /// Payload bytes of batch `i` after the archive, released or not.
    fn payload_bytes(&self, i: usize) -> u64 {
        let before = i.checked_sub(1).map_or(self.archive.bytes, |j| self.bytes_through[j]);
        self.bytes_through[i] - before
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

    /// Offsets below this have released payloads ([`Self::release_payloads`]) or are archived.
    pub fn released_end(&self) -> Offset {
        self.released.checked_sub(1).map_or(self.archive.end, |i| self.batches[i].end())
    }

    /// Whether `offset` is a batch boundary of this log (or its end). Inside the archive, whose
    /// batch boundaries are not kept, every offset counts (a reader of storage checks it).
    pub fn is_boundary(&self, offset: Offset) -> bool {
        offset <= self.archive.end
            || offset == self.end()
            || self.batches.binary_search_by_key(&offset, |b| b.base).is_ok()
    }

    /// Panics (debug builds) if its bookkeeping disagrees with its batches: one byte count per
    /// batch, dense offsets from the archive's end, epochs never decreasing, released payloads
    /// a prefix, the start a boundary inside the log, the producer tables indexed.
    pub fn debug_assert_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert_eq!(self.bytes_through.len(), self.batches.len(), "a byte count per batch");
        assert!(self.released <= self.batches.len(), "released past the batches");
        let mut end = self.archive.end;
        let mut epoch = self.archive.epochs.last().map_or(Epoch::NONE, |&(e, _)| e);
        for b in &self.batches {
            assert_eq!(
                b.base,
                end,
                "offsets dense after the archive ({} batches)",
                self.batches.len()
            );
            assert!(
                b.records > 0 && b.epoch >= epoch,
                "an empty batch or a lower epoch at {}",
                b.base
            );
            (end, epoch) = (b.end(), b.epoch);
        }
        assert!(self.bytes_through.windows(2).all(|w| w[0] <= w[1]), "byte counts decrease");
        assert!(
            self.archive.origin <= self.start && self.start <= end && self.is_boundary(self.start),
            "log start {} outside the log ({}..{end}) or inside a batch",
            self.start,
            self.archive.origin
        );
        assert!(self.archive.epochs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert!(self.archive.last.is_none_or(|(base, records, _)| Offset(
            base.0 + u64::from(records)
        ) == self.archive.end));
        self.producers.debug_assert_invariants();
        self.archive.producers.debug_assert_invariants();
    }

    /// What the idempotence table says about `tag`. `oldest_pending`: the producer says it
    /// has no earlier batch unresolved (every batch it sent before this one was acked or
    /// failed).
    pub fn check_seq(&self, tag: ProducerSeq, oldest_pending: bool) -> SeqCheck {
        let Some(recent) = self.producers.recent(tag.producer) else {
            // An unknown producer starts at 0, or where it says nothing earlier is pending (it
            // was forgotten: expired or evicted). A later sequence number first otherwise
            // means its earlier batches are still on their way (retried out of order after a
            // failover): refused until they arrive, so the producer's batches are stored in
            // order.
            return if tag.seq == Seq(0) || oldest_pending {
                SeqCheck::New
            } else {
                SeqCheck::OutOfOrder
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Retention;
    use crate::types::ProducerId;
    use bytes::Bytes;

    fn batch(epoch: u64, base: u64, records: u32, tag: Option<(u64, u32)>) -> Batch {
        Batch {
            epoch: Epoch(epoch),
            base: Offset(base),
            records,
            producer: tag.map(|(p, s)| ProducerSeq { producer: ProducerId(p), seq: Seq(s) }),
            time_ms: 0,
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
        log.truncate(Offset(2)).unwrap();
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
        assert_eq!(
            log.check_seq(tag(1), false),
            SeqCheck::Duplicate { base: Offset(2), records: 1 }
        );
        assert_eq!(log.check_seq(tag(2), false), SeqCheck::New);
        assert_eq!(log.check_seq(tag(4), false), SeqCheck::OutOfOrder);
        log.truncate(Offset(2)).unwrap();
        assert_eq!(log.check_seq(tag(1), false), SeqCheck::New);
        assert_eq!(
            log.check_seq(tag(0), false),
            SeqCheck::Duplicate { base: Offset(0), records: 2 }
        );
        log.truncate(Offset(0)).unwrap();
        assert_eq!(
            log.check_seq(tag(1), false),
            SeqCheck::OutOfOrder,
            "an unknown producer starts at 0"
        );
        assert_eq!(log.check_seq(tag(0), false), SeqCheck::New);
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
        log.truncate(Offset(2)).unwrap();
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
    fn an_archived_prefix_answers_as_the_whole_log_did() {
        // Epochs 1, 1, 2, 2, 4, 4 at offsets 0, 2, 3, 7, 8, 9; producer 7 tags every batch.
        let batches = vec![
            batch(1, 0, 2, Some((7, 0))),
            batch(1, 2, 1, Some((7, 1))),
            batch(2, 3, 4, Some((7, 2))),
            batch(2, 7, 1, Some((7, 3))),
            batch(4, 8, 1, Some((7, 4))),
            batch(4, 9, 1, Some((7, 5))),
        ];
        let whole = ReplicaLog::from_batches(batches.clone()).unwrap();
        for cut in 0..=batches.len() {
            let mut log = ReplicaLog::from_batches(batches.clone()).unwrap();
            let below = cut.checked_sub(1).map_or(Offset(0), |i| batches[i].end());
            assert_eq!(log.archive(below), cut);
            assert_eq!((log.archived_batches(), log.archived_end()), (cut as u64, below));
            assert_eq!(log.batches(), &batches[cut..]);
            assert_eq!((log.end(), log.last_epoch()), (whole.end(), whole.last_epoch()));
            for e in 0..6 {
                let e = Epoch(e);
                assert_eq!(log.end_of_epoch(e), whole.end_of_epoch(e), "cut {cut}, {e}");
                assert_eq!(log.largest_epoch_at_most(e), whole.largest_epoch_at_most(e));
                assert_eq!(log.epoch_answer(e, Epoch(4)), whole.epoch_answer(e, Epoch(4)));
            }
            for seq in 0..8 {
                let tag = ProducerSeq { producer: ProducerId(7), seq: Seq(seq) };
                assert_eq!(
                    log.check_seq(tag, false),
                    whole.check_seq(tag, false),
                    "cut {cut}, seq {seq}"
                );
            }
            for b in &batches[cut..] {
                assert_eq!(log.bytes_after(b.base), whole.bytes_after(b.base));
            }
            assert_eq!(log.keeping_last_bytes(Offset(10), 1), Offset(9).max(below));
            assert!(log.read_from(Offset(0), 1 << 20).is_empty() || cut == 0, "from the archive");
        }
    }

    #[test]
    fn truncation_stops_at_the_archive_and_keeps_its_producers() {
        let mut log = ReplicaLog::from_batches(vec![
            batch(1, 0, 2, Some((7, 0))),
            batch(1, 2, 1, Some((8, 0))),
            batch(2, 3, 4, Some((7, 1))),
            batch(2, 7, 1, None),
        ])
        .unwrap();
        log.archive(Offset(3));
        let refused = log.truncate(Offset(2));
        assert_eq!(
            refused,
            Err(LogError::TruncateBelowArchive { to: Offset(2), archived: Offset(3) })
        );
        assert_eq!(log.end(), Offset(8), "a refused truncation changes nothing");
        log.truncate(Offset(3)).unwrap();
        assert_eq!((log.end(), log.last_epoch()), (Offset(3), Epoch(1)));
        let tag = |p, s| ProducerSeq { producer: ProducerId(p), seq: Seq(s) };
        // The archived producers are still known after the table was rebuilt.
        assert_eq!(
            log.check_seq(tag(7, 0), false),
            SeqCheck::Duplicate { base: Offset(0), records: 2 }
        );
        assert_eq!(log.check_seq(tag(7, 1), false), SeqCheck::New);
        assert_eq!(log.check_seq(tag(8, 1), false), SeqCheck::New);
        assert_eq!(log.end_of_epoch(Epoch(1)), Offset(3));
        log.append(batch(3, 3, 1, Some((7, 1)))).unwrap();
        assert_eq!(log.end_of_epoch(Epoch(2)), Offset(3));
        assert_eq!(log.largest_epoch_at_most(Epoch(2)), Some(Epoch(1)));
    }

    #[test]
    fn lag_inside_the_archive_is_counted_from_a_mark() {
        // 3,000 batches of 1 KiB: marks about every 1 MiB.
        let payload = Bytes::from(vec![0u8; 1024]);
        let mut log = ReplicaLog::default();
        for i in 0..3000u64 {
            let b = Batch { payload: payload.clone(), ..batch(1, i, 1, None) };
            log.append(b).unwrap();
        }
        let exact: Vec<u64> = (0..3000).map(|i| log.bytes_after(Offset(i))).collect();
        log.archive(Offset(2900));
        assert_eq!(log.batches().len(), 100, "a bounded number stays in memory");
        for i in 0..3000u64 {
            let got = log.bytes_after(Offset(i));
            let want = exact[i as usize];
            assert!(
                got >= want && got <= want + ARCHIVE_MARK_BYTES + 1024,
                "at {i}: {got} vs {want}"
            );
        }
        assert_eq!(log.bytes_after(Offset(2900)), 100 * 1024);
        assert_eq!(log.bytes_after(Offset(0)), 3000 * 1024);
    }

    fn timed(epoch: u64, base: u64, records: u32, time_ms: u64) -> Batch {
        Batch { time_ms, ..batch(epoch, base, records, None) }
    }

    #[test]
    fn retention_starts_the_log_by_size_and_by_age() {
        // Ten one-byte batches of 2 records, at times 100, 200, ..., 1000.
        let mut log = ReplicaLog::default();
        for i in 0..10u64 {
            log.append(timed(1, 2 * i, 2, 100 * (i + 1))).unwrap();
        }
        let by_size = |n| Retention { bytes_max: Some(n), age_ms_max: None };
        let by_age = |ms| Retention { bytes_max: None, age_ms_max: Some(ms) };
        assert_eq!(log.retention_point(Retention::default(), 5_000), Offset(0));
        assert_eq!(log.retention_point(by_size(4), 0), Offset(12), "the newest 4 bytes stay");
        assert_eq!(log.retention_point(by_size(10), 0), Offset(0), "all of it fits");
        // At 1050, an age of 500 keeps the batches of time 550 and later.
        assert_eq!(log.retention_point(by_age(500), 1_050), Offset(10));
        let both = Retention { bytes_max: Some(8), age_ms_max: Some(200) };
        assert_eq!(log.retention_point(both, 1_050), Offset(16), "whichever cuts more");
        // Archived, it is judged at the marks (every batch is one here: marks every MiB
        // means only the first), so it keeps more, never less.
        let mut archived = log.clone();
        archived.archive(Offset(20));
        assert!(archived.retention_point(by_size(4), 0) <= Offset(12));
        // The start only grows, and a truncation below it is refused.
        assert_eq!(log.raise_start(Offset(12)), Offset(12));
        assert_eq!(log.raise_start(Offset(4)), Offset(12));
        assert_eq!(log.retention_point(by_size(100), 0), Offset(12), "never below the start");
        assert!(log.truncate(Offset(10)).is_err());
        assert!(log.truncate(Offset(14)).is_ok());
        log.debug_assert_invariants();
    }

    #[test]
    fn a_log_recovered_past_retention_answers_from_its_start() {
        // Storage kept the batches from offset 10 on (epochs 3 and 5).
        let limits = ProducerLimits::default();
        let mut log = ReplicaLog::starting_at(Offset(10), limits);
        assert!(log.is_empty());
        assert_eq!((log.end(), log.start(), log.origin()), (Offset(10), Offset(10), Offset(10)));
        log.append(batch(3, 10, 2, None)).unwrap();
        log.append(batch(5, 12, 1, None)).unwrap();
        assert!(log.append(batch(5, 2, 1, None)).is_err(), "dense from the origin");
        // An epoch it has: as before. One older than its first: the asker's log is the
        // committed history below the start, so it truncates to the start at most.
        assert_eq!(log.epoch_answer(Epoch(4), Epoch(6)), (Some(Epoch(3)), Offset(12)));
        assert_eq!(log.epoch_answer(Epoch(2), Epoch(6)), (None, Offset(10)));
        let follower =
            ReplicaLog::from_batches(vec![batch(2, 0, 10, None), batch(2, 10, 4, None)]).unwrap();
        assert_eq!(follower.truncation_point(None, Offset(10)), Offset(10));
        let short = ReplicaLog::from_batches(vec![batch(2, 0, 10, None)]).unwrap();
        assert_eq!(short.truncation_point(None, Offset(10)), Offset(10), "no further than its end");
        // A checkpoint of it keeps its origin.
        log.archive(Offset(12));
        let bytes = log.checkpoint().expect("archived");
        let (back, last) = ReplicaLog::from_checkpoint(&bytes, limits).unwrap();
        assert_eq!(
            (back.origin(), back.start(), back.archived_end()),
            (Offset(10), Offset(10), Offset(12))
        );
        assert_eq!(last, (Offset(10), 2, Epoch(3)));
        assert_eq!(back.archived_batches(), 1);
    }

    #[test]
    fn a_read_counts_released_payloads_as_they_were() {
        // 100 batches of 1 KiB, their payloads released: a read of 10 KiB takes 10, not all.
        let payload = Bytes::from(vec![0u8; 1024]);
        let mut log = ReplicaLog::default();
        for i in 0..100u64 {
            log.append(Batch { payload: payload.clone(), ..batch(1, i, 1, None) }).unwrap();
        }
        log.release_payloads(Offset(100));
        let per = 1024 + crate::config::BATCH_HEADER_BYTES;
        let read = log.read_from(Offset(0), 10 * per);
        assert_eq!(read.len(), 10);
        assert!(read.iter().all(|b| b.payload.is_empty()), "released");
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
