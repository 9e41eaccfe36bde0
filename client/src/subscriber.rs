//! The subscriber: one subscription made of parts (one per broker core that owns some of its
//! shards, below; in a cluster per broker and core), merged, records with their shard and
//! offset, consumer-group commits.
//!
//! Call order: [`crate::Client::subscribe`] with [`SubscribeOptions`], then [`Subscriber::next`]
//! in a loop; with a group, [`Subscriber::commit_consumed`] (or [`Subscriber::commit`]) whenever
//! the application has processed what it received. Records are read straight from the
//! subscription's QUIC stream, so a slow reader slows the broker's sending (flow control), and
//! nothing is buffered beyond one decoded batch per part.
//!
//! With `ClientConfig::subscribe_per_core` (the default), the shards of one broker are grouped
//! by the core that owns them (`s % core_count`), and each group is a part of its own, on the
//! pool's connection owned by that core: every core of the broker encrypts and sends its own
//! shards' records and reads them from its own logs, instead of one connection's core sending
//! them all (and reading the other cores' shards over the core mesh). A subscription to every
//! shard of a stream asks the broker how many shards it has first (DescribeStream); when that
//! fails, or the pool reaches one core, the subscription is one part as without the option.
//!
//! In a cluster, the shards to read (all of the placement's, or those asked for) are grouped by
//! owner (and by the owner's core, as above), and each group gets a Subscribe naming its
//! shards; a part refused with `NotOwner` is grouped again after a fresh placement, and an
//! unavailable shard is retried within `cluster::SHARD_UNAVAILABLE_DEADLINE_MS`. Commits go to
//! the part that reads the shard, on its owner, following `NotOwner` like the publisher.
//!
//! A part whose connection is lost, or whose broker is stopping, is opened again (`resume`):
//! each of its shards at the offset after the last record returned, or where it started, for
//! as long as the subscription lives (or [`SubscribeOptions::resume_timeout_ms`]).

mod open;
mod resume;

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use felix_proto::{
    CommitOffset, ErrorCode, Frame, FrameType, Offset, ShardId, StartAt, SubscriptionId,
};

use crate::client::Client;
use crate::conn::{unexpected, Conn, SubStream};
use crate::error::ClientError;
use open::{open_at_home, open_in_cluster, Start};
pub use resume::SubscriptionState;

/// Bytes asked of quinn per read.
const READ_CHUNK_BYTES: usize = 256 * 1024;

/// What to subscribe to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// Where each shard starts (for a group: only where it has no committed position).
    pub start: StartAt,
    /// A consumer group: resume from its committed positions; enables commits.
    pub group: Option<String>,
    /// The shards to read; `None` reads all.
    pub shards: Option<Vec<ShardId>>,
    /// Whether a lost connection resumes the subscription on a fresh one (see
    /// [`Subscriber::next`]).
    pub resume: bool,
    /// How long a part may try to resume, from the moment its connection was found lost,
    /// before [`Subscriber::next`] fails with the last error; `None` (the default): for as
    /// long as the subscription lives.
    pub resume_timeout_ms: Option<u64>,
}

impl SubscribeOptions {
    /// Every shard of `stream`, from the next record stored, no group.
    pub fn new(stream: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            start: StartAt::Latest,
            group: None,
            shards: None,
            resume: true,
            resume_timeout_ms: None,
        }
    }

    /// Sets where the subscription starts.
    pub fn start(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// Sets the consumer group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Restricts the subscription to `shards`.
    pub fn shards(mut self, shards: Vec<ShardId>) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Turns resuming after a lost connection on or off (default on).
    pub fn resume(mut self, resume: bool) -> Self {
        self.resume = resume;
        self
    }

    /// Bounds how long a part tries to resume (default: no bound).
    pub fn resume_timeout_ms(mut self, timeout_ms: Option<u64>) -> Self {
        self.resume_timeout_ms = timeout_ms;
        self
    }
}

/// A record received from a subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedRecord {
    /// The shard it was stored in.
    pub shard: ShardId,
    /// Its offset in the shard.
    pub offset: Offset,
    /// When its batch was stored (Unix ms).
    pub timestamp_ms: u64,
    /// Its key, if any.
    pub key: Option<Bytes>,
    /// Its payload.
    pub value: Bytes,
}

/// A running subscription.
pub struct Subscriber {
    client: Client,
    options: SubscribeOptions,
    /// One per broker core the subscription reads from (see the module); one when it is not
    /// split.
    parts: Vec<Part>,
    /// The shards read, over every part, sorted.
    shards: Vec<ShardId>,
    /// The part read first next time (the parts take turns).
    next_part: usize,
    buffered: VecDeque<ReceivedRecord>,
    /// The next offset to return per shard: where the shard started (from a broker that says,
    /// `SUBSCRIBE_POSITIONS`) until a record of it is returned, then the offset after that
    /// record. A resumed part starts each shard here.
    next_offsets: BTreeMap<ShardId, Offset>,
    /// The next offset to read per shard, from the records handed out (what
    /// `commit_consumed` commits).
    consumed: BTreeMap<ShardId, Offset>,
    /// What this subscriber committed per shard (`commit` takes `&self`, hence the lock; it is
    /// never held across an await).
    committed: std::sync::Mutex<BTreeMap<ShardId, Offset>>,
    resumes: u64,
    /// Records skipped because retention deleted them before they were read.
    skipped: u64,
    /// Whether every part is reading, or one is being resumed (see [`Subscriber::state`]).
    state: tokio::sync::watch::Sender<SubscriptionState>,
}

/// One Subscribe on one connection and the stream it delivers on.
struct Part {
    conn: Arc<Conn>,
    id: SubscriptionId,
    shards: Vec<ShardId>,
    /// Where each shard started, when the broker said (`SUBSCRIBE_POSITIONS`).
    starts: Vec<(ShardId, Offset)>,
    stream: SubStream,
    ended: bool,
    /// The broker reset the stream with `ShuttingDown`: the part is to resume.
    stopping: bool,
}

impl Subscriber {
    pub(crate) async fn start(
        client: Client,
        options: SubscribeOptions,
    ) -> Result<Self, ClientError> {
        let per_core = client.shared.config.subscribe_per_core;
        let (start, shards) = (Start::At(options.start), options.shards.clone());
        let parts = match client.shared.cluster.clone() {
            Some(cluster) => open_in_cluster(&cluster, &options, shards, start, per_core).await?,
            None => open_at_home(&client, &options, shards, start).await?,
        };
        let mut sub = Self {
            client,
            options,
            parts,
            shards: Vec::new(),
            next_part: 0,
            buffered: VecDeque::new(),
            next_offsets: BTreeMap::new(),
            consumed: BTreeMap::new(),
            committed: std::sync::Mutex::new(BTreeMap::new()),
            resumes: 0,
            skipped: 0,
            state: tokio::sync::watch::Sender::new(SubscriptionState::Reading { resumes: 0 }),
        };
        sub.update_shards();
        Ok(sub)
    }

    /// Whether the subscription is reading or resuming a part, to watch from another task
    /// (`felix subscribe` prints it): [`SubscriptionState::Resuming`] from the moment a part's
    /// lost connection (or stopping broker) is noticed until every such part is back.
    pub fn state(&self) -> tokio::sync::watch::Receiver<SubscriptionState> {
        self.state.subscribe()
    }

    /// How many times the subscription resumed after a lost connection.
    pub fn resumes(&self) -> u64 {
        self.resumes
    }

    /// How many records of the shards read were skipped because retention deleted them
    /// before this subscriber read them: a shard whose next record is gone continues at its
    /// oldest retained one (when the broker's reading falls behind retention, or when a resume
    /// finds the position it needs deleted). Each skip is also logged.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The broker's id for this subscription (of its first part, when it has several).
    pub fn id(&self) -> SubscriptionId {
        self.parts.first().map_or(SubscriptionId(0), |p| p.id)
    }

    /// Per shard, the offset of the next record [`Subscriber::next`] returns: where the shard
    /// started, when the broker says (`SUBSCRIBE_POSITIONS`), until a record of it is
    /// returned, then the offset after that record. A subscription at [`StartAt::Latest`] thus
    /// tells where each shard ended when it started (what `felix subscribe --exit-at-end`
    /// reads up to).
    pub fn positions(&self) -> &BTreeMap<ShardId, Offset> {
        &self.next_offsets
    }

    /// The shards this subscription reads (from the SubscribeOk answers).
    pub fn shards(&self) -> &[ShardId] {
        &self.shards
    }

    /// How many parts the subscription is made of: one per broker core it reads from (see the
    /// module), or one when it is not split.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// The options it was started with.
    pub fn options(&self) -> &SubscribeOptions {
        &self.options
    }

    /// The next record; `Ok(None)` once the broker has finished every part's stream.
    /// Cancel-safe: dropping the future loses no record. An error that ends one part (its
    /// stream reset, or a lost connection it cannot resume from) is returned once; the other
    /// parts go on, and their records come on later calls.
    ///
    /// When the connection is lost and `resume` is on, the part on that connection (in a
    /// cluster: at its shards' current owners) is opened again on a fresh connection, each of
    /// its shards at the offset after the last record `next` returned, or, before the first
    /// one, where the shard started (the broker says where in `SubscribeOk`), whatever the
    /// start (earliest, latest, an offset, a time) and with or without a group: nothing is
    /// returned twice and nothing is missed. Failed attempts are retried with the client's
    /// reconnect backoff, for as long as the subscription lives (or
    /// [`SubscribeOptions::resume_timeout_ms`], then the last error is returned); refusals
    /// that no retry can fix (a certificate or token, a stream or shard that does not exist)
    /// end the part at once. [`Subscriber::state`] shows a resume in progress.
    ///
    /// A stopping broker resets its subscription streams with `ShuttingDown`: the part resumes
    /// the same way once the connection is closed, and never ends with `Ok(None)`. Where
    /// records were deleted by retention before they were read, a shard continues at its
    /// oldest retained record (see [`Subscriber::skipped`]).
    ///
    /// Against a broker without `SUBSCRIBE_POSITIONS` a part resumes from the next offset (a
    /// single shard that returned records), from the group's commits (with a group), or from
    /// the original start (earliest, an offset or a time, what was returned skipped); one that
    /// started at `Latest` over several shards without a commit of this subscriber on each of
    /// them (in a cluster: always) cannot resume exactly and fails with `ConnectionLost`.
    pub async fn next(&mut self) -> Result<Option<ReceivedRecord>, ClientError> {
        loop {
            if let Some(r) = self.buffered.pop_front() {
                if let Some(next) = self.next_offsets.get(&r.shard).copied() {
                    if r.offset < next {
                        continue; // returned before a resume
                    }
                    if r.offset > next {
                        let gap = r.offset.0 - next.0;
                        tracing::warn!(
                            stream = %self.options.stream, shard = r.shard.0, from = next.0, gap,
                            "records deleted by retention before they were read are skipped"
                        );
                        self.skipped += gap;
                    }
                }
                self.next_offsets.insert(r.shard, Offset(r.offset.0 + 1));
                self.consumed.insert(r.shard, Offset(r.offset.0 + 1));
                return Ok(Some(r));
            }
            if self.parts.iter().all(|p| p.ended) {
                return Ok(None);
            }
            if let Some(i) = self.parts.iter().position(|p| p.stopping && !p.ended) {
                // The broker is stopping (a restart, say): the part resumes on a fresh
                // connection once this one is closed. A part whose resume is cancelled (this
                // future dropped) is resumed again next time.
                let lost = ClientError::ConnectionLost("the broker is shutting down".into());
                self.resume_after(i, lost).await?;
                continue;
            }
            self.decode_buffered()?;
            if !self.buffered.is_empty() {
                continue;
            }
            let (i, read) = self.read_any().await;
            match read {
                Ok(Some(chunk)) => self.parts[i].stream.decoder.handle_chunk(chunk),
                Ok(None) => self.parts[i].ended = true,
                Err(quinn::ReadError::Reset(code)) => {
                    let code = u16::try_from(code.into_inner())
                        .map_or(ErrorCode::Unknown, ErrorCode::from_u16);
                    if code == ErrorCode::ShuttingDown {
                        // Resumed above, next time round (the stream reads as ended now).
                        self.parts[i].stopping = true;
                        continue;
                    }
                    self.parts[i].ended = true;
                    let message = "the broker reset the subscription stream".to_owned();
                    return Err(ClientError::Broker { code, message });
                }
                Err(e) => {
                    // Why the connection went (timed out, closed), rather than quinn's
                    // "connection lost" alone.
                    let why = match e {
                        quinn::ReadError::ConnectionLost(c) => c.to_string(),
                        other => other.to_string(),
                    };
                    self.resume_after(i, ClientError::ConnectionLost(why)).await?;
                }
            }
        }
    }

    /// Decodes what the parts have received, until some records are buffered.
    fn decode_buffered(&mut self) -> Result<(), ClientError> {
        let n = self.parts.len();
        for k in 0..n {
            let part = &mut self.parts[(self.next_part + k) % n];
            while let Some(item) = part.stream.decoder.poll_frame() {
                match item {
                    Ok(Frame::EventBatch(b)) => {
                        // Offsets end below u64::MAX (the next offset after each record is
                        // computed unchecked below).
                        if b.base_offset.0.checked_add(b.records.len() as u64).is_none() {
                            return Err(ClientError::Protocol(format!(
                                "EventBatch of {} at offset {} runs past the last offset",
                                b.shard, b.base_offset.0
                            )));
                        }
                        for (i, rec) in b.records.into_iter().enumerate() {
                            self.buffered.push_back(ReceivedRecord {
                                shard: b.shard,
                                offset: Offset(b.base_offset.0 + i as u64),
                                timestamp_ms: b.timestamp_ms,
                                key: rec.key,
                                value: rec.value.into_bytes(),
                            });
                        }
                    }
                    Ok(Frame::Error(e)) => {
                        return Err(ClientError::from_broker(e.code, e.message));
                    }
                    Ok(Frame::Ping(_) | Frame::Pong(_)) => {}
                    Ok(other) => return Err(unexpected(&other, FrameType::EventBatch)),
                    Err(e) if e.fatal => {
                        part.ended = true;
                        return Err(ClientError::Protocol(format!("subscription framing: {e}")));
                    }
                    Err(e) => tracing::warn!(error = %e, "undecodable frame on a subscription"),
                }
                if !self.buffered.is_empty() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Reads the next chunk of whichever part has one first (the parts take turns at being
    /// polled first). Cancel-safe: quinn's `read_chunk` is.
    async fn read_any(&mut self) -> (usize, Result<Option<Bytes>, quinn::ReadError>) {
        let n = self.parts.len();
        let first = self.next_part % n;
        self.next_part = self.next_part.wrapping_add(1);
        let chunk =
            |r: Result<Option<quinn::Chunk>, quinn::ReadError>| r.map(|c| c.map(|c| c.bytes));
        if n == 1 {
            return (0, chunk(self.parts[0].stream.recv.read_chunk(READ_CHUNK_BYTES, true).await));
        }
        let mut reads: Vec<_> = self
            .parts
            .iter_mut()
            .enumerate()
            .filter(|(_, p)| !p.ended)
            .map(|(i, p)| {
                Box::pin(async move {
                    (i, chunk(p.stream.recv.read_chunk(READ_CHUNK_BYTES, true).await))
                })
            })
            .collect();
        // `next` reads only while some part has not ended: `reads` is not empty.
        let k = reads.len();
        let start = first % k.max(1);
        std::future::poll_fn(|cx| {
            for j in 0..k {
                if let Poll::Ready(x) = reads[(start + j) % k].as_mut().poll(cx) {
                    return Poll::Ready(x);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Takes the shards the parts read, and where those not seen before start, from the
    /// parts' SubscribeOk answers (a shard's position already known is kept: a resumed part
    /// that starts later than asked shows as a gap, retention's).
    fn update_shards(&mut self) {
        let mut shards: Vec<ShardId> =
            self.parts.iter().flat_map(|p| p.shards.iter().copied()).collect();
        shards.sort_unstable();
        shards.dedup();
        self.shards = shards;
        for (shard, start) in self.parts.iter().flat_map(|p| p.starts.iter()) {
            self.next_offsets.entry(*shard).or_insert(*start);
        }
    }

    /// Commits that the group has consumed `shard` up to, not including, `next_offset`.
    /// Needs a group and the broker's `CONSUMER_GROUPS` capability. In a cluster the commit
    /// goes to the shard's owner.
    pub async fn commit(&self, shard: ShardId, next_offset: Offset) -> Result<(), ClientError> {
        let Some(group) = &self.options.group else {
            return Err(ClientError::InvalidArgument("commit needs a consumer group".into()));
        };
        let part = self.parts.iter().find(|p| p.shards.contains(&shard)).or(self.parts.first());
        let conn = match part {
            Some(p) => p.conn.clone(),
            None => self.client.shared.conn(0).await?,
        };
        let stream = &self.options.stream;
        let commit = |conn: Arc<Conn>| async move {
            let id = conn.next_request_id();
            let frame = Frame::CommitOffset(CommitOffset {
                request_id: id,
                stream: stream.clone(),
                group: group.clone(),
                shard,
                offset: next_offset,
            });
            conn.request(id, &frame).await
        };
        let mut answer = commit(conn).await;
        if let Some(cluster) = &self.client.shared.cluster {
            answer = cluster.follow(stream, Some(shard), answer, None, commit).await;
        }
        match answer? {
            Frame::CommitOk(_) => {
                self.committed_positions().insert(shard, next_offset);
                Ok(())
            }
            other => Err(unexpected(&other, FrameType::CommitOk)),
        }
    }

    fn committed_positions(&self) -> std::sync::MutexGuard<'_, BTreeMap<ShardId, Offset>> {
        // A panic elsewhere while it was held leaves a map that is still whole.
        self.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Commits, for every shard, the position after the last record [`Subscriber::next`]
    /// returned, unless already committed.
    pub async fn commit_consumed(&mut self) -> Result<(), ClientError> {
        let todo: Vec<(ShardId, Offset)> = self
            .consumed
            .iter()
            .filter(|(s, o)| self.committed_positions().get(s) != Some(o))
            .map(|(s, o)| (*s, *o))
            .collect();
        for (shard, offset) in todo {
            self.commit(shard, offset).await?;
        }
        Ok(())
    }
}
