//! Batches being filled: the queue between [`crate::Publisher::send`] and a publisher worker,
//! and the outcome a batch's records share.
//!
//! `send` adds a record to its key's open batch under the queue's lock and gets back a
//! [`PublishTicket`]: the batch's shared [`BatchOutcome`] and the record's index in it (one
//! allocation per batch, no channel per record). A batch that is full moves to the queue's
//! ready list at once. The worker takes one item at a time, the older of the ready list's front
//! and the open batch whose deadline came first, so one key's batches leave in the order they
//! were filled, and a lingering batch keeps filling until the worker can send it.
//!
//! Call order: [`WorkerQueue::push`] (callers), [`WorkerQueue::take_next`] then
//! [`WorkerQueue::poll_deadline`] (the worker), [`WorkerQueue::flush`], [`WorkerQueue::close`].

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{Offset, Payload, Record, ShardId, HEADER_LEN};
use tokio::sync::{oneshot, Notify, Semaphore, TryAcquireError};
use tokio::time::Instant;

use crate::error::ClientError;
use crate::timer::FineTimer;

/// Records queued per worker (in open or ready batches) before [`crate::Publisher::send`]
/// waits (backpressure).
pub const WORKER_QUEUE_RECORDS: usize = 8192;
/// The most distinct keys with an open batch per worker; the oldest is made ready when a new
/// key would exceed it.
pub const OPEN_BATCHES_MAX: usize = 1024;
/// How early a batch may leave before its linger deadline, in microseconds. The worker sleeps
/// until the earliest deadline less this (on a [`FineTimer`], microsecond-resolution) and takes
/// every batch due within it, so batches due close together leave on one wake-up.
pub const LINGER_TIMER_SLACK_US: u64 = 100;
/// The records a fresh batch has room for before its vectors grow.
const BATCH_RECORDS_PREALLOC: usize = 64;

/// Where an acked record was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Receipt {
    /// The shard.
    pub shard: ShardId,
    /// The record's offset in the shard.
    pub offset: Offset,
}

/// What a record's publish resolved to: `Some(receipt)` when acked, `None` with `AckMode::None`
/// (the batch was written to the connection, nothing more is known).
pub type PublishResult = Result<Option<Receipt>, ClientError>;

/// Resolves when the record's batch is acked (or written, with `AckMode::None`). A clone
/// resolves the same.
#[derive(Debug)]
pub struct PublishTicket {
    batch: Arc<BatchOutcome>,
    index: u32,
    /// Where this ticket's waker is kept in the outcome, once it has waited.
    waker_slot: Option<usize>,
}

impl Clone for PublishTicket {
    fn clone(&self) -> Self {
        // A clone may wait in another task: it registers its own waker.
        Self { batch: self.batch.clone(), index: self.index, waker_slot: None }
    }
}

impl PublishTicket {
    /// Whether `other` is a ticket of the same batch (it resolves at the same moment, with the
    /// same outcome): a caller with many records in flight may wait on one ticket per batch.
    pub fn same_batch(&self, other: &PublishTicket) -> bool {
        Arc::ptr_eq(&self.batch, &other.batch)
    }
}

impl Future for PublishTicket {
    type Output = PublishResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PublishResult> {
        let this = self.get_mut();
        this.batch.poll_record(this.index, &mut this.waker_slot, cx)
    }
}

/// What a whole batch came to.
#[derive(Clone, Debug)]
pub(crate) enum BatchResult {
    /// Stored in `shard` from `base` on, one offset per record in order.
    Acked { shard: ShardId, base: Offset },
    /// Written to the connection (`AckMode::None`).
    Written,
    /// Failed; every record of the batch gets the error.
    Failed(ClientError),
}

impl BatchResult {
    fn record(&self, index: u32) -> PublishResult {
        match self {
            Self::Acked { shard, base } => {
                // A broker's base offset near u64::MAX (a bad one) gives a capped receipt, not
                // an overflow.
                let offset = Offset(base.0.saturating_add(u64::from(index)));
                Ok(Some(Receipt { shard: *shard, offset }))
            }
            Self::Written => Ok(None),
            Self::Failed(e) => Err(e.clone()),
        }
    }
}

/// The outcome of one batch, shared by its records' tickets.
#[derive(Debug, Default)]
struct BatchOutcome {
    state: Mutex<OutcomeState>,
}

#[derive(Debug, Default)]
struct OutcomeState {
    done: Option<BatchResult>,
    /// The wakers of the tickets that wait, each in the slot its ticket was given.
    wakers: Vec<Waker>,
}

impl BatchOutcome {
    fn lock(&self) -> MutexGuard<'_, OutcomeState> {
        // Single assignments under the lock: a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poll_record(
        &self,
        index: u32,
        slot: &mut Option<usize>,
        cx: &mut Context<'_>,
    ) -> Poll<PublishResult> {
        let mut state = self.lock();
        if let Some(done) = &state.done {
            return Poll::Ready(done.record(index));
        }
        match slot.and_then(|i| state.wakers.get_mut(i)) {
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => *w = cx.waker().clone(),
            None => {
                *slot = Some(state.wakers.len());
                state.wakers.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }

    /// Sets the outcome (the first one wins) and wakes the waiting tickets.
    fn resolve(&self, result: BatchResult) {
        let wakers = {
            let mut state = self.lock();
            if state.done.is_some() {
                return;
            }
            state.done = Some(result);
            std::mem::take(&mut state.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }
}

/// The sending side of a batch's outcome. Dropped without [`Completion::resolve`] (a worker
/// gone, a batch abandoned), it fails the batch with `ClientError::Closed`, so no ticket waits
/// for ever.
#[derive(Debug)]
pub(crate) struct Completion(Arc<BatchOutcome>);

impl Completion {
    /// Resolves every record of the batch.
    pub(crate) fn resolve(self, result: BatchResult) {
        self.0.resolve(result);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.0.resolve(BatchResult::Failed(ClientError::Closed));
    }
}

/// A batch of one key's records.
#[derive(Debug)]
pub(crate) struct Batch {
    pub key: Option<Bytes>,
    pub records: Vec<Payload>,
    pub completion: Completion,
    /// The Publish frame's size so far (header included).
    frame_bytes: usize,
    /// Payload plus key bytes per record: what the broker stores (its batch limit).
    stored_bytes: usize,
    deadline: Instant,
    /// When the batch became ready: full, flushed, or its deadline come (the earlier of the
    /// deadline and the moment it moved to the ready list); `None` while it is open.
    ready_at: Option<Instant>,
}

impl Batch {
    /// When the batch became ready to send (its deadline while it is still open).
    pub(crate) fn ready_at(&self) -> Instant {
        self.ready_at.unwrap_or(self.deadline)
    }
}

/// What the worker takes from the queue, in order.
#[derive(Debug)]
pub(crate) enum Ready {
    /// A batch to send.
    Batch(Batch),
    /// Everything before it has been taken: reply once it is all acked.
    Flush(oneshot::Sender<()>),
}

/// The limits a batch is filled to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchCaps {
    /// Records per batch (the publisher's and the broker's limit, at least 1).
    pub records_max: usize,
    /// The broker's `max_frame_bytes`.
    pub frame_bytes_max: usize,
    /// The publisher's `batch_bytes_max` (payload plus key bytes).
    pub stored_bytes_max: usize,
    /// How long a batch waits for more records.
    pub linger: Duration,
    /// The stream name's length (it is in every Publish frame).
    pub stream_len: usize,
}

/// The queue between the senders of one connection slot and its worker.
#[derive(Debug)]
pub(crate) struct WorkerQueue {
    caps: BatchCaps,
    state: Mutex<QueueState>,
    /// Wakes the worker: a batch became ready, a new deadline, a flush, the close.
    wake: Notify,
    /// One permit per record that may still be queued.
    room: Semaphore,
}

#[derive(Debug, Default)]
struct QueueState {
    open: HashMap<Option<Bytes>, Batch>,
    ready: VecDeque<Ready>,
    /// Set when the publisher is gone (take everything, then stop) or the worker is.
    closed: bool,
}

impl WorkerQueue {
    pub(crate) fn new(caps: BatchCaps) -> Self {
        Self {
            caps,
            state: Mutex::new(QueueState::default()),
            wake: Notify::new(),
            room: Semaphore::new(WORKER_QUEUE_RECORDS),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Every change under the lock leaves the maps consistent: a poisoned one is usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `record` to its key's open batch, waiting while the queue is full; fails with
    /// `Closed` once the worker is gone.
    pub(crate) async fn push(&self, record: Record) -> Result<PublishTicket, ClientError> {
        match self.room.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::NoPermits) => {
                self.room.acquire().await.map_err(|_| ClientError::Closed)?.forget()
            }
            Err(TryAcquireError::Closed) => return Err(ClientError::Closed),
        }
        let (ticket, wake) = {
            let mut state = self.lock();
            if state.closed {
                return Err(ClientError::Closed);
            }
            state.add(record, &self.caps)
        };
        if wake {
            self.wake.notify_one();
        }
        Ok(ticket)
    }

    /// Takes the next batch to send, or a flush marker: the oldest of the ready list's front
    /// and the open batch due first within [`LINGER_TIMER_SLACK_US`] (every open batch counts as
    /// due once the queue is closed). Returns it, or `None` when nothing is due, and whether the
    /// queue is closed. The records taken leave room for as many new ones.
    ///
    /// One at a time, so that the worker always sends the oldest due records next: a due batch
    /// it has not taken stays open, and keeps taking records, while the worker is held up
    /// sending the one before it (a producer window, an in-flight slot, QUIC flow control),
    /// instead of waiting behind a list taken earlier.
    pub(crate) fn take_next(&self) -> (Option<Ready>, bool) {
        let (item, closed) = {
            let mut state = self.lock();
            let horizon = if state.closed {
                None
            } else {
                Some(Instant::now() + Duration::from_micros(LINGER_TIMER_SLACK_US))
            };
            (state.next(horizon), state.closed)
        };
        if let Some(Ready::Batch(b)) = &item {
            self.room.add_permits(b.records.len());
        }
        (item, closed)
    }

    /// Wakes the worker (it has batches to send again).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Waits until there may be something to take: a wake-up, or the earliest open batch's
    /// deadline less [`LINGER_TIMER_SLACK_US`], on the worker's `timer`.
    pub(crate) async fn poll_deadline(&self, timer: &mut FineTimer) {
        let notified = self.wake.notified();
        let deadline = self.lock().open.values().map(|b| b.deadline).min();
        match deadline {
            Some(d) => {
                let slack = Duration::from_micros(LINGER_TIMER_SLACK_US);
                let at = d.checked_sub(slack).unwrap_or(d);
                tokio::select! {
                    _ = notified => {}
                    _ = timer.sleep_until(at) => {}
                }
            }
            None => notified.await,
        }
    }

    /// Makes every open batch ready, oldest first, then a flush marker answered on `done`.
    pub(crate) fn flush(&self, done: oneshot::Sender<()>) {
        {
            let mut state = self.lock();
            state.make_all_ready();
            state.ready.push_back(Ready::Flush(done));
        }
        self.wake.notify_one();
    }

    /// The publisher is gone: the worker takes everything left, then stops.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// The worker is gone: fail what is queued (its completions fail with `Closed`) and refuse
    /// new records.
    pub(crate) fn shut(&self) {
        let dropped = {
            let mut state = self.lock();
            state.closed = true;
            let open: Vec<Batch> = state.open.drain().map(|(_, b)| b).collect();
            (open, std::mem::take(&mut state.ready))
        };
        self.room.close();
        drop(dropped);
    }
}

impl QueueState {
    /// Adds `record`; returns its ticket and whether the worker should look at the queue.
    fn add(&mut self, record: Record, caps: &BatchCaps) -> (PublishTicket, bool) {
        let Record { key, value } = record;
        let frame_record_bytes = 4 + value.len();
        let stored_record_bytes = value.len() + key.as_ref().map_or(0, Bytes::len);
        let mut wake = false;
        let full = self.open.get(&key).is_some_and(|b| {
            b.records.len() >= caps.records_max
                || b.frame_bytes + frame_record_bytes > caps.frame_bytes_max
                || b.stored_bytes + stored_record_bytes > caps.stored_bytes_max
        });
        if full {
            if let Some(batch) = self.open.remove(&key) {
                self.push_ready(batch);
                wake = true;
            }
        }
        if !self.open.contains_key(&key) {
            if self.open.len() >= OPEN_BATCHES_MAX {
                let oldest =
                    self.open.iter().min_by_key(|(_, b)| b.deadline).map(|(k, _)| k.clone());
                if let Some(batch) = oldest.and_then(|k| self.open.remove(&k)) {
                    self.push_ready(batch);
                }
            }
            // A new deadline, maybe the earliest.
            wake = true;
        }
        let mut entry = match self.open.entry(key) {
            Entry::Occupied(e) => e,
            Entry::Vacant(v) => {
                let prealloc = caps.records_max.min(BATCH_RECORDS_PREALLOC);
                let batch = Batch {
                    frame_bytes: frame_fixed_bytes(caps.stream_len, v.key().as_ref()),
                    key: v.key().clone(),
                    records: Vec::with_capacity(prealloc),
                    completion: Completion(Arc::default()),
                    stored_bytes: 0,
                    deadline: Instant::now() + caps.linger,
                    ready_at: None,
                };
                v.insert_entry(batch)
            }
        };
        let batch = entry.get_mut();
        let ticket = PublishTicket {
            batch: batch.completion.0.clone(),
            index: batch.records.len() as u32,
            waker_slot: None,
        };
        batch.records.push(value);
        batch.frame_bytes += frame_record_bytes;
        batch.stored_bytes += stored_record_bytes;
        if batch.records.len() >= caps.records_max
            || batch.frame_bytes >= caps.frame_bytes_max
            || batch.stored_bytes >= caps.stored_bytes_max
        {
            let batch = entry.remove();
            self.push_ready(batch);
            wake = true;
        }
        (ticket, wake)
    }

    /// Appends `batch` to the ready list, noting when it became ready.
    fn push_ready(&mut self, mut batch: Batch) {
        batch.ready_at = Some(Instant::now().min(batch.deadline));
        self.ready.push_back(Ready::Batch(batch));
    }

    /// The next item (see [`WorkerQueue::take_next`]). Per-key order holds: a ready batch of
    /// a key was pushed no later than its open batch was created, so it became ready before that
    /// batch's deadline, and so did every item ahead of it (each became ready no later than it
    /// was pushed): the open batch never goes ahead of the ready list's front then.
    fn next(&mut self, horizon: Option<Instant>) -> Option<Ready> {
        let due = self
            .open
            .iter()
            .filter(|(_, b)| horizon.is_none_or(|h| b.deadline <= h))
            .min_by_key(|(_, b)| b.deadline)
            .map(|(k, b)| (k.clone(), b.deadline));
        let open_first = match (&due, self.ready.front()) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some((_, deadline)), Some(Ready::Batch(front))) => *deadline < front.ready_at(),
            (Some(_), Some(Ready::Flush(_))) => false,
        };
        if open_first {
            if let Some(mut batch) = due.and_then(|(key, _)| self.open.remove(&key)) {
                batch.ready_at = Some(Instant::now().min(batch.deadline));
                return Some(Ready::Batch(batch));
            }
        }
        self.ready.pop_front()
    }

    /// Moves every open batch to the ready list, oldest first (a flush).
    fn make_all_ready(&mut self) {
        let mut batches: Vec<Batch> = self.open.drain().map(|(_, b)| b).collect();
        batches.sort_by_key(|b| b.deadline);
        for b in batches {
            self.push_ready(b);
        }
    }
}

/// Bytes of a Publish frame besides its records: header, ack prefix, key, stream, count.
pub(crate) fn frame_fixed_bytes(stream_len: usize, key: Option<&Bytes>) -> usize {
    // Header, acked prefix, key, producer tag (always counted), stream, record count.
    HEADER_LEN + 9 + key.map_or(0, |k| 2 + k.len()) + 12 + 2 + stream_len + 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn caps(records_max: usize, linger_ms: u64) -> BatchCaps {
        BatchCaps {
            records_max,
            frame_bytes_max: 1 << 20,
            stored_bytes_max: 1 << 20,
            linger: Duration::from_millis(linger_ms),
            stream_len: 5,
        }
    }

    fn keyed(key: &'static [u8], v: u8) -> Record {
        Record::keyed(Bytes::from_static(key), Bytes::from(vec![v; 10]))
    }

    /// Takes items as the worker does, until nothing is due.
    fn take_all(q: &WorkerQueue) -> (Vec<Ready>, bool) {
        let mut items = Vec::new();
        loop {
            match q.take_next() {
                (Some(item), _) => items.push(item),
                (None, closed) => return (items, closed),
            }
        }
    }

    fn batches(items: Vec<Ready>) -> Vec<(Option<Bytes>, Vec<u8>)> {
        items
            .into_iter()
            .filter_map(|i| match i {
                Ready::Batch(mut b) => {
                    let firsts = b.records.iter().map(|r| r.to_bytes()[0]).collect();
                    let key = b.key.take();
                    b.completion.resolve(BatchResult::Written);
                    Some((key, firsts))
                }
                Ready::Flush(_) => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn full_batches_are_ready_at_once_in_fill_order_per_key() {
        let q = WorkerQueue::new(caps(2, 60_000));
        for v in 0..5 {
            q.push(keyed(b"a", v)).await.unwrap();
        }
        q.push(keyed(b"b", 9)).await.unwrap();
        let (items, closed) = take_all(&q);
        assert!(!closed);
        let a = Some(Bytes::from_static(b"a"));
        assert_eq!(batches(items), vec![(a.clone(), vec![0, 1]), (a.clone(), vec![2, 3])]);
        // The lingering ones leave with a flush, oldest first, before the flush marker.
        let (tx, _rx) = oneshot::channel();
        q.flush(tx);
        let (items, _) = take_all(&q);
        assert!(matches!(items.last(), Some(Ready::Flush(_))));
        let b = Some(Bytes::from_static(b"b"));
        assert_eq!(batches(items), vec![(a, vec![4]), (b, vec![9])]);
    }

    #[tokio::test]
    async fn a_due_batch_keeps_filling_until_the_worker_takes_it() {
        let q = WorkerQueue::new(caps(10, 1));
        q.push(keyed(b"a", 0)).await.unwrap();
        q.push(keyed(b"b", 0)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
        // Both are due; the worker takes one and is busy sending it...
        let (first, _) = q.take_next();
        let first = batches(first.into_iter().collect());
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].1, vec![0]);
        let other: &'static [u8] = if first[0].0.as_deref() == Some(b"a") { b"b" } else { b"a" };
        // ...while the other key's due batch takes more records.
        q.push(keyed(other, 1)).await.unwrap();
        q.push(keyed(other, 2)).await.unwrap();
        let (second, _) = q.take_next();
        let other = Some(Bytes::from_static(other));
        assert_eq!(batches(second.into_iter().collect()), vec![(other, vec![0, 1, 2])]);
        assert!(q.take_next().0.is_none(), "nothing left");
    }

    #[tokio::test]
    async fn the_older_of_the_ready_front_and_the_first_due_open_batch_goes_first() {
        let q = WorkerQueue::new(caps(2, 1));
        // A key's full batch leaves before its own later batch, whenever that is due.
        for v in 0..3 {
            q.push(keyed(b"a", v)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
        let a = Some(Bytes::from_static(b"a"));
        let (items, _) = take_all(&q);
        assert_eq!(batches(items), vec![(a.clone(), vec![0, 1]), (a.clone(), vec![2])]);
        // An open batch due before a full one became ready goes ahead of it.
        q.push(keyed(b"b", 9)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
        q.push(keyed(b"a", 3)).await.unwrap();
        q.push(keyed(b"a", 4)).await.unwrap();
        let b = Some(Bytes::from_static(b"b"));
        let (items, _) = take_all(&q);
        assert_eq!(batches(items), vec![(b, vec![9]), (a, vec![3, 4])]);
    }

    #[tokio::test]
    async fn tickets_resolve_per_record_from_one_batch_outcome() {
        let q = WorkerQueue::new(caps(3, 60_000));
        let mut tickets = Vec::new();
        for v in 0..3 {
            tickets.push(q.push(keyed(b"k", v)).await.unwrap());
        }
        let counter = Arc::new(Count(0.into()));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        for t in &mut tickets {
            assert!(Pin::new(t).poll(&mut cx).is_pending());
        }
        let (mut items, _) = take_all(&q);
        let Some(Ready::Batch(batch)) = items.pop() else { panic!("no batch ready") };
        batch.completion.resolve(BatchResult::Acked { shard: ShardId(7), base: Offset(100) });
        assert_eq!(counter.0.load(std::sync::atomic::Ordering::Relaxed), 3, "each ticket woken");
        for (i, t) in tickets.into_iter().enumerate() {
            let r = t.await.unwrap().unwrap();
            assert_eq!(r, Receipt { shard: ShardId(7), offset: Offset(100 + i as u64) });
        }
    }

    #[tokio::test]
    async fn tickets_know_their_batch() {
        let q = WorkerQueue::new(caps(2, 60_000));
        let a0 = q.push(keyed(b"a", 0)).await.unwrap();
        let b0 = q.push(keyed(b"b", 0)).await.unwrap();
        let a1 = q.push(keyed(b"a", 1)).await.unwrap();
        let a2 = q.push(keyed(b"a", 2)).await.unwrap();
        assert!(a0.same_batch(&a1), "one batch of key a");
        assert!(!a0.same_batch(&b0), "another key, another batch");
        assert!(!a1.same_batch(&a2), "a full batch left: a new one began");
    }

    #[tokio::test]
    async fn a_ticket_and_its_clone_waiting_in_two_tasks_are_both_woken() {
        let q = WorkerQueue::new(caps(10, 60_000));
        let t = q.push(keyed(b"k", 0)).await.unwrap();
        let mut clone = t.clone();
        let (first, second) = (Arc::new(Count(0.into())), Arc::new(Count(0.into())));
        let (w1, w2) = (Waker::from(first.clone()), Waker::from(second.clone()));
        let mut t = t;
        assert!(Pin::new(&mut t).poll(&mut Context::from_waker(&w1)).is_pending());
        assert!(Pin::new(&mut clone).poll(&mut Context::from_waker(&w2)).is_pending());
        let (tx, _rx) = oneshot::channel();
        q.flush(tx);
        let (mut items, _) = take_all(&q);
        items.pop(); // the flush marker
        let Some(Ready::Batch(batch)) = items.pop() else { panic!("no batch ready") };
        batch.completion.resolve(BatchResult::Written);
        let woken = |c: &Arc<Count>| c.0.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!((woken(&first), woken(&second)), (1, 1));
        assert_eq!((t.await, clone.await), (Ok(None), Ok(None)));
    }

    #[tokio::test]
    async fn a_dropped_batch_fails_its_tickets_and_a_shut_queue_refuses_records() {
        let q = WorkerQueue::new(caps(10, 60_000));
        let t = q.push(keyed(b"k", 1)).await.unwrap();
        q.shut();
        assert_eq!(t.await, Err(ClientError::Closed));
        assert!(matches!(q.push(keyed(b"k", 2)).await, Err(ClientError::Closed)));
    }

    #[tokio::test]
    async fn a_lingering_batch_is_ready_within_the_slack_of_its_deadline() {
        let q = WorkerQueue::new(caps(10, 5));
        let mut timer = FineTimer::new();
        let start = Instant::now();
        q.push(keyed(b"k", 1)).await.unwrap();
        // As the worker does: take, wait, take again (a wake-up may come before the deadline).
        let items = loop {
            let (items, _) = take_all(&q);
            if !items.is_empty() {
                break items;
            }
            q.poll_deadline(&mut timer).await;
        };
        let waited = start.elapsed();
        assert_eq!(items.len(), 1);
        let slack = Duration::from_micros(LINGER_TIMER_SLACK_US);
        assert!(waited + slack >= Duration::from_millis(5), "{waited:?} too early");
        // Only "it fired": how late it may be is measured by the latency bench, not here.
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }

    #[tokio::test]
    async fn a_full_queue_waits_until_the_worker_takes_records() {
        let q = Arc::new(WorkerQueue::new(caps(1024, 60_000)));
        for v in 0..WORKER_QUEUE_RECORDS {
            q.push(keyed(b"k", v as u8)).await.unwrap();
        }
        let q2 = q.clone();
        let mut blocked = tokio::spawn(async move { q2.push(keyed(b"k", 0)).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut blocked).await.is_err(),
            "the 8193rd record must wait"
        );
        let (tx, _rx) = oneshot::channel();
        q.flush(tx);
        let _ = take_all(&q);
        blocked.await.unwrap().unwrap();
    }
}
