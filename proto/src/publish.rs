//! Publish's own encoding rules: its flag bits, its exact encoded size (so a writer sizes the
//! buffer once and never reallocates it) and its body.

use bytes::{BufMut, BytesMut};

use crate::codec::WriteExt;
use crate::frame::Publish;
use crate::header::{Flags, HEADER_LEN};

impl Publish {
    /// The frame's flag bits: what the batch carries.
    pub fn flags(&self) -> Flags {
        let mut bits = 0;
        if self.ack.is_some() {
            bits |= Flags::ACKED.0;
        }
        if self.key.is_some() {
            bits |= Flags::KEYED.0;
        }
        if self.producer.is_some() {
            bits |= Flags::PRODUCER.0;
            if self.oldest_pending {
                bits |= Flags::OLDEST_PENDING.0;
            }
        }
        Flags(bits)
    }

    /// The encoded frame's size, header included (what [`Frame::encode`] writes).
    pub fn encoded_len(&self) -> usize {
        let ack = if self.ack.is_some() { 8 + 1 } else { 0 };
        let key = self.key.as_ref().map_or(0, |k| 2 + k.len().min(usize::from(u16::MAX)));
        let producer = if self.producer.is_some() { 8 + 4 } else { 0 };
        let stream = 2 + self.stream.len().min(usize::from(u16::MAX));
        let records: usize = self.records.iter().map(|r| 4 + r.len()).sum();
        HEADER_LEN + ack + key + producer + stream + 4 + records
    }
}

/// Writes a Publish body into `dst`.
pub(crate) fn encode_publish_body(p: &Publish, dst: &mut BytesMut) {
    if let Some(ack) = p.ack {
        dst.put_u64(ack.request_id.0);
        dst.put_u8(ack.mode as u8);
    }
    if let Some(key) = &p.key {
        dst.put_bytes_u16(key);
    }
    if let Some(tag) = p.producer {
        dst.put_u64(tag.producer.0);
        dst.put_u32(tag.seq);
    }
    dst.put_bytes_u16(p.stream.as_bytes());
    dst.put_u32(u32::try_from(p.records.len()).unwrap_or(u32::MAX));
    for r in &p.records {
        dst.put_u32(u32::try_from(r.len()).unwrap_or(u32::MAX));
        for part in r.parts() {
            dst.put_slice(part);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::frame::{AckRequest, RequestId};
    use crate::{AckMode, Frame, Payload, ProducerId, ProducerTag};

    use super::*;

    #[test]
    fn encoded_len_is_exact_for_every_flag_combination() {
        for bits in 0..8 {
            let records = (0..20)
                .map(|i| {
                    let b = Bytes::from(vec![i as u8; i * 300]);
                    Payload::from_parts([b.slice(..i * 100), b.slice(i * 100..)])
                })
                .collect();
            let p = Publish {
                oldest_pending: false,
                ack: (bits & 1 != 0)
                    .then_some(AckRequest { request_id: RequestId(7), mode: AckMode::Durable }),
                key: (bits & 2 != 0).then(|| Bytes::from_static(b"user-42")),
                producer: (bits & 4 != 0)
                    .then_some(ProducerTag { producer: ProducerId(9), seq: 3 }),
                stream: "t/n/s".into(),
                records,
            };
            let flags = p.flags();
            let frame = Frame::Publish(p.clone());
            let mut buf = BytesMut::with_capacity(p.encoded_len());
            let capacity = buf.capacity();
            frame.encode(&mut buf);
            assert_eq!(buf.len(), p.encoded_len(), "bits {bits}");
            assert_eq!(buf.capacity(), capacity, "bits {bits}: the buffer grew");
            assert_eq!(frame.flags(), flags);
            assert_eq!(flags.contains(Flags::PRODUCER), bits & 4 != 0);
        }
    }
}
