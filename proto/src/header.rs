//! The fixed frame header, frame types, flag bits and capability bits.
//!
//! ```text
//! 0      2         3      4       6                10
//! +------+---------+------+-------+-----------------+----------
//! | 'FX' | version | type | flags | body length u32 | body ...
//! +------+---------+------+-------+-----------------+----------
//! ```
//! All integers are big-endian. The body length excludes the header.

use crate::error::DecodeError;

/// The two magic bytes that open every frame: ASCII "FX".
pub const MAGIC: u16 = 0x4658;
/// The frame format version this build speaks.
pub const FRAME_VERSION: u8 = 1;
/// The protocol version carried in Hello / HelloOk.
pub const PROTOCOL_VERSION: u16 = 1;
/// The header's length in bytes.
pub const HEADER_LEN: usize = 10;
/// The QUIC ALPN protocol id.
pub const ALPN: &[u8] = b"felix/1";

/// Every frame type. The byte values are stable; a retired value is never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// Client → broker: opens the control stream.
    Hello = 0x01,
    /// Broker → client: answers Hello.
    HelloOk = 0x02,
    /// Client → broker: create a stream.
    CreateStream = 0x03,
    /// Client → broker: describe one stream.
    DescribeStream = 0x04,
    /// Broker → client: a stream's settings (answers CreateStream and DescribeStream).
    StreamInfo = 0x05,
    /// Client → broker: list streams by prefix.
    ListStreams = 0x06,
    /// Broker → client: answers ListStreams.
    StreamList = 0x07,
    /// Client → broker: where does each shard of a stream live (needs `CLUSTER`).
    Metadata = 0x08,
    /// Broker → client: answers Metadata.
    MetadataOk = 0x09,
    /// Client → broker: delete a stream (answered by StreamInfo).
    DeleteStream = 0x0A,
    /// Client → broker: change a stream's settings (answered by StreamInfo).
    AlterStream = 0x0B,
    /// Client → broker: a batch of records.
    Publish = 0x10,
    /// Broker → client: a batch was stored.
    PublishAck = 0x11,
    /// Broker → client: a batch was refused.
    PublishError = 0x12,
    /// Broker → client: the request's shard lives on another broker (needs `CLUSTER`).
    NotOwner = 0x13,
    /// Client → broker: start a subscription.
    Subscribe = 0x20,
    /// Broker → client: the subscription started.
    SubscribeOk = 0x21,
    /// Broker → client: first frame of a subscription's unidirectional stream.
    SubscriptionStart = 0x22,
    /// Broker → client: records of one shard.
    EventBatch = 0x23,
    /// Client → broker: store a consumer group's position.
    CommitOffset = 0x24,
    /// Broker → client: the position was stored durably.
    CommitOk = 0x25,
    /// Either way: a request or the connection failed.
    Error = 0x30,
    /// Either way: liveness probe.
    Ping = 0x31,
    /// Either way: answers Ping.
    Pong = 0x32,
    /// Broker ↔ broker: one message of a shard's replication (needs `REPLICATION`).
    Replicate = 0x40,
}

impl FrameType {
    /// Every frame type.
    pub const ALL: [FrameType; 25] = [
        Self::Hello,
        Self::HelloOk,
        Self::CreateStream,
        Self::DescribeStream,
        Self::StreamInfo,
        Self::ListStreams,
        Self::StreamList,
        Self::Metadata,
        Self::MetadataOk,
        Self::DeleteStream,
        Self::AlterStream,
        Self::Publish,
        Self::PublishAck,
        Self::PublishError,
        Self::NotOwner,
        Self::Subscribe,
        Self::SubscribeOk,
        Self::SubscriptionStart,
        Self::EventBatch,
        Self::CommitOffset,
        Self::CommitOk,
        Self::Error,
        Self::Ping,
        Self::Pong,
        Self::Replicate,
    ];

    /// The type for a wire byte.
    pub fn from_u8(byte: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u8 == byte)
    }

    /// The flag bits defined for this frame type.
    pub fn known_flags(self) -> Flags {
        match self {
            Self::Publish => {
                Flags(Flags::ACKED.0 | Flags::KEYED.0 | Flags::PRODUCER.0 | Flags::OLDEST_PENDING.0)
            }
            Self::CreateStream => Flags::REPLICAS,
            Self::Subscribe | Self::SubscribeOk => Flags::POSITIONS,
            _ => Flags::NONE,
        }
    }

    /// Whether the body of this type starts with a u64 request id (so errors can be correlated).
    pub fn has_request_id(self) -> bool {
        matches!(
            self,
            Self::CreateStream
                | Self::DescribeStream
                | Self::DeleteStream
                | Self::AlterStream
                | Self::StreamInfo
                | Self::ListStreams
                | Self::StreamList
                | Self::Metadata
                | Self::MetadataOk
                | Self::NotOwner
                | Self::PublishAck
                | Self::PublishError
                | Self::Subscribe
                | Self::SubscribeOk
                | Self::CommitOffset
                | Self::CommitOk
                | Self::Error
        )
    }
}

/// Flag bits of the frame header. Their meaning depends on the frame type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u16);

impl Flags {
    /// No flags.
    pub const NONE: Flags = Flags(0);
    /// Publish: the body starts with a request id (u64) and an ack mode (u8).
    pub const ACKED: Flags = Flags(0x0001);
    /// Publish: after the acked prefix, a u16 key length and the key.
    pub const KEYED: Flags = Flags(0x0002);
    /// Publish: after the key, a producer id (u64) and a sequence number (u32).
    pub const PRODUCER: Flags = Flags(0x0004);
    /// CreateStream: after the retention, a replication factor (u8). Needs `CLUSTER`.
    pub const REPLICAS: Flags = Flags(0x0008);
    /// Subscribe: after the group, a start offset (u64) for each listed shard. SubscribeOk:
    /// after the shards, the offset each shard starts at (u64). Needs `SUBSCRIBE_POSITIONS`.
    pub const POSITIONS: Flags = Flags(0x0010);
    /// Publish, with [`Flags::PRODUCER`]: the producer has no earlier batch unresolved (no body
    /// bytes). Needs `OLDEST_PENDING`.
    pub const OLDEST_PENDING: Flags = Flags(0x0020);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// Capability bits exchanged in Hello / HelloOk. A peer sets a flag bit, or sends a frame that
/// needs a capability, only after the other side advertised the capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// No capabilities.
    pub const NONE: Capabilities = Capabilities(0);
    /// Publish may carry [`Flags::ACKED`].
    pub const PUBLISH_ACKED: Capabilities = Capabilities(1 << 0);
    /// Publish may carry [`Flags::KEYED`].
    pub const PUBLISH_KEYED: Capabilities = Capabilities(1 << 1);
    /// Subscribe may name a consumer group; CommitOffset is accepted.
    pub const CONSUMER_GROUPS: Capabilities = Capabilities(1 << 2);
    /// The peer speaks the cluster frames (Metadata, MetadataOk, NotOwner). A broker
    /// advertises it when it runs in a cluster.
    pub const CLUSTER: Capabilities = Capabilities(1 << 3);
    /// Publish may carry [`Flags::PRODUCER`]: the broker stores a tagged batch once.
    pub const IDEMPOTENT: Capabilities = Capabilities(1 << 4);
    /// The peer is a broker of the same cluster and speaks the replication frame
    /// (`Replicate`). Only brokers advertise it, to each other; it is not part of [`ALL`].
    ///
    /// [`ALL`]: Capabilities::ALL
    pub const REPLICATION: Capabilities = Capabilities(1 << 5);
    /// Subscribe and SubscribeOk may carry [`Flags::POSITIONS`]: a subscription learns where
    /// each of its shards starts, and resumes each shard at an offset of its own.
    pub const SUBSCRIBE_POSITIONS: Capabilities = Capabilities(1 << 6);
    /// Publish may carry [`Flags::OLDEST_PENDING`]: a shard that forgot an idle producer (or
    /// never knew it) takes its batch at the sequence number it carries when the producer
    /// says nothing earlier is pending.
    pub const OLDEST_PENDING: Capabilities = Capabilities(1 << 7);
    /// Everything this build offers to clients (every bit but `REPLICATION`).
    pub const ALL: Capabilities = Capabilities(0b1101_1111);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }

    /// The bits both sides have.
    pub fn intersect(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 & other.0)
    }

    /// The flag bits of `frame_type` that these capabilities allow a peer to send.
    pub fn allowed_flags(self, frame_type: FrameType) -> Flags {
        let mut bits = 0;
        if frame_type == FrameType::Publish {
            if self.contains(Self::PUBLISH_ACKED) {
                bits |= Flags::ACKED.0;
            }
            if self.contains(Self::PUBLISH_KEYED) {
                bits |= Flags::KEYED.0;
            }
            if self.contains(Self::IDEMPOTENT) {
                bits |= Flags::PRODUCER.0;
            }
            if self.contains(Self::OLDEST_PENDING) {
                bits |= Flags::OLDEST_PENDING.0;
            }
        }
        if frame_type == FrameType::CreateStream && self.contains(Self::CLUSTER) {
            bits |= Flags::REPLICAS.0;
        }
        if matches!(frame_type, FrameType::Subscribe | FrameType::SubscribeOk)
            && self.contains(Self::SUBSCRIBE_POSITIONS)
        {
            bits |= Flags::POSITIONS.0;
        }
        Flags(bits)
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The frame type.
    pub frame_type: FrameType,
    /// The flag bits.
    pub flags: Flags,
    /// The body length in bytes (the header excluded).
    pub body_len: u32,
}

impl FrameHeader {
    /// Decodes a header from the first [`HEADER_LEN`] bytes of `buf`.
    ///
    /// Errors from this function are framing errors, except `UnknownFrameType` which leaves the
    /// framing intact (the body can be skipped by its length).
    pub fn decode(buf: &[u8; HEADER_LEN]) -> Result<RawHeader, DecodeError> {
        let magic = u16::from_be_bytes([buf[0], buf[1]]);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        if buf[2] != FRAME_VERSION {
            return Err(DecodeError::UnsupportedVersion(buf[2]));
        }
        Ok(RawHeader {
            frame_type: buf[3],
            flags: Flags(u16::from_be_bytes([buf[4], buf[5]])),
            body_len: u32::from_be_bytes([buf[6], buf[7], buf[8], buf[9]]),
        })
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        out[2] = FRAME_VERSION;
        out[3] = self.frame_type as u8;
        out[4..6].copy_from_slice(&self.flags.0.to_be_bytes());
        out[6..10].copy_from_slice(&self.body_len.to_be_bytes());
        out
    }
}

/// A header whose magic and version were checked but whose type is not yet interpreted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawHeader {
    /// The frame type byte.
    pub frame_type: u8,
    /// The flag bits.
    pub flags: Flags,
    /// The body length.
    pub body_len: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader { frame_type: FrameType::Publish, flags: Flags::KEYED, body_len: 77 };
        let raw = FrameHeader::decode(&h.encode()).unwrap();
        assert_eq!(raw, RawHeader { frame_type: 0x10, flags: Flags::KEYED, body_len: 77 });
    }

    #[test]
    fn every_type_round_trips_through_its_byte() {
        for t in FrameType::ALL {
            assert_eq!(FrameType::from_u8(t as u8), Some(t));
        }
        assert_eq!(FrameType::from_u8(0xee), None);
    }

    #[test]
    fn capabilities_gate_flags() {
        assert_eq!(Capabilities::NONE.allowed_flags(FrameType::Publish), Flags::NONE);
        assert_eq!(Capabilities::PUBLISH_ACKED.allowed_flags(FrameType::Publish), Flags::ACKED);
        assert_eq!(Capabilities::ALL.allowed_flags(FrameType::Ping), Flags::NONE);
        let positions = Capabilities::SUBSCRIBE_POSITIONS;
        assert_eq!(positions.allowed_flags(FrameType::Subscribe), Flags::POSITIONS);
        assert_eq!(positions.allowed_flags(FrameType::SubscribeOk), Flags::POSITIONS);
        assert_eq!(Capabilities::NONE.allowed_flags(FrameType::SubscribeOk), Flags::NONE);
        assert!(!Capabilities::ALL.contains(Capabilities::REPLICATION));
    }
}
