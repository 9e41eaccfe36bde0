//! The shared state of one stream log: its segments, shards, write queue and counters,
//! behind the `Inner` that `StreamLog` handles, the writer and the flusher share.
//!
//! Plain data and the few operations on it that every module needs; `log` (appends,
//! reads), `commit` (writer and group commit) and `recovery` (which builds it) all depend on
//! this module and on no other of the three, except that `log` opens through `recovery`
//! and starts `commit`'s tasks, and `commit` rolls segments through `recovery`.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;

use felix_proto::{AckMode, Offset, ProducerTag, Record, ShardId};

use crate::cache::SharedCache;
use crate::config::{RetentionConfig, StorageConfig};
use crate::epochs::EpochIndex;
use crate::error::{Result, StorageError};
use crate::index::ShardIndex;
use crate::io::LogFile;
use crate::producers::ProducerTable;
use crate::stats::StorageStats;
use crate::sync::{Completer, Completion, Signal};
use crate::truncate::Truncations;

/// One segment file of the log.
pub(crate) struct Segment {
    /// Log position of byte 0 of the file.
    pub(crate) base_position: u64,
    pub(crate) file: Rc<LogFile>,
    /// File position after the last completed write (aligned).
    pub(crate) end: u64,
    /// Newest batch timestamp (or creation time if empty).
    pub(crate) last_timestamp_ms: u64,
    /// Next offset of every shard when the segment was created.
    pub(crate) start_offsets: Vec<(ShardId, Offset)>,
}

/// A shard of the log.
pub(crate) struct ShardState {
    /// The broker gave this shard to this core (others were only found on disk).
    pub(crate) owned: bool,
    /// Next offset to hand out (>= the index's next offset while batches are queued).
    pub(crate) next_offset: u64,
    pub(crate) index: ShardIndex,
    /// `truncate_shard` is writing this shard's marker: appends of it are refused.
    pub(crate) truncating: bool,
    /// The last tagged batches of each producer (idempotent appends), queued ones included.
    pub(crate) producers: ProducerTable,
    /// Where the leader epoch of the shard's batches changes, queued ones included.
    pub(crate) epochs: EpochIndex,
    tail_waiters: Vec<(u64, Completer<()>)>,
}

impl ShardState {
    pub(crate) fn new(
        owned: bool,
        index: ShardIndex,
        producers: ProducerTable,
        epochs: EpochIndex,
    ) -> Self {
        Self {
            owned,
            next_offset: index.next_offset(),
            index,
            truncating: false,
            producers,
            epochs,
            tail_waiters: Vec::new(),
        }
    }

    /// Offsets from `next` on are handed out again (a failed write): set the next offset
    /// back and forget the producers' batches and the epoch changes that held them.
    pub(crate) fn rewind(&mut self, next: u64) {
        self.next_offset = next;
        self.producers.forget_after(next);
        self.epochs.truncate(next);
    }

    /// Wake the tail readers waiting for an offset that is now written.
    pub(crate) fn wake_tail_waiters(&mut self) {
        let next = self.index.next_offset();
        let (ready, wait): (Vec<_>, Vec<_>) =
            self.tail_waiters.drain(..).partition(|(o, _)| *o < next);
        self.tail_waiters = wait;
        for (_, w) in ready {
            w.complete(());
        }
    }

    /// Wake `waiter` once the record at `offset` is written.
    pub(crate) fn add_tail_waiter(&mut self, offset: u64, waiter: Completer<()>) {
        self.tail_waiters.push((offset, waiter));
    }

    /// Drop every tail waiter (they get `Closed`).
    pub(crate) fn drop_tail_waiters(&mut self) {
        self.tail_waiters.clear();
    }
}

/// A batch accepted by `append` and not yet written.
pub(crate) struct Pending {
    pub(crate) shard: ShardId,
    pub(crate) base_offset: u64,
    pub(crate) records: Vec<Record>,
    pub(crate) timestamp_ms: u64,
    /// The producer tag of an idempotent batch, written after the batch header.
    pub(crate) producer: Option<ProducerTag>,
    /// The leader epoch the batch is stamped with, written after the tag.
    pub(crate) epoch: Option<u64>,
    pub(crate) len: usize,
    pub(crate) ack: AckMode,
    pub(crate) done: Option<Completer<Result<()>>>,
}

/// Retries of a tagged batch that is queued or being written, by (shard, base offset): they
/// are answered as the batch is (its write publishes or fails), each by its own ack mode.
pub(crate) type RetryWaiters = BTreeMap<(ShardId, u64), Vec<(AckMode, Completer<Result<()>>)>>;

/// A zero fill of `[from, reserved_end)` of the active segment in flight: while it runs (and
/// `gen` is the log's `fill_gen`), writes must end at or before `from`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fill {
    pub(crate) gen: u64,
    pub(crate) from: u64,
}

impl State {
    /// Panics (debug builds) if the commit path's bookkeeping breaks what every step keeps:
    /// durable <= written (log positions), a flush never issued past what was written, no
    /// in-flight bytes without an in-flight write, queued bytes only with a queue, segments in
    /// log order with the active one's published end at or below what was issued, every
    /// durable waiter inside what was written, and each shard's next offset at or past its
    /// index's (queued batches hold the offsets between).
    pub(crate) fn debug_assert_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(self.durable_pos <= self.written_pos, "durable past written");
        assert!(self.flush_issued_pos <= self.written_pos, "a flush issued past written");
        assert!(self.inflight > 0 || self.inflight_bytes == 0, "in-flight bytes, no write");
        assert!(!self.queue.is_empty() || self.queued_bytes == 0, "queued bytes, no queue");
        assert!(!self.segments.is_empty(), "a log always has an active segment");
        assert!(
            self.segments.windows(2).all(|w| w[0].base_position < w[1].base_position),
            "segments out of log order"
        );
        if let Some(active) = self.segments.last() {
            assert!(active.end <= self.issued_end, "published past what was issued");
        }
        if let Some((pos, _)) = self.durable_waiters.back() {
            assert!(*pos <= self.written_pos, "a durable waiter past what was written");
        }
        for (shard, s) in &self.shards {
            assert!(
                s.next_offset >= s.index.next_offset(),
                "{shard}: next offset {} behind its index's {}",
                s.next_offset,
                s.index.next_offset()
            );
        }
    }

    /// Where the next write must end: before the zero fill in flight in the active segment,
    /// if one is.
    pub(crate) fn write_limit(&self, segment_bytes_max: u64) -> u64 {
        write_limit(self.fill, self.fill_gen, segment_bytes_max)
    }
}

/// [`State::write_limit`] from its parts.
pub(crate) fn write_limit(fill: Option<Fill>, fill_gen: u64, segment_bytes_max: u64) -> u64 {
    match fill {
        Some(f) if f.gen == fill_gen => f.from.min(segment_bytes_max),
        _ => segment_bytes_max,
    }
}

/// The mutable state of one stream log, borrowed briefly and never across an await.
pub(crate) struct State {
    pub(crate) shards: BTreeMap<ShardId, ShardState>,
    /// Oldest first; the last one is active.
    pub(crate) segments: Vec<Segment>,
    pub(crate) queue: VecDeque<Pending>,
    pub(crate) queued_bytes: usize,
    /// File position in the active segment after the last issued write.
    pub(crate) issued_end: u64,
    /// File position in the active segment up to which space was prepared (reserved or
    /// zeroed, or that tried): the writer grows it in `SEGMENT_GROW_BYTES` steps ahead of
    /// writes (`Preallocate`).
    pub(crate) reserved_end: u64,
    /// The zero fill in flight, if any (`Preallocate::Zero`; one at a time).
    pub(crate) fill: Option<Fill>,
    /// Raised at a roll: a fill still in flight then zeroes the old segment's tail and no
    /// longer bounds the writes (they go to another file).
    pub(crate) fill_gen: u64,
    /// Writes issued and not yet published, and their bytes.
    pub(crate) inflight: usize,
    pub(crate) inflight_bytes: u64,
    /// Resolves when the most recently issued write has published.
    pub(crate) last_write: Option<Completion<()>>,
    /// A write failed: (file position to truncate back to, the error).
    pub(crate) write_failed: Option<(u64, StorageError)>,
    /// Log position after the last published write.
    pub(crate) written_pos: u64,
    pub(crate) durable_pos: u64,
    /// fdatasyncs in flight, and the log position the newest of them covers.
    pub(crate) flushes_in_flight: usize,
    pub(crate) flush_issued_pos: u64,
    pub(crate) durable_waiters: VecDeque<(u64, Completer<Result<()>>)>,
    /// Duplicates waiting for their original batch to be written (see [`RetryWaiters`]).
    pub(crate) retry_waiters: RetryWaiters,
    pub(crate) poisoned: Option<String>,
    pub(crate) stats: StorageStats,
    /// Durable truncation markers (see `truncate`).
    pub(crate) truncations: Truncations,
}

/// What every handle and background task of one log shares.
pub(crate) struct Inner {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    pub(crate) config: StorageConfig,
    /// Changed by [`crate::StreamLog::set_retention`]; read by each retention pass.
    pub(crate) retention: std::cell::Cell<RetentionConfig>,
    pub(crate) state: RefCell<State>,
    pub(crate) writer: Signal,
    pub(crate) flusher: Signal,
    /// Blocks read for readers (the core's, shared by its logs).
    pub(crate) cache: SharedCache,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.writer.close();
        self.flusher.close();
    }
}
