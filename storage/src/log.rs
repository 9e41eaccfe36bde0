//! `StreamLog`: one physical log per (stream, core) holding all of that core's shards of
//! the stream, with a per-shard index. Appends, reads and tail notification; the write
//! path (writer and group commit) is in `commit`.
//!
//! Call order: [`StreamLog::open`] (recovers) -> any number of concurrent
//! [`StreamLog::append`] (or [`StreamLog::append_tagged`], idempotent per producer, or
//! [`StreamLog::append_with`], which also stamps a leader epoch and places a follower's copy),
//! [`StreamLog::read`] (or [`StreamLog::read_with`], in `read`), [`StreamLog::wait_for`] and the epoch queries
//! ([`StreamLog::last_epoch`], [`StreamLog::largest_epoch_at_most`],
//! [`StreamLog::end_of_epoch`]) from tasks of the
//! same executor -> optionally [`StreamLog::close`]. Two background tasks run per log: the
//! writer (turns queued batches into aligned writes, up to 8 MiB in flight, published in
//! log order) and the flusher (group commit: one fdatasync covers every write published
//! before it was issued, and the next starts as soon as the previous ends while durable
//! appends wait).

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::rc::Rc;

use felix_proto::{AckMode, Offset, ProducerTag, Record, ShardId};

use crate::config::{RetentionConfig, StorageConfig};
use crate::epochs::EpochIndex;
use crate::error::{Result, StorageError};
use crate::format::{batch_encoded_len, SEGMENT_HEADER_BYTES, SHARDS_PER_LOG_MAX};
use crate::index::Lookup;
use crate::io;
use crate::producers::Check;
use crate::state::{Inner, Pending, ShardState, State};
use crate::stats::StorageStats;
use crate::sync::{completion, Completion, Signal};

/// Two batches of one shard closer than this are read with one I/O.
pub const READ_GAP_BYTES_MAX: u64 = 64 << 10;

/// What a successful append returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Offset of the batch's first record.
    pub base_offset: Offset,
    /// Records appended.
    pub record_count: u32,
    /// The batch was a retry of a stored tagged batch: nothing was appended, and the
    /// offsets are the original's.
    pub duplicate: bool,
}

/// What an append says about its batch besides the records ([`StreamLog::append_with`]).
/// The default is a plain batch: no tag, no epoch, wherever the shard's next offset is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchMeta {
    /// The producer tag of an idempotent batch: stored after the header, and checked against
    /// the shard's producer table (see [`StreamLog::append_tagged`]) unless `expected_base`
    /// is set.
    pub producer: Option<ProducerTag>,
    /// The leader epoch that appended the batch (replication): stored after the header (and
    /// the tag), read back in [`StoredBatch::epoch`], and recorded in the shard's epoch index.
    /// Never lower than the shard's last epoch (`EpochRegression`).
    pub epoch: Option<u64>,
    /// A follower's copy of a leader's batch: the offset its first record must get, i.e. the
    /// shard's next offset (queued appends included), else `OffsetMismatch` and nothing is
    /// stored. A follower stores exactly the leader's batches: their producer tags are
    /// recorded in the table but not checked (a second copy the leader stored, e.g. after
    /// evicting the producer, is stored again).
    pub expected_base: Option<Offset>,
}

/// One batch returned by a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBatch {
    /// The shard.
    pub shard: ShardId,
    /// Offset of the first record.
    pub base_offset: Offset,
    /// Timestamp of the first record (ms since the Unix epoch).
    pub first_timestamp_ms: u64,
    /// Timestamp of the last record.
    pub last_timestamp_ms: u64,
    /// The producer tag of an idempotent batch.
    pub producer: Option<ProducerTag>,
    /// The leader epoch the batch was stamped with ([`BatchMeta::epoch`]).
    pub epoch: Option<u64>,
    /// The records; keys and values are slices of one read buffer.
    pub records: Vec<Record>,
}

/// What retention did in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Segments deleted.
    pub segments_deleted: u64,
    /// Bytes deleted.
    pub bytes_deleted: u64,
}

/// A handle to one stream log; clones share the log.
#[derive(Clone)]
pub struct StreamLog {
    pub(crate) inner: Rc<Inner>,
}

impl StreamLog {
    /// Open (or create) the log in `dir`, recovering it, for a core owning `shards`.
    ///
    /// Must run inside a glommio executor; spawns the writer and flusher tasks there.
    pub async fn open(
        name: &str,
        dir: &Path,
        shards: &[ShardId],
        config: &StorageConfig,
        retention: RetentionConfig,
    ) -> Result<(StreamLog, crate::recovery::RecoveryReport)> {
        let cache = crate::cache::ReadCache::shared(config.read_cache_bytes);
        Self::open_with_cache(name, dir, shards, config, retention, cache).await
    }

    /// [`StreamLog::open`] sharing a core's read cache.
    pub(crate) async fn open_with_cache(
        name: &str,
        dir: &Path,
        shards: &[ShardId],
        config: &StorageConfig,
        retention: RetentionConfig,
        cache: crate::cache::SharedCache,
    ) -> Result<(StreamLog, crate::recovery::RecoveryReport)> {
        config.validate()?;
        if shards.len() > SHARDS_PER_LOG_MAX {
            return Err(StorageError::TooManyShards {
                count: shards.len(),
                limit: SHARDS_PER_LOG_MAX,
            });
        }
        // glommio's directory calls fail (EBADF) on relative paths: make the path absolute.
        let dir = &std::path::absolute(dir)
            .map_err(|e| StorageError::io("resolving path", dir.to_owned(), e))?;
        let rec = crate::recovery::recover(dir, config, shards).await?;
        let mut stats = StorageStats::new();
        stats.torn_bytes_dropped = rec.report.torn_bytes_dropped;
        stats.repaired_bytes_dropped = rec.report.repaired.as_ref().map_or(0, |r| r.bytes_dropped);
        stats.flushes += rec.flushes;
        stats.segments_created += rec.segments_created;
        let written_pos = rec.segments.last().map_or(0, |s| s.base_position + s.end);
        let issued_end = rec.segments.last().map_or(SEGMENT_HEADER_BYTES, |s| s.end);
        let state = State {
            shards: rec.shards,
            segments: rec.segments,
            queue: VecDeque::new(),
            queued_bytes: 0,
            issued_end,
            // Whatever was reserved before a restart is unknown: the next write reserves.
            reserved_end: issued_end,
            fill: None,
            fill_gen: 0,
            inflight: 0,
            inflight_bytes: 0,
            last_write: None,
            write_failed: None,
            written_pos,
            durable_pos: written_pos,
            flushes_in_flight: 0,
            flush_issued_pos: written_pos,
            durable_waiters: VecDeque::new(),
            retry_waiters: BTreeMap::new(),
            poisoned: None,
            stats,
            truncations: rec.truncations,
        };
        let inner = Rc::new(Inner {
            name: name.to_owned(),
            dir: dir.to_owned(),
            config: config.clone(),
            retention: std::cell::Cell::new(retention),
            state: RefCell::new(state),
            writer: Signal::new(),
            flusher: Signal::new(),
            cache,
        });
        io::spawn(crate::commit::writer_loop(Rc::downgrade(&inner), inner.writer.clone()));
        io::spawn(crate::commit::flusher_loop(Rc::downgrade(&inner), inner.flusher.clone()));
        Ok((StreamLog { inner }, rec.report))
    }

    /// The counters of the read cache this log uses (its core's, when opened by a
    /// [`crate::CoreStore`]).
    pub fn read_cache_stats(&self) -> crate::ReadCacheStats {
        self.inner.cache.borrow().stats()
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Append one batch to `shard`. Returns once `ack` is satisfied: immediately for
    /// `AckMode::None` (the base offset is then provisional: if the write fails, e.g. with
    /// ENOSPC, the offsets are handed out again), after the write for `Written`, after the
    /// covering fdatasync for `Durable`.
    pub async fn append(
        &self,
        shard: ShardId,
        records: &[Record],
        timestamp_ms: u64,
        ack: AckMode,
    ) -> Result<AppendOutcome> {
        self.append_with(shard, records, timestamp_ms, ack, BatchMeta::default()).await
    }

    /// [`StreamLog::append`] with an optional producer tag: a tagged batch is stored once
    /// per shard. The shard remembers each producer's last `PRODUCER_SEQ_WINDOW` batches
    /// (`producers_per_shard_max` producers, the one whose last append is oldest forgotten
    /// first). For a known producer:
    ///
    /// * the next sequence number (its last + 1, wrapping) is appended;
    /// * a remembered one is a **duplicate**: nothing is appended, and the original's offsets
    ///   come back (`duplicate: true`) once the original satisfies `ack` (it may still be
    ///   queued or being written; if its write fails, so does the retry); a different record
    ///   count is `SequenceMismatch`;
    /// * one ahead of the next (by less than 2^31) is `OutOfOrderSequence`, one behind the
    ///   remembered ones `SequenceTooOld`; nothing is appended.
    ///
    /// An unknown producer (never seen, forgotten, or whose batches were all truncated or
    /// lost with a failed write) may start at any sequence number. Duplicates do not count
    /// as appends, wake no tail reader and add nothing to the index.
    pub async fn append_tagged(
        &self,
        shard: ShardId,
        records: &[Record],
        timestamp_ms: u64,
        ack: AckMode,
        tag: Option<ProducerTag>,
    ) -> Result<AppendOutcome> {
        let meta = BatchMeta { producer: tag, ..BatchMeta::default() };
        self.append_with(shard, records, timestamp_ms, ack, meta).await
    }

    /// [`StreamLog::append_tagged`] with everything a batch may carry ([`BatchMeta`]): the
    /// producer tag, the leader epoch that appended it (replication), and for a follower's
    /// copy of a leader's batch the offset it must land at. Checked before anything else,
    /// in this order: `expected_base` against the shard's next offset (`OffsetMismatch`),
    /// then `epoch` against the shard's last epoch (`EpochRegression`); then the producer tag
    /// as in `append_tagged` (not for a follower's copy). A refused batch stores nothing and
    /// takes no offset.
    ///
    /// A batch without an epoch is allowed anywhere, also after stamped ones: the epoch
    /// queries count it as epoch 0 (see [`StreamLog::end_of_epoch`]).
    pub async fn append_with(
        &self,
        shard: ShardId,
        records: &[Record],
        timestamp_ms: u64,
        ack: AckMode,
        meta: BatchMeta,
    ) -> Result<AppendOutcome> {
        self.submit(shard, records, timestamp_ms, ack, meta)?.done().await
    }

    /// Queues an append without waiting: [`StreamLog::append_with`] up to the point where
    /// the batch has its offsets. Batches submitted one after another are stored in that
    /// order, whenever their [`Appending`]s are awaited (or if they are dropped: a queued
    /// batch is written either way). A refused batch is an error here and takes no offset.
    pub fn submit(
        &self,
        shard: ShardId,
        records: &[Record],
        timestamp_ms: u64,
        ack: AckMode,
        meta: BatchMeta,
    ) -> Result<Appending> {
        let (outcome, wait) = {
            let mut st = self.inner.state.borrow_mut();
            match self.enqueue(&mut st, shard, records, timestamp_ms, ack, meta) {
                Ok(x) => x,
                Err(e) => {
                    st.stats.append_errors += 1;
                    return Err(e);
                }
            }
        };
        if !outcome.duplicate {
            self.inner.writer.notify();
        }
        Ok(Appending { log: self.clone(), outcome, wait })
    }

    fn enqueue(
        &self,
        st: &mut State,
        shard: ShardId,
        records: &[Record],
        timestamp_ms: u64,
        ack: AckMode,
        meta: BatchMeta,
    ) -> Result<(AppendOutcome, AckWait)> {
        let tag = meta.producer;
        if let Some(reason) = &st.poisoned {
            return Err(StorageError::Poisoned { reason: reason.clone() });
        }
        let config = &self.inner.config;
        if records.is_empty() {
            return Err(StorageError::EmptyBatch);
        }
        if records.len() > config.batch_records_max {
            return Err(StorageError::TooManyRecords {
                count: records.len(),
                limit: config.batch_records_max,
            });
        }
        let len = batch_encoded_len(records, tag, meta.epoch);
        if len > config.batch_bytes_max {
            return Err(StorageError::BatchTooLarge { bytes: len, limit: config.batch_bytes_max });
        }
        let record_count = records.len() as u32;
        let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
        if s.truncating {
            return Err(StorageError::ShardBusy { shard, reason: "the shard is being truncated" });
        }
        if let Some(expected) = meta.expected_base {
            if expected.0 != s.next_offset {
                return Err(StorageError::OffsetMismatch {
                    shard,
                    expected,
                    next: Offset(s.next_offset),
                });
            }
        }
        if let Some(epoch) = meta.epoch {
            let last = s.epochs.epoch_max();
            if epoch < last {
                return Err(StorageError::EpochRegression { shard, epoch, last });
            }
        }
        // Before the queue limit: a duplicate queues nothing. A follower's copy is not
        // checked: the leader decided it is new.
        if let Some(tag) = tag.filter(|_| meta.expected_base.is_none()) {
            match s.producers.check(tag, record_count) {
                Check::Append => {}
                Check::Duplicate(e) => return Ok(self.duplicate(st, shard, e, ack)),
                Check::Mismatch(e) => {
                    return Err(StorageError::SequenceMismatch {
                        shard,
                        producer: tag.producer,
                        seq: tag.seq,
                        stored_records: e.record_count,
                        retry_records: record_count,
                    })
                }
                Check::OutOfOrder { expected } => {
                    return Err(StorageError::OutOfOrderSequence {
                        shard,
                        producer: tag.producer,
                        expected,
                        got: tag.seq,
                    })
                }
                Check::TooOld { oldest_kept } => {
                    return Err(StorageError::SequenceTooOld {
                        shard,
                        producer: tag.producer,
                        seq: tag.seq,
                        oldest_kept,
                    })
                }
            }
        }
        if st.queued_bytes + len > config.queue_bytes_max {
            return Err(StorageError::QueueFull {
                queued_bytes: st.queued_bytes,
                limit: config.queue_bytes_max,
            });
        }
        let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
        let base_offset = s.next_offset;
        s.next_offset += records.len() as u64;
        // Recorded now, with the offsets: a retry that arrives while this batch is queued or
        // being written is a duplicate. A failed write forgets it again (`ShardState::rewind`).
        if let Some(tag) = tag {
            let forgotten = s.producers.record(tag, base_offset, record_count, timestamp_ms);
            st.stats.producers_evicted += forgotten.evicted;
            st.stats.producers_expired += forgotten.expired;
        }
        // Likewise the epoch index (a failed write cuts it back in `ShardState::rewind`).
        if s.epochs.push(meta.epoch, base_offset) {
            st.stats.epoch_changes_dropped += 1;
        }
        let (tx, wait) = match ack {
            AckMode::None => (None, AckWait::Now),
            _ => {
                let (tx, rx) = completion();
                (Some(tx), AckWait::Done(rx))
            }
        };
        st.queue.push_back(Pending {
            shard,
            base_offset,
            records: records.to_vec(),
            timestamp_ms,
            producer: tag,
            epoch: meta.epoch,
            len,
            ack,
            done: tx,
        });
        st.queued_bytes += len;
        st.stats.appends += 1;
        st.stats.records += records.len() as u64;
        let outcome =
            AppendOutcome { base_offset: Offset(base_offset), record_count, duplicate: false };
        Ok((outcome, wait))
    }

    /// Answer a retry of the stored batch `original` of `shard` once the original
    /// satisfies `ack`. A table entry at or past the index's next offset is queued or being
    /// written (failed writes and truncations forget theirs); one before it is written.
    fn duplicate(
        &self,
        st: &mut State,
        shard: ShardId,
        original: crate::producers::SeqEntry,
        ack: AckMode,
    ) -> (AppendOutcome, AckWait) {
        st.stats.duplicates += 1;
        let outcome = AppendOutcome {
            base_offset: Offset(original.base_offset),
            record_count: original.record_count,
            duplicate: true,
        };
        let Some(s) = st.shards.get(&shard) else { return (outcome, AckWait::Now) };
        let written = original.base_offset < s.index.next_offset();
        let wait = match ack {
            AckMode::None => AckWait::Now,
            AckMode::Written if written => AckWait::Now,
            AckMode::Durable if written => {
                // Durable already if its batch ends at or before `durable_pos`; else wait for
                // a flush of everything written (the original included).
                let end = match s.index.lookup(original.base_offset, 0) {
                    Lookup::Recent(e) => e.first().map(|e| e.position + u64::from(e.len)),
                    _ => None,
                };
                if end.is_some_and(|end| end <= st.durable_pos) {
                    AckWait::Now
                } else {
                    AckWait::Flush
                }
            }
            _ => {
                let (tx, rx) = completion();
                st.retry_waiters.entry((shard, original.base_offset)).or_default().push((ack, tx));
                AckWait::Done(rx)
            }
        };
        (outcome, wait)
    }

    /// Resolve once `shard` holds a written record at `offset` (tail readers).
    pub async fn wait_for(&self, shard: ShardId, offset: Offset) -> Result<()> {
        let rx = {
            let mut st = self.inner.state.borrow_mut();
            if let Some(reason) = &st.poisoned {
                return Err(StorageError::Poisoned { reason: reason.clone() });
            }
            let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
            if s.index.next_offset() > offset.0 {
                return Ok(());
            }
            let (tx, rx) = completion();
            s.add_tail_waiter(offset.0, tx);
            rx
        };
        rx.await.ok_or(StorageError::Closed)
    }

    /// The next offset of `shard` that will be written (the end of its written data).
    pub fn next_offset(&self, shard: ShardId) -> Result<Offset> {
        let mut st = self.inner.state.borrow_mut();
        let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
        Ok(Offset(s.index.next_offset()))
    }

    /// The offset the next append to `shard` will get (written or queued, not yet failed).
    pub fn next_offset_assigned(&self, shard: ShardId) -> u64 {
        self.inner.state.borrow().shards.get(&shard).map_or(0, |s| s.next_offset)
    }

    /// Producers that `shard`'s producer table remembers (at most
    /// `StorageConfig::producers_per_shard_max`).
    pub fn producer_count(&self, shard: ShardId) -> Result<usize> {
        let mut st = self.inner.state.borrow_mut();
        let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
        Ok(s.producers.len())
    }

    /// The epoch of the last batch of `shard` (queued ones included; a batch without an
    /// epoch counts as epoch 0), `None` if the shard holds no batch. Mirrors
    /// `felix_replication::ReplicaLog::last_epoch` (whose empty log says `Epoch::NONE`).
    /// Exact unless a truncation cut below every change the epoch index keeps
    /// (`EPOCH_CHANGES_PER_SHARD_MAX`); then an upper bound.
    pub fn last_epoch(&self, shard: ShardId) -> Result<Option<u64>> {
        self.with_epochs(shard, |ix, _, _| ix.last_epoch())
    }

    /// The largest epoch `<= epoch` that batches of `shard` were stamped with (0 for batches
    /// without one), if any; mirrors `ReplicaLog::largest_epoch_at_most`, the leader's answer
    /// in the epoch handshake. Conservative where the index cannot vouch for the answer (docs/
    /// storage-format.md, "Epoch index"): `None` when the answer would lie among the epoch
    /// changes dropped for the bound, and only batches before the first one whose epoch is
    /// lower than its predecessor's (an epoch-less batch after stamped ones) count.
    pub fn largest_epoch_at_most(&self, shard: ShardId, epoch: u64) -> Result<Option<u64>> {
        self.with_epochs(shard, |ix, _, next| ix.largest_epoch_at_most(epoch, next))
    }

    /// Where `epoch` ends in `shard`: the first offset of the first batch of a later epoch,
    /// else the shard's next offset (queued batches included); mirrors
    /// `ReplicaLog::end_of_epoch`. Batches without an epoch count as epoch 0. Conservative,
    /// never larger than the truth, so that the truncation handshake never keeps more than the
    /// common prefix: the shard's start offset when a later epoch may begin among the epoch
    /// changes dropped for the bound, and never past the first batch whose epoch is lower
    /// than its predecessor's. Always in `start_offset..=next`.
    pub fn end_of_epoch(&self, shard: ShardId, epoch: u64) -> Result<Offset> {
        self.with_epochs(shard, |ix, start, next| Offset(ix.end_of_epoch(epoch, start, next)))
    }

    /// Answer `f(epoch index, start offset, next offset assigned)` about `shard`.
    fn with_epochs<T>(
        &self,
        shard: ShardId,
        f: impl FnOnce(&EpochIndex, u64, u64) -> T,
    ) -> Result<T> {
        let mut st = self.inner.state.borrow_mut();
        let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
        Ok(f(&s.epochs, s.index.start_offset(), s.next_offset))
    }

    /// The first offset of `shard` still stored.
    pub fn start_offset(&self, shard: ShardId) -> Result<Offset> {
        let mut st = self.inner.state.borrow_mut();
        let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
        Ok(Offset(s.index.start_offset()))
    }

    /// Make everything written so far durable (one fdatasync, shared with group commit).
    pub async fn flush(&self) -> Result<()> {
        let rx = {
            let mut st = self.inner.state.borrow_mut();
            if let Some(reason) = &st.poisoned {
                return Err(StorageError::Poisoned { reason: reason.clone() });
            }
            if st.written_pos <= st.durable_pos {
                return Ok(());
            }
            let (tx, rx) = completion();
            let pos = st.written_pos;
            st.durable_waiters.push_back((pos, tx));
            rx
        };
        self.inner.flusher.notify();
        rx.await.unwrap_or(Err(StorageError::Closed))
    }

    /// A snapshot of the counters and histograms.
    pub fn stats(&self) -> StorageStats {
        self.inner.state.borrow().stats.clone()
    }

    /// Replaces the log's sidecar file `name` (in the log's directory, beside its segments:
    /// `[A-Za-z0-9._-]`, not ending in `.tmp`) by one holding `bytes`, atomically: a crash
    /// leaves the old file or the new one. Recovery ignores sidecar files; their owner (the
    /// broker's replica checkpoints) checks what it reads back.
    pub async fn write_sidecar(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        check_sidecar_name(name)?;
        io::replace_file(&self.inner.dir, name, bytes).await
    }

    /// The bytes of sidecar file `name` ([`write_sidecar`](Self::write_sidecar)), `None` if
    /// there is none; at most [`SIDECAR_BYTES_MAX`].
    pub async fn read_sidecar(&self, name: &str) -> Result<Option<Vec<u8>>> {
        check_sidecar_name(name)?;
        io::read_file(&self.inner.dir.join(name), SIDECAR_BYTES_MAX).await
    }

    /// Idempotent producers the shards' producer tables remember, summed over the shards.
    pub fn producers_known(&self) -> u64 {
        self.inner.state.borrow().shards.values().map(|s| s.producers.len() as u64).sum()
    }

    /// Bytes stored in segment files (header blocks and padding included).
    pub fn stored_bytes(&self) -> u64 {
        self.inner.state.borrow().segments.iter().map(|s| s.end).sum()
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.inner.state.borrow().segments.len()
    }

    /// Wait for queued writes (and a zero fill in flight), flush, and stop the background
    /// tasks. Other handles get `Closed` afterwards.
    pub async fn close(self) -> Result<()> {
        loop {
            let idle = {
                let st = self.inner.state.borrow();
                st.queue.is_empty() && st.inflight == 0 && st.fill.is_none()
            };
            if idle {
                break;
            }
            io::sleep(std::time::Duration::from_millis(1)).await;
        }
        let r = self.flush().await;
        self.inner.writer.close();
        self.inner.flusher.close();
        r
    }
}

/// What an append waits for before it answers.
/// A batch queued by [`StreamLog::submit`]: its offsets are fixed; [`Appending::done`] waits
/// until its ack mode is satisfied.
#[must_use = "the append's result is known only when it is awaited"]
pub struct Appending {
    log: StreamLog,
    outcome: AppendOutcome,
    wait: AckWait,
}

impl Appending {
    /// The offsets the batch got, or its original's for a duplicate (provisional until
    /// `done` succeeds, as for [`StreamLog::append`]).
    pub fn outcome(&self) -> AppendOutcome {
        self.outcome
    }

    /// Waits until the batch is written, or durable, as its ack mode asks.
    pub async fn done(self) -> Result<AppendOutcome> {
        let Appending { log, outcome, wait } = self;
        match wait {
            AckWait::Now => Ok(outcome),
            AckWait::Flush => log.flush().await.map(|()| outcome),
            AckWait::Done(done) => match done.await {
                Some(Ok(())) => Ok(outcome),
                Some(Err(e)) => Err(e),
                None => Err(StorageError::Closed),
            },
        }
    }
}

enum AckWait {
    /// Nothing: answer now.
    Now,
    /// The completion of the batch's write (or flush), or of the original's for a retry.
    Done(Completion<Result<()>>),
    /// A flush of everything written (a durable retry of a written, not yet durable batch).
    Flush,
}

pub(crate) fn owned_shard<'a>(
    stream: &str,
    shards: &'a mut BTreeMap<ShardId, ShardState>,
    shard: ShardId,
) -> Result<&'a mut ShardState> {
    match shards.get_mut(&shard) {
        Some(s) if s.owned => Ok(s),
        _ => Err(StorageError::UnknownShard { stream: stream.to_owned(), shard }),
    }
}

/// The largest sidecar file [`StreamLog::read_sidecar`] reads.
pub const SIDECAR_BYTES_MAX: u64 = 64 << 20;

fn check_sidecar_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.ends_with(".tmp")
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidConfig {
            reason: "a sidecar file name is [A-Za-z0-9._-], not .tmp",
        })
    }
}
