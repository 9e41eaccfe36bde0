//! The subscriber: one subscription on one connection, records with their shard and offset,
//! consumer-group commits.
//!
//! Call order: [`crate::Client::subscribe`] with [`SubscribeOptions`], then [`Subscriber::next`]
//! in a loop; with a group, [`Subscriber::commit_consumed`] (or [`Subscriber::commit`]) whenever
//! the application has processed what it received. Records are read straight from the
//! subscription's QUIC stream, so a slow reader slows the broker's sending (flow control), and
//! nothing is buffered beyond one decoded batch.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use felix_proto::{
    CommitOffset, ErrorCode, Frame, FrameType, Offset, ShardId, StartAt, Subscribe, SubscribeOk,
    SubscriptionId,
};

use crate::client::Client;
use crate::conn::{unexpected, Conn, SubStream};
use crate::error::ClientError;

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
    conn: Arc<Conn>,
    options: SubscribeOptions,
    id: SubscriptionId,
    shards: Vec<ShardId>,
    stream: SubStream,
    buffered: VecDeque<ReceivedRecord>,
    /// The next offset to read per shard, from the records handed out.
    consumed: BTreeMap<ShardId, Offset>,
    committed: BTreeMap<ShardId, Offset>,
    resumes: u64,
    ended: bool,
}

impl Subscriber {
    pub(crate) async fn start(
        client: Client,
        slot: usize,
        options: SubscribeOptions,
    ) -> Result<Self, ClientError> {
        let conn = client.shared.conn(slot).await?;
        let (ok, stream) = open(&conn, &options, options.start).await?;
        Ok(Self {
            client,
            conn,
            options,
            id: ok.subscription_id,
            shards: ok.shards,
            stream,
            buffered: VecDeque::new(),
            consumed: BTreeMap::new(),
            committed: BTreeMap::new(),
            resumes: 0,
            ended: false,
        })
    }

    /// How many times the subscription resumed after a lost connection.
    pub fn resumes(&self) -> u64 {
        self.resumes
    }

    /// The broker's id for this subscription.
    pub fn id(&self) -> SubscriptionId {
        self.id
    }

    /// The shards this subscription reads (from SubscribeOk).
    pub fn shards(&self) -> &[ShardId] {
        &self.shards
    }

    /// The options it was started with.
    pub fn options(&self) -> &SubscribeOptions {
        &self.options
    }

    /// The next record; `Ok(None)` once the broker has finished the subscription's stream.
    /// Cancel-safe: dropping the future loses no record.
    ///
    /// When the connection is lost and `resume` is on, the subscription is opened again on a
    /// fresh connection (with the client's reconnect backoff) and records already returned
    /// are skipped, so nothing is returned twice and nothing is missed. It resumes from the
    /// group's commits (with a group), from the next offset (a single shard), or from the
    /// original start (earliest, an offset or a time). A subscription without a group over
    /// several shards that started at `Latest` cannot resume without missing records: it
    /// fails with `ConnectionLost` instead.
    pub async fn next(&mut self) -> Result<Option<ReceivedRecord>, ClientError> {
        loop {
            if let Some(r) = self.buffered.pop_front() {
                if self.consumed.get(&r.shard).is_some_and(|next| r.offset < *next) {
                    continue; // returned before a resume
                }
                self.consumed.insert(r.shard, Offset(r.offset.0 + 1));
                return Ok(Some(r));
            }
            if self.ended {
                return Ok(None);
            }
            while let Some(item) = self.stream.decoder.poll_frame() {
                match item {
                    Ok(Frame::EventBatch(b)) => {
                        for (i, rec) in b.records.into_iter().enumerate() {
                            self.buffered.push_back(ReceivedRecord {
                                shard: b.shard,
                                offset: Offset(b.base_offset.0 + i as u64),
                                timestamp_ms: b.timestamp_ms,
                                key: rec.key,
                                value: rec.value,
                            });
                        }
                    }
                    Ok(Frame::Error(e)) => {
                        return Err(ClientError::from_broker(e.code, e.message));
                    }
                    Ok(Frame::Ping(_) | Frame::Pong(_)) => {}
                    Ok(other) => return Err(unexpected(&other, FrameType::EventBatch)),
                    Err(e) if e.fatal => {
                        self.ended = true;
                        return Err(ClientError::Protocol(format!("subscription framing: {e}")));
                    }
                    Err(e) => tracing::warn!(error = %e, "undecodable frame on a subscription"),
                }
                if !self.buffered.is_empty() {
                    break;
                }
            }
            if !self.buffered.is_empty() {
                continue;
            }
            match self.stream.recv.read_chunk(READ_CHUNK_BYTES, true).await {
                Ok(Some(chunk)) => self.stream.decoder.handle_chunk(chunk.bytes),
                Ok(None) => self.ended = true,
                Err(quinn::ReadError::Reset(code)) => {
                    self.ended = true;
                    let code = u16::try_from(code.into_inner())
                        .map_or(ErrorCode::Unknown, ErrorCode::from_u16);
                    let message = "the broker reset the subscription stream".to_owned();
                    return Err(ClientError::Broker { code, message });
                }
                Err(e) => {
                    let lost = ClientError::ConnectionLost(e.to_string());
                    self.resume_after(lost).await?;
                }
            }
        }
    }

    /// Opens the subscription again after `lost`, or returns `lost` when it cannot resume.
    async fn resume_after(&mut self, lost: ClientError) -> Result<(), ClientError> {
        let Some(start) = self.resume_start() else {
            self.ended = true;
            return Err(lost);
        };
        tracing::warn!(error = %lost, stream = %self.options.stream, "resuming subscription");
        // Whatever was decoded but not returned is read again on the new stream.
        self.buffered.clear();
        let slot = self.client.shared.next_slot();
        let conn = self.client.shared.conn(slot).await?;
        let (ok, stream) = open(&conn, &self.options, start).await?;
        self.conn = conn;
        self.id = ok.subscription_id;
        self.shards = ok.shards;
        self.stream = stream;
        self.resumes += 1;
        Ok(())
    }

    /// Where a resumed subscription starts, when it can resume without missing records.
    fn resume_start(&self) -> Option<StartAt> {
        let o = &self.options;
        if !o.resume {
            return None;
        }
        if o.group.is_some() {
            return Some(o.start);
        }
        if let [shard] = self.shards[..] {
            return Some(self.consumed.get(&shard).map_or(o.start, |next| StartAt::Offset(*next)));
        }
        (o.start != StartAt::Latest).then_some(o.start)
    }

    /// Commits that the group has consumed `shard` up to, not including, `next_offset`.
    /// Needs a group and the broker's `CONSUMER_GROUPS` capability.
    pub async fn commit(&self, shard: ShardId, next_offset: Offset) -> Result<(), ClientError> {
        let Some(group) = &self.options.group else {
            return Err(ClientError::InvalidArgument("commit needs a consumer group".into()));
        };
        let id = self.conn.next_request_id();
        let frame = Frame::CommitOffset(CommitOffset {
            request_id: id,
            stream: self.options.stream.clone(),
            group: group.clone(),
            shard,
            offset: next_offset,
        });
        match self.conn.request(id, &frame).await? {
            Frame::CommitOk(_) => Ok(()),
            other => Err(unexpected(&other, FrameType::CommitOk)),
        }
    }

    /// Commits, for every shard, the position after the last record [`Subscriber::next`]
    /// returned, unless already committed.
    pub async fn commit_consumed(&mut self) -> Result<(), ClientError> {
        let todo: Vec<(ShardId, Offset)> = self
            .consumed
            .iter()
            .filter(|(s, o)| self.committed.get(s) != Some(o))
            .map(|(s, o)| (*s, *o))
            .collect();
        for (shard, offset) in todo {
            self.commit(shard, offset).await?;
            self.committed.insert(shard, offset);
        }
        Ok(())
    }
}

/// Sends Subscribe on `conn` and takes the subscription's stream.
async fn open(
    conn: &Conn,
    options: &SubscribeOptions,
    start: StartAt,
) -> Result<(SubscribeOk, SubStream), ClientError> {
    let id = conn.next_request_id();
    let frame = Frame::Subscribe(Subscribe {
        request_id: id,
        stream: options.stream.clone(),
        shards: options.shards.clone(),
        start,
        group: options.group.clone(),
    });
    let ok = match conn.request(id, &frame).await? {
        Frame::SubscribeOk(ok) => ok,
        other => return Err(unexpected(&other, FrameType::SubscribeOk)),
    };
    let stream = conn.take_subscription_stream(ok.subscription_id).await?;
    Ok((ok, stream))
}
