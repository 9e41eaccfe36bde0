//! The publisher: batching per key with a linger time and size limits, one worker task per
//! connection of the pool (no task carries every connection's batches), acks resolved per record.
//!
//! Call order: [`crate::Client::publisher`], then [`Publisher::send`] (returns a
//! [`PublishTicket`] that resolves when the batch is acked) or [`Publisher::publish`] (send and
//! wait), [`Publisher::flush`] to wait for everything sent so far, [`Publisher::close`].
//!
//! Routing: a keyed record goes to the connection whose broker core owns its shard when the
//! pool has one (the broker's rule: shard `s` is owned by core `s % core_count`; a hint only,
//! the broker forwards a batch that lands elsewhere); otherwise to a connection chosen by the
//! key's hash, so one key always takes the same connection and the same stream (per-key order).
//! Unkeyed records rotate over the connections one full batch at a time.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{
    key_hash, shard_for_key, AckMode, AckRequest, Capabilities, Frame, Limits, Offset, Publish,
    Record, RequestId, ShardId, HEADER_LEN,
};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::client::Client;
use crate::config::PublishSettings;
use crate::conn::{Conn, Lane};
use crate::error::ClientError;

/// Records queued per worker before [`Publisher::send`] waits (backpressure).
pub const WORKER_QUEUE_RECORDS: usize = 8192;
/// The most distinct keys with an open batch per worker; the oldest is sent when exceeded.
pub const OPEN_BATCHES_MAX: usize = 1024;
/// Records taken from the queue in one go before batches are checked for expiry.
const DRAIN_RECORDS_MAX: usize = 4096;

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

/// Resolves when the record's batch is acked (or written, with `AckMode::None`).
#[derive(Debug)]
pub struct PublishTicket {
    rx: oneshot::Receiver<PublishResult>,
}

impl Future for PublishTicket {
    type Output = PublishResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PublishResult> {
        Pin::new(&mut self.rx).poll(cx).map(|r| r.unwrap_or(Err(ClientError::Closed)))
    }
}

/// Publishes records to one stream. Cheap to clone; clones share the workers.
#[derive(Clone)]
pub struct Publisher {
    shared: Arc<PubShared>,
}

struct PubShared {
    stream: String,
    settings: PublishSettings,
    caps: Capabilities,
    limits: Limits,
    workers: Vec<mpsc::Sender<Cmd>>,
    /// The stream's shard count, for routing keys to the core that owns their shard.
    shard_count: Option<u32>,
    core_count: u16,
    /// Worker index for each broker core, when some connection is owned by that core.
    worker_of_core: HashMap<u16, usize>,
    unkeyed_records: AtomicU64,
}

enum Cmd {
    Record(Record, oneshot::Sender<PublishResult>),
    Flush(oneshot::Sender<()>),
}

impl Publisher {
    pub(crate) async fn start(
        client: Client,
        stream: String,
        settings: PublishSettings,
    ) -> Result<Self, ClientError> {
        let caps = client.capabilities();
        if settings.ack_mode != AckMode::None && !caps.contains(Capabilities::PUBLISH_ACKED) {
            return Err(ClientError::Unsupported("acked publish"));
        }
        // The shard count lets keys go to the connection of their shard's core. A stream that
        // does not exist yet may be created by the broker on the first publish (auto-create):
        // then publish without the hint, and let the broker answer if it refuses.
        let shard_count = match client.describe_stream(&stream).await {
            Ok(d) => Some(d.shards),
            Err(ClientError::Broker { code: felix_proto::ErrorCode::StreamNotFound, .. }) => None,
            Err(e) => return Err(e),
        };
        let limits = client.limits();
        let slots = client.shared.slots.len();
        let mut worker_of_core = HashMap::new();
        for i in 0..slots {
            if let Some(core) = client.shared.slot_core(i) {
                worker_of_core.entry(core).or_insert(i);
            }
        }
        let workers = (0..slots)
            .map(|slot| {
                let (tx, rx) = mpsc::channel(WORKER_QUEUE_RECORDS);
                let worker = Worker {
                    client: client.clone(),
                    slot,
                    stream: stream.clone(),
                    settings: settings.clone(),
                    limits,
                    open: HashMap::new(),
                    conn: None,
                    lanes: Vec::new(),
                    next_lane: 0,
                    in_flight: Arc::new(Semaphore::new(settings.in_flight_batches_max)),
                };
                tokio::spawn(worker.run(rx));
                tx
            })
            .collect();
        Ok(Self {
            shared: Arc::new(PubShared {
                stream,
                core_count: client.core_count().max(1),
                settings,
                caps,
                limits,
                workers,
                shard_count: shard_count.filter(|n| *n > 0),
                worker_of_core,
                unkeyed_records: AtomicU64::new(0),
            }),
        })
    }

    /// The stream this publisher writes to.
    pub fn stream(&self) -> &str {
        &self.shared.stream
    }

    /// The shard a key goes to, when the stream's shard count is known.
    pub fn shard_for_key(&self, key: &[u8]) -> Option<ShardId> {
        self.shared.shard_count.map(|n| shard_for_key(key, n))
    }

    /// Queues `record` for the next batch; waits only when the worker's queue is full.
    ///
    /// Fails at once, sending nothing, when the record is keyed and the broker did not
    /// advertise `PUBLISH_KEYED` (`Unsupported("keyed publish")`), when the key is over the
    /// broker's limit, or when the record cannot fit in a frame.
    pub async fn send(&self, record: Record) -> Result<PublishTicket, ClientError> {
        let s = &self.shared;
        if let Some(key) = &record.key {
            if !s.caps.contains(Capabilities::PUBLISH_KEYED) {
                return Err(ClientError::Unsupported("keyed publish"));
            }
            if key.len() > usize::from(s.limits.max_key_bytes) {
                return Err(ClientError::KeyTooLong {
                    len: key.len(),
                    max: s.limits.max_key_bytes,
                });
            }
        }
        let fixed = frame_fixed_bytes(&s.stream, record.key.as_ref());
        let room = (s.limits.max_frame_bytes as usize).saturating_sub(fixed + 4);
        if record.value.len() > room {
            return Err(ClientError::RecordTooLarge { len: record.value.len(), max: room });
        }
        let worker = self.worker_for(record.key.as_deref());
        let (tx, rx) = oneshot::channel();
        s.workers[worker].send(Cmd::Record(record, tx)).await.map_err(|_| ClientError::Closed)?;
        Ok(PublishTicket { rx })
    }

    /// Sends `record` and waits for its ack.
    pub async fn publish(&self, record: Record) -> PublishResult {
        self.send(record).await?.await
    }

    /// Sends every queued record and waits until every batch sent so far is acked or failed.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let mut waits = Vec::with_capacity(self.shared.workers.len());
        for w in &self.shared.workers {
            let (tx, rx) = oneshot::channel();
            w.send(Cmd::Flush(tx)).await.map_err(|_| ClientError::Closed)?;
            waits.push(rx);
        }
        for rx in waits {
            rx.await.map_err(|_| ClientError::Closed)?;
        }
        Ok(())
    }

    /// Flushes, then stops this handle (the workers stop when the last clone is gone).
    pub async fn close(self) -> Result<(), ClientError> {
        self.flush().await
    }

    fn worker_for(&self, key: Option<&[u8]>) -> usize {
        let s = &self.shared;
        let n = s.workers.len();
        match key {
            Some(key) => {
                let owner = s
                    .shard_count
                    .map(|count| (shard_for_key(key, count).0 % u32::from(s.core_count)) as u16)
                    .and_then(|core| s.worker_of_core.get(&core).copied());
                owner.unwrap_or((key_hash(key) % n as u64) as usize)
            }
            None => {
                let i = s.unkeyed_records.fetch_add(1, Ordering::Relaxed);
                let per_batch = u64::from(s.settings.batch_records_max.max(1));
                ((i / per_batch) % n as u64) as usize
            }
        }
    }
}

/// Bytes of a Publish frame besides its records: header, ack prefix, key, stream, count.
fn frame_fixed_bytes(stream: &str, key: Option<&Bytes>) -> usize {
    HEADER_LEN + 9 + key.map_or(0, |k| 2 + k.len()) + 2 + stream.len() + 4
}

/// A batch being filled.
struct OpenBatch {
    key: Option<Bytes>,
    records: Vec<Bytes>,
    waiters: Vec<oneshot::Sender<PublishResult>>,
    /// The Publish frame's size so far (header included).
    frame_bytes: usize,
    /// Payload plus key bytes per record: what the broker stores (its batch limit).
    stored_bytes: usize,
    deadline: Instant,
}

/// Batches and sends the records of one connection slot.
struct Worker {
    client: Client,
    slot: usize,
    stream: String,
    settings: PublishSettings,
    limits: Limits,
    open: HashMap<Option<Bytes>, OpenBatch>,
    /// The connection `lanes` belong to.
    conn: Option<Arc<Conn>>,
    lanes: Vec<Arc<Lane>>,
    next_lane: usize,
    in_flight: Arc<Semaphore>,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        loop {
            let deadline = self.open.values().map(|b| b.deadline).min();
            let sleep = tokio::time::sleep_until(
                deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
            );
            tokio::select! {
                cmd = rx.recv() => {
                    match cmd {
                        Some(cmd) => {
                            let mut next = Some(cmd);
                            let mut drained = 0;
                            while let Some(cmd) = next.take() {
                                self.handle(cmd).await;
                                drained += 1;
                                if drained < DRAIN_RECORDS_MAX {
                                    next = rx.try_recv().ok();
                                }
                            }
                        }
                        None => {
                            self.flush_all().await;
                            self.wait_in_flight().await;
                            return;
                        }
                    }
                    self.flush_expired().await;
                }
                _ = sleep, if deadline.is_some() => self.flush_expired().await,
            }
        }
    }

    /// Handles one command.
    async fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Record(record, tx) => self.add(record, tx).await,
            Cmd::Flush(done) => {
                self.flush_all().await;
                self.wait_in_flight().await;
                let _ = done.send(());
            }
        }
    }

    fn records_cap(&self) -> usize {
        self.settings.batch_records_max.min(self.limits.max_batch_records).max(1) as usize
    }

    async fn add(&mut self, record: Record, tx: oneshot::Sender<PublishResult>) {
        let Record { key, value } = record;
        let frame_record_bytes = 4 + value.len();
        let stored_record_bytes = value.len() + key.as_ref().map_or(0, Bytes::len);
        let fixed = frame_fixed_bytes(&self.stream, key.as_ref());
        let frame_cap = self.limits.max_frame_bytes as usize;
        let stored_cap = self.settings.batch_bytes_max as usize;
        let records_cap = self.records_cap();
        let full = self.open.get(&key).is_some_and(|b| {
            b.records.len() >= records_cap
                || b.frame_bytes + frame_record_bytes > frame_cap
                || b.stored_bytes + stored_record_bytes > stored_cap
        });
        if full {
            if let Some(batch) = self.open.remove(&key) {
                self.send_batch(batch).await;
            }
        }
        if !self.open.contains_key(&key) && self.open.len() >= OPEN_BATCHES_MAX {
            let oldest = self.open.iter().min_by_key(|(_, b)| b.deadline).map(|(k, _)| k.clone());
            if let Some(batch) = oldest.and_then(|k| self.open.remove(&k)) {
                self.send_batch(batch).await;
            }
        }
        let linger = Duration::from_micros(self.settings.linger_us);
        let batch = self.open.entry(key.clone()).or_insert_with(|| OpenBatch {
            key: key.clone(),
            records: Vec::new(),
            waiters: Vec::new(),
            frame_bytes: fixed,
            stored_bytes: 0,
            deadline: Instant::now() + linger,
        });
        batch.records.push(value);
        batch.waiters.push(tx);
        batch.frame_bytes += frame_record_bytes;
        batch.stored_bytes += stored_record_bytes;
        if batch.records.len() >= records_cap
            || batch.frame_bytes >= frame_cap
            || batch.stored_bytes >= stored_cap
        {
            if let Some(batch) = self.open.remove(&key) {
                self.send_batch(batch).await;
            }
        }
    }

    async fn flush_expired(&mut self) {
        let now = Instant::now();
        let mut expired: Vec<OpenBatch> = Vec::new();
        self.open.retain(|_, b| {
            if b.deadline <= now {
                expired.push(OpenBatch {
                    key: b.key.take(),
                    records: std::mem::take(&mut b.records),
                    waiters: std::mem::take(&mut b.waiters),
                    frame_bytes: b.frame_bytes,
                    stored_bytes: b.stored_bytes,
                    deadline: b.deadline,
                });
                false
            } else {
                true
            }
        });
        expired.sort_by_key(|b| b.deadline);
        for batch in expired {
            self.send_batch(batch).await;
        }
    }

    async fn flush_all(&mut self) {
        let mut all: Vec<OpenBatch> = self.open.drain().map(|(_, b)| b).collect();
        all.sort_by_key(|b| b.deadline);
        for batch in all {
            self.send_batch(batch).await;
        }
    }

    async fn wait_in_flight(&self) {
        let n = self.settings.in_flight_batches_max as u32;
        if let Ok(permits) = self.in_flight.acquire_many(n).await {
            drop(permits);
        }
    }

    /// The lane for a batch with `key` on the slot's current connection, opening the
    /// connection (with backoff) or lanes as needed.
    async fn lane(&mut self, key: Option<&Bytes>) -> Result<(Arc<Conn>, Arc<Lane>), ClientError> {
        let conn = self.client.shared.conn(self.slot).await?;
        let same = self.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn));
        if !same || self.lanes.iter().any(|l| l.is_closed()) {
            self.lanes.clear();
            self.conn = Some(conn.clone());
        }
        let lanes_max = self.client.shared.config.streams_per_connection.max(1);
        let index = match key {
            Some(k) => (key_hash(k) % lanes_max as u64) as usize,
            None => {
                self.next_lane = self.next_lane.wrapping_add(1);
                self.next_lane % lanes_max
            }
        };
        while self.lanes.len() <= index {
            self.lanes.push(conn.open_lane().await?);
        }
        Ok((conn, self.lanes[index].clone()))
    }

    async fn send_batch(&mut self, batch: OpenBatch) {
        let OpenBatch { key, records, waiters, .. } = batch;
        let (conn, lane) = match self.lane(key.as_ref()).await {
            Ok(x) => x,
            Err(e) => return fail(waiters, e),
        };
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            return fail(waiters, ClientError::Closed);
        };
        let mode = self.settings.ack_mode;
        let id = if mode == AckMode::None { RequestId(0) } else { conn.next_request_id() };
        let count = records.len();
        let frame = Frame::Publish(Publish {
            ack: (mode != AckMode::None).then_some(AckRequest { request_id: id, mode }),
            key,
            stream: self.stream.clone(),
            records,
        });
        let bytes = match conn.encode_checked(&frame) {
            Ok(b) => b,
            Err(e) => return fail(waiters, e),
        };
        let rx = match lane.send_request(id, &bytes).await {
            Ok(rx) => rx,
            Err(e) => {
                self.lanes.clear();
                return fail(waiters, e);
            }
        };
        if mode == AckMode::None {
            drop(permit);
            for w in waiters {
                let _ = w.send(Ok(None));
            }
            return;
        }
        let waiter = lane.waiter();
        let limit = conn.ack_timeout();
        tokio::spawn(async move {
            let _permit = permit;
            match waiter.wait(id, rx, limit, "ack").await {
                Ok(Frame::PublishAck(ack)) if ack.count as usize == count => {
                    for (i, w) in waiters.into_iter().enumerate() {
                        let offset = Offset(ack.base_offset.0 + i as u64);
                        let _ = w.send(Ok(Some(Receipt { shard: ack.shard, offset })));
                    }
                }
                Ok(Frame::PublishAck(ack)) => fail(
                    waiters,
                    ClientError::Protocol(format!("ack for {} records of {count}", ack.count)),
                ),
                Ok(other) => fail(
                    waiters,
                    crate::conn::unexpected(&other, felix_proto::FrameType::PublishAck),
                ),
                Err(e) => fail(waiters, e),
            }
        });
    }
}

fn fail(waiters: Vec<oneshot::Sender<PublishResult>>, e: ClientError) {
    for w in waiters {
        let _ = w.send(Err(e.clone()));
    }
}
