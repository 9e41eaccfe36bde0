//! The publish path, in one place: a Publish frame's routing to a shard (key, producer, or the
//! next unkeyed shard this broker owns), the cluster's ownership check, the in-flight byte
//! budgets (per connection and per core), the hand-over to the owner core (here or over the
//! mesh), what the append waits for (`AckMode::None` becomes `Written` here, once, for the
//! replicated and the single-broker path), storage or the replication driver, the tail, and
//! the completion (budgets released, counters and ack latency recorded, the answer).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use felix_proto::{AckMode, ErrorCode, Frame, Publish, PublishAck, Record, ShardId};
use felix_storage::{AppendOutcome, BatchMeta};
use glommio::channels::local_channel;
use glommio::sync::Semaphore;

use super::cluster::Refused;
use super::core_app::CoreApp;
use super::error::{storage_error, WireError};
use super::mesh::{AppendBatch, CoreRequest, CoreResponse};
use super::session::{ready, Answer, Session};
use super::stats::{self, AppStats};
use super::tail::{BATCH_OVERHEAD_BYTES, RECORD_OVERHEAD_BYTES};
use super::tasks::now_ms;

/// One core's publish budget and latencies: the bytes in flight on the core, and the
/// publish-to-ack and receive-span histograms (core-local, published periodically).
pub struct PublishPath {
    budget: Rc<Semaphore>,
    ack_latency_us: RefCell<hdrhistogram::Histogram<u64>>,
    ack_record_latency_us: RefCell<hdrhistogram::Histogram<u64>>,
    receive_span_us: RefCell<hdrhistogram::Histogram<u64>>,
}

impl PublishPath {
    /// A path with `inflight_bytes_per_core` of budget.
    pub fn new(inflight_bytes_per_core: usize) -> Self {
        PublishPath {
            budget: Rc::new(Semaphore::new(inflight_bytes_per_core as u64)),
            ack_latency_us: RefCell::new(stats::new_histogram()),
            ack_record_latency_us: RefCell::new(stats::new_histogram()),
            receive_span_us: RefCell::new(stats::new_histogram()),
        }
    }

    /// An ack `us` after its frame arrived, for a batch of `records`.
    fn record_ack(&self, us: u64, records: u64) {
        let _ = self.ack_latency_us.borrow_mut().record(us.max(1));
        let _ = self.ack_record_latency_us.borrow_mut().record_n(us.max(1), records);
    }

    /// A publish frame's receive span (`felix_publish_receive_span_us`).
    pub fn record_receive_span(&self, us: u64) {
        let _ = self.receive_span_us.borrow_mut().record(us.max(1));
    }

    /// Copies the histograms to the admin thread's.
    pub fn publish_histograms(&self, to: &AppStats) {
        stats::publish_histogram(&to.ack_latency_us, &self.ack_latency_us.borrow());
        stats::publish_histogram(&to.ack_record_latency_us, &self.ack_record_latency_us.borrow());
        stats::publish_histogram(&to.receive_span_us, &self.receive_span_us.borrow());
    }
}

/// A local append queued in storage (its offsets fixed), waiting for its ack mode
/// ([`CoreApp::submit_local`]).
pub type LocalAppend = Pin<Box<dyn Future<Output = Result<AppendOutcome, WireError>>>>;

/// Serves one Publish frame of `session`: the batch is queued (here or on its owner core)
/// before this returns, so the batches of one QUIC stream keep their order per shard; the
/// answer resolves once its ack mode is met.
pub async fn publish(session: &Rc<Session>, p: Publish) -> Answer {
    let received = Instant::now();
    let app = session.app.clone();
    let c = &app.stats().counters;
    let request_id = p.ack.map(|a| a.request_id);
    let mode = p.ack.map_or(AckMode::None, |a| a.mode);
    // An acked Publish is refused with PublishError, an unacked one with Error (id 0).
    let fail = move |e: WireError| -> Answer {
        ready(Some(e.into_answer(request_id.unwrap_or_default(), request_id.is_some())))
    };
    if app.is_stopping() {
        stats::add(&c.publish_errors, 1);
        return fail(WireError::new(ErrorCode::ShuttingDown, "the broker is shutting down"));
    }
    let entry = match app.stream(&p.stream, true).await {
        Ok(e) => e,
        Err(e) => {
            stats::add(&c.publish_errors, 1);
            return fail(e);
        }
    };
    let shard = match (&p.key, p.producer, &app.cluster()) {
        (Some(k), _, _) => felix_proto::shard_for_key(k, entry.meta.shards),
        // An idempotent producer's batches all go to one shard, so a retry finds its
        // original (docs/protocol.md, "Idempotent publishing").
        (None, Some(tag), _) => {
            ShardId((tag.producer.0 % u64::from(entry.meta.shards.max(1))) as u32)
        }
        (None, None, None) => app.unkeyed_shard(&entry),
        // In a cluster: a shard this broker owns (shard 0, refused below, if none).
        (None, None, Some(link)) => app
            .unkeyed_shard_among(&entry, &link.owned(&p.stream, entry.meta.shards))
            .unwrap_or(ShardId(0)),
    };
    if let Some(Err(r)) = app.cluster().as_ref().map(|l| l.check(&p.stream, shard, true)) {
        stats::add(&c.publish_errors, 1);
        return match (request_id, r) {
            (Some(id), r) => ready(session.refused(id, &p.stream, r, true)),
            // Nothing to answer an unacked batch with: dropped, counted.
            (None, Refused::NotOwner { .. }) => {
                stats::add(&c.cluster_not_owner, 1);
                ready(None)
            }
            (None, Refused::Wire(e)) => fail(e),
        };
    }
    let bytes: usize = p.records.iter().map(felix_proto::Payload::len).sum::<usize>()
        + p.key.as_ref().map_or(0, Bytes::len) * p.records.len();
    stats::add(&c.publishes, 1);
    stats::add(&c.publish_records, p.records.len() as u64);
    stats::add(&c.publish_bytes, bytes as u64);
    // Backpressure: wait for budget before queueing (this stops reading the stream). The
    // budget counts what the batch holds in memory, per-record overhead included, so
    // batches of empty records cannot slip past it.
    let units = (bytes + p.records.len() * RECORD_OVERHEAD_BYTES + BATCH_OVERHEAD_BYTES) as u64;
    let conn_units = units.min(app.settings().inflight_bytes_per_conn as u64);
    let core_units = units.min(app.settings().inflight_bytes_per_core as u64);
    let (Ok(conn_permit), Ok(core_permit)) = (
        session.budget.acquire_static_permit(conn_units).await,
        app.publish_path().budget.acquire_static_permit(core_units).await,
    ) else {
        return fail(WireError::new(ErrorCode::ShuttingDown, "budget closed"));
    };
    stats::add(&c.inflight_bytes, units);
    let (producer, oldest_pending) = (p.producer, p.oldest_pending);
    let records: Vec<Record> =
        p.records.into_iter().map(|value| Record { key: p.key.clone(), value }).collect();
    let timestamp_ms = now_ms();
    let owner = app.owner(shard);
    let batch = AppendBatch {
        stream: p.stream,
        shard,
        records,
        timestamp_ms,
        ack: mode,
        producer,
        oldest_pending,
    };
    let stored: Pin<Box<dyn Future<Output = Result<felix_storage::AppendOutcome, WireError>>>> =
        if owner == app.core() {
            // Queued now, its offsets fixed, before the stream's next frame is read (the
            // stream was opened on this core above).
            match app.submit_local(batch) {
                Ok(appending) => appending,
                Err(e) => Box::pin(async move { Err(e) }),
            }
        } else {
            stats::add(&c.forwarded_out, 1);
            let req = CoreRequest::Append(batch);
            match app.mesh().submit(app.core(), owner, req).await {
                Ok(rx) => Box::pin(async move {
                    match rx.recv().await {
                        Some(CoreResponse::Appended(r)) => r,
                        Some(_) => Err(WireError::new(ErrorCode::Internal, "unexpected reply")),
                        // The owner core took the batch and went away without an
                        // answer: it may have appended it.
                        None => Err(WireError::new(
                            ErrorCode::OutcomeUnknown,
                            "the owner core did not answer: outcome unknown",
                        )),
                    }
                }),
                Err(e) => Box::pin(async move { Err(e) }),
            }
        };
    // The completion runs in its own task: budgets are released, and the answer is ready,
    // whether or not the responder is still there to send it (the connection may be gone).
    let (answer_tx, answer_rx) = local_channel::new_bounded::<Option<Frame>>(1);
    glommio::spawn_local(async move {
        let result = stored.await;
        drop((conn_permit, core_permit));
        let c = &app.stats().counters;
        let before = c.inflight_bytes.fetch_sub(units, std::sync::atomic::Ordering::Relaxed);
        debug_assert!(before >= units, "the core's in-flight bytes never go negative");
        let answer = match (request_id, result) {
            (Some(id), Ok(out)) if mode != AckMode::None => {
                stats::add(&c.acks, 1);
                let us = received.elapsed().as_micros() as u64;
                app.publish_path().record_ack(us, u64::from(out.record_count));
                Some(Frame::PublishAck(PublishAck {
                    request_id: id,
                    shard,
                    base_offset: out.base_offset,
                    count: out.record_count,
                }))
            }
            (_, Ok(_)) => None,
            (_, Err(e)) => {
                stats::add(&c.publish_errors, 1);
                Some(e.into_answer(request_id.unwrap_or_default(), request_id.is_some()))
            }
        };
        let _ = answer_tx.try_send(answer);
    })
    .detach();
    Box::pin(async move { answer_rx.recv().await.flatten() })
}

impl CoreApp {
    /// Queues a batch another core forwarded, opening its stream on this core first if this
    /// core has not yet: [`CoreApp::submit_local`] after at most one await. Batches handed to
    /// it one after another (each awaited before the next) are stored in that order.
    pub async fn submit_forwarded(
        self: &Rc<Self>,
        batch: AppendBatch,
    ) -> Result<LocalAppend, WireError> {
        if !self.streams().contains(&batch.stream) {
            self.stream(&batch.stream, false).await?;
        }
        self.submit_local(batch)
    }

    /// Queues an append to an owned shard of a stream open on this core, without waiting:
    /// when it returns, the batch has its offsets, so batches submitted one after another are
    /// stored in that order (per-key ordering rests on this). The future waits for `ack`. A
    /// batch tagged by `producer` that the shard already stored is not stored again: the
    /// outcome names the original offsets (`duplicate`).
    pub fn submit_local(self: &Rc<Self>, batch: AppendBatch) -> Result<LocalAppend, WireError> {
        let AppendBatch { stream, shard, records, timestamp_ms, ack, producer, oldest_pending } =
            batch;
        let stream = stream.as_str();
        debug_assert_eq!(self.owner(shard), self.core(), "a shard is appended to by its owner");
        let entry = self.streams().get(stream).ok_or_else(|| {
            WireError::new(ErrorCode::StreamNotFound, format!("{stream} is not open on this core"))
        })?;
        let Some(log) = entry.log.clone() else {
            return Err(WireError::new(
                ErrorCode::Internal,
                format!("{shard} of {stream} is not on {}", self.core()),
            ));
        };
        // Below the free-space floor, appends are refused (reads and commits go on).
        self.disk().check()?;
        let bytes: u64 = records
            .iter()
            .map(|r| (r.value.len() + r.key.as_ref().map_or(0, Bytes::len)) as u64)
            .sum();
        let app = self.clone();
        // What the append waits for, decided here once for both paths: every append waits at
        // least for its write (`None` answers nothing, but the tail only ever holds written
        // data, and a replica's `None` waits for the leader's write like `Written`).
        let mode = if ack == AckMode::None { AckMode::Written } else { ack };
        if let Some(host) = self.replication().filter(|h| h.is_replicated(stream)) {
            let tag = producer.map(|t| (t, oldest_pending));
            let replicated = host.submit(stream, shard, &records, timestamp_ms, mode, tag)?;
            return Ok(Box::pin(async move {
                let base = replicated.await?;
                stats::add(&app.stats().counters.storage_append_bytes, bytes);
                stats::add(&app.stats().counters.storage_appends, 1);
                entry.count_append(shard, bytes, records.len() as u64);
                let record_count = records.len() as u32;
                Ok(AppendOutcome { base_offset: base, record_count, duplicate: false })
            }));
        }
        let meta = BatchMeta { producer, ..BatchMeta::default() };
        let appending =
            log.submit(shard, &records, timestamp_ms, mode, meta).map_err(|e| storage_error(&e))?;
        Ok(Box::pin(async move {
            let out = appending.done().await.map_err(|e| storage_error(&e))?;
            debug_assert_eq!(
                out.record_count as usize,
                records.len(),
                "every record gets an offset"
            );
            if out.duplicate {
                // Stored before: nothing new for the tail or the byte counters.
                stats::add(&app.stats().counters.publish_duplicates, 1);
                return Ok(out);
            }
            debug_assert!(
                log.next_offset(shard)
                    .is_ok_and(|n| n.0 >= out.base_offset.0 + records.len() as u64),
                "the shard's next offset advances past an appended batch"
            );
            stats::add(&app.stats().counters.storage_append_bytes, bytes);
            stats::add(&app.stats().counters.storage_appends, 1);
            entry.count_append(shard, bytes, records.len() as u64);
            entry.tails.with(shard, |t| {
                t.handle_append(Instant::now(), shard, out.base_offset, timestamp_ms, records)
            });
            Ok(out)
        }))
    }
}
