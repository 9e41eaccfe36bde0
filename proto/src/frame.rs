//! Frames: the typed bodies, and their encoding and decoding.
//!
//! Every body layout is documented byte-exact in `docs/protocol.md`. Decoding is zero-copy
//! (payloads and keys are slices of the frame's buffer), bounded by [`Limits`] and total: any
//! input yields a frame or a [`DecodeError`].

use bytes::{BufMut, Bytes, BytesMut};

use crate::cluster::{self, Metadata, MetadataOk, NotOwner};
use crate::codec::{Reader, WriteExt};
use crate::error::{DecodeError, ErrorCode};
use crate::event_batch;
use crate::header::{Capabilities, Flags, FrameHeader, FrameType, HEADER_LEN};
use crate::limits::{self, Limits};
use crate::payload::Payload;
use crate::publish;
use crate::replica::{self, Replicate};
use crate::{AckMode, CoreId, Offset, ProducerId, ProducerTag, Record, ShardId};

/// Correlates a request with its answer. Chosen by the client; 0 means "no request".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RequestId(pub u64);

/// Names a subscription on a connection. Chosen by the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SubscriptionId(pub u64);

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Opens the control stream.
    Hello(Hello),
    /// Answers Hello.
    HelloOk(HelloOk),
    /// Creates a stream.
    CreateStream(CreateStream),
    /// Asks for one stream's settings.
    DescribeStream(DescribeStream),
    /// Deletes a stream and its records.
    DeleteStream(DescribeStream),
    /// Changes a stream's settings.
    AlterStream(AlterStream),
    /// A stream's settings.
    StreamInfo(StreamInfo),
    /// Lists streams by prefix.
    ListStreams(ListStreams),
    /// Answers ListStreams.
    StreamList(StreamList),
    /// Asks where a stream's shards live (cluster).
    Metadata(Metadata),
    /// Answers Metadata.
    MetadataOk(MetadataOk),
    /// The request's shard lives on another broker (cluster).
    NotOwner(NotOwner),
    /// A batch of records to store.
    Publish(Publish),
    /// A batch was stored.
    PublishAck(PublishAck),
    /// A batch was refused.
    PublishError(ErrorBody),
    /// Starts a subscription.
    Subscribe(Subscribe),
    /// The subscription started.
    SubscribeOk(SubscribeOk),
    /// Opens a subscription's unidirectional stream.
    SubscriptionStart(SubscriptionId),
    /// Records of one shard.
    EventBatch(EventBatch),
    /// Stores a consumer group's position.
    CommitOffset(CommitOffset),
    /// The position was stored durably.
    CommitOk(RequestId),
    /// A request, or the connection, failed.
    Error(ErrorBody),
    /// Liveness probe.
    Ping(u64),
    /// Answers Ping.
    Pong(u64),
    /// One replication message of one shard, between brokers.
    Replicate(Replicate),
}

/// Hello: the first frame on the control stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The protocol version the client speaks.
    pub version: u16,
    /// The client's capabilities.
    pub capabilities: Capabilities,
    /// A bearer token, if the client has one.
    pub token: Option<Bytes>,
}

/// HelloOk: the broker accepted Hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloOk {
    /// The protocol version the broker speaks.
    pub version: u16,
    /// The broker's capabilities.
    pub capabilities: Capabilities,
    /// The limits the broker enforces.
    pub limits: Limits,
    /// The core that owns this connection.
    pub core: CoreId,
    /// How many cores the broker runs (so a client can spread connections over them).
    pub core_count: u16,
}

/// Retention of a stream. `None` is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Retention {
    /// Bytes kept per shard before the oldest segments are deleted.
    pub bytes_max: Option<u64>,
    /// Age in milliseconds after which segments are deleted.
    pub age_max_ms: Option<u64>,
}

/// CreateStream: create `stream` with `shards` shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateStream {
    /// Correlation.
    pub request_id: RequestId,
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// Shard count, 1..=MAX_SHARDS_PER_STREAM.
    pub shards: u32,
    /// Retention.
    pub retention: Retention,
    /// Replication factor (flag `REPLICAS`; a broker of a cluster only): `None` leaves it to
    /// the broker (`felix serve --default-replicas`).
    pub replicas: Option<u8>,
}

/// DescribeStream: ask for a stream's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribeStream {
    /// Correlation.
    pub request_id: RequestId,
    /// `tenant/namespace/stream`.
    pub stream: String,
}

/// AlterStream: change some of a stream's settings; what is `None` stays as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterStream {
    /// Correlation.
    pub request_id: RequestId,
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// The new settings.
    pub changes: StreamChanges,
}

/// The settings an AlterStream changes. `Some(0)` for a retention limit makes it unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StreamChanges {
    /// Bytes kept per shard (0: unlimited).
    pub retention_bytes: Option<u64>,
    /// Age in milliseconds after which records are deleted (0: unlimited).
    pub retention_ms: Option<u64>,
    /// Replication factor.
    pub replicas: Option<u8>,
}

impl StreamChanges {
    const RETENTION_BYTES: u8 = 0x01;
    const RETENTION_MS: u8 = 0x02;
    const REPLICAS: u8 = 0x04;

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `retention` with these changes applied.
    pub fn apply(&self, retention: Retention) -> Retention {
        let limit = |v: u64| (v != 0).then_some(v);
        Retention {
            bytes_max: self.retention_bytes.map_or(retention.bytes_max, limit),
            age_max_ms: self.retention_ms.map_or(retention.age_max_ms, limit),
        }
    }

    fn mask(&self) -> u8 {
        let mut m = 0;
        if self.retention_bytes.is_some() {
            m |= Self::RETENTION_BYTES;
        }
        if self.retention_ms.is_some() {
            m |= Self::RETENTION_MS;
        }
        if self.replicas.is_some() {
            m |= Self::REPLICAS;
        }
        m
    }
}

/// StreamInfo: a stream's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// Correlation.
    pub request_id: RequestId,
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// Shard count.
    pub shards: u32,
    /// Retention.
    pub retention: Retention,
}

/// ListStreams: names of the streams starting with `prefix` that the caller may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListStreams {
    /// Correlation.
    pub request_id: RequestId,
    /// Name prefix; empty lists all.
    pub prefix: String,
}

/// StreamList: answers ListStreams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamList {
    /// Correlation.
    pub request_id: RequestId,
    /// Stream names.
    pub streams: Vec<String>,
}

/// Asks for an ack (the ACKED prefix of Publish).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckRequest {
    /// Correlation: the ack or error carries it.
    pub request_id: RequestId,
    /// When to ack.
    pub mode: AckMode,
}

/// Publish: a batch of records for one stream.
///
/// Body: `[ACKED: request_id u64, ack_mode u8] [KEYED: key_len u16, key] [PRODUCER: producer
/// u64, seq u32] stream, count u32, count x (len u32, payload)`. The request id stays at offset 0 so that even a malformed body
/// can be answered with a correlated error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    /// Present when an ack (or a correlated error) is wanted.
    pub ack: Option<AckRequest>,
    /// The batch's key: all records go to `shard_for_key(key)`. An empty key is a key.
    pub key: Option<Bytes>,
    /// Idempotent publishing (capability `IDEMPOTENT`): the batch's producer and sequence. The
    /// shard's owner stores a tagged batch once; a retry gets the original offsets.
    pub producer: Option<ProducerTag>,
    /// Flag `OLDEST_PENDING` (capability `OLDEST_PENDING`, only with `producer`): the producer
    /// has no earlier batch unresolved (each one it sent before was acked or failed), so a
    /// shard that does not know the producer (never did, or forgot it: expired or evicted)
    /// may take this batch at its sequence number instead of refusing it with
    /// `OutOfOrderSequence` until sequence 0 arrives.
    pub oldest_pending: bool,
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// Payloads: decoded, each is the slices of the received chunks it arrived in.
    pub records: Vec<Payload>,
}

/// PublishAck: the batch was stored in `shard` at `base_offset..base_offset + count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishAck {
    /// Correlation.
    pub request_id: RequestId,
    /// The shard.
    pub shard: ShardId,
    /// The first record's offset.
    pub base_offset: Offset,
    /// The record count.
    pub count: u32,
}

/// The body of PublishError and Error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorBody {
    /// Correlation; `RequestId(0)` for a connection-level error.
    pub request_id: RequestId,
    /// What went wrong.
    pub code: ErrorCode,
    /// A human-readable explanation.
    pub message: String,
}

/// Where a subscription starts, per shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest retained record.
    Earliest,
    /// The next record to be stored.
    Latest,
    /// This offset.
    Offset(Offset),
    /// The first record stored at or after this Unix time in milliseconds.
    Timestamp(u64),
}

/// Subscribe: start receiving `stream`'s records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// Correlation.
    pub request_id: RequestId,
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// The shards to read; `None` reads all.
    pub shards: Option<Vec<ShardId>>,
    /// Where to start when the group has no committed position.
    pub start: StartAt,
    /// A consumer group: resume from its committed positions.
    pub group: Option<String>,
    /// Flag `POSITIONS` (capability `SUBSCRIBE_POSITIONS`): the offset each shard of `shards`
    /// starts at, in its order (one per shard; sent only with a shard list). They replace
    /// `start` and the group's commits: how a subscription resumes each shard where it was.
    pub positions: Option<Vec<Offset>>,
}

/// SubscribeOk: the subscription started; EventBatches follow on a unidirectional stream that
/// opens with SubscriptionStart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscribeOk {
    /// Correlation.
    pub request_id: RequestId,
    /// The subscription.
    pub subscription_id: SubscriptionId,
    /// The shards it reads.
    pub shards: Vec<ShardId>,
    /// Flag `POSITIONS` (sent to a client that advertised `SUBSCRIBE_POSITIONS`): the offset
    /// each shard of `shards` starts at, in its order.
    pub positions: Option<Vec<Offset>>,
}

/// EventBatch: records `base_offset..` of `shard`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventBatch {
    /// The shard.
    pub shard: ShardId,
    /// The first record's offset.
    pub base_offset: Offset,
    /// When the batch was stored (Unix ms).
    pub timestamp_ms: u64,
    /// The records, with their keys.
    pub records: Vec<Record>,
}

/// CommitOffset: `group` has consumed `shard` of `stream` up to (not including) `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitOffset {
    /// Correlation.
    pub request_id: RequestId,
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// The consumer group.
    pub group: String,
    /// The shard.
    pub shard: ShardId,
    /// The next offset the group will read.
    pub offset: Offset,
}

impl Frame {
    /// The frame's type.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Self::Hello(_) => FrameType::Hello,
            Self::HelloOk(_) => FrameType::HelloOk,
            Self::CreateStream(_) => FrameType::CreateStream,
            Self::DescribeStream(_) => FrameType::DescribeStream,
            Self::DeleteStream(_) => FrameType::DeleteStream,
            Self::AlterStream(_) => FrameType::AlterStream,
            Self::StreamInfo(_) => FrameType::StreamInfo,
            Self::ListStreams(_) => FrameType::ListStreams,
            Self::StreamList(_) => FrameType::StreamList,
            Self::Metadata(_) => FrameType::Metadata,
            Self::MetadataOk(_) => FrameType::MetadataOk,
            Self::NotOwner(_) => FrameType::NotOwner,
            Self::Publish(_) => FrameType::Publish,
            Self::PublishAck(_) => FrameType::PublishAck,
            Self::PublishError(_) => FrameType::PublishError,
            Self::Subscribe(_) => FrameType::Subscribe,
            Self::SubscribeOk(_) => FrameType::SubscribeOk,
            Self::SubscriptionStart(_) => FrameType::SubscriptionStart,
            Self::EventBatch(_) => FrameType::EventBatch,
            Self::CommitOffset(_) => FrameType::CommitOffset,
            Self::CommitOk(_) => FrameType::CommitOk,
            Self::Error(_) => FrameType::Error,
            Self::Ping(_) => FrameType::Ping,
            Self::Pong(_) => FrameType::Pong,
            Self::Replicate(_) => FrameType::Replicate,
        }
    }

    /// The flag bits this frame is encoded with.
    pub fn flags(&self) -> Flags {
        match self {
            Self::Publish(p) => p.flags(),
            Self::CreateStream(c) if c.replicas.is_some() => Flags::REPLICAS,
            Self::Subscribe(s) if s.positions.is_some() && s.shards.is_some() => Flags::POSITIONS,
            Self::SubscribeOk(s) if s.positions.is_some() => Flags::POSITIONS,
            _ => Flags::NONE,
        }
    }

    /// Appends the frame, header included, to `dst`.
    ///
    /// The caller keeps the frame within the protocol's fixed limits (names, messages, tokens);
    /// longer text fields are cut at their limit rather than corrupting the framing.
    pub fn encode(&self, dst: &mut BytesMut) {
        let start = dst.len();
        dst.put_slice(&[0u8; HEADER_LEN]);
        self.encode_body(dst);
        let body_len = dst.len() - start - HEADER_LEN;
        let header = FrameHeader {
            frame_type: self.frame_type(),
            flags: self.flags(),
            body_len: u32::try_from(body_len).unwrap_or(u32::MAX),
        };
        dst[start..start + HEADER_LEN].copy_from_slice(&header.encode());
    }

    /// The frame encoded into a fresh buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::new();
        self.encode(&mut buf);
        buf.freeze()
    }

    fn encode_body(&self, dst: &mut BytesMut) {
        match self {
            Self::Hello(h) => {
                dst.put_u16(h.version);
                dst.put_u64(h.capabilities.0);
                match &h.token {
                    Some(t) => {
                        dst.put_u8(1);
                        dst.put_bytes_u16(t);
                    }
                    None => dst.put_u8(0),
                }
            }
            Self::HelloOk(h) => {
                dst.put_u16(h.version);
                dst.put_u64(h.capabilities.0);
                dst.put_u32(h.limits.max_frame_bytes);
                dst.put_u32(h.limits.max_batch_records);
                dst.put_u16(h.limits.max_key_bytes);
                dst.put_u16(h.core.0);
                dst.put_u16(h.core_count);
            }
            Self::CreateStream(c) => {
                dst.put_u64(c.request_id.0);
                dst.put_bytes_u16(c.stream.as_bytes());
                dst.put_u32(c.shards);
                put_retention(dst, c.retention);
                if let Some(n) = c.replicas {
                    dst.put_u8(n);
                }
            }
            Self::DescribeStream(d) | Self::DeleteStream(d) => {
                dst.put_u64(d.request_id.0);
                dst.put_bytes_u16(d.stream.as_bytes());
            }
            Self::AlterStream(a) => {
                dst.put_u64(a.request_id.0);
                dst.put_bytes_u16(a.stream.as_bytes());
                dst.put_u8(a.changes.mask());
                dst.put_u64(a.changes.retention_bytes.unwrap_or(0));
                dst.put_u64(a.changes.retention_ms.unwrap_or(0));
                dst.put_u8(a.changes.replicas.unwrap_or(0));
            }
            Self::StreamInfo(s) => {
                dst.put_u64(s.request_id.0);
                dst.put_bytes_u16(s.stream.as_bytes());
                dst.put_u32(s.shards);
                put_retention(dst, s.retention);
            }
            Self::ListStreams(l) => {
                dst.put_u64(l.request_id.0);
                dst.put_bytes_u16(l.prefix.as_bytes());
            }
            Self::StreamList(l) => {
                dst.put_u64(l.request_id.0);
                dst.put_u32(len_u32(l.streams.len()));
                for s in &l.streams {
                    dst.put_bytes_u16(s.as_bytes());
                }
            }
            Self::Metadata(m) => cluster::encode_metadata(m, dst),
            Self::MetadataOk(m) => cluster::encode_metadata_ok(m, dst),
            Self::NotOwner(n) => cluster::encode_not_owner(n, dst),
            Self::Publish(p) => publish::encode_publish_body(p, dst),
            Self::PublishAck(a) => {
                dst.put_u64(a.request_id.0);
                dst.put_u32(a.shard.0);
                dst.put_u64(a.base_offset.0);
                dst.put_u32(a.count);
            }
            Self::PublishError(e) | Self::Error(e) => {
                dst.put_u64(e.request_id.0);
                dst.put_u16(e.code.as_u16());
                dst.put_bytes_u16(truncate_utf8(&e.message, limits::MAX_MESSAGE_BYTES));
            }
            Self::Subscribe(s) => {
                dst.put_u64(s.request_id.0);
                dst.put_bytes_u16(s.stream.as_bytes());
                match &s.shards {
                    None => dst.put_u8(0),
                    Some(shards) => {
                        dst.put_u8(1);
                        put_shards(dst, shards);
                    }
                }
                match s.start {
                    StartAt::Earliest => dst.put_u8(0),
                    StartAt::Latest => dst.put_u8(1),
                    StartAt::Offset(o) => {
                        dst.put_u8(2);
                        dst.put_u64(o.0);
                    }
                    StartAt::Timestamp(t) => {
                        dst.put_u8(3);
                        dst.put_u64(t);
                    }
                }
                match &s.group {
                    None => dst.put_u8(0),
                    Some(g) => {
                        dst.put_u8(1);
                        dst.put_bytes_u16(g.as_bytes());
                    }
                }
                if let (Some(shards), Some(positions)) = (&s.shards, &s.positions) {
                    put_positions(dst, shards.len(), positions);
                }
            }
            Self::SubscribeOk(s) => {
                dst.put_u64(s.request_id.0);
                dst.put_u64(s.subscription_id.0);
                put_shards(dst, &s.shards);
                if let Some(positions) = &s.positions {
                    put_positions(dst, s.shards.len(), positions);
                }
            }
            Self::SubscriptionStart(id) => dst.put_u64(id.0),
            Self::EventBatch(b) => event_batch::encode_event_batch_body(b, dst),
            Self::CommitOffset(c) => {
                dst.put_u64(c.request_id.0);
                dst.put_bytes_u16(c.stream.as_bytes());
                dst.put_bytes_u16(c.group.as_bytes());
                dst.put_u32(c.shard.0);
                dst.put_u64(c.offset.0);
            }
            Self::CommitOk(id) => dst.put_u64(id.0),
            Self::Ping(n) | Self::Pong(n) => dst.put_u64(*n),
            Self::Replicate(m) => replica::encode_replicate(m, dst),
        }
    }

    /// Decodes the body of a frame whose header was already checked (`flags` known for
    /// `frame_type` and allowed). `body` is exactly the body's bytes.
    pub fn decode_body(
        frame_type: FrameType,
        flags: Flags,
        body: Bytes,
        limits: &Limits,
    ) -> Result<Frame, DecodeError> {
        Self::decode_parts(frame_type, flags, Reader::new(body), limits)
    }

    /// [`Frame::decode_body`] for a body held in parts (the chunks it arrived in): record
    /// payloads of a Publish are slices of the parts; other fields that straddle parts are
    /// copied.
    pub fn decode_parts(
        frame_type: FrameType,
        flags: Flags,
        mut r: Reader,
        limits: &Limits,
    ) -> Result<Frame, DecodeError> {
        let frame = match frame_type {
            FrameType::Hello => {
                let version = r.u16("version")?;
                let capabilities = Capabilities(r.u64("capabilities")?);
                let token = match presence(&mut r, "token presence")? {
                    false => None,
                    true => Some(r.bytes_u16(limits::MAX_TOKEN_BYTES, "token")?),
                };
                Frame::Hello(Hello { version, capabilities, token })
            }
            FrameType::HelloOk => Frame::HelloOk(HelloOk {
                version: r.u16("version")?,
                capabilities: Capabilities(r.u64("capabilities")?),
                limits: Limits {
                    max_frame_bytes: r.u32("max_frame_bytes")?,
                    max_batch_records: r.u32("max_batch_records")?,
                    max_key_bytes: r.u16("max_key_bytes")?,
                },
                core: CoreId(r.u16("core")?),
                core_count: r.u16("core_count")?,
            }),
            FrameType::CreateStream => Frame::CreateStream(CreateStream {
                request_id: RequestId(r.u64("request_id")?),
                stream: stream_name(&mut r)?,
                shards: r.u32("shards")?,
                retention: retention(&mut r)?,
                replicas: match flags.contains(Flags::REPLICAS) {
                    true => Some(r.u8("replicas")?),
                    false => None,
                },
            }),
            FrameType::DescribeStream => Frame::DescribeStream(DescribeStream {
                request_id: RequestId(r.u64("request_id")?),
                stream: stream_name(&mut r)?,
            }),
            FrameType::DeleteStream => Frame::DeleteStream(DescribeStream {
                request_id: RequestId(r.u64("request_id")?),
                stream: stream_name(&mut r)?,
            }),
            FrameType::AlterStream => Frame::AlterStream(decode_alter_stream(&mut r)?),
            FrameType::StreamInfo => Frame::StreamInfo(StreamInfo {
                request_id: RequestId(r.u64("request_id")?),
                stream: stream_name(&mut r)?,
                shards: r.u32("shards")?,
                retention: retention(&mut r)?,
            }),
            FrameType::ListStreams => Frame::ListStreams(ListStreams {
                request_id: RequestId(r.u64("request_id")?),
                prefix: r.string_u16(limits::MAX_STREAM_NAME_BYTES, "prefix")?,
            }),
            FrameType::StreamList => {
                let request_id = RequestId(r.u64("request_id")?);
                // Each name takes at least its 2-byte length.
                let count = bounded_count(&mut r, limits::MAX_LISTED_STREAMS, 2, "stream count")?;
                let mut streams = Vec::with_capacity(count);
                for _ in 0..count {
                    streams.push(stream_name(&mut r)?);
                }
                Frame::StreamList(StreamList { request_id, streams })
            }
            FrameType::Metadata => Frame::Metadata(cluster::decode_metadata(&mut r)?),
            FrameType::MetadataOk => Frame::MetadataOk(cluster::decode_metadata_ok(&mut r)?),
            FrameType::NotOwner => Frame::NotOwner(cluster::decode_not_owner(&mut r)?),
            FrameType::Publish => Frame::Publish(decode_publish(&mut r, flags, limits)?),
            FrameType::PublishAck => Frame::PublishAck(PublishAck {
                request_id: RequestId(r.u64("request_id")?),
                shard: ShardId(r.u32("shard")?),
                base_offset: Offset(r.u64("base_offset")?),
                count: r.u32("count")?,
            }),
            FrameType::PublishError => Frame::PublishError(error_body(&mut r)?),
            FrameType::Subscribe => Frame::Subscribe(decode_subscribe(&mut r, flags)?),
            FrameType::SubscribeOk => {
                let request_id = RequestId(r.u64("request_id")?);
                let subscription_id = SubscriptionId(r.u64("subscription_id")?);
                let shards = shard_list(&mut r)?;
                let positions = match flags.contains(Flags::POSITIONS) {
                    true => Some(positions(&mut r, shards.len())?),
                    false => None,
                };
                Frame::SubscribeOk(SubscribeOk { request_id, subscription_id, shards, positions })
            }
            FrameType::SubscriptionStart => {
                Frame::SubscriptionStart(SubscriptionId(r.u64("subscription_id")?))
            }
            FrameType::EventBatch => Frame::EventBatch(decode_event_batch(&mut r, limits)?),
            FrameType::CommitOffset => Frame::CommitOffset(CommitOffset {
                request_id: RequestId(r.u64("request_id")?),
                stream: stream_name(&mut r)?,
                group: r.string_u16(limits::MAX_GROUP_NAME_BYTES, "group")?,
                shard: ShardId(r.u32("shard")?),
                offset: Offset(r.u64("offset")?),
            }),
            FrameType::CommitOk => Frame::CommitOk(RequestId(r.u64("request_id")?)),
            FrameType::Error => Frame::Error(error_body(&mut r)?),
            FrameType::Ping => Frame::Ping(r.u64("nonce")?),
            FrameType::Pong => Frame::Pong(r.u64("nonce")?),
            FrameType::Replicate => Frame::Replicate(replica::decode_replicate(&mut r, limits)?),
        };
        r.expect_end()?;
        Ok(frame)
    }
}

fn decode_publish(r: &mut Reader, flags: Flags, limits: &Limits) -> Result<Publish, DecodeError> {
    let ack = if flags.contains(Flags::ACKED) {
        let request_id = RequestId(r.u64("request_id")?);
        let raw = r.u8("ack_mode")?;
        let mode = AckMode::from_u8(raw)
            .ok_or(DecodeError::InvalidValue { what: "ack_mode", value: u64::from(raw) })?;
        Some(AckRequest { request_id, mode })
    } else {
        None
    };
    let key = if flags.contains(Flags::KEYED) { Some(key(r, limits)?) } else { None };
    let producer = if flags.contains(Flags::PRODUCER) {
        let producer = ProducerId(r.u64("producer")?);
        Some(ProducerTag { producer, seq: r.u32("seq")? })
    } else {
        None
    };
    // Without a tag the flag means nothing: ignored, as the encoder never sets it then.
    let oldest_pending = producer.is_some() && flags.contains(Flags::OLDEST_PENDING);
    let stream = stream_name(r)?;
    let records = payloads(r, limits)?;
    Ok(Publish { ack, key, producer, oldest_pending, stream, records })
}

fn decode_subscribe(r: &mut Reader, flags: Flags) -> Result<Subscribe, DecodeError> {
    let request_id = RequestId(r.u64("request_id")?);
    let stream = stream_name(r)?;
    let shards = match presence(r, "shards presence")? {
        false => None,
        // Absent means every shard; a present list names at least one.
        true => match shard_list(r)? {
            list if list.is_empty() => {
                return Err(DecodeError::InvalidValue { what: "shard count", value: 0 })
            }
            list => Some(list),
        },
    };
    let start = match r.u8("start kind")? {
        0 => StartAt::Earliest,
        1 => StartAt::Latest,
        2 => StartAt::Offset(Offset(r.u64("start offset")?)),
        3 => StartAt::Timestamp(r.u64("start timestamp")?),
        other => {
            return Err(DecodeError::InvalidValue { what: "start kind", value: u64::from(other) })
        }
    };
    let group = match presence(r, "group presence")? {
        false => None,
        true => Some(r.string_u16(limits::MAX_GROUP_NAME_BYTES, "group")?),
    };
    let positions = match (flags.contains(Flags::POSITIONS), &shards) {
        (false, _) => None,
        (true, Some(list)) => Some(positions(r, list.len())?),
        // Positions belong to the shards of a list: without one there is nothing to place.
        (true, None) => {
            return Err(DecodeError::InvalidValue {
                what: "positions without a shard list",
                value: 0,
            })
        }
    };
    Ok(Subscribe { request_id, stream, shards, start, group, positions })
}

fn decode_event_batch(r: &mut Reader, limits: &Limits) -> Result<EventBatch, DecodeError> {
    let shard = ShardId(r.u32("shard")?);
    let base_offset = Offset(r.u64("base_offset")?);
    let timestamp_ms = r.u64("timestamp_ms")?;
    // A record takes at least 5 bytes: key presence and value length.
    let count = record_count(r, limits, 5)?;
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let key = match presence(r, "key presence")? {
            false => None,
            true => Some(key(r, limits)?),
        };
        let len = r.u32("record length")? as usize;
        // One slice for the reader of a subscription (copied here only if it straddles parts).
        let value = Payload::from(r.bytes(len, "record")?);
        records.push(Record { key, value });
    }
    Ok(EventBatch { shard, base_offset, timestamp_ms, records })
}

fn payloads(r: &mut Reader, limits: &Limits) -> Result<Vec<Payload>, DecodeError> {
    // A record takes at least its 4-byte length.
    let count = record_count(r, limits, 4)?;
    // A batch holds at least one record: an empty one would store nothing and ack no offset.
    if count == 0 {
        return Err(DecodeError::InvalidValue { what: "record count", value: 0 });
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let len = r.u32("record length")? as usize;
        records.push(r.payload(len, "record")?);
    }
    Ok(records)
}

/// Reads a record count, checked against the limit and against what the body can hold, so the
/// vector allocated for it is bounded by the input's size: at most `size_of::<T>() / min_bytes`
/// bytes per input byte, which is 88 / 5 = 17.6 for an EventBatch's `Record`s (a valid batch of
/// empty records needs that much), 56 / 4 = 14 for a Publish's `Payload`s
/// (`tests/arbitrary_bytes.rs` checks the bound).
fn record_count(r: &mut Reader, limits: &Limits, min_bytes: usize) -> Result<usize, DecodeError> {
    let count = r.u32("record count")?;
    if count > limits.max_batch_records {
        return Err(DecodeError::TooManyRecords {
            count: u64::from(count),
            max: limits.max_batch_records,
        });
    }
    let count = count as usize;
    if count.saturating_mul(min_bytes) > r.remaining() {
        return Err(DecodeError::Truncated { what: "records" });
    }
    Ok(count)
}

fn bounded_count(
    r: &mut Reader,
    max: usize,
    min_bytes: usize,
    what: &'static str,
) -> Result<usize, DecodeError> {
    let count = r.u32(what)? as usize;
    if count > max {
        return Err(DecodeError::FieldTooLong { what, len: count, max });
    }
    if count.saturating_mul(min_bytes) > r.remaining() {
        return Err(DecodeError::Truncated { what });
    }
    Ok(count)
}

fn key(r: &mut Reader, limits: &Limits) -> Result<Bytes, DecodeError> {
    let len = usize::from(r.u16("key length")?);
    if len > usize::from(limits.max_key_bytes) {
        return Err(DecodeError::KeyTooLong { len, max: limits.max_key_bytes });
    }
    r.bytes(len, "key")
}

fn presence(r: &mut Reader, what: &'static str) -> Result<bool, DecodeError> {
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(DecodeError::InvalidValue { what, value: u64::from(other) }),
    }
}

fn decode_alter_stream(r: &mut Reader) -> Result<AlterStream, DecodeError> {
    let request_id = RequestId(r.u64("request_id")?);
    let stream = stream_name(r)?;
    let mask = r.u8("changes")?;
    let known =
        StreamChanges::RETENTION_BYTES | StreamChanges::RETENTION_MS | StreamChanges::REPLICAS;
    if mask & !known != 0 {
        return Err(DecodeError::InvalidValue { what: "changes", value: u64::from(mask) });
    }
    let bytes = r.u64("retention bytes")?;
    let age = r.u64("retention age")?;
    let replicas = r.u8("replicas")?;
    let given = |bit: u8| mask & bit != 0;
    Ok(AlterStream {
        request_id,
        stream,
        changes: StreamChanges {
            retention_bytes: given(StreamChanges::RETENTION_BYTES).then_some(bytes),
            retention_ms: given(StreamChanges::RETENTION_MS).then_some(age),
            replicas: given(StreamChanges::REPLICAS).then_some(replicas),
        },
    })
}

fn stream_name(r: &mut Reader) -> Result<String, DecodeError> {
    r.string_u16(limits::MAX_STREAM_NAME_BYTES, "stream")
}

fn shard_list(r: &mut Reader) -> Result<Vec<ShardId>, DecodeError> {
    let count = usize::from(r.u16("shard count")?);
    if count > limits::MAX_SUBSCRIBE_SHARDS {
        return Err(DecodeError::FieldTooLong {
            what: "shard list",
            len: count,
            max: limits::MAX_SUBSCRIBE_SHARDS,
        });
    }
    if count.saturating_mul(4) > r.remaining() {
        return Err(DecodeError::Truncated { what: "shard list" });
    }
    let mut shards = Vec::with_capacity(count);
    for _ in 0..count {
        shards.push(ShardId(r.u32("shard")?));
    }
    Ok(shards)
}

/// One offset per shard of a list of `count` shards (already bounded by the shard list's limit).
fn positions(r: &mut Reader, count: usize) -> Result<Vec<Offset>, DecodeError> {
    if count.saturating_mul(8) > r.remaining() {
        return Err(DecodeError::Truncated { what: "positions" });
    }
    (0..count).map(|_| r.u64("position").map(Offset)).collect()
}

/// The positions of a shard list of `count` shards as [`put_shards`] wrote it: one each (a
/// missing one is written as 0; the caller gives one per shard).
fn put_positions(dst: &mut BytesMut, count: usize, positions: &[Offset]) {
    for i in 0..count.min(limits::MAX_SUBSCRIBE_SHARDS) {
        dst.put_u64(positions.get(i).map_or(0, |o| o.0));
    }
}

fn put_shards(dst: &mut BytesMut, shards: &[ShardId]) {
    let n = shards.len().min(limits::MAX_SUBSCRIBE_SHARDS);
    dst.put_u16(n as u16);
    for s in &shards[..n] {
        dst.put_u32(s.0);
    }
}

fn retention(r: &mut Reader) -> Result<Retention, DecodeError> {
    let bytes = r.u64("retention bytes")?;
    let age = r.u64("retention age")?;
    Ok(Retention {
        bytes_max: (bytes != 0).then_some(bytes),
        age_max_ms: (age != 0).then_some(age),
    })
}

fn put_retention(dst: &mut BytesMut, retention: Retention) {
    dst.put_u64(retention.bytes_max.unwrap_or(0));
    dst.put_u64(retention.age_max_ms.unwrap_or(0));
}

fn error_body(r: &mut Reader) -> Result<ErrorBody, DecodeError> {
    Ok(ErrorBody {
        request_id: RequestId(r.u64("request_id")?),
        code: ErrorCode::from_u16(r.u16("code")?),
        message: r.string_u16(limits::MAX_MESSAGE_BYTES, "message")?,
    })
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_utf8(s: &str, max: usize) -> &[u8] {
    if s.len() <= max {
        return s.as_bytes();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let s = "é".repeat(limits::MAX_MESSAGE_BYTES);
        let cut = truncate_utf8(&s, limits::MAX_MESSAGE_BYTES);
        assert_eq!(cut.len(), limits::MAX_MESSAGE_BYTES);
        assert!(std::str::from_utf8(cut).is_ok());
    }

    #[test]
    fn record_count_larger_than_body_is_rejected_before_allocating() {
        let limits = Limits::default();
        // stream "a/b/c", count 4000, no records.
        let mut body = BytesMut::new();
        body.put_bytes_u16(b"a/b/c");
        body.put_u32(4000);
        let err = Frame::decode_body(FrameType::Publish, Flags::NONE, body.freeze(), &limits)
            .unwrap_err();
        assert_eq!(err, DecodeError::Truncated { what: "records" });
    }
}
