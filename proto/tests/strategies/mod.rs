//! proptest strategies for every frame, shared by the property tests.

use bytes::Bytes;
use felix_proto::*;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{1,12}/[a-z0-9._-]{1,12}/[a-zA-Z0-9._-]{1,20}"
}

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!(".{{0,{max}}}")).unwrap()
}

fn request_id() -> impl Strategy<Value = RequestId> {
    any::<u64>().prop_map(RequestId)
}

fn retention() -> impl Strategy<Value = Retention> {
    (option::of(1u64..), option::of(1u64..))
        .prop_map(|(bytes_max, age_max_ms)| Retention { bytes_max, age_max_ms })
}

fn ack_mode() -> impl Strategy<Value = AckMode> {
    prop_oneof![Just(AckMode::None), Just(AckMode::Written), Just(AckMode::Durable)]
}

fn code() -> impl Strategy<Value = ErrorCode> {
    proptest::sample::select(ErrorCode::ALL.to_vec())
}

fn shards() -> impl Strategy<Value = Vec<ShardId>> {
    vec(any::<u32>().prop_map(ShardId), 0..8)
}

/// A Subscribe's shard list names at least one shard (absent means every shard).
fn subscribe_shards() -> impl Strategy<Value = Vec<ShardId>> {
    vec(any::<u32>().prop_map(ShardId), 1..8)
}

/// One offset per shard of a list of `n`.
fn positions(n: usize) -> impl Strategy<Value = Vec<Offset>> {
    vec(any::<u64>().prop_map(Offset), n..=n)
}

fn start() -> impl Strategy<Value = StartAt> {
    prop_oneof![
        Just(StartAt::Earliest),
        Just(StartAt::Latest),
        any::<u64>().prop_map(|o| StartAt::Offset(Offset(o))),
        any::<u64>().prop_map(StartAt::Timestamp),
    ]
}

fn record() -> impl Strategy<Value = Record> {
    (option::of(bytes(32)), bytes(64)).prop_map(|(key, value)| Record { key, value: value.into() })
}

fn error_body() -> impl Strategy<Value = ErrorBody> {
    (request_id(), code(), text(40)).prop_map(|(request_id, code, message)| ErrorBody {
        request_id,
        code,
        message,
    })
}

fn owner() -> impl Strategy<Value = ShardOwner> {
    (text(20), text(40), any::<bool>()).prop_map(|(node, address, live)| ShardOwner {
        node,
        address,
        live,
    })
}

/// Any frame within the default limits.
pub fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u16>(), any::<u64>(), option::of(bytes(64))).prop_map(|(v, c, token)| {
            Frame::Hello(Hello { version: v, capabilities: Capabilities(c), token })
        }),
        (
            any::<u16>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>()
        )
            .prop_map(|(v, c, f, r, k, core, n)| Frame::HelloOk(HelloOk {
                version: v,
                capabilities: Capabilities(c),
                limits: Limits { max_frame_bytes: f, max_batch_records: r, max_key_bytes: k },
                core: CoreId(core),
                core_count: n,
            })),
        (request_id(), name(), any::<u32>(), retention(), proptest::option::of(any::<u8>()))
            .prop_map(|(request_id, stream, shards, retention, replicas)| {
                Frame::CreateStream(CreateStream {
                    request_id,
                    stream,
                    shards,
                    retention,
                    replicas,
                })
            }),
        (request_id(), name()).prop_map(|(request_id, stream)| Frame::DescribeStream(
            DescribeStream { request_id, stream }
        )),
        (request_id(), name()).prop_map(|(request_id, stream)| Frame::DeleteStream(
            DescribeStream { request_id, stream }
        )),
        (
            request_id(),
            name(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u8>())
        )
            .prop_map(|(request_id, stream, retention_bytes, retention_ms, replicas)| {
                Frame::AlterStream(AlterStream {
                    request_id,
                    stream,
                    changes: StreamChanges { retention_bytes, retention_ms, replicas },
                })
            }),
        (request_id(), name(), any::<u32>(), retention()).prop_map(
            |(request_id, stream, shards, retention)| {
                Frame::StreamInfo(StreamInfo { request_id, stream, shards, retention })
            }
        ),
        (request_id(), text(20)).prop_map(|(request_id, prefix)| Frame::ListStreams(ListStreams {
            request_id,
            prefix
        })),
        (request_id(), vec(name(), 0..5)).prop_map(|(request_id, streams)| Frame::StreamList(
            StreamList { request_id, streams }
        )),
        (request_id(), name())
            .prop_map(|(request_id, stream)| Frame::Metadata(Metadata { request_id, stream })),
        (request_id(), name(), vec(owner(), 0..6)).prop_map(|(request_id, stream, owners)| {
            Frame::MetadataOk(MetadataOk { request_id, stream, owners })
        }),
        (request_id(), name(), any::<u32>(), owner()).prop_map(|(request_id, stream, s, owner)| {
            Frame::NotOwner(NotOwner { request_id, stream, shard: ShardId(s), owner })
        }),
        (
            option::of((request_id(), ack_mode())),
            option::of(bytes(40)),
            option::of((any::<u64>(), any::<u32>())),
            name(),
            vec(bytes(100), 1..20)
        )
            .prop_map(|(ack, key, producer, stream, records)| Frame::Publish(Publish {
                oldest_pending: false,
                ack: ack.map(|(request_id, mode)| AckRequest { request_id, mode }),
                key,
                producer: producer.map(|(p, seq)| ProducerTag { producer: ProducerId(p), seq }),
                stream,
                records: records.into_iter().map(Payload::from).collect(),
            })),
        (
            name(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            prop_oneof![
                any::<u64>().prop_map(|last_epoch| ReplicaBody::EpochQuery { last_epoch }),
                (any::<u64>(), option::of(any::<u64>()), any::<u64>()).prop_map(
                    |(asked, answer_epoch, end)| ReplicaBody::EpochAnswer {
                        asked,
                        answer_epoch,
                        end: Offset(end),
                    }
                ),
                (any::<u64>(), any::<u64>()).prop_map(|(from, durable_end)| ReplicaBody::Fetch {
                    from: Offset(from),
                    durable_end: Offset(durable_end),
                }),
                (any::<u64>(), any::<u64>(), any::<u64>(), vec(replica_batch(), 0..4)).prop_map(
                    |(from, committed, log_start, batches)| ReplicaBody::FetchReply {
                        from: Offset(from),
                        committed: Offset(committed),
                        log_start: Offset(log_start),
                        batches,
                    }
                ),
            ],
        )
            .prop_map(|(stream, shard, from, epoch, body)| Frame::Replicate(Replicate {
                stream,
                shard: ShardId(shard),
                from,
                epoch,
                body,
            })),
        (request_id(), any::<u32>(), any::<u64>(), any::<u32>()).prop_map(
            |(request_id, s, o, count)| {
                Frame::PublishAck(PublishAck {
                    request_id,
                    shard: ShardId(s),
                    base_offset: Offset(o),
                    count,
                })
            }
        ),
        error_body().prop_map(Frame::PublishError),
        (request_id(), name(), option::of(subscribe_shards()), start(), option::of(text(20)))
            .prop_flat_map(|(request_id, stream, shards, start, group)| {
                // Positions come with a shard list only, one per shard.
                let n = shards.as_ref().map(Vec::len);
                let positions = match n {
                    Some(n) => option::of(positions(n)).boxed(),
                    None => Just(None).boxed(),
                };
                positions.prop_map(move |positions| {
                    Frame::Subscribe(Subscribe {
                        request_id,
                        stream: stream.clone(),
                        shards: shards.clone(),
                        start,
                        group: group.clone(),
                        positions,
                    })
                })
            }),
        (request_id(), any::<u64>(), shards()).prop_flat_map(|(request_id, id, shards)| {
            option::of(positions(shards.len())).prop_map(move |positions| {
                Frame::SubscribeOk(SubscribeOk {
                    request_id,
                    subscription_id: SubscriptionId(id),
                    shards: shards.clone(),
                    positions,
                })
            })
        }),
        any::<u64>().prop_map(|id| Frame::SubscriptionStart(SubscriptionId(id))),
        (any::<u32>(), any::<u64>(), any::<u64>(), vec(record(), 0..20)).prop_map(
            |(s, o, timestamp_ms, records)| Frame::EventBatch(EventBatch {
                shard: ShardId(s),
                base_offset: Offset(o),
                timestamp_ms,
                records,
            })
        ),
        (request_id(), name(), text(20), any::<u32>(), any::<u64>()).prop_map(
            |(request_id, stream, group, s, o)| Frame::CommitOffset(CommitOffset {
                request_id,
                stream,
                group,
                shard: ShardId(s),
                offset: Offset(o),
            })
        ),
        request_id().prop_map(Frame::CommitOk),
        error_body().prop_map(Frame::Error),
        any::<u64>().prop_map(Frame::Ping),
        any::<u64>().prop_map(Frame::Pong),
    ]
}

fn replica_batch() -> impl Strategy<Value = ReplicaBatch> {
    (any::<u64>(), any::<u64>(), 1u32..=100, option::of((any::<u64>(), any::<u32>())), bytes(200))
        .prop_map(|(epoch, base, records, producer, payload)| ReplicaBatch {
            epoch,
            base: Offset(base),
            records,
            producer: producer.map(|(p, seq)| ProducerTag { producer: ProducerId(p), seq }),
            payload: Payload::from(payload),
        })
}
