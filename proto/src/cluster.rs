//! The cluster frames: `Metadata` / `MetadataOk` (where each shard of a stream lives) and
//! `NotOwner` (a request reached a broker that does not own its shard). Sent only between
//! peers that both advertised [`crate::Capabilities::CLUSTER`]; byte-exact in
//! `docs/protocol.md`, section "Cluster".

use bytes::{BufMut, BytesMut};

use crate::codec::{Reader, WriteExt};
use crate::error::DecodeError;
use crate::frame::RequestId;
use crate::limits;
use crate::ShardId;

/// The longest broker node id, in bytes.
pub const MAX_NODE_ID_BYTES: usize = 64;
/// The longest broker address (`host:port`), in bytes.
pub const MAX_ADDRESS_BYTES: usize = 255;

/// Metadata: where does each shard of `stream` live?
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Correlation.
    pub request_id: RequestId,
    /// `tenant/namespace/stream`.
    pub stream: String,
}

/// One shard's owner, as the answering broker sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardOwner {
    /// The owner's node id.
    pub node: String,
    /// Where clients reach the owner (`host:port`).
    pub address: String,
    /// Whether the owner is live (holds its membership lease). A shard whose owner is not
    /// live is unavailable until the owner returns.
    pub live: bool,
}

/// MetadataOk: the owners of every shard of a stream, `owners[s]` for shard `s`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataOk {
    /// Correlation.
    pub request_id: RequestId,
    /// The stream.
    pub stream: String,
    /// One entry per shard, in shard order.
    pub owners: Vec<ShardOwner>,
}

/// NotOwner: the request's shard lives on another broker; send it there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotOwner {
    /// Correlation: the refused request's id.
    pub request_id: RequestId,
    /// The stream.
    pub stream: String,
    /// The shard the request needed.
    pub shard: ShardId,
    /// Its owner.
    pub owner: ShardOwner,
}

pub(crate) fn encode_metadata(m: &Metadata, dst: &mut BytesMut) {
    dst.put_u64(m.request_id.0);
    dst.put_bytes_u16(m.stream.as_bytes());
}

pub(crate) fn decode_metadata(r: &mut Reader) -> Result<Metadata, DecodeError> {
    Ok(Metadata { request_id: RequestId(r.u64("request_id")?), stream: stream(r)? })
}

pub(crate) fn encode_metadata_ok(m: &MetadataOk, dst: &mut BytesMut) {
    dst.put_u64(m.request_id.0);
    dst.put_bytes_u16(m.stream.as_bytes());
    dst.put_u32(m.owners.len() as u32);
    for o in &m.owners {
        put_owner(o, dst);
    }
}

pub(crate) fn decode_metadata_ok(r: &mut Reader) -> Result<MetadataOk, DecodeError> {
    let request_id = RequestId(r.u64("request_id")?);
    let stream = stream(r)?;
    let count = r.u32("shard count")? as usize;
    if count > limits::MAX_SHARDS_PER_STREAM as usize {
        return Err(DecodeError::FieldTooLong {
            what: "owners",
            len: count,
            max: limits::MAX_SHARDS_PER_STREAM as usize,
        });
    }
    // Each owner takes at least its two lengths and the live byte.
    if count.saturating_mul(OWNER_BYTES_MIN) > r.remaining() {
        return Err(DecodeError::Truncated { what: "owners" });
    }
    let mut owners = Vec::with_capacity(count);
    for _ in 0..count {
        owners.push(owner(r)?);
    }
    Ok(MetadataOk { request_id, stream, owners })
}

pub(crate) fn encode_not_owner(n: &NotOwner, dst: &mut BytesMut) {
    dst.put_u64(n.request_id.0);
    dst.put_bytes_u16(n.stream.as_bytes());
    dst.put_u32(n.shard.0);
    put_owner(&n.owner, dst);
}

pub(crate) fn decode_not_owner(r: &mut Reader) -> Result<NotOwner, DecodeError> {
    Ok(NotOwner {
        request_id: RequestId(r.u64("request_id")?),
        stream: stream(r)?,
        shard: ShardId(r.u32("shard")?),
        owner: owner(r)?,
    })
}

const OWNER_BYTES_MIN: usize = 2 + 2 + 1;

fn put_owner(o: &ShardOwner, dst: &mut BytesMut) {
    dst.put_bytes_u16(o.node.as_bytes());
    dst.put_bytes_u16(o.address.as_bytes());
    dst.put_u8(u8::from(o.live));
}

fn owner(r: &mut Reader) -> Result<ShardOwner, DecodeError> {
    let node = r.string_u16(MAX_NODE_ID_BYTES, "node")?;
    let address = r.string_u16(MAX_ADDRESS_BYTES, "address")?;
    let live = match r.u8("live")? {
        0 => false,
        1 => true,
        other => return Err(DecodeError::InvalidValue { what: "live", value: u64::from(other) }),
    };
    Ok(ShardOwner { node, address, live })
}

fn stream(r: &mut Reader) -> Result<String, DecodeError> {
    r.string_u16(limits::MAX_STREAM_NAME_BYTES, "stream")
}
