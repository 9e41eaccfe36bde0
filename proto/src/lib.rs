//! felix-proto: the Felix wire protocol.
//!
//! Owns: frame layouts, their encoding and decoding, limits, wire error codes, stream names,
//! the key-to-shard hash and the connection-ID layout (`cid`). Never does: any I/O, clock reads, or allocation beyond what a decoded
//! frame needs. `docs/protocol.md` is the byte-exact description; the vectors under
//! `proto/tests/vectors` keep the two in step.
#![forbid(unsafe_code)]

pub mod cid;
pub mod cluster;
pub mod codec;
pub mod correlation;
pub mod decoder;
pub mod error;
mod event_batch;
pub mod frame;
pub mod hash;
pub mod header;
pub mod ids;
pub mod limits;
pub mod payload;
mod publish;
pub mod record;
pub mod replica;
pub mod stream_name;

pub use cluster::{Metadata, MetadataOk, NotOwner, ShardOwner};
pub use decoder::{decode_frame, FrameDecoder};
pub use error::{DecodeError, ErrorCode, FrameError};
pub use event_batch::{
    encode_event_batch, encode_event_batch_slices, encode_event_batch_slices_into,
    event_batch_slices_len,
};
pub use frame::{
    AckRequest, AlterStream, CommitOffset, CreateStream, DescribeStream, ErrorBody, EventBatch,
    Frame, Hello, HelloOk, ListStreams, Publish, PublishAck, RequestId, Retention, StartAt,
    StreamChanges, StreamInfo, StreamList, Subscribe, SubscribeOk, SubscriptionId,
};
pub use hash::{key_hash, shard_for_key};
pub use header::{Capabilities, Flags, FrameHeader, FrameType, ALPN, HEADER_LEN, PROTOCOL_VERSION};
pub use ids::{CoreId, Offset, ProducerId, ProducerTag, ShardId};
pub use limits::Limits;
pub use payload::Payload;
pub use record::{AckMode, Record};
pub use replica::{ReplicaBatch, ReplicaBody, Replicate};
pub use stream_name::{StreamName, StreamNameError};
