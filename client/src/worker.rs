//! A publisher's worker: one per connection of a broker's pool. It takes the batches its queue
//! makes ready, tags idempotent ones with their producer's next sequence number, writes them on
//! one of the connection's publish lanes and hands each to a task that waits for its ack, and
//! sends again what must be sent again (docs/client.md, "Idempotent publishing and retries",
//! "Retries").
//!
//! Call order: [`Worker::spawn`] (by the publisher, per connection slot); the worker runs until
//! its queue is closed and everything sent is answered.
//!
//! On one broker a tagged batch whose outcome is unknown is parked and sent again on the next
//! connection, in its producer's order. In a cluster an acked batch is never waited for on a
//! broker its shard has left: one the cached placement shows elsewhere, or whose broker failed
//! a moment ago, goes to the shard's owner at once (`Resend::follow`), and one whose ack does
//! not come follows its shard (`Resend::wait_or_leave`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{
    key_hash, shard_for_key, AckMode, AckRequest, Capabilities, ErrorCode, Frame, Payload, Publish,
    RequestId, ShardId,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

use crate::batch::{Batch, BatchResult, Completion, Ready, WorkerQueue};
use crate::client::Client;
use crate::cluster::{is_unreachable, unavailable, Cluster};
use crate::config::PublishSettings;
use crate::conn::{Conn, Lane};
use crate::error::ClientError;
use crate::pool::Pool;
use crate::producer::{mark_broken, outcome_unknown, take_tag, Producer, TagHold};
use crate::resend::{is_shutting_down, note_failure, resolve, Resend};
use crate::send_stats::SendRecorder;
use crate::timer::FineTimer;

/// What every worker of one publisher shares.
pub(crate) struct WorkerCtx {
    pub(crate) client: Client,
    pub(crate) stream: String,
    pub(crate) settings: PublishSettings,
    /// The stream's shard count when the publisher started (keys map to producers by shard).
    pub(crate) shard_count: Option<u32>,
    /// In a cluster, the producers of tagged batches, by (shard, lane), shared by the workers
    /// of every broker: when a shard's leader changes, its batches go on under the same
    /// producer at the next leader, whose sequence check keeps them in order behind the
    /// retried ones. Each producer's id names its shard (`Producer::on_shard`), so an unkeyed
    /// batch is stored there too.
    pub(crate) shard_producers: Mutex<HashMap<(ShardId, usize), Producer>>,
    /// In a cluster, each key with records queued and not yet tagged: the worker holding them
    /// (its broker's address and index) and how many. A key's next records go to that worker
    /// too, whatever the placement says meanwhile, so a key's batches take their producer's
    /// sequence numbers in record order even while its shard moves (bounded by the records
    /// queued).
    pub(crate) untagged: Mutex<HashMap<Bytes, (SocketAddr, usize, usize)>>,
    /// How long batches waited in the workers before they were written.
    pub(crate) send_stats: Arc<SendRecorder>,
}

impl WorkerCtx {
    /// `records` records of `key` left the untagged state (their batch got its tag, or goes
    /// without one).
    pub(crate) fn tagged(&self, key: Option<&Bytes>, records: usize) {
        let Some(key) = key else { return };
        let mut untagged = self.untagged.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = untagged.get_mut(key) {
            entry.2 = entry.2.saturating_sub(records);
            if entry.2 == 0 {
                untagged.remove(key);
            }
        }
    }
}

/// Sends the batches of one connection slot of one broker's pool, in the order its queue makes
/// them ready.
///
/// Idempotent batches (`PublishSettings::idempotent`): each (shard, lane) of the worker has its
/// own producer id, so one producer's batches go to one shard on one QUIC stream, in sequence
/// order. A tagged batch whose connection is lost (or whose ack times out) is parked in `lost`
/// by its ack task; before it sends anything new, the worker waits until every batch in flight
/// is answered or parked, then sends the parked ones again, oldest first, with their tags: the
/// broker stores each once and keeps each producer's order.
pub(crate) struct Worker {
    ctx: Arc<WorkerCtx>,
    pool: Arc<Pool>,
    slot: usize,
    queue: Arc<WorkerQueue>,
    /// The connection `lanes` belong to.
    conn: Option<Arc<Conn>>,
    lanes: Vec<Arc<Lane>>,
    next_lane: usize,
    in_flight: Arc<Semaphore>,
    /// The producer of each (shard, lane) this worker sent tagged batches on.
    producers: HashMap<(Option<ShardId>, usize), Producer>,
    /// In a cluster: the turn of the next unkeyed batch among the shards its broker owns.
    next_unkeyed: usize,
    /// Tagged batches to send again (bounded: each held an in-flight permit when parked).
    lost: Arc<Mutex<Vec<Outgoing>>>,
    /// Batches sent so far: the send order of parked batches.
    sent: u64,
}

/// A batch on its way: what sending it (again) needs.
struct Outgoing {
    key: Option<Bytes>,
    /// The batch's shard, when the client knows it: a tagged batch's, or a key's by the
    /// shard count.
    shard: Option<ShardId>,
    records: Vec<Payload>,
    completion: Completion,
    lane: usize,
    /// The producer tag and its place in the producer's window (idempotent batches only).
    tag: Option<TagHold>,
    /// When the batch was first sent: it is retried until `retry_timeout_ms` after that.
    first_sent: Instant,
    /// Send order, for sending parked batches again oldest first.
    order: u64,
    /// When the batch became ready, until it is first written (for [`SendStats`]).
    ready_at: Option<Instant>,
}

/// A worker gone (stopped, or its task dropped) fails what is still queued.
impl Drop for Worker {
    fn drop(&mut self) {
        self.queue.shut();
    }
}

impl Worker {
    /// Starts the worker of slot `slot` of `pool`, taking its batches from `queue`.
    pub(crate) fn spawn(
        ctx: Arc<WorkerCtx>,
        pool: Arc<Pool>,
        slot: usize,
        queue: Arc<WorkerQueue>,
    ) {
        let in_flight = Arc::new(Semaphore::new(ctx.settings.in_flight_batches_max));
        let worker = Worker {
            ctx,
            pool,
            slot,
            queue,
            conn: None,
            lanes: Vec::new(),
            next_lane: 0,
            in_flight,
            producers: HashMap::new(),
            next_unkeyed: 0,
            lost: Arc::new(Mutex::new(Vec::new())),
            sent: 0,
        };
        tokio::spawn(worker.run());
    }

    async fn run(mut self) {
        let mut timer = FineTimer::new();
        loop {
            // One item at a time: what is not taken yet keeps filling while this one waits.
            let (item, closed) = self.queue.take_next();
            let idle = item.is_none();
            match item {
                Some(Ready::Batch(batch)) => self.send_batch(batch).await,
                Some(Ready::Flush(done)) => {
                    self.settle().await;
                    let _ = done.send(());
                }
                None if closed => {
                    self.settle().await;
                    return;
                }
                None => {}
            }
            if self.has_lost() {
                self.resend_lost().await;
            } else if idle {
                self.queue.poll_deadline(&mut timer).await;
            }
        }
    }

    /// Waits until every batch sent is acked or failed, sending parked batches again meanwhile.
    async fn settle(&mut self) {
        loop {
            self.wait_in_flight().await;
            if !self.has_lost() {
                return;
            }
            self.resend_lost().await;
        }
    }

    fn has_lost(&self) -> bool {
        !self.lost.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Sends the parked batches again, oldest first, once nothing else is in flight (so none of
    /// their producers has a later batch on the wire).
    async fn resend_lost(&mut self) {
        self.wait_in_flight().await;
        let mut lost = std::mem::take(&mut *self.lost.lock().unwrap_or_else(|p| p.into_inner()));
        lost.sort_by_key(|o| o.order);
        let count = lost.len();
        for out in lost {
            self.send_outgoing(out).await;
        }
        // Everything was parked again (the broker is still out of reach): do not spin.
        if count > 0 && self.lost.lock().unwrap_or_else(|p| p.into_inner()).len() == count {
            tokio::time::sleep(Duration::from_millis(RESEND_PAUSE_MS)).await;
        }
    }

    /// An in-flight slot (`None`: the publisher is closing), counting a wait for one.
    async fn in_flight_permit(&self) -> Option<OwnedSemaphorePermit> {
        match self.in_flight.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(TryAcquireError::Closed) => None,
            Err(TryAcquireError::NoPermits) => {
                let started = Instant::now();
                let permit = self.in_flight.clone().acquire_owned().await.ok();
                self.ctx.send_stats.in_flight_wait(started.elapsed());
                permit
            }
        }
    }

    async fn wait_in_flight(&self) {
        let n = self.ctx.settings.in_flight_batches_max as u32;
        if let Ok(permits) = self.in_flight.acquire_many(n).await {
            drop(permits);
        }
    }

    /// The lane index a batch with `key` takes: the key's hash, or the next one in turn.
    fn lane_index(&mut self, key: Option<&Bytes>) -> usize {
        let lanes_max = self.ctx.client.shared.config.streams_per_connection.max(1);
        match key {
            Some(k) => (key_hash(k) % lanes_max as u64) as usize,
            None => {
                self.next_lane = self.next_lane.wrapping_add(1);
                self.next_lane % lanes_max
            }
        }
    }

    /// Lane `index` on the slot's current connection, opening the connection or lanes as
    /// needed: with backoff on one broker, in a cluster with one attempt (the batch fails over
    /// to its shard's next owner instead of waiting for a broker that may be gone). The flag
    /// says the connection is not the one the last batch took.
    async fn lane(&mut self, index: usize) -> Result<(Arc<Conn>, Arc<Lane>, bool), ClientError> {
        let conn = match &self.ctx.client.shared.cluster {
            Some(cluster) => cluster.pool_conn(&self.pool, self.slot).await?,
            None => self.pool.conn(self.slot).await?,
        };
        let same = self.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn));
        let changed = !same && self.conn.is_some();
        if !same || self.lanes.iter().any(|l| l.is_closed()) {
            self.lanes.clear();
            self.conn = Some(conn.clone());
        }
        while self.lanes.len() <= index {
            self.lanes.push(conn.open_lane().await?);
        }
        Ok((conn, self.lanes[index].clone(), changed))
    }

    /// The producer a batch with `key` on `lane` belongs to, when batches are idempotent.
    fn producer_of(
        &mut self,
        key: Option<&Bytes>,
        lane: usize,
    ) -> Option<(Option<ShardId>, usize)> {
        let settings = &self.ctx.settings;
        let caps = self.pool.hello().capabilities;
        if !settings.idempotent
            || settings.ack_mode == AckMode::None
            || !caps.contains(Capabilities::IDEMPOTENT)
        {
            return None;
        }
        let shards = self.ctx.shard_count?;
        let shard = match key {
            // A producer's batches must all reach one shard: without the shard count, a key's
            // shard is unknown, and the batch goes untagged.
            Some(k) => Some(shard_for_key(k, shards)),
            // An unkeyed tagged batch goes to the producer's shard (producer id mod shards),
            // not to a shard of the core it reached. In a cluster: a shard this broker owns,
            // its producer's id naming it. On one broker: tagged only where the connection
            // names its core, with a producer id whose shard that core owns (below), so it
            // costs no hop.
            None if self.ctx.client.shared.cluster.is_some() => Some(self.unkeyed_shard(shards)),
            None => {
                self.pool.slot_core(self.slot)?;
                None
            }
        };
        Some((shard, lane))
    }

    /// In a cluster, the shard of the next unkeyed batch: in turn, one that the cached
    /// placement shows this worker's broker owning (live), on the core of the worker's
    /// connection if it can; any shard in turn when it owns none (the batch then fails over to
    /// that shard's owner).
    fn unkeyed_shard(&mut self, shards: u32) -> ShardId {
        self.next_unkeyed = self.next_unkeyed.wrapping_add(1);
        let turn = self.next_unkeyed;
        let any = ShardId((turn % shards.max(1) as usize) as u32);
        let Some(cluster) = &self.ctx.client.shared.cluster else { return any };
        let Some(placement) = cluster.cached(&self.ctx.stream) else { return any };
        let here = self.pool.addr();
        let owned: Vec<u32> = (0..shards)
            .filter(|s| {
                placement.owner(ShardId(*s)).is_some_and(|o| {
                    o.live && cluster.resolved(&o.address).is_some_and(|a| a == here)
                })
            })
            .collect();
        let cores = u32::from(self.pool.hello().core_count.max(1));
        let core = self.pool.slot_core(self.slot).map(u32::from);
        let on_core: Vec<u32> = owned.iter().copied().filter(|s| Some(s % cores) == core).collect();
        match (on_core.is_empty(), owned.is_empty()) {
            (false, _) => ShardId(on_core[turn % on_core.len()]),
            (true, false) => ShardId(owned[turn % owned.len()]),
            (true, true) => any,
        }
    }

    /// The next tag of producer `which`, once its window (`PRODUCER_IN_FLIGHT_MAX` sequence numbers from its oldest unresolved batch)
    /// has room (sending parked batches again meanwhile).
    async fn next_tag(&mut self, which: (Option<ShardId>, usize)) -> TagHold {
        let cluster = self.ctx.client.shared.cluster.is_some();
        let mut waiting_since: Option<Instant> = None;
        loop {
            let (ctx, pool, slot) = (&self.ctx, &self.pool, self.slot);
            let fresh = move || new_producer(ctx, pool, slot, which);
            let taken = match which {
                (Some(shard), lane) if cluster => {
                    let mut shared = ctx.shard_producers.lock().unwrap_or_else(|p| p.into_inner());
                    take_tag(&mut shared, (shard, lane), fresh)
                }
                _ => take_tag(&mut self.producers, which, fresh),
            };
            let shared = match taken {
                Ok(hold) => {
                    if let Some(since) = waiting_since {
                        self.ctx.send_stats.window_wait(since.elapsed());
                    }
                    return hold;
                }
                Err(shared) => shared,
            };
            waiting_since.get_or_insert_with(Instant::now);
            let resolved = shared.resolved.notified();
            if self.has_lost() {
                self.resend_lost().await;
                continue;
            }
            tokio::select! {
                _ = resolved => {}
                _ = tokio::time::sleep(Duration::from_millis(RESEND_PAUSE_MS)) => {}
            }
        }
    }

    async fn send_batch(&mut self, batch: Batch) {
        let ready_at = batch.ready_at();
        let Batch { key, records, completion, .. } = batch;
        let lane = self.lane_index(key.as_ref());
        let which = self.producer_of(key.as_ref(), lane);
        let tag = match which {
            Some(which) => Some(self.next_tag(which).await),
            None => None,
        };
        let shard = which.and_then(|w| w.0).or_else(|| {
            let cluster = self.ctx.client.shared.cluster.as_ref();
            let shards = cluster.and_then(|c| c.cached_shards(&self.ctx.stream));
            Some(shard_for_key(key.as_ref()?, shards.or(self.ctx.shard_count)?))
        });
        self.ctx.tagged(key.as_ref(), records.len());
        self.sent += 1;
        let out = Outgoing {
            key,
            shard,
            records,
            completion,
            lane,
            tag,
            first_sent: Instant::now(),
            order: self.sent,
            ready_at: Some(ready_at),
        };
        self.send_outgoing(out).await;
    }

    /// Parks a tagged batch to be sent again, or fails it when its retry time is over.
    fn park_or_fail(&self, out: Outgoing, e: ClientError) {
        park_or_fail(&self.lost, &self.queue, &self.ctx.settings, out, e);
    }

    async fn send_outgoing(&mut self, mut out: Outgoing) {
        let cluster = self.ctx.client.shared.cluster.clone();
        let mode = self.ctx.settings.ack_mode;
        // In a cluster, an acked batch whose broker failed a moment ago (penalized), or whose
        // shard the cached placement shows elsewhere (or down), is not sent here: it fails over
        // to the shard's owner at once. Nothing was sent, so this is safe for any batch.
        if let Some(c) = cluster.as_ref().filter(|_| mode != AckMode::None) {
            if self.leaves(c, &out) {
                return self.fail_over(c.clone(), out).await;
            }
        }
        let (conn, lane, changed) = match self.lane(out.lane).await {
            Ok(x) => x,
            Err(e) => {
                if out.tag.is_some() && cluster.is_none() && is_unreachable(&e) {
                    return self.park_or_fail(out, e);
                }
                // Nothing was sent: in a cluster, an acked batch whose broker is out of reach
                // is retried at the shard's owner after a fresh look at the placement (an
                // idempotent one keeps its place in its producer's window until answered).
                if let Some(c) = cluster.filter(|_| mode != AckMode::None && is_unreachable(&e)) {
                    c.invalidate(&self.ctx.stream);
                    return self.fail_over(c, out).await;
                }
                mark_broken(out.tag.as_ref());
                return out.completion.resolve(BatchResult::Failed(e));
            }
        };
        if changed && out.tag.is_some() {
            // A new connection: the batches of the old one are answered or parked first, so
            // that a producer's parked batches go out again before this later one.
            self.wait_in_flight().await;
            if self.has_lost() {
                self.lost.lock().unwrap_or_else(|p| p.into_inner()).push(out);
                return;
            }
        }
        let Some(permit) = self.in_flight_permit().await else {
            return out.completion.resolve(BatchResult::Failed(ClientError::Closed));
        };
        let id = if mode == AckMode::None { RequestId(0) } else { conn.next_request_id() };
        let count = out.records.len();
        let oldest_pending = conn.capabilities().contains(Capabilities::OLDEST_PENDING)
            && out.tag.as_ref().is_some_and(|t| t.producer.is_oldest(t.tag.seq));
        let frame = Frame::Publish(Publish {
            oldest_pending,
            ack: (mode != AckMode::None).then_some(AckRequest { request_id: id, mode }),
            key: out.key.clone(),
            producer: out.tag.as_ref().map(|t| t.tag),
            stream: self.ctx.stream.clone(),
            records: out.records.clone(),
        });
        let bytes = match conn.encode_checked(&frame) {
            Ok(b) => b,
            Err(e) => {
                mark_broken(out.tag.as_ref());
                return out.completion.resolve(BatchResult::Failed(e));
            }
        };
        drop(frame);
        // In a cluster, an acked batch is kept until its ack: a broker that refuses it with
        // NotOwner or ShardUnavailable stored nothing, and it is sent again.
        let resend =
            cluster.as_ref().filter(|_| mode != AckMode::None).map(|_| self.resend_of(&out));
        let write_started = Instant::now();
        let rx = match lane.send_request(id, bytes).await {
            Ok(rx) => {
                if let Some(ready_at) = out.ready_at.take() {
                    let now = Instant::now();
                    self.ctx.send_stats.written(now - ready_at, now - write_started);
                }
                rx
            }
            Err(e) => {
                self.lanes.clear();
                if let Some(c) = &cluster {
                    c.invalidate(&self.ctx.stream);
                }
                if out.tag.is_some() && cluster.is_none() && outcome_unknown(&e) {
                    drop(permit);
                    return self.park_or_fail(out, e);
                }
                if let (Some(cluster), Some(resend)) =
                    (cluster, resend.filter(|r| r.producer.is_some()))
                {
                    // An idempotent batch follows its shard to the next leader.
                    cluster.mark_unreachable(conn.peer(), e.clone());
                    tokio::spawn(async move {
                        let _permit = permit;
                        let answer = resend.follow(&cluster, Err(e)).await;
                        if !matches!(answer, Ok(Frame::PublishAck(_))) {
                            mark_broken(out.tag.as_ref());
                        }
                        resolve(out.completion, count, answer);
                    });
                    return;
                }
                drop(permit);
                mark_broken(out.tag.as_ref());
                return out.completion.resolve(BatchResult::Failed(e));
            }
        };
        if mode == AckMode::None {
            drop(permit);
            return out.completion.resolve(BatchResult::Written);
        }
        let waiter = lane.waiter();
        let limit = conn.ack_timeout();
        let peer = conn.peer();
        let probe_conn = conn.clone();
        let lost = self.lost.clone();
        let queue = self.queue.clone();
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let wait = waiter.wait(id, rx, limit, "ack");
            let mut answer = match (&cluster, &resend) {
                // An idempotent batch leaves a broker its shard has left (see `Resend`).
                (Some(c), Some(r)) => r.wait_or_leave(c, &probe_conn, wait).await,
                _ => wait.await,
            };
            if let (Some(cluster), Some(resend)) = (cluster, resend) {
                if answer.as_ref().is_err_and(outcome_unknown) {
                    // Its broker may be gone: look at the placement again.
                    cluster.invalidate(&resend.stream);
                }
                note_failure(&cluster, peer, &answer);
                answer = resend.follow(&cluster, answer).await;
            } else if out.tag.is_some() {
                match answer {
                    // Outcome unknown, or the broker is stopping: sent again (after a
                    // reconnect), and stored once.
                    Err(e) if outcome_unknown(&e) || is_shutting_down(&e) => {
                        return park_or_fail(&lost, &queue, &ctx.settings, out, e);
                    }
                    // Ahead of the shard's next sequence number: an earlier batch of the
                    // producer is missing (it failed, or is being sent again). Nothing was
                    // stored: send it again, after the earlier ones.
                    Err(ClientError::Broker { code: ErrorCode::OutOfOrderSequence, .. }) => {
                        return park_or_fail(
                            &lost,
                            &queue,
                            &ctx.settings,
                            out,
                            ClientError::Broker {
                                code: ErrorCode::OutOfOrderSequence,
                                message: "an earlier batch of the producer is missing".into(),
                            },
                        );
                    }
                    other => answer = other,
                }
            }
            if !matches!(answer, Ok(Frame::PublishAck(_))) {
                mark_broken(out.tag.as_ref());
            }
            resolve(out.completion, count, answer);
        });
    }

    /// In a cluster, whether `out` must not be sent on this worker's broker: the broker is
    /// penalized (it failed a moment ago), or the cached placement shows the batch's shard
    /// owned elsewhere or down.
    fn leaves(&self, cluster: &Cluster, out: &Outgoing) -> bool {
        let here = self.pool.addr();
        cluster.penalty(here).is_some()
            || out.shard.is_some_and(|s| cluster.owner_elsewhere(&self.ctx.stream, s, here))
    }

    /// Sends `out`, which was not sent, to its shard's owner from a task of its own
    /// (`Resend::follow`), holding an in-flight slot (an idempotent one keeps its place in its
    /// producer's window until answered).
    async fn fail_over(&mut self, cluster: Arc<Cluster>, out: Outgoing) {
        let Some(permit) = self.in_flight_permit().await else {
            return out.completion.resolve(BatchResult::Failed(ClientError::Closed));
        };
        let resend = self.resend_of(&out);
        let Outgoing { completion, tag, .. } = out;
        let first = Err(unavailable(&self.ctx.stream, resend.shard));
        tokio::spawn(async move {
            let _permit = permit;
            let answer = resend.follow(&cluster, first).await;
            if !matches!(answer, Ok(Frame::PublishAck(_))) {
                mark_broken(tag.as_ref());
            }
            resolve(completion, resend.records.len(), answer);
        });
    }

    /// What sending `out` again in a cluster needs.
    fn resend_of(&self, out: &Outgoing) -> Resend {
        Resend {
            stream: self.ctx.stream.clone(),
            key: out.key.clone(),
            shard: out.shard,
            producer: out.tag.as_ref().map(|t| t.tag),
            producer_shared: out.tag.as_ref().map(|t| t.producer.clone()),
            records: out.records.clone(),
            mode: self.ctx.settings.ack_mode,
            retry_ms: self.ctx.settings.retry_timeout_ms,
        }
    }
}

/// A new producer for `which` on worker `slot` of `pool`. In a cluster, its id names its shard
/// (`Producer::on_shard`). On one broker, an unkeyed producer's id is drawn until its shard
/// (`id mod shards`) is owned by the core of the worker's connection (shard `s` lives on core
/// `s % cores`), so its batches need no hop inside the broker.
fn new_producer(
    ctx: &WorkerCtx,
    pool: &Pool,
    slot: usize,
    which: (Option<ShardId>, usize),
) -> Producer {
    let cluster = ctx.client.shared.cluster.is_some();
    match (which.0, ctx.shard_count, pool.slot_core(slot)) {
        (Some(shard), Some(shards), _) if cluster => Producer::on_shard(shards, shard),
        (None, Some(shards), Some(core)) => {
            Producer::on_core(shards, pool.hello().core_count, core)
        }
        _ => Producer::new(),
    }
}

/// Pause before sending parked batches again when the last attempt parked all of them.
const RESEND_PAUSE_MS: u64 = 50;

/// Parks `out` in `lost` (waking the worker) while its retry time lasts, else fails it with `e`.
fn park_or_fail(
    lost: &Mutex<Vec<Outgoing>>,
    queue: &WorkerQueue,
    settings: &PublishSettings,
    out: Outgoing,
    e: ClientError,
) {
    let retry_for = Duration::from_millis(settings.retry_timeout_ms);
    if out.first_sent.elapsed() >= retry_for {
        mark_broken(out.tag.as_ref());
        return out.completion.resolve(BatchResult::Failed(e));
    }
    tracing::debug!(error = %e, "idempotent batch parked, to be sent again");
    lost.lock().unwrap_or_else(|p| p.into_inner()).push(out);
    queue.wake();
}
