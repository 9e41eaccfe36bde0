//! The replication frame: `Replicate`, one message of one shard's replication protocol between
//! two brokers of a cluster (the follower asks, the leader answers; `felix-replication`'s
//! `Message`). Sent only on connections between brokers whose Hello and HelloOk both carry
//! [`crate::Capabilities::REPLICATION`]; byte-exact in `docs/protocol.md`, section
//! "Replication".

use bytes::{BufMut, BytesMut};

use crate::codec::{Reader, WriteExt};
use crate::error::DecodeError;
use crate::limits::{self, Limits};
use crate::payload::Payload;
use crate::{Offset, ProducerId, ProducerTag, ShardId};

/// Replicate: one replication message about shard `shard` of `stream`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replicate {
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// The shard.
    pub shard: ShardId,
    /// The sender's replica number in the shard's group (its index in the group's replicas).
    pub from: u32,
    /// The leader epoch the message belongs to; a replica ignores messages of other epochs.
    pub epoch: u64,
    /// The message.
    pub body: ReplicaBody,
}

/// The four replication messages (docs/replication.md, "Protocol").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaBody {
    /// Follower → leader: where does your log leave `last_epoch` (my last batch's epoch)?
    EpochQuery {
        /// The epoch of the follower's last batch.
        last_epoch: u64,
    },
    /// Leader → follower: the largest epoch `<= asked` in the leader's log (`None`: it has
    /// none) and where it ends there.
    EpochAnswer {
        /// The epoch the query asked about.
        asked: u64,
        /// The largest epoch `<= asked` the leader has.
        answer_epoch: Option<u64>,
        /// Where `answer_epoch` ends in the leader's log.
        end: Offset,
    },
    /// Follower → leader: send what follows `from`; I am durable up to `durable_end`.
    Fetch {
        /// The follower's log end.
        from: Offset,
        /// The follower's fdatasync'd end.
        durable_end: Offset,
    },
    /// Leader → follower: the batches after `from` (possibly none), the commit point and the
    /// log start.
    FetchReply {
        /// The offset the batches continue from.
        from: Offset,
        /// The leader's committed offset (high watermark).
        committed: Offset,
        /// The shard's log start as the leader decided it (retention): replicas may delete
        /// what lies below it.
        log_start: Offset,
        /// The batches, in offset order, each starting where the previous one ends.
        batches: Vec<ReplicaBatch>,
    },
}

/// One replicated batch as it travels in a `FetchReply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaBatch {
    /// The epoch of the leader that appended it.
    pub epoch: u64,
    /// Offset of its first record.
    pub base: Offset,
    /// Its record count (at least 1, at most the receiver's `max_batch_records`).
    pub records: u32,
    /// The idempotent producer's tag, if it has one.
    pub producer: Option<ProducerTag>,
    /// The encoded records (opaque here; storage's record encoding).
    pub payload: Payload,
}

const KIND_EPOCH_QUERY: u8 = 1;
const KIND_EPOCH_ANSWER: u8 = 2;
const KIND_FETCH: u8 = 3;
const KIND_FETCH_REPLY: u8 = 4;

/// The fewest bytes a batch takes in a `FetchReply` (epoch, base, records, presence, length).
const BATCH_BYTES_MIN: usize = 8 + 8 + 4 + 1 + 4;

/// The most batches one `FetchReply` may carry.
pub const MAX_REPLICA_BATCHES: usize = 4096;

pub(crate) fn encode_replicate(m: &Replicate, dst: &mut BytesMut) {
    dst.put_bytes_u16(m.stream.as_bytes());
    dst.put_u32(m.shard.0);
    dst.put_u32(m.from);
    dst.put_u64(m.epoch);
    match &m.body {
        ReplicaBody::EpochQuery { last_epoch } => {
            dst.put_u8(KIND_EPOCH_QUERY);
            dst.put_u64(*last_epoch);
        }
        ReplicaBody::EpochAnswer { asked, answer_epoch, end } => {
            dst.put_u8(KIND_EPOCH_ANSWER);
            dst.put_u64(*asked);
            dst.put_u8(u8::from(answer_epoch.is_some()));
            if let Some(e) = answer_epoch {
                dst.put_u64(*e);
            }
            dst.put_u64(end.0);
        }
        ReplicaBody::Fetch { from, durable_end } => {
            dst.put_u8(KIND_FETCH);
            dst.put_u64(from.0);
            dst.put_u64(durable_end.0);
        }
        ReplicaBody::FetchReply { from, committed, log_start, batches } => {
            dst.put_u8(KIND_FETCH_REPLY);
            dst.put_u64(from.0);
            dst.put_u64(committed.0);
            dst.put_u64(log_start.0);
            dst.put_u32(u32::try_from(batches.len()).unwrap_or(u32::MAX));
            // Room for every batch at once: growing on the way would copy the payloads again.
            let room: usize = batches.iter().map(|b| BATCH_BYTES_MIN + 12 + b.payload.len()).sum();
            dst.reserve(room);
            for b in batches {
                dst.put_u64(b.epoch);
                dst.put_u64(b.base.0);
                dst.put_u32(b.records);
                dst.put_u8(u8::from(b.producer.is_some()));
                if let Some(tag) = b.producer {
                    dst.put_u64(tag.producer.0);
                    dst.put_u32(tag.seq);
                }
                dst.put_u32(u32::try_from(b.payload.len()).unwrap_or(u32::MAX));
                for part in b.payload.parts() {
                    dst.put_slice(part);
                }
            }
        }
    }
}

pub(crate) fn decode_replicate(r: &mut Reader, limits: &Limits) -> Result<Replicate, DecodeError> {
    let stream = r.string_u16(limits::MAX_STREAM_NAME_BYTES, "stream")?;
    let shard = ShardId(r.u32("shard")?);
    let from = r.u32("from")?;
    let epoch = r.u64("epoch")?;
    let body = match r.u8("kind")? {
        KIND_EPOCH_QUERY => ReplicaBody::EpochQuery { last_epoch: r.u64("last_epoch")? },
        KIND_EPOCH_ANSWER => {
            let asked = r.u64("asked")?;
            let answer_epoch = match r.u8("answer presence")? {
                0 => None,
                1 => Some(r.u64("answer_epoch")?),
                other => {
                    return Err(DecodeError::InvalidValue {
                        what: "answer presence",
                        value: u64::from(other),
                    })
                }
            };
            ReplicaBody::EpochAnswer { asked, answer_epoch, end: Offset(r.u64("end")?) }
        }
        KIND_FETCH => ReplicaBody::Fetch {
            from: Offset(r.u64("from")?),
            durable_end: Offset(r.u64("durable_end")?),
        },
        KIND_FETCH_REPLY => {
            let from = Offset(r.u64("from")?);
            let committed = Offset(r.u64("committed")?);
            let log_start = Offset(r.u64("log_start")?);
            let count = r.u32("batch count")? as usize;
            if count > MAX_REPLICA_BATCHES {
                return Err(DecodeError::FieldTooLong {
                    what: "batch count",
                    len: count,
                    max: MAX_REPLICA_BATCHES,
                });
            }
            if count.saturating_mul(BATCH_BYTES_MIN) > r.remaining() {
                return Err(DecodeError::Truncated { what: "batches" });
            }
            let mut batches = Vec::with_capacity(count);
            for _ in 0..count {
                batches.push(batch(r, limits)?);
            }
            ReplicaBody::FetchReply { from, committed, log_start, batches }
        }
        other => return Err(DecodeError::InvalidValue { what: "kind", value: u64::from(other) }),
    };
    Ok(Replicate { stream, shard, from, epoch, body })
}

fn batch(r: &mut Reader, limits: &Limits) -> Result<ReplicaBatch, DecodeError> {
    let epoch = r.u64("batch epoch")?;
    let base = Offset(r.u64("batch base")?);
    let records = r.u32("batch records")?;
    if records == 0 {
        return Err(DecodeError::InvalidValue { what: "batch records", value: 0 });
    }
    if records > limits.max_batch_records {
        return Err(DecodeError::TooManyRecords {
            count: u64::from(records),
            max: limits.max_batch_records,
        });
    }
    let producer = match r.u8("producer presence")? {
        0 => None,
        1 => {
            let producer = ProducerId(r.u64("producer")?);
            Some(ProducerTag { producer, seq: r.u32("seq")? })
        }
        other => {
            return Err(DecodeError::InvalidValue {
                what: "producer presence",
                value: u64::from(other),
            })
        }
    };
    let len = r.u32("batch length")? as usize;
    let payload = r.payload(len, "batch")?;
    Ok(ReplicaBatch { epoch, base, records, producer, payload })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{decode_frame, Capabilities, Frame, FrameType};

    fn fetch_reply(batches: Vec<ReplicaBatch>) -> Frame {
        Frame::Replicate(Replicate {
            stream: "a/b/c".into(),
            shard: ShardId(1),
            from: 2,
            epoch: 5,
            body: ReplicaBody::FetchReply {
                from: Offset(0),
                committed: Offset(0),
                log_start: Offset(0),
                batches,
            },
        })
    }

    fn one_batch(records: u32) -> ReplicaBatch {
        ReplicaBatch {
            epoch: 5,
            base: Offset(0),
            records,
            producer: None,
            payload: Bytes::from_static(b"r").into(),
        }
    }

    fn decode(bytes: Bytes) -> Result<Frame, DecodeError> {
        decode_frame(bytes, &Limits::default(), Capabilities::ALL).map_err(|e| e.error)
    }

    /// Body offset of the kind byte: stream (2 + 5), shard, from, epoch.
    const KIND_AT: usize = crate::HEADER_LEN + 7 + 4 + 4 + 8;

    #[test]
    fn a_fetch_reply_is_written_without_growing_past_its_payloads() {
        let payload = Bytes::from(vec![7u8; 300_000]);
        let batches = (0..5)
            .map(|i| ReplicaBatch {
                producer: (i % 2 == 0).then_some(ProducerTag { producer: ProducerId(1), seq: i }),
                payload: payload.slice(i as usize * 30_000..(i as usize + 1) * 30_000).into(),
                ..one_batch(3)
            })
            .collect();
        let mut dst = BytesMut::new();
        fetch_reply(batches).encode(&mut dst);
        // Grown by doubling, the buffer would end with up to twice the room it needs.
        assert!(dst.capacity() < dst.len() + 1024, "{} for {}", dst.capacity(), dst.len());
        assert!(decode(dst.freeze()).is_ok());
    }

    #[test]
    fn bad_kinds_counts_and_presence_bytes_are_refused() {
        let good = fetch_reply(vec![one_batch(1)]).to_bytes();
        assert!(decode(good.clone()).is_ok());
        assert_eq!(good[3], FrameType::Replicate as u8);

        let mut bad = good.to_vec();
        bad[KIND_AT] = 9;
        assert_eq!(
            decode(Bytes::from(bad)),
            Err(DecodeError::InvalidValue { what: "kind", value: 9 })
        );

        let zero = fetch_reply(vec![one_batch(0)]).to_bytes();
        assert_eq!(
            decode(zero),
            Err(DecodeError::InvalidValue { what: "batch records", value: 0 })
        );

        let over = fetch_reply(vec![one_batch(Limits::default().max_batch_records + 1)]);
        assert!(matches!(decode(over.to_bytes()), Err(DecodeError::TooManyRecords { .. })));

        // A batch count the body cannot hold allocates nothing: it is refused first.
        let mut huge = fetch_reply(vec![]).to_bytes().to_vec();
        let count_at = KIND_AT + 1 + 8 + 8 + 8;
        huge[count_at..count_at + 4].copy_from_slice(&1000u32.to_be_bytes());
        assert_eq!(decode(Bytes::from(huge)), Err(DecodeError::Truncated { what: "batches" }));
        let mut many = fetch_reply(vec![]).to_bytes().to_vec();
        many[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(decode(Bytes::from(many)), Err(DecodeError::FieldTooLong { .. })));

        let mut presence = fetch_reply(vec![one_batch(1)]).to_bytes().to_vec();
        let presence_at = count_at + 4 + 8 + 8 + 4;
        presence[presence_at] = 2;
        assert_eq!(
            decode(Bytes::from(presence)),
            Err(DecodeError::InvalidValue { what: "producer presence", value: 2 })
        );
    }
}
