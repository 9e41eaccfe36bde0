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
//!
//! In a cluster (`crate::cluster`), each broker's pool gets its own workers, started on first
//! use: a keyed record goes to the workers of its shard's owner (from the cached placement),
//! then as above to the connection of the shard's core there; unkeyed records rotate over the
//! live owners of the stream's shards, a batch at a time. A batch refused with `NotOwner` is
//! sent again to the named owner, and one refused with `ShardUnavailable` is retried within
//! `cluster::SHARD_UNAVAILABLE_DEADLINE_MS`: the broker stored nothing of either, so nothing is
//! lost or duplicated.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
use crate::cluster::{is_unreachable, unavailable, Cluster};
use crate::config::PublishSettings;
use crate::conn::{Conn, Lane};
use crate::error::ClientError;
use crate::pool::Pool;

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
    ctx: Arc<WorkerCtx>,
    caps: Capabilities,
    limits: Limits,
    /// The workers of the home broker's pool: all of them for a single-node broker.
    home: Arc<BrokerWorkers>,
    /// In a cluster: the workers of the other brokers' pools, started on first use (at most
    /// one set per pool, so bounded by `cluster::BROKER_POOLS_MAX`).
    others: Mutex<HashMap<SocketAddr, Arc<BrokerWorkers>>>,
    /// The stream's shard count, for routing keys to the core that owns their shard.
    shard_count: Option<u32>,
    unkeyed_records: AtomicU64,
}

/// What every worker of one publisher shares.
struct WorkerCtx {
    client: Client,
    stream: String,
    settings: PublishSettings,
}

/// The workers of one broker's pool, one per connection.
struct BrokerWorkers {
    pool: Arc<Pool>,
    workers: Vec<mpsc::Sender<Cmd>>,
    /// Worker index for each broker core, when some connection is owned by that core.
    worker_of_core: HashMap<u16, usize>,
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
        if let Some(cluster) = &client.shared.cluster {
            // Route from the first record on; a stream not placed yet is routed by the
            // brokers' answers until a later fetch succeeds.
            if let Err(e) = cluster.placement(&stream).await {
                tracing::debug!(stream, error = %e, "no placement yet");
            }
        }
        let limits = client.limits();
        let home = client.shared.home.clone();
        let ctx = Arc::new(WorkerCtx { client, stream, settings });
        Ok(Self {
            shared: Arc::new(PubShared {
                home: BrokerWorkers::start(home, &ctx),
                ctx,
                caps,
                limits,
                others: Mutex::new(HashMap::new()),
                shard_count: shard_count.filter(|n| *n > 0),
                unkeyed_records: AtomicU64::new(0),
            }),
        })
    }

    /// The stream this publisher writes to.
    pub fn stream(&self) -> &str {
        &self.shared.ctx.stream
    }

    /// The shard a key goes to, when the stream's shard count is known.
    pub fn shard_for_key(&self, key: &[u8]) -> Option<ShardId> {
        let placed = self.cluster().and_then(|c| c.cached(self.stream())).map(|p| p.shards());
        placed.or(self.shared.shard_count).map(|n| shard_for_key(key, n))
    }

    /// Queues `record` for the next batch; waits only when the worker's queue is full.
    ///
    /// Fails at once, sending nothing, when the record is keyed and the broker did not
    /// advertise `PUBLISH_KEYED` (`Unsupported("keyed publish")`), when the key is over the
    /// broker's limit, or when the record cannot fit in a frame. In a cluster, also when the
    /// publisher does not ask for acks and the record's shard is unavailable or its owner
    /// cannot be reached (`ShardUnavailable`, or the connect error): an unacked record sent
    /// elsewhere would be dropped unseen.
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
        let fixed = frame_fixed_bytes(&s.ctx.stream, record.key.as_ref());
        let room = (s.limits.max_frame_bytes as usize).saturating_sub(fixed + 4);
        if record.value.len() > room {
            return Err(ClientError::RecordTooLarge { len: record.value.len(), max: room });
        }
        let (broker, worker) = self.route(record.key.as_deref()).await?;
        let (tx, rx) = oneshot::channel();
        let queue = &broker.workers[worker];
        queue.send(Cmd::Record(record, tx)).await.map_err(|_| ClientError::Closed)?;
        Ok(PublishTicket { rx })
    }

    /// Sends `record` and waits for its ack.
    pub async fn publish(&self, record: Record) -> PublishResult {
        self.send(record).await?.await
    }

    /// Sends every queued record and waits until every batch sent so far is acked or failed.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let mut brokers = vec![self.shared.home.clone()];
        brokers
            .extend(self.shared.others.lock().unwrap_or_else(|p| p.into_inner()).values().cloned());
        let mut waits = Vec::new();
        for w in brokers.iter().flat_map(|b| b.workers.iter()) {
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

    fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.shared.ctx.client.shared.cluster.as_ref()
    }

    /// The workers and the worker index a record with `key` goes to.
    async fn route(&self, key: Option<&[u8]>) -> Result<(Arc<BrokerWorkers>, usize), ClientError> {
        let s = &self.shared;
        let placement = self.cluster().and_then(|c| c.cached(&s.ctx.stream));
        let Some(placement) = placement else {
            return Ok((s.home.clone(), self.home_worker_for(key)));
        };
        let unacked = s.ctx.settings.ack_mode == AckMode::None;
        match key {
            Some(key) => {
                let shard = shard_for_key(key, placement.shards());
                let owner = placement.owner(shard).filter(|o| o.live);
                let Some(owner) = owner else {
                    if let Some(c) = self.cluster() {
                        c.invalidate(&s.ctx.stream); // the owner may be back: look again
                    }
                    if unacked {
                        return Err(unavailable(&s.ctx.stream, Some(shard)));
                    }
                    // A live broker answers ShardUnavailable; the ack task retries.
                    let broker = match placement.live_addresses().first() {
                        Some(via) => self.workers_at(via, false).await?,
                        None => s.home.clone(),
                    };
                    return Ok((broker.clone(), broker.worker_for_key(key, Some(shard))));
                };
                let broker = self.workers_at(&owner.address, unacked).await?;
                let worker = broker.worker_for_key(key, Some(shard));
                Ok((broker, worker))
            }
            None => {
                let live = placement.live_addresses();
                if live.is_empty() {
                    return Ok((s.home.clone(), self.home_worker_for(None)));
                }
                let i = s.unkeyed_records.fetch_add(1, Ordering::Relaxed);
                let batch = (i / u64::from(s.ctx.settings.batch_records_max.max(1))) as usize;
                let broker = self.workers_at(live[batch % live.len()], unacked).await?;
                let worker = (batch / live.len()) % broker.workers.len();
                Ok((broker, worker))
            }
        }
    }

    /// The workers of the broker at `address`, started on first use. When the broker cannot
    /// be reached, an acked record goes to the home broker instead (its answer, NotOwner or
    /// ShardUnavailable, is followed by the ack task); an unacked one fails.
    async fn workers_at(
        &self,
        address: &str,
        unacked: bool,
    ) -> Result<Arc<BrokerWorkers>, ClientError> {
        let s = &self.shared;
        let Some(cluster) = self.cluster() else { return Ok(s.home.clone()) };
        let pool = match cluster.pool_for(address).await {
            Ok(pool) => pool,
            Err(e) if unacked => return Err(e),
            Err(e) => {
                tracing::debug!(broker = address, error = %e, "owner unreachable, via home");
                return Ok(s.home.clone());
            }
        };
        if pool.addr() == s.home.pool.addr() {
            return Ok(s.home.clone());
        }
        let mut others = s.others.lock().unwrap_or_else(|p| p.into_inner());
        let broker =
            others.entry(pool.addr()).or_insert_with(|| BrokerWorkers::start(pool, &s.ctx)).clone();
        Ok(broker)
    }

    /// The home worker for `key` (single node, or no placement known yet).
    fn home_worker_for(&self, key: Option<&[u8]>) -> usize {
        let s = &self.shared;
        match key {
            Some(key) => s.home.worker_for_key(key, s.shard_count.map(|n| shard_for_key(key, n))),
            None => {
                let n = s.home.workers.len();
                let i = s.unkeyed_records.fetch_add(1, Ordering::Relaxed);
                let per_batch = u64::from(s.ctx.settings.batch_records_max.max(1));
                ((i / per_batch) % n as u64) as usize
            }
        }
    }
}

impl BrokerWorkers {
    /// Starts one worker per connection of `pool`.
    fn start(pool: Arc<Pool>, ctx: &Arc<WorkerCtx>) -> Arc<Self> {
        let mut worker_of_core = HashMap::new();
        for i in 0..pool.len() {
            if let Some(core) = pool.slot_core(i) {
                worker_of_core.entry(core).or_insert(i);
            }
        }
        let limits = pool.hello().limits;
        let in_flight_max = ctx.settings.in_flight_batches_max;
        let workers = (0..pool.len())
            .map(|slot| {
                let (tx, rx) = mpsc::channel(WORKER_QUEUE_RECORDS);
                let worker = Worker {
                    ctx: ctx.clone(),
                    pool: pool.clone(),
                    slot,
                    limits,
                    open: HashMap::new(),
                    conn: None,
                    lanes: Vec::new(),
                    next_lane: 0,
                    in_flight: Arc::new(Semaphore::new(in_flight_max)),
                };
                tokio::spawn(worker.run(rx));
                tx
            })
            .collect();
        Arc::new(Self { pool, workers, worker_of_core })
    }

    /// The worker of the connection owned by `shard`'s core when there is one (the broker's
    /// rule: shard `s` lives on core `s % core_count`), else one chosen by the key's hash.
    fn worker_for_key(&self, key: &[u8], shard: Option<ShardId>) -> usize {
        let cores = u32::from(self.pool.hello().core_count.max(1));
        shard
            .and_then(|s| self.worker_of_core.get(&((s.0 % cores) as u16)).copied())
            .unwrap_or((key_hash(key) % self.workers.len() as u64) as usize)
    }
}

/// Bytes of a Publish frame besides its records: header, ack prefix, key, stream, count.
fn frame_fixed_bytes(stream: &str, key: Option<&Bytes>) -> usize {
    HEADER_LEN + 9 + key.map_or(0, |k| 2 + k.len()) + 2 + stream.len() + 4
}

/// A batch being filled.
struct OpenBatch {
    key: Option<Bytes>,
    records: Vec<felix_proto::Payload>,
    waiters: Vec<oneshot::Sender<PublishResult>>,
    /// The Publish frame's size so far (header included).
    frame_bytes: usize,
    /// Payload plus key bytes per record: what the broker stores (its batch limit).
    stored_bytes: usize,
    deadline: Instant,
}

/// Batches and sends the records of one connection slot of one broker's pool.
struct Worker {
    ctx: Arc<WorkerCtx>,
    pool: Arc<Pool>,
    slot: usize,
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
        self.ctx.settings.batch_records_max.min(self.limits.max_batch_records).max(1) as usize
    }

    async fn add(&mut self, record: Record, tx: oneshot::Sender<PublishResult>) {
        let Record { key, value } = record;
        let frame_record_bytes = 4 + value.len();
        let stored_record_bytes = value.len() + key.as_ref().map_or(0, Bytes::len);
        let fixed = frame_fixed_bytes(&self.ctx.stream, key.as_ref());
        let frame_cap = self.limits.max_frame_bytes as usize;
        let stored_cap = self.ctx.settings.batch_bytes_max as usize;
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
        let linger = Duration::from_micros(self.ctx.settings.linger_us);
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
        let n = self.ctx.settings.in_flight_batches_max as u32;
        if let Ok(permits) = self.in_flight.acquire_many(n).await {
            drop(permits);
        }
    }

    /// The lane for a batch with `key` on the slot's current connection, opening the
    /// connection (with backoff) or lanes as needed.
    async fn lane(&mut self, key: Option<&Bytes>) -> Result<(Arc<Conn>, Arc<Lane>), ClientError> {
        let conn = self.pool.conn(self.slot).await?;
        let same = self.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn));
        if !same || self.lanes.iter().any(|l| l.is_closed()) {
            self.lanes.clear();
            self.conn = Some(conn.clone());
        }
        let lanes_max = self.ctx.client.shared.config.streams_per_connection.max(1);
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
        let cluster = self.ctx.client.shared.cluster.clone();
        let mode = self.ctx.settings.ack_mode;
        let (conn, lane) = match self.lane(key.as_ref()).await {
            Ok(x) => x,
            Err(e) => {
                // Nothing was sent: in a cluster, an acked batch whose broker is out of reach
                // is retried at the shard's owner after a fresh look at the placement.
                if let Some(cluster) = cluster.filter(|_| mode != AckMode::None) {
                    if is_unreachable(&e) {
                        cluster.invalidate(&self.ctx.stream);
                        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
                            return fail(waiters, ClientError::Closed);
                        };
                        let resend = Resend { stream: self.ctx.stream.clone(), key, records, mode };
                        let first = Err(unavailable(&self.ctx.stream, None));
                        tokio::spawn(async move {
                            let _permit = permit;
                            let answer = resend.follow(&cluster, first).await;
                            resolve(waiters, resend.records.len(), answer);
                        });
                        return;
                    }
                }
                return fail(waiters, e);
            }
        };
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            return fail(waiters, ClientError::Closed);
        };
        let id = if mode == AckMode::None { RequestId(0) } else { conn.next_request_id() };
        let count = records.len();
        let frame = Frame::Publish(Publish {
            ack: (mode != AckMode::None).then_some(AckRequest { request_id: id, mode }),
            key,
            stream: self.ctx.stream.clone(),
            records,
        });
        let bytes = match conn.encode_checked(&frame) {
            Ok(b) => b,
            Err(e) => return fail(waiters, e),
        };
        // In a cluster, an acked batch is kept until its ack: a broker that refuses it with
        // NotOwner or ShardUnavailable stored nothing, and it is sent again.
        let resend = match (frame, &cluster) {
            (Frame::Publish(p), Some(_)) if mode != AckMode::None => {
                Some(Resend { stream: p.stream, key: p.key, records: p.records, mode })
            }
            _ => None,
        };
        let rx = match lane.send_request(id, &bytes).await {
            Ok(rx) => rx,
            Err(e) => {
                self.lanes.clear();
                if let Some(c) = &cluster {
                    c.invalidate(&self.ctx.stream);
                }
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
            let mut answer = waiter.wait(id, rx, limit, "ack").await;
            if let (Some(cluster), Some(resend)) = (cluster, resend) {
                if answer.as_ref().is_err_and(ClientError::is_connection_lost) {
                    // The outcome is unknown (no resend), but the broker may be gone.
                    cluster.invalidate(&resend.stream);
                }
                answer = resend.follow(&cluster, answer).await;
            }
            resolve(waiters, count, answer);
        });
    }
}

/// An acked batch kept for sending again in a cluster.
#[derive(Clone)]
struct Resend {
    stream: String,
    key: Option<Bytes>,
    records: Vec<felix_proto::Payload>,
    mode: AckMode,
}

impl Resend {
    /// Follows `first` (see `Cluster::follow`): a NotOwner or ShardUnavailable answer sends
    /// the batch again, on the control lane of the owner's connection for its shard.
    async fn follow(
        &self,
        cluster: &Cluster,
        first: Result<Frame, ClientError>,
    ) -> Result<Frame, ClientError> {
        let shard = match (&self.key, cluster.cached_shards(&self.stream)) {
            (Some(key), Some(n)) => Some(shard_for_key(key, n)),
            _ => None,
        };
        cluster
            .follow(&self.stream, shard, first, |conn| {
                let batch = self.clone();
                async move {
                    let id = conn.next_request_id();
                    let frame = Frame::Publish(Publish {
                        ack: Some(AckRequest { request_id: id, mode: batch.mode }),
                        key: batch.key,
                        stream: batch.stream,
                        records: batch.records,
                    });
                    conn.request(id, &frame).await
                }
            })
            .await
    }
}

/// Resolves the waiters of a batch of `count` records with its ack (or failure).
fn resolve(
    waiters: Vec<oneshot::Sender<PublishResult>>,
    count: usize,
    answer: Result<Frame, ClientError>,
) {
    match answer {
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
        Ok(other) => {
            fail(waiters, crate::conn::unexpected(&other, felix_proto::FrameType::PublishAck))
        }
        Err(e) => fail(waiters, e),
    }
}

fn fail(waiters: Vec<oneshot::Sender<PublishResult>>, e: ClientError) {
    for w in waiters {
        let _ = w.send(Err(e.clone()));
    }
}
