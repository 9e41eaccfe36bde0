//! Subscriptions: one unidirectional stream per subscription, one pump per shard.
//!
//! A pump asks the shard's owner core (itself or over the mesh) for encoded EventBatches from
//! its position (served from the owner's in-memory tail when they are recent, see `tail`,
//! waiting there for new data) and queues them for the subscription's writer. The queue is bounded ([`SUBSCRIPTION_QUEUE_FRAMES`]) and the writer is
//! bounded by QUIC flow control, so a slow subscriber stops its pumps rather than growing
//! memory; a writer blocked longer than the slow-consumer limit resets the stream with
//! `SlowConsumer` (18) and the subscription ends. A subscriber that stops the stream ends the
//! subscription at once, and a stopping broker resets it with `ShuttingDown` (22), see
//! [`write_subscription`].

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{
    Capabilities, ErrorCode, Frame, Offset, ShardId, StartAt, Subscribe, SubscribeOk,
    SubscriptionId,
};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use super::core_app::CoreApp;
use super::error::WireError;
use super::mesh::{CoreRequest, CoreResponse};
use super::session::Session;
use super::stats;
use crate::net::SendStream;

/// Subscriptions one connection may hold at once.
pub const SUBSCRIPTIONS_PER_CONN_MAX: usize = 64;
/// Queue entries per subscription (each one EventBatch, or one log read's small batches).
pub const SUBSCRIPTION_QUEUE_FRAMES: usize = 8;
/// Bytes one read asks the owner for, at most.
pub const READ_BYTES_MAX: usize = 1 << 20;
/// Bytes one read asks for, at least (a subscription over very many shards).
pub const READ_BYTES_MIN: usize = 64 << 10;
/// The bytes all of one subscription's reads may ask for at once: each shard's pump holds
/// one read's batches while the queue is full, so its reads shrink as its shards grow.
pub const SUBSCRIPTION_READ_BYTES: usize = 16 << 20;
/// How long one read waits at the tail before it asks again.
pub const TAIL_WAIT_MS: u64 = 500;
/// How long a pump waits before it asks the owner again after a failed read.
pub const READ_RETRY_MS: u64 = 100;

/// Starts a subscription; returns the SubscribeOk to send.
pub async fn start(session: Rc<Session>, s: Subscribe) -> Result<SubscribeOk, WireError> {
    let app = session.app.clone();
    // The slot is taken before the first await: concurrent Subscribes on one connection
    // each see the ones accepted before them, so the limit cannot be overrun.
    let slot = SubscriptionSlot::take(&session)?;
    if app.is_stopping() {
        return Err(WireError::new(ErrorCode::ShuttingDown, "the broker is shutting down"));
    }
    if let Some(g) = &s.group {
        if g.is_empty() || g.chars().any(char::is_control) {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                "group names are non-empty, without control characters",
            ));
        }
    }
    // Subscribing never creates a stream: a mistyped name is `StreamNotFound`, not a new
    // stream kept for ever.
    let entry = app.stream(&s.stream, false).await?;
    let shards: Vec<ShardId> = match &s.shards {
        None => (0..entry.meta.shards).map(ShardId).collect(),
        Some(list) => {
            if let Some(bad) = list.iter().find(|x| x.0 >= entry.meta.shards) {
                return Err(WireError::new(
                    ErrorCode::InvalidShard,
                    format!("{} has no {bad}", s.stream),
                ));
            }
            let mut list = list.clone();
            list.sort_unstable();
            list.dedup();
            list
        }
    };
    // In a cluster the session checked ownership before; a stream auto-created just now may
    // have been placed elsewhere since.
    if let Some(link) = &app.cluster() {
        for shard in &shards {
            link.check(&s.stream, *shard, false).map_err(|r| r.into_wire(&s.stream))?;
        }
    }
    let asked = asked_positions(&s)?;
    let mut positions = Vec::with_capacity(shards.len());
    for shard in &shards {
        let pos = match asked.get(shard) {
            Some(&at) => resolve_position(&app, &s.stream, *shard, at).await?,
            None => resolve(&app, &s.stream, *shard, s.start, s.group.clone()).await?,
        };
        positions.push((*shard, pos));
    }
    let mut send = session.conn.open_uni().await.map_err(|e| {
        WireError::new(ErrorCode::LimitReached, format!("cannot open a stream: {e}"))
    })?;
    let id = SubscriptionId(session.next_subscription_id());
    if send.write_all(&Frame::SubscriptionStart(id).to_bytes()).await.is_err() {
        return Err(WireError::new(ErrorCode::Internal, "subscription stream closed"));
    }
    stats::add(&app.stats().counters.subscriptions, 1);
    let (tx, rx) = queue();
    let writer_app = app.clone();
    let cancelled = Rc::new(std::cell::Cell::new(false));
    let writer_cancel = cancelled.clone();
    let deleted = Rc::new(std::cell::Cell::new(false));
    let writer_deleted = deleted.clone();
    app.tasks().spawn(async move {
        // However the writer ends, its pumps stop and the connection's slot is freed.
        let _slot = slot;
        let _guard = OnDrop(move || writer_cancel.set(true));
        write_subscription(&writer_app, rx, send, &writer_deleted).await;
    });
    let tx = Rc::new(tx);
    let read_bytes = read_bytes(positions.len());
    // A client that can resume each shard where it was learns where each one starts.
    let starts = session
        .client_has(Capabilities::SUBSCRIBE_POSITIONS)
        .then(|| positions.iter().map(|(_, pos)| *pos).collect());
    for (shard, pos) in positions {
        let (session, stream, tx) = (session.clone(), s.stream.clone(), tx.clone());
        let ends = Ends { cancelled: cancelled.clone(), deleted: deleted.clone() };
        let pump = pump(session, stream, shard, pos, read_bytes, tx, ends);
        app.tasks().spawn(pump);
    }
    Ok(SubscribeOk { request_id: s.request_id, subscription_id: id, shards, positions: starts })
}

/// The positions a Subscribe asks for (flag `POSITIONS`), by shard; empty without them. A shard
/// named twice is refused: its start would be ambiguous.
fn asked_positions(s: &Subscribe) -> Result<BTreeMap<ShardId, Offset>, WireError> {
    let mut asked = BTreeMap::new();
    let (Some(list), Some(positions)) = (&s.shards, &s.positions) else { return Ok(asked) };
    for (shard, at) in list.iter().zip(positions) {
        if asked.insert(*shard, *at).is_some() {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("{shard} is named twice in a Subscribe with positions"),
            ));
        }
    }
    Ok(asked)
}

/// Where `shard` starts for `start` (and `group`'s commit, if it has one), on its owner.
async fn resolve(
    app: &Rc<CoreApp>,
    stream: &str,
    shard: ShardId,
    start: StartAt,
    group: Option<String>,
) -> Result<Offset, WireError> {
    let req = CoreRequest::Resolve { stream: stream.to_owned(), shard, start, group };
    match app.on_owner(shard, req).await? {
        CoreResponse::Position(answer) => answer,
        _ => Err(WireError::new(ErrorCode::Internal, "unexpected reply")),
    }
}

/// Where `shard` starts for a position asked for: there, or at the oldest retained record when
/// retention deleted the position (the subscriber sees the gap in the first batch's offset).
/// A position past the shard's end is `OffsetOutOfRange`.
async fn resolve_position(
    app: &Rc<CoreApp>,
    stream: &str,
    shard: ShardId,
    at: Offset,
) -> Result<Offset, WireError> {
    match resolve(app, stream, shard, StartAt::Offset(at), None).await {
        Err(e) if e.code == ErrorCode::OffsetOutOfRange => {
            match resolve(app, stream, shard, StartAt::Earliest, None).await? {
                oldest if oldest > at => Ok(oldest),
                _ => Err(e),
            }
        }
        answer => answer,
    }
}

/// The bytes each read of a subscription over `shards` shards asks for: together at most
/// [`SUBSCRIPTION_READ_BYTES`] (above [`READ_BYTES_MIN`] each), so that the batches its pumps
/// hold while the queue is full stay bounded however many shards it reads.
fn read_bytes(shards: usize) -> usize {
    (SUBSCRIPTION_READ_BYTES / shards.max(1)).clamp(READ_BYTES_MIN, READ_BYTES_MAX)
}

/// What ends a subscription's pumps, shared with its writer.
struct Ends {
    /// Set when the writer ended: the pumps stop.
    cancelled: Rc<std::cell::Cell<bool>>,
    /// Set by a pump that found its stream deleted: the writer resets with `StreamNotFound`.
    deleted: Rc<std::cell::Cell<bool>>,
}

async fn pump(
    session: Rc<Session>,
    stream: String,
    shard: ShardId,
    mut next: Offset,
    read_bytes: usize,
    tx: Rc<LocalSender<Queued>>,
    ends: Ends,
) {
    let app = session.app.clone();
    while !session.closed.get() && !app.is_stopping() && !ends.cancelled.get() {
        let req = CoreRequest::Read {
            stream: stream.clone(),
            shard,
            from: next,
            max_bytes: read_bytes,
            wait_ms: TAIL_WAIT_MS,
        };
        let batches = match app.on_owner(shard, req).await {
            Ok(CoreResponse::Batches(Ok(b))) => b,
            Ok(CoreResponse::Batches(Err(e))) if e.code == ErrorCode::StreamNotFound => {
                // The stream was deleted: this pump ends, and with the others the subscription.
                ends.deleted.set(true);
                return;
            }
            Ok(CoreResponse::Batches(Err(e))) if e.code == ErrorCode::OffsetOutOfRange => {
                // Retention removed what we were about to read: jump to the oldest retained.
                match app
                    .on_owner(
                        shard,
                        CoreRequest::Resolve {
                            stream: stream.clone(),
                            shard,
                            start: StartAt::Earliest,
                            group: None,
                        },
                    )
                    .await
                {
                    Ok(CoreResponse::Position(Ok(p))) => {
                        next = p;
                        continue;
                    }
                    // Asked again, as after a failed read: a pump that ended here would stop
                    // its shard while the subscription's other shards go on.
                    _ => {
                        glommio::timer::sleep(Duration::from_millis(READ_RETRY_MS)).await;
                        continue;
                    }
                }
            }
            _ => {
                glommio::timer::sleep(Duration::from_millis(READ_RETRY_MS)).await;
                continue;
            }
        };
        for b in batches {
            if b.end() <= next.0 {
                continue;
            }
            if tx.send(Queued { frame: b.frame.clone(), frames: b.frames }).await.is_err() {
                return;
            }
            next = Offset(b.end());
        }
    }
}

/// The writer of one subscription: writes what its pumps queue, until
/// - the subscriber stops the stream (STOP_SENDING, sent when it drops it): the subscription
///   ends at once, whether or not a record is coming;
/// - a write stays blocked longer than the slow-consumer limit: the stream is reset with
///   `SlowConsumer`;
/// - every pump has ended: when the broker is stopping, the stream is reset with
///   `ShuttingDown`, so that the subscriber resumes elsewhere instead of reading a clean end
///   (which means the broker finished the subscription); otherwise it is finished.
async fn write_subscription(
    app: &CoreApp,
    rx: QueueReceiver,
    mut send: SendStream,
    deleted: &std::cell::Cell<bool>,
) {
    let c = &app.stats().counters;
    loop {
        let next = futures_lite::future::or(async { Next::Queued(rx.recv().await) }, async {
            send.stopped().await;
            Next::Stopped
        });
        let Queued { frame, frames } = match next.await {
            Next::Queued(Some(q)) => q,
            Next::Queued(None) => break,
            Next::Stopped => return,
        };
        let len = frame.len() as u64;
        // Handed to quinn as it is: a tail batch's frame is shared by all its subscribers.
        let mut chunks = [frame];
        match glommio::timer::timeout(app.settings().slow_consumer, async {
            send.write_all_chunks(&mut chunks)
                .await
                .map_err(|e| glommio::GlommioError::IoError(std::io::Error::other(e.to_string())))
        })
        .await
        {
            Ok(()) => {
                stats::add(&c.event_batches, u64::from(frames));
                stats::add(&c.event_bytes, len);
            }
            Err(glommio::GlommioError::TimedOut(_)) => {
                stats::add(&c.slow_consumers, 1);
                send.reset(ErrorCode::SlowConsumer as u32);
                return;
            }
            Err(_) => return,
        }
    }
    if app.is_stopping() {
        send.reset(ErrorCode::ShuttingDown as u32);
    } else if deleted.get() {
        send.reset(ErrorCode::StreamNotFound as u32);
    }
}

/// What a subscription's writer waits for.
enum Next {
    /// Frames from the pumps; `None` once every pump has ended.
    Queued(Option<Queued>),
    /// The subscriber stopped the stream, or the connection is gone.
    Stopped,
}

/// One of a connection's [`SUBSCRIPTIONS_PER_CONN_MAX`] subscription slots, held from the
/// moment a Subscribe is accepted until its subscription ends (or its start fails).
struct SubscriptionSlot(Rc<Session>);

impl SubscriptionSlot {
    fn take(session: &Rc<Session>) -> Result<Self, WireError> {
        let held = session.active_subscriptions.get();
        if held >= SUBSCRIPTIONS_PER_CONN_MAX {
            return Err(WireError::new(
                ErrorCode::LimitReached,
                format!("at most {SUBSCRIPTIONS_PER_CONN_MAX} subscriptions per connection"),
            ));
        }
        session.active_subscriptions.set(held + 1);
        Ok(Self(session.clone()))
    }
}

impl Drop for SubscriptionSlot {
    fn drop(&mut self) {
        let held = self.0.active_subscriptions.get();
        debug_assert!(held > 0, "a subscription slot is released once");
        self.0.active_subscriptions.set(held.saturating_sub(1));
    }
}

/// Encoded EventBatch frames on a subscription's queue: one, or a log read's small batches
/// back to back (`super::frames`).
pub struct Queued {
    /// The frames' bytes.
    pub frame: Bytes,
    /// EventBatch frames in it.
    pub frames: u32,
}

/// A subscription's queue of encoded frames, from its pumps to its writer, bounded by
/// [`SUBSCRIPTION_QUEUE_FRAMES`] entries.
pub fn queue() -> (LocalSender<Queued>, QueueReceiver) {
    let (tx, rx) = local_channel::new_bounded(SUBSCRIPTION_QUEUE_FRAMES);
    (tx, QueueReceiver(rx))
}

/// The writer's end of a subscription's [`queue`]. Dropping it empties the queue first, so
/// every pump blocked in `send` fails and ends: glommio wakes the senders blocked on a full
/// channel when its receiver goes, but a woken sender that finds the channel still full waits
/// again, for ever, and its pump would hold its session and batches for the life of the core.
pub struct QueueReceiver(LocalReceiver<Queued>);

impl QueueReceiver {
    /// The next frames; `None` once every sender is gone.
    pub async fn recv(&self) -> Option<Queued> {
        self.0.recv().await
    }
}

impl Drop for QueueReceiver {
    fn drop(&mut self) {
        // Takes what is queued without waiting: a pending receive is dropped unregistered.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            let next = std::pin::pin!(self.0.recv());
            let taken = std::future::Future::poll(next, &mut cx);
            if !matches!(taken, std::task::Poll::Ready(Some(_))) {
                break;
            }
        }
    }
}

/// Runs a closure when dropped.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subscription's pumps hold one read each while its queue is full: up to 16 shards
    /// read 1 MiB at a time, more read less, so that 508 shards hold 32 MiB, not 508 MiB.
    #[test]
    fn reads_shrink_as_a_subscription_reads_more_shards() {
        assert_eq!(read_bytes(0), READ_BYTES_MAX);
        assert_eq!(read_bytes(1), READ_BYTES_MAX);
        assert_eq!(read_bytes(16), READ_BYTES_MAX);
        assert_eq!(read_bytes(32), 512 << 10);
        for shards in [17, 100, 256, 508, 4096] {
            let each = read_bytes(shards);
            assert!((READ_BYTES_MIN..READ_BYTES_MAX).contains(&each), "{shards}: {each}");
            let total = each * shards;
            assert!(
                total <= SUBSCRIPTION_READ_BYTES || each == READ_BYTES_MIN,
                "{shards} shards: {total} bytes"
            );
        }
        assert_eq!(read_bytes(508) * 508, 508 * READ_BYTES_MIN);
    }
}
