//! The live tail of each owned shard, kept in memory so subscribers at the tail are served
//! without reading the disk, and each batch is encoded once for every subscriber.
//!
//! A batch enters the tail when its append completed (written, or durable for durable
//! publishes), so a subscriber never sees a record before the publisher could. Batches are kept
//! contiguous by offset; one that completes out of order (mixed ack modes) restarts the tail at
//! itself. The tail of a shard holds at most [`TAIL_BYTES_PER_SHARD`] (payload and per-record
//! overhead) and [`TAIL_BATCHES_PER_SHARD`] batches; older batches are read from the log. The EventBatch frame of a cached batch is encoded the first time a
//! subscriber asks for it and shared (a `Bytes` clone) with every later one, across cores too.
//!
//! A batch's records point into the packet buffers they arrived in (nothing copied them), and
//! while they are held those buffers cannot be received into again (`net::recv`). So a batch
//! keeps its records only until it is encoded (the frame is its own copy) or for
//! [`TAIL_RAW_AGE_MS`], whichever comes first: a batch no subscriber asked for by then leaves
//! the tail, with every batch before it (the tail stays contiguous), and is read from the log.
//! A subscriber at the tail is woken by the append and encodes the batch at once.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_proto::{encode_event_batch, EventBatch, Offset, Record, ShardId};

/// Memory one record costs beyond its bytes (its `Record` and queue entries), for budgets.
pub const RECORD_OVERHEAD_BYTES: usize = 64;
/// Memory one batch costs beyond its records, for budgets.
pub const BATCH_OVERHEAD_BYTES: usize = 256;

/// Bytes kept in memory per owned shard: payloads and keys, plus each record's and batch's
/// overhead ([`RECORD_OVERHEAD_BYTES`], [`BATCH_OVERHEAD_BYTES`], also counted by the publish budgets), so batches of empty
/// records count too.
pub const TAIL_BYTES_PER_SHARD: usize = 4 << 20;
/// Batches kept in memory per owned shard, whatever their size.
pub const TAIL_BATCHES_PER_SHARD: usize = 8192;
/// How long a batch no subscriber has read keeps its records (and the packet buffers they
/// point into) before it leaves the tail.
pub const TAIL_RAW_AGE_MS: u64 = 10;
/// How often each core looks for such batches.
pub const TAIL_SWEEP_MS: u64 = 5;
/// Tail readers waiting per shard; past it readers poll every [`CROWDED_RETRY_MS`].
pub const TAIL_WAITERS_PER_SHARD: usize = 4096;
/// How long a reader turned away from a crowded tail waits before it asks again.
pub const CROWDED_RETRY_MS: u64 = 20;

/// EventBatches ready to send: their offsets and their encoded frames, back to back (one,
/// except where a log read put small batches in one buffer: `super::frames`).
#[derive(Clone, Debug)]
pub struct EncodedBatch {
    /// The first record's offset.
    pub base_offset: Offset,
    /// Records in the frames (consecutive offsets).
    pub count: u32,
    /// The encoded EventBatch frames, headers included.
    pub frame: Bytes,
    /// EventBatch frames in `frame`.
    pub frames: u32,
}

impl EncodedBatch {
    /// Encodes `batch`.
    pub fn encode(batch: &EventBatch) -> Self {
        let mut buf = BytesMut::new();
        encode_event_batch(batch, &mut buf);
        Self {
            base_offset: batch.base_offset,
            count: batch.records.len() as u32,
            frame: buf.freeze(),
            frames: 1,
        }
    }

    /// The offset after the batch's last record.
    pub fn end(&self) -> u64 {
        self.base_offset.0 + u64::from(self.count)
    }
}

struct Cached {
    shard: ShardId,
    base_offset: u64,
    count: u64,
    timestamp_ms: u64,
    /// The records as received, until the batch is encoded.
    records: Option<Vec<Record>>,
    bytes: usize,
    frame: Option<EncodedBatch>,
}

impl Cached {
    fn end(&self) -> u64 {
        self.base_offset + self.count
    }

    fn encoded(&mut self, encodes: &mut u64) -> EncodedBatch {
        if let Some(frame) = &self.frame {
            return frame.clone();
        }
        *encodes += 1;
        let frame = EncodedBatch::encode(&EventBatch {
            shard: self.shard,
            base_offset: Offset(self.base_offset),
            timestamp_ms: self.timestamp_ms,
            records: self.records.take().unwrap_or_default(),
        });
        self.frame = Some(frame.clone());
        frame
    }
}

#[derive(Default)]
struct WaitSlot {
    woken: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

/// Resolves when the shard's tail grows. Dropping it unregisters the reader.
pub struct TailWait {
    slot: Rc<WaitSlot>,
}

impl Future for TailWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.slot.woken.get() {
            return Poll::Ready(());
        }
        self.slot.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// What the tail can say about a read from `from`.
pub enum TailRead {
    /// Batches starting exactly at `from`.
    Batches(Vec<EncodedBatch>),
    /// `from` is the next offset to be written: await the wait.
    AtTail(TailWait),
    /// At the tail, but too many readers wait already: try again later.
    Crowded,
    /// Not in memory: read the log.
    Miss,
}

/// The in-memory tail of one shard.
#[derive(Default)]
pub struct ShardTail {
    batches: VecDeque<Cached>,
    bytes: usize,
    /// When each batch still holding its records arrived, and its first offset, oldest first
    /// (a batch encoded since is skipped when its turn comes).
    raw: VecDeque<(Instant, u64)>,
    /// The next offset no completed append has reached yet, once known.
    next: Option<u64>,
    waiters: Vec<Weak<WaitSlot>>,
    /// EventBatch encodings done for this shard's tail (one per batch at most).
    pub encodes: u64,
}

impl ShardTail {
    /// Records a completed append.
    pub fn handle_append(
        &mut self,
        now: Instant,
        shard: ShardId,
        base_offset: Offset,
        timestamp_ms: u64,
        records: Vec<Record>,
    ) {
        let bytes: usize = records
            .iter()
            .map(|r| r.value.len() + r.key.as_ref().map_or(0, Bytes::len) + RECORD_OVERHEAD_BYTES)
            .sum::<usize>()
            + BATCH_OVERHEAD_BYTES;
        let end = base_offset.0 + records.len() as u64;
        if self.batches.back().is_some_and(|b| b.end() != base_offset.0) {
            // Completed out of order: restart the tail here.
            self.batches.clear();
            self.raw.clear();
            self.bytes = 0;
        }
        self.batches.push_back(Cached {
            shard,
            base_offset: base_offset.0,
            count: records.len() as u64,
            timestamp_ms,
            records: Some(records),
            bytes,
            frame: None,
        });
        self.raw.push_back((now, base_offset.0));
        self.bytes += bytes;
        self.next = Some(self.next.map_or(end, |n| n.max(end)));
        while (self.bytes > TAIL_BYTES_PER_SHARD || self.batches.len() > TAIL_BATCHES_PER_SHARD)
            && self.batches.len() > 1
        {
            if let Some(old) = self.batches.pop_front() {
                self.bytes -= old.bytes;
            }
        }
        self.release_raw(now);
        for w in self.waiters.drain(..) {
            if let Some(slot) = w.upgrade() {
                slot.woken.set(true);
                if let Some(waker) = slot.waker.take() {
                    waker.wake();
                }
            }
        }
    }

    /// Serves a read of up to about `max_bytes` from `from`, if the tail can.
    pub fn read(&mut self, from: Offset, max_bytes: usize, log_next: Offset) -> TailRead {
        let from = from.0;
        // At the tail: nothing beyond `from` is written, or the tail is contiguous up to `from`
        // and the batch at `from` will enter it when its append completes.
        if self.next == Some(from) || (from >= log_next.0 && self.next.is_none_or(|n| from >= n)) {
            // Readers that gave up dropped their wait: forget them.
            self.waiters.retain(|w| w.strong_count() > 0);
            if self.waiters.len() >= TAIL_WAITERS_PER_SHARD {
                return TailRead::Crowded;
            }
            let slot = Rc::new(WaitSlot::default());
            self.waiters.push(Rc::downgrade(&slot));
            return TailRead::AtTail(TailWait { slot });
        }
        let Some(first) = self.batches.front() else { return TailRead::Miss };
        if from < first.base_offset {
            return TailRead::Miss;
        }
        let i = self.batches.partition_point(|b| b.end() <= from);
        match self.batches.get(i) {
            Some(b) if b.base_offset == from => {}
            _ => return TailRead::Miss,
        }
        let mut out = Vec::new();
        let mut taken = 0;
        for b in self.batches.range_mut(i..) {
            if taken > 0 && taken + b.bytes > max_bytes {
                break;
            }
            taken += b.bytes;
            out.push(b.encoded(&mut self.encodes));
        }
        TailRead::Batches(out)
    }

    /// Lets go of the batches no subscriber read within [`TAIL_RAW_AGE_MS`] of their arrival,
    /// with every batch before them.
    pub fn release_raw(&mut self, now: Instant) {
        let age = Duration::from_millis(TAIL_RAW_AGE_MS);
        let mut cut = None;
        while let Some(&(at, base)) = self.raw.front() {
            if now.saturating_duration_since(at) < age {
                break;
            }
            self.raw.pop_front();
            let i = self.batches.partition_point(|b| b.base_offset < base);
            if self.batches.get(i).is_some_and(|b| b.base_offset == base && b.frame.is_none()) {
                cut = Some(i);
            }
        }
        if let Some(last) = cut {
            for b in self.batches.drain(..=last) {
                self.bytes -= b.bytes;
            }
        }
    }

    /// Batches holding their records as received (for tests and metrics).
    pub fn raw_batches(&self) -> usize {
        self.batches.iter().filter(|b| b.frame.is_none()).count()
    }
}

/// The tails of a stream's shards on one core.
#[derive(Default)]
pub struct StreamTails {
    shards: RefCell<std::collections::HashMap<ShardId, ShardTail>>,
}

impl StreamTails {
    /// Runs `f` on `shard`'s tail.
    pub fn with<R>(&self, shard: ShardId, f: impl FnOnce(&mut ShardTail) -> R) -> R {
        f(self.shards.borrow_mut().entry(shard).or_default())
    }

    /// [`ShardTail::release_raw`] on every shard.
    pub fn release_raw(&self, now: Instant) {
        for t in self.shards.borrow_mut().values_mut() {
            t.release_raw(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recs(n: usize) -> Vec<Record> {
        (0..n).map(|i| Record::unkeyed(vec![i as u8; 10])).collect()
    }

    #[test]
    fn serves_contiguous_batches_and_encodes_once() {
        let now = Instant::now();
        let mut t = ShardTail::default();
        t.handle_append(now, ShardId(1), Offset(0), 5, recs(3));
        t.handle_append(now, ShardId(1), Offset(3), 6, recs(2));
        let TailRead::Batches(a) = t.read(Offset(0), 1 << 20, Offset(5)) else { panic!("miss") };
        assert_eq!(
            a.iter().map(|b| (b.base_offset.0, b.count)).collect::<Vec<_>>(),
            vec![(0, 3), (3, 2)]
        );
        let TailRead::Batches(b) = t.read(Offset(3), 1 << 20, Offset(5)) else { panic!("miss") };
        // The same encoded frame, not a second encoding.
        assert_eq!(a[1].frame.as_ptr(), b[0].frame.as_ptr());
        // Mid-batch offsets go to the log.
        assert!(matches!(t.read(Offset(1), 1 << 20, Offset(5)), TailRead::Miss));
        assert!(matches!(t.read(Offset(5), 1 << 20, Offset(5)), TailRead::AtTail(_)));
    }

    #[test]
    fn out_of_order_completion_restarts_the_tail_and_memory_is_bounded() {
        let now = Instant::now();
        let mut t = ShardTail::default();
        t.handle_append(now, ShardId(0), Offset(0), 0, recs(1));
        t.handle_append(now, ShardId(0), Offset(5), 0, recs(1));
        assert!(matches!(t.read(Offset(0), 1 << 20, Offset(6)), TailRead::Miss));
        let big = vec![Record::unkeyed(vec![0u8; TAIL_BYTES_PER_SHARD / 2])];
        for i in 0..10u64 {
            t.handle_append(now, ShardId(0), Offset(6 + i), 0, big.clone());
        }
        assert!(t.bytes <= TAIL_BYTES_PER_SHARD);
        assert!(matches!(t.read(Offset(15), 1 << 20, Offset(16)), TailRead::Batches(_)));
    }

    #[test]
    fn unread_batches_let_go_of_their_records_after_the_raw_age() {
        let t0 = Instant::now();
        let age = Duration::from_millis(TAIL_RAW_AGE_MS);
        let mut t = ShardTail::default();
        t.handle_append(t0, ShardId(0), Offset(0), 0, recs(2));
        t.handle_append(t0, ShardId(0), Offset(2), 0, recs(2));
        // Read (encoded) in time: the first batch keeps its frame, not its records.
        let TailRead::Batches(a) = t.read(Offset(0), 10, Offset(4)) else { panic!("miss") };
        assert_eq!(a.len(), 1);
        assert_eq!(t.raw_batches(), 1);
        t.handle_append(t0 + age / 2, ShardId(0), Offset(4), 0, recs(2));
        t.release_raw(t0 + age - Duration::from_millis(1));
        assert_eq!(t.raw_batches(), 2, "nothing is let go before the age");
        // The unread batch at 2 ages out, and the read one before it goes with it (the tail
        // stays contiguous); the batch at 4 is younger and stays.
        t.release_raw(t0 + age);
        assert_eq!(t.raw_batches(), 1);
        assert!(matches!(t.read(Offset(0), 1 << 20, Offset(6)), TailRead::Miss));
        assert!(matches!(t.read(Offset(2), 1 << 20, Offset(6)), TailRead::Miss));
        let TailRead::Batches(b) = t.read(Offset(4), 1 << 20, Offset(6)) else { panic!("miss") };
        assert_eq!((b[0].base_offset.0, b[0].count), (4, 2));
        // Encoded, it outlives the age.
        t.release_raw(t0 + age * 10);
        assert_eq!(t.raw_batches(), 0);
        assert!(matches!(t.read(Offset(4), 1 << 20, Offset(6)), TailRead::Batches(_)));
        assert_eq!(t.bytes, 20 + 2 * RECORD_OVERHEAD_BYTES + BATCH_OVERHEAD_BYTES);
    }

    #[test]
    fn batches_of_empty_records_are_bounded_too() {
        // Empty records weigh their overhead, and past the batch cap the oldest go: a
        // subscriber reading at the tail (every batch encoded, none let go by age) cannot make
        // the tail grow without limit.
        let now = Instant::now();
        let mut t = ShardTail::default();
        let empty = || vec![Record::unkeyed(Vec::new()); 4096];
        for i in 0..2_000u64 {
            t.handle_append(now, ShardId(0), Offset(i * 4096), 0, empty());
            assert!(matches!(
                t.read(Offset(i * 4096), 1 << 20, Offset(i * 4096)),
                TailRead::Batches(_)
            ));
        }
        assert!(t.bytes <= TAIL_BYTES_PER_SHARD, "{}", t.bytes);
        assert!(t.batches.len() < 100, "{} batches held", t.batches.len());
        let one = || vec![Record::unkeyed(vec![1u8])];
        let base = 2_000 * 4096;
        for i in 0..(TAIL_BATCHES_PER_SHARD as u64 + 500) {
            t.handle_append(now, ShardId(0), Offset(base + i), 0, one());
            let _ = t.read(Offset(base + i), 1 << 20, Offset(base + i));
        }
        assert!(t.batches.len() <= TAIL_BATCHES_PER_SHARD, "{} batches held", t.batches.len());
        // A read from the oldest held batch takes about max_bytes, not the whole tail.
        let oldest = t.batches.front().map(|b| b.base_offset).unwrap();
        let TailRead::Batches(got) = t.read(Offset(oldest), 64 << 10, Offset(base + 9000)) else {
            panic!("miss");
        };
        assert!(got.len() < 300, "{} batches in one read", got.len());
    }
}
