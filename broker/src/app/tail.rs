//! The live tail of each owned shard, kept in memory so subscribers at the tail are served
//! without reading the disk, and each batch is encoded once for every subscriber.
//!
//! A batch enters the tail when its append completed (written, or durable for durable
//! publishes), so a subscriber never sees a record before the publisher could. Batches are kept
//! contiguous by offset; one that completes out of order (mixed ack modes) restarts the tail at
//! itself. The tail of a shard holds at most [`TAIL_BYTES_PER_SHARD`] of payload; older batches
//! are read from the log. The EventBatch frame of a cached batch is encoded the first time a
//! subscriber asks for it and shared (a `Bytes` clone) with every later one, across cores too.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use felix_proto::{encode_event_batch, EventBatch, Offset, Record, ShardId};

/// Payload bytes kept in memory per owned shard.
pub const TAIL_BYTES_PER_SHARD: usize = 4 << 20;
/// Tail readers waiting per shard; past it readers poll every [`CROWDED_RETRY_MS`].
pub const TAIL_WAITERS_PER_SHARD: usize = 4096;
/// How long a reader turned away from a crowded tail waits before it asks again.
pub const CROWDED_RETRY_MS: u64 = 20;

/// An EventBatch ready to send: its offsets and its encoded frame.
#[derive(Clone, Debug)]
pub struct EncodedBatch {
    /// The first record's offset.
    pub base_offset: Offset,
    /// Records in the batch.
    pub count: u32,
    /// The encoded EventBatch frame, header included.
    pub frame: Bytes,
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
    timestamp_ms: u64,
    records: Vec<Record>,
    bytes: usize,
    frame: OnceCell<EncodedBatch>,
}

impl Cached {
    fn end(&self) -> u64 {
        self.base_offset + self.records.len() as u64
    }

    fn encoded(&self, encodes: &mut u64) -> EncodedBatch {
        if self.frame.get().is_none() {
            *encodes += 1;
        }
        self.frame
            .get_or_init(|| {
                EncodedBatch::encode(&EventBatch {
                    shard: self.shard,
                    base_offset: Offset(self.base_offset),
                    timestamp_ms: self.timestamp_ms,
                    records: self.records.clone(),
                })
            })
            .clone()
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
    batches: VecDeque<Rc<Cached>>,
    bytes: usize,
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
        shard: ShardId,
        base_offset: Offset,
        timestamp_ms: u64,
        records: Vec<Record>,
    ) {
        let bytes: usize =
            records.iter().map(|r| r.value.len() + r.key.as_ref().map_or(0, Bytes::len)).sum();
        let end = base_offset.0 + records.len() as u64;
        if self.batches.back().is_some_and(|b| b.end() != base_offset.0) {
            // Completed out of order: restart the tail here.
            self.batches.clear();
            self.bytes = 0;
        }
        self.batches.push_back(Rc::new(Cached {
            shard,
            base_offset: base_offset.0,
            timestamp_ms,
            records,
            bytes,
            frame: OnceCell::new(),
        }));
        self.bytes += bytes;
        self.next = Some(self.next.map_or(end, |n| n.max(end)));
        while self.bytes > TAIL_BYTES_PER_SHARD && self.batches.len() > 1 {
            if let Some(old) = self.batches.pop_front() {
                self.bytes -= old.bytes;
            }
        }
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
        for b in self.batches.range(i..) {
            if taken > 0 && taken + b.bytes > max_bytes {
                break;
            }
            taken += b.bytes;
            out.push(b.encoded(&mut self.encodes));
        }
        TailRead::Batches(out)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recs(n: usize) -> Vec<Record> {
        (0..n).map(|i| Record::unkeyed(vec![i as u8; 10])).collect()
    }

    #[test]
    fn serves_contiguous_batches_and_encodes_once() {
        let mut t = ShardTail::default();
        t.handle_append(ShardId(1), Offset(0), 5, recs(3));
        t.handle_append(ShardId(1), Offset(3), 6, recs(2));
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
        let mut t = ShardTail::default();
        t.handle_append(ShardId(0), Offset(0), 0, recs(1));
        t.handle_append(ShardId(0), Offset(5), 0, recs(1));
        assert!(matches!(t.read(Offset(0), 1 << 20, Offset(6)), TailRead::Miss));
        let big = vec![Record::unkeyed(vec![0u8; TAIL_BYTES_PER_SHARD / 2])];
        for i in 0..10u64 {
            t.handle_append(ShardId(0), Offset(6 + i), 0, big.clone());
        }
        assert!(t.bytes <= TAIL_BYTES_PER_SHARD);
        assert!(matches!(t.read(Offset(15), 1 << 20, Offset(16)), TailRead::Batches(_)));
    }
}
