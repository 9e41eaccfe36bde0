//! EventBatch's own encoding rules: its exact encoded size (so the one copy of a batch's
//! records into its frame goes into a buffer allocated once, never grown and copied again) and
//! its body.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::WriteExt;
use crate::frame::EventBatch;
use crate::header::{Flags, FrameHeader, FrameType, HEADER_LEN};
use crate::{Offset, ShardId};

/// Bytes of an EventBatch body before its records: shard, base offset, timestamp, count.
const FIXED_BODY_BYTES: usize = 4 + 8 + 8 + 4;

impl EventBatch {
    /// The encoded frame's size, header included (what [`encode_event_batch`] writes).
    pub fn encoded_len(&self) -> usize {
        let records: usize =
            self.records.iter().map(|r| record_len(r.key.as_deref(), r.value.len())).sum();
        HEADER_LEN + FIXED_BODY_BYTES + records
    }
}

/// The encoded size of one record with this key and value.
fn record_len(key: Option<&[u8]>, value_len: usize) -> usize {
    1 + key.map_or(0, |k| 2 + k.len().min(usize::from(u16::MAX))) + 4 + value_len
}

/// Encodes an EventBatch frame from borrowed records, `(key, value)` slices as a storage read
/// shows them: the frame is allocated once at its exact size and each byte copied once.
pub fn encode_event_batch_slices<'a, I>(
    shard: ShardId,
    base_offset: Offset,
    timestamp_ms: u64,
    records: I,
) -> Bytes
where
    I: Iterator<Item = (Option<&'a [u8]>, &'a [u8])> + Clone,
{
    let mut dst = BytesMut::with_capacity(event_batch_slices_len(records.clone()));
    encode_event_batch_slices_into(&mut dst, shard, base_offset, timestamp_ms, records);
    dst.freeze()
}

/// The encoded size of the EventBatch frame [`encode_event_batch_slices`] makes of `records`.
pub fn event_batch_slices_len<'a, I>(records: I) -> usize
where
    I: Iterator<Item = (Option<&'a [u8]>, &'a [u8])>,
{
    HEADER_LEN + FIXED_BODY_BYTES + records.map(|(k, v)| record_len(k, v.len())).sum::<usize>()
}

/// [`encode_event_batch_slices`] appending to `dst` (frames encoded back to back in one buffer
/// are sent as one chunk). `dst` grows at most once, by the frame's exact size; not at all
/// when it has the room.
pub fn encode_event_batch_slices_into<'a, I>(
    dst: &mut BytesMut,
    shard: ShardId,
    base_offset: Offset,
    timestamp_ms: u64,
    records: I,
) where
    I: Iterator<Item = (Option<&'a [u8]>, &'a [u8])> + Clone,
{
    let (count, records_len) = records
        .clone()
        .fold((0usize, 0usize), |(n, len), (k, v)| (n + 1, len + record_len(k, v.len())));
    let body_len = FIXED_BODY_BYTES + records_len;
    dst.reserve(HEADER_LEN + body_len);
    let header = FrameHeader {
        frame_type: FrameType::EventBatch,
        flags: Flags::NONE,
        body_len: u32::try_from(body_len).unwrap_or(u32::MAX),
    };
    dst.put_slice(&header.encode());
    put_fixed(dst, shard, base_offset, timestamp_ms, count);
    for (key, value) in records {
        put_record(dst, key, value.len(), [value]);
    }
}

/// Encodes an EventBatch frame (header included) straight from its parts, so a broker can
/// encode a batch once and send the same bytes to every subscriber. `dst` grows once, by the
/// frame's exact size.
pub fn encode_event_batch(batch: &EventBatch, dst: &mut BytesMut) {
    dst.reserve(batch.encoded_len());
    let start = dst.len();
    dst.put_slice(&[0u8; HEADER_LEN]);
    encode_event_batch_body(batch, dst);
    let body_len = u32::try_from(dst.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
    let header = FrameHeader { frame_type: FrameType::EventBatch, flags: Flags::NONE, body_len };
    dst[start..start + HEADER_LEN].copy_from_slice(&header.encode());
}

/// Writes an EventBatch body into `dst`.
pub(crate) fn encode_event_batch_body(b: &EventBatch, dst: &mut BytesMut) {
    put_fixed(dst, b.shard, b.base_offset, b.timestamp_ms, b.records.len());
    for rec in &b.records {
        put_record(dst, rec.key.as_deref(), rec.value.len(), rec.value.parts().map(|p| &p[..]));
    }
}

/// The body's fields before its records.
fn put_fixed(dst: &mut BytesMut, shard: ShardId, base: Offset, timestamp_ms: u64, count: usize) {
    dst.put_u32(shard.0);
    dst.put_u64(base.0);
    dst.put_u64(timestamp_ms);
    dst.put_u32(len_u32(count));
}

/// One record: key presence and key, value length, then the value's parts in order.
fn put_record<'a>(
    dst: &mut BytesMut,
    key: Option<&[u8]>,
    value_len: usize,
    parts: impl IntoIterator<Item = &'a [u8]>,
) {
    match key {
        Some(k) => {
            dst.put_u8(1);
            dst.put_bytes_u16(k);
        }
        None => dst.put_u8(0),
    }
    dst.put_u32(len_u32(value_len));
    for part in parts {
        dst.put_slice(part);
    }
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::{Frame, Offset, Payload, Record, ShardId};

    use super::*;

    fn batch() -> EventBatch {
        let records = (0..40)
            .map(|i| {
                let b = Bytes::from(vec![i as u8; i * 300]);
                let value = Payload::from_parts([b.slice(..i * 100), b.slice(i * 100..)]);
                match i % 3 {
                    0 => Record { key: None, value },
                    1 => Record { key: Some(Bytes::new()), value },
                    _ => Record { key: Some(Bytes::from(vec![b'k'; i])), value },
                }
            })
            .collect();
        EventBatch { shard: ShardId(3), base_offset: Offset(77), timestamp_ms: 9, records }
    }

    #[test]
    fn encoded_len_is_exact_with_and_without_keys() {
        let b = batch();
        let mut dst = BytesMut::new();
        encode_event_batch(&b, &mut dst);
        assert_eq!(dst.len(), b.encoded_len());
        // The same bytes as the generic frame encoder, and the frame decodes back.
        assert_eq!(dst.freeze(), Frame::EventBatch(b.clone()).to_bytes());
        let empty = EventBatch { records: Vec::new(), ..b };
        assert_eq!(Frame::EventBatch(empty.clone()).to_bytes().len(), empty.encoded_len());
    }

    #[test]
    fn slices_encode_to_the_same_frame_as_owned_records() {
        let b = batch();
        let values: Vec<Bytes> = b.records.iter().map(|r| r.value.to_bytes()).collect();
        let slices = b.records.iter().zip(&values).map(|(r, v)| (r.key.as_deref(), &v[..]));
        let frame = encode_event_batch_slices(b.shard, b.base_offset, b.timestamp_ms, slices);
        assert_eq!(frame, Frame::EventBatch(b.clone()).to_bytes());
        assert_eq!(frame.len(), b.encoded_len());
        let none = encode_event_batch_slices(b.shard, b.base_offset, 1, std::iter::empty());
        assert_eq!(none.len(), EventBatch { records: Vec::new(), ..b }.encoded_len());
    }

    #[test]
    fn the_frame_is_written_into_one_allocation() {
        let b = batch();
        let mut dst = BytesMut::new();
        encode_event_batch(&b, &mut dst);
        // Reserved once at the exact size: growing on the way would have left spare room.
        assert_eq!(dst.capacity(), dst.len());
        // Appended after what a buffer already holds, the header still lands at the start.
        let mut dst = BytesMut::from(&b"xy"[..]);
        encode_event_batch(&b, &mut dst);
        assert_eq!(&dst[..2], b"xy");
        assert_eq!(dst.len(), 2 + b.encoded_len());
    }
}
