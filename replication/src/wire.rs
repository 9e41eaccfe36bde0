//! Replica messages on the wire: [`Message`] to and from `felix_proto::Replicate`, the frame a
//! broker's replication driver sends core to core (docs/protocol.md, "Replication").
//!
//! The frame names the stream, the shard and the sender; the message's epoch travels in the
//! frame's header fields, its body in [`ReplicaBody`]. A batch's payload is handed over as the
//! parts it arrived in (no copy on decoding; one gather when a `Batch` needs contiguous bytes).

use felix_proto::{ProducerTag, ReplicaBatch, ReplicaBody, Replicate, ShardId};

use crate::message::Message;
use crate::types::{Batch, Epoch, ProducerId, ProducerSeq, ReplicaNumber, Seq};

/// The frame carrying `message` about shard `shard` of `stream`, sent by replica `from`.
pub fn to_frame(stream: &str, shard: ShardId, from: ReplicaNumber, message: &Message) -> Replicate {
    let (epoch, body) = match message {
        Message::EpochQuery { epoch, last_epoch } => {
            (*epoch, ReplicaBody::EpochQuery { last_epoch: last_epoch.0 })
        }
        Message::EpochAnswer { epoch, asked, answer_epoch, end } => (
            *epoch,
            ReplicaBody::EpochAnswer {
                asked: asked.0,
                answer_epoch: answer_epoch.map(|e| e.0),
                end: *end,
            },
        ),
        Message::Fetch { epoch, from, durable_end } => {
            (*epoch, ReplicaBody::Fetch { from: *from, durable_end: *durable_end })
        }
        Message::FetchReply { epoch, from, batches, committed, log_start } => (
            *epoch,
            ReplicaBody::FetchReply {
                from: *from,
                committed: *committed,
                log_start: *log_start,
                batches: batches.iter().map(batch_to_wire).collect(),
            },
        ),
    };
    Replicate { stream: stream.to_owned(), shard, from: from.0, epoch: epoch.0, body }
}

/// A received frame as (stream, shard, sender, message).
pub fn from_frame(frame: Replicate) -> (String, ShardId, ReplicaNumber, Message) {
    let epoch = Epoch(frame.epoch);
    let message = match frame.body {
        ReplicaBody::EpochQuery { last_epoch } => {
            Message::EpochQuery { epoch, last_epoch: Epoch(last_epoch) }
        }
        ReplicaBody::EpochAnswer { asked, answer_epoch, end } => Message::EpochAnswer {
            epoch,
            asked: Epoch(asked),
            answer_epoch: answer_epoch.map(Epoch),
            end,
        },
        ReplicaBody::Fetch { from, durable_end } => Message::Fetch { epoch, from, durable_end },
        ReplicaBody::FetchReply { from, committed, log_start, batches } => Message::FetchReply {
            epoch,
            from,
            batches: batches.into_iter().map(batch_from_wire).collect(),
            committed,
            log_start,
        },
    };
    (frame.stream, frame.shard, ReplicaNumber(frame.from), message)
}

fn batch_to_wire(b: &Batch) -> ReplicaBatch {
    ReplicaBatch {
        epoch: b.epoch.0,
        base: b.base,
        records: b.records,
        producer: b
            .producer
            .map(|p| ProducerTag { producer: felix_proto::ProducerId(p.producer.0), seq: p.seq.0 }),
        payload: b.payload.clone().into(),
    }
}

fn batch_from_wire(b: ReplicaBatch) -> Batch {
    Batch {
        epoch: Epoch(b.epoch),
        base: b.base,
        records: b.records,
        producer: b
            .producer
            .map(|t| ProducerSeq { producer: ProducerId(t.producer.0), seq: Seq(t.seq) }),
        time_ms: 0,
        payload: b.payload.into_bytes(),
    }
    .with_time_from_payload()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use felix_proto::{decode_frame, Capabilities, Frame, Limits, Offset};
    use proptest::prelude::*;

    use super::*;

    fn batch() -> impl Strategy<Value = Batch> {
        (
            any::<u64>(),
            any::<u64>(),
            1u32..=1000,
            proptest::option::of((any::<u64>(), any::<u32>())),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(epoch, base, records, producer, payload)| {
                Batch {
                    epoch: Epoch(epoch),
                    base: Offset(base),
                    records,
                    producer: producer
                        .map(|(p, s)| ProducerSeq { producer: ProducerId(p), seq: Seq(s) }),
                    time_ms: 0,
                    payload: Bytes::from(payload),
                }
                // The time travels in the payload's first 8 bytes.
                .with_time_from_payload()
            })
    }

    fn message() -> impl Strategy<Value = Message> {
        let epoch = any::<u64>().prop_map(Epoch);
        prop_oneof![
            (epoch.clone(), any::<u64>())
                .prop_map(|(epoch, l)| Message::EpochQuery { epoch, last_epoch: Epoch(l) }),
            (epoch.clone(), any::<u64>(), proptest::option::of(any::<u64>()), any::<u64>())
                .prop_map(|(epoch, asked, answer, end)| Message::EpochAnswer {
                    epoch,
                    asked: Epoch(asked),
                    answer_epoch: answer.map(Epoch),
                    end: Offset(end),
                }),
            (epoch.clone(), any::<u64>(), any::<u64>()).prop_map(|(epoch, from, durable)| {
                Message::Fetch { epoch, from: Offset(from), durable_end: Offset(durable) }
            }),
            (
                epoch,
                any::<u64>(),
                proptest::collection::vec(batch(), 0..5),
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(|(epoch, from, batches, committed, log_start)| {
                    Message::FetchReply {
                        epoch,
                        from: Offset(from),
                        batches,
                        committed: Offset(committed),
                        log_start: Offset(log_start),
                    }
                }),
        ]
    }

    proptest! {
        /// Every message survives encoding, a split of the bytes into two chunks, decoding and
        /// the way back, with its stream, shard and sender.
        #[test]
        fn messages_round_trip_through_the_frame(
            m in message(),
            shard in any::<u32>(),
            from in any::<u32>(),
            split in any::<prop::sample::Index>(),
        ) {
            let frame = Frame::Replicate(to_frame("t/ns/s", ShardId(shard), ReplicaNumber(from), &m));
            let bytes = frame.to_bytes();
            let at = split.index(bytes.len());
            let mut decoder =
                felix_proto::FrameDecoder::new(Limits::default(), Capabilities::ALL);
            decoder.handle_chunk(bytes.slice(..at));
            decoder.handle_chunk(bytes.slice(at..));
            let decoded = decoder.poll_frame().expect("a frame").expect("decodes");
            prop_assert_eq!(&decoded, &decode_frame(bytes, &Limits::default(), Capabilities::ALL).unwrap());
            let Frame::Replicate(r) = decoded else { panic!("not Replicate") };
            let (stream, s, f, back) = from_frame(r);
            prop_assert_eq!(stream, "t/ns/s");
            prop_assert_eq!((s, f), (ShardId(shard), ReplicaNumber(from)));
            prop_assert_eq!(back, m);
        }
    }
}
