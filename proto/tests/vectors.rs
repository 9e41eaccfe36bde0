//! Hex test vectors: each frame below, encoded, must equal `vectors/<name>.hex`, decode back to
//! the same frame, and appear in `docs/protocol.md` under `<!-- vector: <name> -->`.
//!
//! To regenerate the files after a deliberate protocol change: `FELIX_BLESS=1 cargo test -p
//! felix-proto --test vectors` (then update docs/protocol.md, which this test checks).

use std::path::PathBuf;

use bytes::Bytes;
use felix_proto::*;

fn vectors() -> Vec<(&'static str, Frame)> {
    let s = |x: &str| x.to_owned();
    vec![
        (
            "hello",
            Frame::Hello(Hello {
                version: 1,
                capabilities: Capabilities::ALL,
                token: Some(Bytes::from_static(b"tok")),
            }),
        ),
        (
            "hello_ok",
            Frame::HelloOk(HelloOk {
                version: 1,
                capabilities: Capabilities::ALL,
                limits: Limits::default(),
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
            }),
        ),
        (
            "describe_stream",
            Frame::DescribeStream(DescribeStream { request_id: RequestId(2), stream: s("a/b/c") }),
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
        (
            "publish",
            Frame::Publish(Publish {
                ack: None,
                key: None,
                stream: s("a/b/c"),
                records: vec![Bytes::from_static(b"hi")],
            }),
        ),
        (
            "publish_acked_keyed",
            Frame::Publish(Publish {
                ack: Some(AckRequest { request_id: RequestId(7), mode: AckMode::Durable }),
                key: Some(Bytes::from_static(b"k1")),
                stream: s("a/b/c"),
                records: vec![Bytes::from_static(b"x"), Bytes::from_static(b"yz")],
            }),
        ),
        (
            "publish_keyed_empty_key",
            Frame::Publish(Publish {
                ack: None,
                key: Some(Bytes::new()),
                stream: s("a/b/c"),
                records: vec![Bytes::from_static(b"v")],
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
            }),
        ),
        (
            "subscribe_ok",
            Frame::SubscribeOk(SubscribeOk {
                request_id: RequestId(9),
                subscription_id: SubscriptionId(1),
                shards: vec![ShardId(0), ShardId(2)],
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

#[test]
fn vectors_match_files_and_decode() {
    let bless = std::env::var_os("FELIX_BLESS").is_some();
    for (name, frame) in vectors() {
        let path = dir().join(format!("{name}.hex"));
        let encoded = frame.to_bytes();
        if bless {
            std::fs::write(&path, to_hex(&encoded)).unwrap();
        }
        let file = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (run with FELIX_BLESS=1 to create)", path.display())
        });
        assert_eq!(normalise(&file), normalise(&to_hex(&encoded)), "vector {name} changed");
        let bytes = hex::decode(normalise(&file)).unwrap();
        let decoded = decode_frame(Bytes::from(bytes), &Limits::default(), Capabilities::ALL);
        assert_eq!(decoded, Ok(frame), "vector {name} decodes differently");
    }
}

#[test]
fn protocol_doc_shows_every_vector() {
    let doc_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/protocol.md");
    for (name, frame) in vectors() {
        let marker = format!("<!-- vector: {name} -->");
        let at = doc.find(&marker).unwrap_or_else(|| panic!("docs/protocol.md lacks {marker}"));
        let rest = &doc[at + marker.len()..];
        let open = rest.find("```").expect("a code block after the marker");
        let body_start = open + rest[open..].find('\n').expect("code block line") + 1;
        let close = body_start + rest[body_start..].find("```").expect("closing fence");
        let shown = normalise(&rest[body_start..close]);
        assert_eq!(shown, normalise(&to_hex(&frame.to_bytes())), "docs/protocol.md: {name}");
    }
}
