//! The publisher: batching per key with a linger time and size limits, one worker task per
//! connection of the pool (no task carries every connection's batches), acks resolved per batch
//! (`crate::batch`: the records of a batch share one outcome; no channel per record).
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
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{key_hash, shard_for_key, AckMode, Capabilities, Limits, Record, ShardId};
use tokio::sync::oneshot;

use crate::batch::{frame_fixed_bytes, BatchCaps, WorkerQueue};
pub use crate::batch::{
    PublishResult, PublishTicket, Receipt, LINGER_TIMER_SLACK_US, OPEN_BATCHES_MAX,
    WORKER_QUEUE_RECORDS,
};
use crate::client::Client;
use crate::cluster::{unavailable, Cluster};
use crate::config::PublishSettings;
use crate::error::ClientError;
use crate::pool::Pool;
pub use crate::producer::PRODUCER_IN_FLIGHT_MAX;
use crate::send_stats::{SendStats, SendStatsReader};
use crate::worker::{Worker, WorkerCtx};

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

/// The workers of one broker's pool, one per connection.
struct BrokerWorkers {
    pool: Arc<Pool>,
    workers: Vec<Arc<WorkerQueue>>,
    /// Worker index for each broker core, when some connection is owned by that core.
    worker_of_core: HashMap<u16, usize>,
}

/// The last handle gone: every worker sends what it holds, waits for its acks and stops.
impl Drop for PubShared {
    fn drop(&mut self) {
        let others = self.others.get_mut().unwrap_or_else(|p| p.into_inner());
        for broker in std::iter::once(&self.home).chain(others.values()) {
            for queue in &broker.workers {
                queue.close();
            }
        }
    }
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
            // The description needs the token's Read, which publish or subscribe grants: a
            // token with neither is refused here, and a publisher is to hear of Publish.
            Err(ClientError::Broker {
                code: code @ felix_proto::ErrorCode::Forbidden,
                message,
            }) if message.contains("does not allow") => {
                let message = format!("the token does not allow Publish on {stream}");
                return Err(ClientError::Broker { code, message });
            }
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
        let shard_count = shard_count.filter(|n| *n > 0);
        let ctx = Arc::new(WorkerCtx {
            client,
            stream,
            settings,
            shard_count,
            shard_producers: Mutex::default(),
            untagged: Mutex::default(),
            send_stats: Arc::default(),
        });
        Ok(Self {
            shared: Arc::new(PubShared {
                home: BrokerWorkers::start(home, &ctx),
                ctx,
                caps,
                limits,
                others: Mutex::new(HashMap::new()),
                shard_count,
                unkeyed_records: AtomicU64::new(0),
            }),
        })
    }

    /// How long this publisher's batches waited in the client before they were written, and
    /// which limit held them (since the publisher started; clones share it). See
    /// [`SendStats`].
    pub fn send_stats(&self) -> SendStats {
        self.shared.ctx.send_stats.snapshot()
    }

    /// A reader of [`Publisher::send_stats`] that does not keep the publisher open.
    pub fn send_stats_reader(&self) -> SendStatsReader {
        SendStatsReader(self.shared.ctx.send_stats.clone())
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
        let fixed = frame_fixed_bytes(s.ctx.stream.len(), record.key.as_ref());
        let room = (s.limits.max_frame_bytes as usize).saturating_sub(fixed + 4);
        if record.value.len() > room {
            return Err(ClientError::RecordTooLarge { len: record.value.len(), max: room });
        }
        let (broker, worker) = match (self.cluster(), &record.key) {
            (Some(_), Some(key)) => self.route_sticky(key).await?,
            _ => self.route(record.key.as_deref()).await?,
        };
        broker.workers[worker].push(record).await
    }

    /// In a cluster: where a keyed record goes. To the worker still holding untagged records
    /// of its key, if one does (see `WorkerCtx::untagged`), else by the placement.
    async fn route_sticky(&self, key: &Bytes) -> Result<(Arc<BrokerWorkers>, usize), ClientError> {
        let s = &self.shared;
        let held = s.ctx.untagged.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied();
        let target = match held
            .and_then(|(addr, worker, _)| self.workers_by_addr(addr).map(|b| (b, worker)))
        {
            Some(t) => t,
            None => self.route(Some(key)).await?,
        };
        let addr = target.0.pool.addr();
        let mut untagged = s.ctx.untagged.lock().unwrap_or_else(|p| p.into_inner());
        let entry = untagged.entry(key.clone()).or_insert((addr, target.1, 0));
        if (entry.0, entry.1) == (addr, target.1) {
            entry.2 += 1;
        }
        Ok(target)
    }

    /// The started workers of the broker at `addr`.
    fn workers_by_addr(&self, addr: SocketAddr) -> Option<Arc<BrokerWorkers>> {
        let s = &self.shared;
        if s.home.pool.addr() == addr {
            return Some(s.home.clone());
        }
        s.others.lock().unwrap_or_else(|p| p.into_inner()).get(&addr).cloned()
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
            w.flush(tx);
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
                let mut live = placement.live_addresses();
                // A broker that failed a moment ago is left out while others are live.
                if let Some(c) = self.cluster() {
                    let up = |a: &&str| c.resolved(a).is_none_or(|a| c.penalty(a).is_none());
                    if live.iter().any(up) {
                        live.retain(up);
                    }
                }
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
        let settings = &ctx.settings;
        let caps = BatchCaps {
            records_max: settings.batch_records_max.min(limits.max_batch_records).max(1) as usize,
            frame_bytes_max: limits.max_frame_bytes as usize,
            stored_bytes_max: settings.batch_bytes_max as usize,
            linger: Duration::from_micros(settings.linger_us),
            stream_len: ctx.stream.len(),
        };
        let workers = (0..pool.len())
            .map(|slot| {
                let queue = Arc::new(WorkerQueue::new(caps));
                Worker::spawn(ctx.clone(), pool.clone(), slot, queue.clone());
                queue
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
