//! Hex test vectors: each frame below, encoded, must equal `vectors/<name>.hex`, decode back to
//! the same frame, and appear in `docs/protocol.md` under `<!-- vector: <name> -->`.
//!
//! Rejection vectors are bytes a receiver must refuse: each names the error code, the request
//! id the error carries and whether the stream survives, checked however the bytes arrive.
//!
//! To regenerate the files after a deliberate protocol change: `FELIX_BLESS=1 cargo test -p
//! felix-proto --test vectors` (then update docs/protocol.md, which this test checks).

use std::path::PathBuf;

use bytes::{BufMut, Bytes, BytesMut};
use felix_proto::*;

/// The frame limit the Felix broker advertises: 4 MiB less one 4 KiB block (a stored batch
/// must fit one aligned 4 MiB write; `felix_storage::BATCH_BYTES_LIMIT`). The broker's
/// end-to-end tests check that it advertises exactly this.
const BROKER_MAX_FRAME_BYTES: u32 = 4_190_208;

/// The capabilities of a broker (or client) that is not in a cluster.
const SINGLE_NODE: Capabilities = Capabilities(
    Capabilities::PUBLISH_ACKED.0 | Capabilities::PUBLISH_KEYED.0 | Capabilities::CONSUMER_GROUPS.0,
);

fn broker_limits() -> Limits {
    Limits { max_frame_bytes: BROKER_MAX_FRAME_BYTES, ..Limits::default() }
}

fn vectors() -> Vec<(&'static str, Frame)> {
    let s = |x: &str| x.to_owned();
    vec![
        (
            "hello",
            Frame::Hello(Hello {
                version: 1,
                // A single-node client: everything but CLUSTER.
                capabilities: SINGLE_NODE,
                token: Some(Bytes::from_static(b"tok")),
            }),
        ),
        (
            "hello_ok",
            Frame::HelloOk(HelloOk {
                version: 1,
                // What a single-node broker advertises: everything but CLUSTER.
                capabilities: SINGLE_NODE,
                limits: broker_limits(),
                core: CoreId(1),
                core_count: 2,
            }),
        ),
        (
            "create_stream",
            Frame::CreateStream(CreateStream {
                request_id: RequestId(1),
                stream: s("acme/app/orders"),
                shards: 12,
                retention: Retention { bytes_max: Some(1 << 30), age_max_ms: None },
                replicas: None,
            }),
        ),
        (
            "create_stream_replicated",
            Frame::CreateStream(CreateStream {
                request_id: RequestId(2),
                stream: s("acme/app/orders"),
                shards: 12,
                retention: Retention::default(),
                replicas: Some(3),
            }),
        ),
        (
            "describe_stream",
            Frame::DescribeStream(DescribeStream { request_id: RequestId(2), stream: s("a/b/c") }),
        ),
        (
            "delete_stream",
            Frame::DeleteStream(DescribeStream { request_id: RequestId(4), stream: s("a/b/c") }),
        ),
        (
            "alter_stream",
            Frame::AlterStream(AlterStream {
                request_id: RequestId(5),
                stream: s("a/b/c"),
                // 64 MiB per shard; the age limit and the replicas as they are.
                changes: StreamChanges {
                    retention_bytes: Some(64 << 20),
                    retention_ms: None,
                    replicas: None,
                },
            }),
        ),
        (
            "stream_info",
            Frame::StreamInfo(StreamInfo {
                request_id: RequestId(2),
                stream: s("a/b/c"),
                shards: 4,
                retention: Retention::default(),
            }),
        ),
        (
            "list_streams",
            Frame::ListStreams(ListStreams { request_id: RequestId(3), prefix: s("a/") }),
        ),
        (
            "stream_list",
            Frame::StreamList(StreamList { request_id: RequestId(3), streams: vec![s("a/b/c")] }),
        ),
        ("metadata", Frame::Metadata(Metadata { request_id: RequestId(40), stream: s("a/b/c") })),
        (
            "metadata_ok",
            Frame::MetadataOk(MetadataOk {
                request_id: RequestId(40),
                stream: s("a/b/c"),
                owners: vec![
                    ShardOwner { node: s("b1"), address: s("10.0.0.1:7400"), live: true },
                    ShardOwner { node: s("b2"), address: s("10.0.0.2:7400"), live: false },
                ],
            }),
        ),
        (
            "not_owner",
            Frame::NotOwner(NotOwner {
                request_id: RequestId(41),
                stream: s("a/b/c"),
                shard: ShardId(1),
                owner: ShardOwner { node: s("b2"), address: s("10.0.0.2:7400"), live: true },
            }),
        ),
        (
            "publish",
            Frame::Publish(Publish {
                oldest_pending: false,
                ack: None,
                key: None,
                producer: None,
                stream: s("a/b/c"),
                records: vec![Bytes::from_static(b"hi").into()],
            }),
        ),
        (
            "publish_acked_keyed",
            Frame::Publish(Publish {
                oldest_pending: false,
                ack: Some(AckRequest { request_id: RequestId(7), mode: AckMode::Durable }),
                key: Some(Bytes::from_static(b"k1")),
                producer: None,
                stream: s("a/b/c"),
                records: vec![Bytes::from_static(b"x").into(), Bytes::from_static(b"yz").into()],
            }),
        ),
        (
            "publish_idempotent",
            Frame::Publish(Publish {
                oldest_pending: false,
                ack: Some(AckRequest { request_id: RequestId(9), mode: AckMode::Durable }),
                key: Some(Bytes::from_static(b"k")),
                producer: Some(ProducerTag { producer: ProducerId(0x0102_0304_0506_0708), seq: 5 }),
                stream: s("a/b/c"),
                records: vec![Bytes::from_static(b"v").into()],
            }),
        ),
        (
            "replicate_fetch_reply",
            Frame::Replicate(Replicate {
                stream: s("a/b/c"),
                shard: ShardId(2),
                from: 0,
                epoch: 3,
                body: ReplicaBody::FetchReply {
                    from: Offset(10),
                    committed: Offset(9),
                    log_start: Offset(4),
                    batches: vec![ReplicaBatch {
                        epoch: 3,
                        base: Offset(10),
                        records: 1,
                        producer: Some(ProducerTag { producer: ProducerId(7), seq: 4 }),
                        payload: Bytes::from_static(b"xy").into(),
                    }],
                },
            }),
        ),
        (
            "replicate_epoch_answer",
            Frame::Replicate(Replicate {
                stream: s("a/b/c"),
                shard: ShardId(2),
                from: 0,
                epoch: 3,
                body: ReplicaBody::EpochAnswer { asked: 2, answer_epoch: Some(1), end: Offset(40) },
            }),
        ),
        (
            "publish_keyed_empty_key",
            Frame::Publish(Publish {
                oldest_pending: false,
                ack: None,
                key: Some(Bytes::new()),
                producer: None,
                stream: s("a/b/c"),
                records: vec![Bytes::from_static(b"v").into()],
            }),
        ),
        (
            "publish_ack",
            Frame::PublishAck(PublishAck {
                request_id: RequestId(7),
                shard: ShardId(3),
                base_offset: Offset(100),
                count: 2,
            }),
        ),
        (
            "publish_error",
            Frame::PublishError(ErrorBody {
                request_id: RequestId(7),
                code: ErrorCode::KeyTooLong,
                message: s("key too long"),
            }),
        ),
        (
            "subscribe",
            Frame::Subscribe(Subscribe {
                request_id: RequestId(9),
                stream: s("a/b/c"),
                shards: Some(vec![ShardId(0), ShardId(2)]),
                start: StartAt::Offset(Offset(5)),
                group: Some(s("g")),
                positions: None,
            }),
        ),
        (
            "subscribe_ok",
            Frame::SubscribeOk(SubscribeOk {
                request_id: RequestId(9),
                subscription_id: SubscriptionId(1),
                shards: vec![ShardId(0), ShardId(2)],
                positions: None,
            }),
        ),
        (
            // A resume: shard 0 from offset 7, shard 2 from offset 3 (`start` is ignored).
            "subscribe_positions",
            Frame::Subscribe(Subscribe {
                request_id: RequestId(10),
                stream: s("a/b/c"),
                shards: Some(vec![ShardId(0), ShardId(2)]),
                start: StartAt::Latest,
                group: None,
                positions: Some(vec![Offset(7), Offset(3)]),
            }),
        ),
        (
            "subscribe_ok_positions",
            Frame::SubscribeOk(SubscribeOk {
                request_id: RequestId(10),
                subscription_id: SubscriptionId(2),
                shards: vec![ShardId(0), ShardId(2)],
                positions: Some(vec![Offset(7), Offset(3)]),
            }),
        ),
        ("subscription_start", Frame::SubscriptionStart(SubscriptionId(1))),
        (
            "event_batch",
            Frame::EventBatch(EventBatch {
                shard: ShardId(2),
                base_offset: Offset(5),
                timestamp_ms: 1_700_000_000_000,
                records: vec![
                    Record::keyed(Bytes::from_static(b"k"), Bytes::from_static(b"v")),
                    Record::unkeyed(Bytes::from_static(b"w")),
                ],
            }),
        ),
        (
            "commit_offset",
            Frame::CommitOffset(CommitOffset {
                request_id: RequestId(10),
                stream: s("a/b/c"),
                group: s("g"),
                shard: ShardId(2),
                offset: Offset(7),
            }),
        ),
        ("commit_ok", Frame::CommitOk(RequestId(10))),
        (
            "error",
            Frame::Error(ErrorBody {
                request_id: RequestId(0),
                code: ErrorCode::UnsupportedVersion,
                message: s("version 9"),
            }),
        ),
        ("ping", Frame::Ping(0x0102030405060708)),
        ("pong", Frame::Pong(0x0102030405060708)),
    ]
}

/// Bytes a receiver refuses, and what it must say.
struct Rejection {
    name: &'static str,
    /// What arrives on the stream.
    bytes: Vec<u8>,
    /// Whether the stream ends (FIN) after `bytes`.
    fin: bool,
    /// The receiver's limits.
    limits: Limits,
    code: ErrorCode,
    /// The request id the error carries (`None`: 0 on the wire).
    request_id: Option<u64>,
    /// Whether the stream is closed (framing lost) rather than carrying on with the next frame.
    fatal: bool,
}

/// `frame` encoded with `extra` flag bits set.
fn with_flags(frame: Frame, extra: u16) -> Vec<u8> {
    let mut b = frame.to_bytes().to_vec();
    let flags = u16::from_be_bytes([b[4], b[5]]) | extra;
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b
}

/// A frame from raw parts: type, flags, body length as claimed, and the body bytes sent.
fn raw(frame_type: u8, flags: u16, body_len: u32, body: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_slice(&[0x46, 0x58, 1, frame_type]);
    b.put_u16(flags);
    b.put_u32(body_len);
    b.put_slice(body);
    b.to_vec()
}

fn rejections() -> Vec<Rejection> {
    let create = Frame::CreateStream(CreateStream {
        request_id: RequestId(77),
        stream: "a/b/c".into(),
        shards: 1,
        retention: Retention::default(),
        replicas: None,
    });
    let publish = Frame::Publish(Publish {
        oldest_pending: false,
        ack: Some(AckRequest { request_id: RequestId(4242), mode: AckMode::Written }),
        key: None,
        producer: None,
        stream: "a/b/c".into(),
        records: vec![Bytes::from_static(b"x").into()],
    });
    // ListStreams whose prefix length is one over the limit: refused at the length, before its
    // bytes are looked for, so the body may stop there.
    let mut long_prefix = 3u64.to_be_bytes().to_vec();
    long_prefix.extend_from_slice(&(limits::MAX_STREAM_NAME_BYTES as u16 + 1).to_be_bytes());
    // Subscribe 9 to a/b/c, shard list present with 0 shards, from earliest, no group.
    let mut empty_shards = 9u64.to_be_bytes().to_vec();
    empty_shards.extend_from_slice(&[0, 5, b'a', b'/', b'b', b'/', b'c', 1, 0, 0, 0, 0]);
    // Subscribe 12 to a/b/c with positions (flag 0x0010) but no shard list: every shard, from
    // latest, no group, one position (7).
    let mut unlisted_positions = 12u64.to_be_bytes().to_vec();
    unlisted_positions.extend_from_slice(&[0, 5, b'a', b'/', b'b', b'/', b'c', 0, 1, 0]);
    unlisted_positions.extend_from_slice(&7u64.to_be_bytes());
    // Publish acked (request 11, written) to a/b/c with 0 records.
    let mut empty_publish = 11u64.to_be_bytes().to_vec();
    empty_publish.extend_from_slice(&[1, 0, 5, b'a', b'/', b'b', b'/', b'c', 0, 0, 0, 0]);
    let cut = vectors().into_iter().find(|v| v.0 == "create_stream").unwrap().1.to_bytes();
    let mut bad_version = Frame::Ping(5).to_bytes().to_vec();
    bad_version[2] = 2;
    let r = |name, bytes, code, request_id: Option<u64>, fatal| Rejection {
        name,
        bytes,
        fin: false,
        limits: broker_limits(),
        code,
        request_id,
        fatal,
    };
    vec![
        r(
            "reject_unknown_flags_create_stream",
            with_flags(create, 0x0100),
            ErrorCode::UnknownFlags,
            Some(77),
            false,
        ),
        r(
            "reject_unknown_flags_publish",
            with_flags(publish, 0x0100),
            ErrorCode::UnknownFlags,
            Some(4242),
            false,
        ),
        r(
            "reject_unknown_type",
            raw(0x7f, 0, 8, &5u64.to_be_bytes()),
            ErrorCode::UnknownFrameType,
            None,
            false,
        ),
        r(
            "reject_frame_too_large",
            raw(0x10, 0x0001, BROKER_MAX_FRAME_BYTES - 9, &7u64.to_be_bytes()),
            ErrorCode::FrameTooLarge,
            Some(7),
            true,
        ),
        r(
            "reject_name_too_long",
            raw(0x06, 0, long_prefix.len() as u32, &long_prefix),
            ErrorCode::InvalidArgument,
            Some(3),
            false,
        ),
        r(
            "reject_empty_shard_list",
            raw(0x20, 0, empty_shards.len() as u32, &empty_shards),
            ErrorCode::InvalidArgument,
            Some(9),
            false,
        ),
        r(
            "reject_positions_without_shards",
            raw(0x20, 0x0010, unlisted_positions.len() as u32, &unlisted_positions),
            ErrorCode::InvalidArgument,
            Some(12),
            false,
        ),
        r(
            "reject_empty_publish",
            raw(0x10, 0x0001, empty_publish.len() as u32, &empty_publish),
            ErrorCode::InvalidArgument,
            Some(11),
            false,
        ),
        Rejection {
            fin: true,
            ..r("reject_cut_by_fin", cut[..20].to_vec(), ErrorCode::Malformed, Some(1), true)
        },
        r("reject_bad_version", bad_version, ErrorCode::UnsupportedVersion, None, true),
    ]
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

/// Hex in the vector files' layout: the 10 header bytes on the first line, then 16 bytes a line.
fn to_hex(bytes: &[u8]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let (head, body) = hex.split_at(HEADER_LEN.min(hex.len()));
    let mut lines = vec![head.join(" ")];
    lines.extend(body.chunks(16).map(|c| c.join(" ")));
    lines.join("\n") + "\n"
}

fn normalise(hex: &str) -> String {
    hex.chars().filter(|c| c.is_ascii_hexdigit()).collect::<String>().to_lowercase()
}

/// Checks `vectors/<name>.hex` against `bytes` (writing it first when blessing).
fn check_file(name: &str, bytes: &[u8]) -> Vec<u8> {
    let path = dir().join(format!("{name}.hex"));
    if std::env::var_os("FELIX_BLESS").is_some() {
        std::fs::write(&path, to_hex(bytes)).unwrap();
    }
    let file = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with FELIX_BLESS=1 to create)", path.display()));
    assert_eq!(normalise(&file), normalise(&to_hex(bytes)), "vector {name} changed");
    hex::decode(normalise(&file)).unwrap()
}

#[test]
fn vectors_match_files_and_decode() {
    for (name, frame) in vectors() {
        let bytes = check_file(name, &frame.to_bytes());
        let decoded = decode_frame(Bytes::from(bytes), &Limits::default(), Capabilities::ALL);
        assert_eq!(decoded, Ok(frame), "vector {name} decodes differently");
    }
}

/// Everything a decoder says about `bytes` fed `step` bytes at a time (0: as `wanted_bytes`
/// asks), then a Ping, then FIN if `fin`.
fn decode_steps(r: &Rejection, bytes: &[u8], step: usize) -> Vec<Result<Frame, FrameError>> {
    let mut wire = bytes.to_vec();
    if !r.fin {
        wire.extend_from_slice(&Frame::Ping(1).to_bytes());
    }
    let mut d = FrameDecoder::new(r.limits, Capabilities::ALL);
    let mut out = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let n = if step == 0 { d.wanted_bytes() } else { step };
        let n = n.clamp(1, wire.len() - at);
        d.handle_bytes(&wire[at..at + n]);
        at += n;
        while let Some(f) = d.poll_frame() {
            out.push(f);
        }
    }
    if r.fin {
        out.extend(d.handle_end().map(Err));
    }
    out
}

#[test]
fn rejection_vectors_match_files_and_are_refused_as_documented() {
    for r in rejections() {
        let bytes = check_file(r.name, &r.bytes);
        for step in [0, 1, 3, bytes.len() + 8] {
            let out = decode_steps(&r, &bytes, step);
            let e = match out.first() {
                Some(Err(e)) => e,
                other => panic!("{}: expected an error, got {other:?}", r.name),
            };
            let said = (e.code(), e.request_id.map(|id| id.0), e.fatal);
            assert_eq!(said, (r.code, r.request_id, r.fatal), "{} (step {step})", r.name);
            // A fatal error ends the stream; otherwise the next frame is read as usual.
            let rest = if r.fatal || r.fin { vec![] } else { vec![Ok(Frame::Ping(1))] };
            assert_eq!(out[1..], rest[..], "{} (step {step})", r.name);
        }
    }
}

/// The hex block after `<!-- vector: name -->` in docs/protocol.md, normalised.
fn doc_block(doc: &str, name: &str) -> String {
    let marker = format!("<!-- vector: {name} -->");
    let at = doc.find(&marker).unwrap_or_else(|| panic!("docs/protocol.md lacks {marker}"));
    let rest = &doc[at + marker.len()..];
    let open = rest.find("```").expect("a code block after the marker");
    let body_start = open + rest[open..].find('\n').expect("code block line") + 1;
    let close = body_start + rest[body_start..].find("```").expect("closing fence");
    normalise(&rest[body_start..close])
}

#[test]
fn protocol_doc_shows_every_vector() {
    let doc_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/protocol.md");
    for (name, frame) in vectors() {
        let shown = doc_block(&doc, name);
        assert_eq!(shown, normalise(&to_hex(&frame.to_bytes())), "docs/protocol.md: {name}");
    }
    for r in rejections() {
        assert_eq!(doc_block(&doc, r.name), normalise(&to_hex(&r.bytes)), "docs/protocol.md");
    }
}
