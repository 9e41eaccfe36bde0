//! The rules of docs/protocol.md that the broker answers, each checked against a running broker
//! over raw frames: limits to the byte, what may come before HelloOk, Error or PublishError,
//! ack mode none, empty and duplicate lists, EventBatch offsets, Subscribe positions,
//! auto-create on Subscribe,
//! frames of the broker's direction sent by a client, and the rejection vectors of
//! proto/tests/vectors with the request ids they must carry.

mod e2e_support;

use bytes::{BufMut, Bytes, BytesMut};
use e2e_support::{raw_connection, read_frames, TestBroker};
use felix_proto::{
    AckMode, AckRequest, Capabilities, CommitOffset, CreateStream, DescribeStream, ErrorBody,
    ErrorCode, EventBatch, Frame, Hello, HelloOk, Limits, Offset, Publish, PublishAck, Record,
    RequestId, Retention, ShardId, StartAt, StreamInfo, StreamList, Subscribe, SubscribeOk,
    SubscriptionId, HEADER_LEN, PROTOCOL_VERSION,
};

/// What docs/protocol.md says the Felix broker advertises as `max_frame_bytes`.
const DOCUMENTED_MAX_FRAME_BYTES: u32 = 4_190_208;
/// Small segments: these tests store a few MiB at most.
const SEGMENT_BYTES: &str = "16777216";

fn start(dir: &std::path::Path, extra: &[&str]) -> TestBroker {
    let mut args = vec!["--segment-bytes", SEGMENT_BYTES];
    args.extend_from_slice(extra);
    TestBroker::start(dir, 2, &args)
}

fn hello_frame(version: u16) -> Bytes {
    Frame::Hello(Hello { version, capabilities: Capabilities::ALL, token: None }).to_bytes()
}

/// A rejection vector of felix-proto, as bytes.
fn vector(name: &str) -> Bytes {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../proto/tests/vectors")
        .join(format!("{name}.hex"));
    let text = std::fs::read_to_string(&path).expect("vector file");
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    let byte = |pair: &[u8]| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap();
    Bytes::from(digits.chunks(2).map(byte).collect::<Vec<u8>>())
}

fn publish(id: Option<u64>, mode: AckMode, stream: &str, records: &[&str]) -> Frame {
    Frame::Publish(Publish {
        oldest_pending: false,
        ack: id.map(|id| AckRequest { request_id: RequestId(id), mode }),
        key: None,
        producer: None,
        stream: stream.into(),
        records: records.iter().map(|r| Bytes::copy_from_slice(r.as_bytes()).into()).collect(),
    })
}

fn subscribe(id: u64, stream: &str, shards: Option<Vec<u32>>, start: StartAt) -> Frame {
    Frame::Subscribe(Subscribe {
        request_id: RequestId(id),
        stream: stream.into(),
        shards: shards.map(|s| s.into_iter().map(ShardId).collect()),
        start,
        group: None,
        positions: None,
    })
}

/// (PublishError?, request id, code) of an error answer.
fn error_of(frame: &Frame) -> (bool, u64, ErrorCode) {
    match frame {
        Frame::PublishError(e) => (true, e.request_id.0, e.code),
        Frame::Error(e) => (false, e.request_id.0, e.code),
        other => panic!("expected an error, got {other:?}"),
    }
}

const ERROR: bool = false;
const PUBLISH_ERROR: bool = true;

/// A bidirectional stream on a raw connection.
struct Lane {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
}

impl Lane {
    async fn open(conn: &quinn::Connection) -> Lane {
        let (send, recv) = conn.open_bi().await.expect("open a stream");
        Lane { send, recv }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.send.write_all(bytes).await.expect("write");
    }

    /// Sends `bytes` and reads `n` answers (fewer if the stream ends).
    async fn ask(&mut self, bytes: &[u8], n: usize) -> Vec<Frame> {
        self.write(bytes).await;
        read_frames(&mut self.recv, n).await
    }

    /// Sends `bytes` and returns the single answer.
    async fn ask1(&mut self, bytes: &[u8]) -> Frame {
        let mut frames = self.ask(bytes, 1).await;
        assert_eq!(frames.len(), 1, "no answer");
        frames.remove(0)
    }

    /// Sends a Ping and expects the Pong: the stream carries on, and nothing else was owed.
    async fn carries_on(&mut self, nonce: u64) {
        assert_eq!(self.ask1(&Frame::Ping(nonce).to_bytes()).await, Frame::Pong(nonce));
    }

    /// The broker ends its side: no frame follows.
    async fn ends(&mut self) {
        assert_eq!(read_frames(&mut self.recv, 1).await, vec![], "the stream must end");
    }
}

/// A raw connection that completed Hello, and its control stream.
async fn connect(broker: &TestBroker, dir: &std::path::Path) -> (quinn::Connection, Lane) {
    let conn = raw_connection(broker.addr, dir).await;
    let mut lane = Lane::open(&conn).await;
    match lane.ask1(&hello_frame(PROTOCOL_VERSION)).await {
        Frame::HelloOk(_) => {}
        other => panic!("expected HelloOk, got {other:?}"),
    }
    (conn, lane)
}

async fn create(lane: &mut Lane, id: u64, stream: &str, shards: u32) {
    let frame = Frame::CreateStream(CreateStream {
        request_id: RequestId(id),
        stream: stream.into(),
        shards,
        retention: Retention::default(),
        replicas: None,
    });
    match lane.ask1(&frame.to_bytes()).await {
        Frame::StreamInfo(i) => assert_eq!((i.request_id.0, i.shards), (id, shards)),
        other => panic!("expected StreamInfo, got {other:?}"),
    }
}

async fn describe(lane: &mut Lane, id: u64, stream: &str) -> Frame {
    let frame =
        Frame::DescribeStream(DescribeStream { request_id: RequestId(id), stream: stream.into() });
    lane.ask1(&frame.to_bytes()).await
}

/// Reads a subscription's stream: its SubscriptionStart, then EventBatches until `records`
/// records came.
async fn read_subscription(conn: &quinn::Connection, records: usize) -> Vec<EventBatch> {
    let wait = e2e_support::WAIT;
    let mut recv = tokio::time::timeout(wait, conn.accept_uni()).await.expect("uni").expect("uni");
    let first = read_frames(&mut recv, 1).await;
    assert!(matches!(first[..], [Frame::SubscriptionStart(_)]), "{first:?}");
    let mut batches = Vec::new();
    let mut got = 0;
    while got < records {
        for f in read_frames(&mut recv, 1).await {
            let Frame::EventBatch(b) = f else { panic!("expected EventBatch, got {f:?}") };
            got += b.records.len();
            batches.push(b);
        }
    }
    batches
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_advertised_as_documented_and_enforced_to_the_byte() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]);
    let conn = raw_connection(broker.addr, dir.path()).await;
    let mut lane = Lane::open(&conn).await;
    let limits = match lane.ask1(&hello_frame(PROTOCOL_VERSION)).await {
        Frame::HelloOk(HelloOk { limits, .. }) => limits,
        other => panic!("expected HelloOk, got {other:?}"),
    };
    let max = DOCUMENTED_MAX_FRAME_BYTES;
    assert_eq!(
        limits,
        Limits { max_frame_bytes: max, max_batch_records: 4096, max_key_bytes: 1024 }
    );
    assert_eq!(max as usize, felix_storage::BATCH_BYTES_LIMIT, "where the limit comes from");

    // A frame of exactly max_frame_bytes is read (a Ping padded with trailing bytes: refused
    // for those, as Malformed, and the stream carries on).
    let mut at_max = BytesMut::new();
    at_max.put_slice(&[0x46, 0x58, 1, 0x31, 0, 0]);
    at_max.put_u32(max - HEADER_LEN as u32);
    at_max.put_u64(42);
    at_max.resize(max as usize, 0);
    assert_eq!(error_of(&lane.ask1(&at_max).await), (ERROR, 0, ErrorCode::Malformed));
    lane.carries_on(1).await;

    // A Publish whose stored form (48 + records x (9 + key + value)) fits is stored; one record
    // more is FrameTooLarge although the frame itself is small.
    create(&mut lane, 1, "acme/app/limits", 1).await;
    let fit = (max as usize - 48) / (9 + 1024);
    for (id, n, fits) in [(2u64, fit + 1, false), (3, fit, true)] {
        let frame = Frame::Publish(Publish {
            oldest_pending: false,
            ack: Some(AckRequest { request_id: RequestId(id), mode: AckMode::Written }),
            key: Some(Bytes::from(vec![b'k'; 1024])),
            producer: None,
            stream: "acme/app/limits".into(),
            records: vec![Bytes::new().into(); n],
        });
        assert!(frame.to_bytes().len() < 64 << 10);
        let answer = lane.ask1(&frame.to_bytes()).await;
        if fits {
            assert!(
                matches!(answer, Frame::PublishAck(PublishAck { count, .. }) if count as usize == n),
                "{answer:?}"
            );
        } else {
            assert_eq!(error_of(&answer), (PUBLISH_ERROR, id, ErrorCode::FrameTooLarge));
        }
    }

    // One byte over: FrameTooLarge with the request id, read from the first 8 body bytes
    // alone, and the stream is closed.
    let mut over = Lane::open(&conn).await;
    let answer = over.ask1(&vector("reject_frame_too_large")).await;
    assert_eq!(error_of(&answer), (PUBLISH_ERROR, 7, ErrorCode::FrameTooLarge));
    over.ends().await;
    lane.carries_on(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_hello_everything_is_unauthenticated_and_hello_can_follow() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]);
    let conn = raw_connection(broker.addr, dir.path()).await;
    let mut lane = Lane::open(&conn).await;
    let unauth = ErrorCode::Unauthenticated;
    assert_eq!(error_of(&lane.ask1(&Frame::Ping(1).to_bytes()).await), (ERROR, 0, unauth));
    assert_eq!(error_of(&lane.ask1(&Frame::Pong(1).to_bytes()).await), (ERROR, 0, unauth));
    let create = Frame::CreateStream(CreateStream {
        request_id: RequestId(77),
        stream: "acme/app/x".into(),
        shards: 1,
        retention: Retention::default(),
        replicas: None,
    });
    assert_eq!(error_of(&lane.ask1(&create.to_bytes()).await), (ERROR, 77, unauth));
    let acked = publish(Some(5), AckMode::Written, "acme/app/x", &["r"]);
    assert_eq!(error_of(&lane.ask1(&acked.to_bytes()).await), (PUBLISH_ERROR, 5, unauth));
    // An acked Publish is answered with PublishError even when its request id is 0.
    let acked0 = publish(Some(0), AckMode::Written, "acme/app/x", &["r"]);
    assert_eq!(error_of(&lane.ask1(&acked0.to_bytes()).await), (PUBLISH_ERROR, 0, unauth));
    let unacked = publish(None, AckMode::None, "acme/app/x", &["r"]);
    assert_eq!(error_of(&lane.ask1(&unacked.to_bytes()).await), (ERROR, 0, unauth));
    // What the decoder refuses gets the decoder's error, Hello or not.
    let flags = lane.ask1(&vector("reject_unknown_flags_create_stream")).await;
    assert_eq!(error_of(&flags), (ERROR, 77, ErrorCode::UnknownFlags));
    // A failed Hello leaves the connection open for another.
    let v9 = lane.ask1(&hello_frame(9)).await;
    assert_eq!(error_of(&v9), (ERROR, 0, ErrorCode::UnsupportedVersion));
    assert!(matches!(lane.ask1(&hello_frame(PROTOCOL_VERSION)).await, Frame::HelloOk(_)));
    lane.carries_on(2).await;
    // A second Hello, on any stream: InvalidArgument, and the connection stays authenticated.
    let mut other = Lane::open(&conn).await;
    let again = other.ask1(&hello_frame(PROTOCOL_VERSION)).await;
    assert_eq!(error_of(&again), (ERROR, 0, ErrorCode::InvalidArgument));
    other.carries_on(3).await;
    lane.carries_on(4).await;

    // Hello may come on any bidirectional stream; it authenticates the whole connection.
    let conn2 = raw_connection(broker.addr, dir.path()).await;
    let mut first = Lane::open(&conn2).await;
    first.write(&Frame::Ping(5).to_bytes()).await;
    assert_eq!(error_of(&read_frames(&mut first.recv, 1).await[0]), (ERROR, 0, unauth));
    let mut second = Lane::open(&conn2).await;
    assert!(matches!(second.ask1(&hello_frame(PROTOCOL_VERSION)).await, Frame::HelloOk(_)));
    first.carries_on(6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_vectors_get_the_documented_answers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]);
    let (conn, mut lane) = connect(&broker, dir.path()).await;
    // Refused frames that keep the framing: the documented error, then the stream carries on.
    let cases = [
        ("reject_unknown_flags_create_stream", (ERROR, 77, ErrorCode::UnknownFlags)),
        ("reject_unknown_flags_publish", (PUBLISH_ERROR, 4242, ErrorCode::UnknownFlags)),
        ("reject_unknown_type", (ERROR, 0, ErrorCode::UnknownFrameType)),
        ("reject_name_too_long", (ERROR, 3, ErrorCode::InvalidArgument)),
        ("reject_empty_shard_list", (ERROR, 9, ErrorCode::InvalidArgument)),
        ("reject_empty_publish", (PUBLISH_ERROR, 11, ErrorCode::InvalidArgument)),
    ];
    for (i, (name, expected)) in cases.into_iter().enumerate() {
        let answer = lane.ask1(&vector(name)).await;
        assert_eq!(error_of(&answer), expected, "{name}");
        lane.carries_on(i as u64).await;
    }
    // Neither the refused Publish of 0 records nor the refused Subscribe created a/b/c.
    assert_eq!(
        error_of(&describe(&mut lane, 20, "a/b/c").await),
        (ERROR, 20, ErrorCode::StreamNotFound)
    );

    // Framing lost: the error, then the broker ends the stream.
    let mut bad = Lane::open(&conn).await;
    let answer = bad.ask1(&vector("reject_bad_version")).await;
    assert_eq!(error_of(&answer), (ERROR, 0, ErrorCode::UnsupportedVersion));
    bad.ends().await;

    // A frame cut by FIN: Malformed with the request id once its first 8 body bytes came.
    let mut cut = Lane::open(&conn).await;
    cut.write(&vector("reject_cut_by_fin")).await;
    cut.send.finish().unwrap();
    let answers = read_frames(&mut cut.recv, 2).await;
    assert_eq!(answers.len(), 1, "the stream ends after the error: {answers:?}");
    assert_eq!(error_of(&answers[0]), (ERROR, 1, ErrorCode::Malformed));
    // ... and with request id 0 when only the header came.
    let mut header_only = Lane::open(&conn).await;
    header_only.write(&vector("reject_cut_by_fin")[..HEADER_LEN]).await;
    header_only.send.finish().unwrap();
    let answers = read_frames(&mut header_only.recv, 2).await;
    assert_eq!(
        answers.iter().map(error_of).collect::<Vec<_>>(),
        vec![(ERROR, 0, ErrorCode::Malformed)]
    );
    // A FIN between frames: the owed answers, then the end.
    let mut clean = Lane::open(&conn).await;
    clean.write(&Frame::Ping(9).to_bytes()).await;
    clean.send.finish().unwrap();
    assert_eq!(read_frames(&mut clean.recv, 2).await, vec![Frame::Pong(9)]);
    lane.carries_on(99).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_error_kinds_shard_lists_and_event_batch_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]);
    let (conn, mut lane) = connect(&broker, dir.path()).await;
    let stream = "acme/app/rules";
    create(&mut lane, 1, stream, 1).await;

    // ACKED with ack mode none: stored, not acked (the Ping's Pong is the next answer).
    let none = publish(Some(30), AckMode::None, stream, &["a"]);
    assert_eq!(
        lane.ask1(&[none.to_bytes(), Frame::Ping(1).to_bytes()].concat()).await,
        Frame::Pong(1)
    );
    let written = publish(Some(31), AckMode::Written, stream, &["b", "c", "d"]);
    let ack = PublishAck {
        request_id: RequestId(31),
        shard: ShardId(0),
        base_offset: Offset(1),
        count: 3,
    };
    assert_eq!(lane.ask1(&written.to_bytes()).await, Frame::PublishAck(ack));
    // ... but its failure is a PublishError with its id; an unacked failure is Error(0).
    let bad_none = publish(Some(32), AckMode::None, "no-such-name", &["x"]);
    assert_eq!(
        error_of(&lane.ask1(&bad_none.to_bytes()).await),
        (PUBLISH_ERROR, 32, ErrorCode::InvalidStreamName)
    );
    let bad_unacked = publish(None, AckMode::None, "no-such-name", &["x"]);
    assert_eq!(
        error_of(&lane.ask1(&bad_unacked.to_bytes()).await),
        (ERROR, 0, ErrorCode::InvalidStreamName)
    );

    // EventBatch offsets: record i at base_offset + i; a subscription from offset 2 starts
    // exactly there, cutting the stored batch [1, 4).
    let from_two = subscribe(33, stream, Some(vec![0, 0]), StartAt::Offset(Offset(2)));
    // The client advertised SUBSCRIBE_POSITIONS: the answer says where the shard starts.
    let ok = SubscribeOk {
        request_id: RequestId(33),
        subscription_id: SubscriptionId(1),
        shards: vec![ShardId(0)],
        positions: Some(vec![Offset(2)]),
    };
    assert_eq!(lane.ask1(&from_two.to_bytes()).await, Frame::SubscribeOk(ok));
    let batches = read_subscription(&conn, 2).await;
    assert_eq!(batches[0].base_offset, Offset(2));
    let values: Vec<Bytes> =
        batches.iter().flat_map(|b| b.records.iter().map(|r| r.value.to_bytes())).collect();
    assert_eq!(values, vec![Bytes::from_static(b"c"), Bytes::from_static(b"d")]);
    let earliest = subscribe(34, stream, None, StartAt::Earliest);
    assert!(matches!(lane.ask1(&earliest.to_bytes()).await, Frame::SubscribeOk(_)));
    let mut next = 0;
    for b in read_subscription(&conn, 4).await {
        assert_eq!(b.base_offset, Offset(next), "batches follow each other");
        for (i, r) in b.records.iter().enumerate() {
            let expected: &[u8] = [b"a", b"b", b"c", b"d"][(b.base_offset.0 + i as u64) as usize];
            assert_eq!(r, &Record::unkeyed(Bytes::from_static(expected)));
        }
        next += b.records.len() as u64;
    }
    assert_eq!(next, 4);

    // Shard lists: duplicates count once, SubscribeOk lists them ascending; a shard the stream
    // does not have is InvalidShard.
    create(&mut lane, 40, "acme/app/three", 3).await;
    let dup = subscribe(41, "acme/app/three", Some(vec![2, 0, 2]), StartAt::Latest);
    match lane.ask1(&dup.to_bytes()).await {
        Frame::SubscribeOk(ok) => assert_eq!(ok.shards, vec![ShardId(0), ShardId(2)]),
        other => panic!("expected SubscribeOk, got {other:?}"),
    }
    let missing = subscribe(42, "acme/app/three", Some(vec![0, 3]), StartAt::Latest);
    assert_eq!(
        error_of(&lane.ask1(&missing.to_bytes()).await),
        (ERROR, 42, ErrorCode::InvalidShard)
    );
    let out_of_range = subscribe(43, stream, None, StartAt::Offset(Offset(5)));
    assert_eq!(
        error_of(&lane.ask1(&out_of_range.to_bytes()).await),
        (ERROR, 43, ErrorCode::OffsetOutOfRange)
    );
    // An empty group name is InvalidArgument.
    let commit = Frame::CommitOffset(CommitOffset {
        request_id: RequestId(44),
        stream: stream.into(),
        group: String::new(),
        shard: ShardId(0),
        offset: Offset(1),
    });
    assert_eq!(
        error_of(&lane.ask1(&commit.to_bytes()).await),
        (ERROR, 44, ErrorCode::InvalidArgument)
    );
}

/// A keyed, acked Publish of `records` to the key's shard.
fn publish_keyed(id: u64, stream: &str, key: &str, records: &[&str]) -> Frame {
    let Frame::Publish(mut p) = publish(Some(id), AckMode::Written, stream, records) else {
        unreachable!("publish builds a Publish")
    };
    p.key = Some(Bytes::copy_from_slice(key.as_bytes()));
    Frame::Publish(p)
}

/// A Subscribe with positions (flag `POSITIONS`): each listed shard from its own offset.
fn subscribe_at(id: u64, stream: &str, at: &[(u32, u64)], group: Option<&str>) -> Frame {
    Frame::Subscribe(Subscribe {
        request_id: RequestId(id),
        stream: stream.into(),
        shards: Some(at.iter().map(|(s, _)| ShardId(*s)).collect()),
        start: StartAt::Latest,
        group: group.map(str::to_owned),
        positions: Some(at.iter().map(|(_, o)| Offset(*o)).collect()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_start_each_shard_at_its_own_offset_whatever_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]);
    let (conn, mut lane) = connect(&broker, dir.path()).await;
    let stream = "acme/app/positions";
    create(&mut lane, 1, stream, 2).await;
    // Three records on each shard, offsets 0..3.
    let key = |shard: u32| {
        (0..64)
            .map(|i| format!("k{i}"))
            .find(|k| felix_proto::shard_for_key(k.as_bytes(), 2) == ShardId(shard))
            .unwrap()
    };
    for shard in [0, 1] {
        let records = ["x0", "x1", "x2"];
        let p = publish_keyed(2 + u64::from(shard), stream, &key(shard), &records);
        assert!(matches!(lane.ask1(&p.to_bytes()).await, Frame::PublishAck(_)));
    }
    // The group has read all of shard 0: its commit is not consulted where positions are.
    let commit = Frame::CommitOffset(CommitOffset {
        request_id: RequestId(4),
        stream: stream.into(),
        group: "g".into(),
        shard: ShardId(0),
        offset: Offset(3),
    });
    assert_eq!(lane.ask1(&commit.to_bytes()).await, Frame::CommitOk(RequestId(4)));
    // Shard 1 from offset 2, shard 0 from offset 1 (listed in any order); SubscribeOk lists
    // the shards ascending, each with where it starts.
    let at = subscribe_at(5, stream, &[(1, 2), (0, 1)], Some("g"));
    let ok = SubscribeOk {
        request_id: RequestId(5),
        subscription_id: SubscriptionId(1),
        shards: vec![ShardId(0), ShardId(1)],
        positions: Some(vec![Offset(1), Offset(2)]),
    };
    assert_eq!(lane.ask1(&at.to_bytes()).await, Frame::SubscribeOk(ok));
    let mut got: Vec<(u32, u64)> = Vec::new();
    for b in read_subscription(&conn, 3).await {
        got.extend((0..b.records.len() as u64).map(|i| (b.shard.0, b.base_offset.0 + i)));
    }
    got.sort_unstable();
    assert_eq!(got, [(0, 1), (0, 2), (1, 2)]);
    // A shard named twice is ambiguous; a position past the shard's end is out of range;
    // positions without a shard list do not decode (the rejection vector).
    let twice = subscribe_at(6, stream, &[(0, 0), (0, 1)], None);
    assert_eq!(
        error_of(&lane.ask1(&twice.to_bytes()).await),
        (ERROR, 6, ErrorCode::InvalidArgument)
    );
    let past = subscribe_at(7, stream, &[(0, 4)], None);
    assert_eq!(
        error_of(&lane.ask1(&past.to_bytes()).await),
        (ERROR, 7, ErrorCode::OffsetOutOfRange)
    );
    // The end itself is a position: what comes next.
    assert!(matches!(
        lane.ask1(&subscribe_at(8, stream, &[(0, 3)], None).to_bytes()).await,
        Frame::SubscribeOk(_)
    ));

    // A client that did not advertise SUBSCRIBE_POSITIONS is not told where its shards start.
    let conn = raw_connection(broker.addr, dir.path()).await;
    let mut lane = Lane::open(&conn).await;
    let caps = Capabilities(Capabilities::ALL.0 & !Capabilities::SUBSCRIBE_POSITIONS.0);
    let hello = Frame::Hello(Hello { version: PROTOCOL_VERSION, capabilities: caps, token: None });
    assert!(matches!(lane.ask1(&hello.to_bytes()).await, Frame::HelloOk(_)));
    match lane.ask1(&subscribe(9, stream, None, StartAt::Latest).to_bytes()).await {
        Frame::SubscribeOk(ok) => assert_eq!(ok.positions, None),
        other => panic!("expected SubscribeOk, got {other:?}"),
    }
}

/// A Subscribe never creates a stream, with auto-create on or off; a Publish does only with it
/// on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_publish_auto_creates_and_only_when_auto_create_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]);
    let (_conn, mut lane) = connect(&broker, dir.path()).await;
    let sub = subscribe(1, "acme/app/fresh", None, StartAt::Latest);
    assert_eq!(error_of(&lane.ask1(&sub.to_bytes()).await), (ERROR, 1, ErrorCode::StreamNotFound));
    assert_eq!(
        error_of(&describe(&mut lane, 2, "acme/app/fresh").await),
        (ERROR, 2, ErrorCode::StreamNotFound)
    );
    let acked = publish(Some(3), AckMode::Written, "acme/app/fresh", &["x"]);
    assert!(matches!(lane.ask1(&acked.to_bytes()).await, Frame::PublishAck(_)));
    // Default shard count: one per core (2 here).
    assert!(matches!(
        describe(&mut lane, 4, "acme/app/fresh").await,
        Frame::StreamInfo(StreamInfo { shards: 2, .. })
    ));
    drop(broker);

    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &["--auto-create", "false"]);
    let (_conn, mut lane) = connect(&broker, dir.path()).await;
    let sub = subscribe(3, "acme/app/fresh", None, StartAt::Latest);
    assert_eq!(error_of(&lane.ask1(&sub.to_bytes()).await), (ERROR, 3, ErrorCode::StreamNotFound));
    let acked = publish(Some(4), AckMode::Written, "acme/app/fresh", &["x"]);
    assert_eq!(
        error_of(&lane.ask1(&acked.to_bytes()).await),
        (PUBLISH_ERROR, 4, ErrorCode::StreamNotFound)
    );
    assert_eq!(
        error_of(&describe(&mut lane, 5, "acme/app/fresh").await),
        (ERROR, 5, ErrorCode::StreamNotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_of_the_broker_direction_are_refused_with_their_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]);
    let (_conn, mut lane) = connect(&broker, dir.path()).await;
    let body = |id: u64| ErrorBody {
        request_id: RequestId(id),
        code: ErrorCode::Internal,
        message: "x".into(),
    };
    let sent = [
        (
            Frame::StreamInfo(StreamInfo {
                request_id: RequestId(12),
                stream: "a/b/c".into(),
                shards: 1,
                retention: Retention::default(),
            }),
            12,
        ),
        (Frame::StreamList(StreamList { request_id: RequestId(13), streams: vec![] }), 13),
        (
            Frame::PublishAck(PublishAck {
                request_id: RequestId(14),
                shard: ShardId(0),
                base_offset: Offset(0),
                count: 1,
            }),
            14,
        ),
        (Frame::PublishError(body(15)), 15),
        (
            Frame::SubscribeOk(SubscribeOk {
                request_id: RequestId(16),
                subscription_id: SubscriptionId(1),
                shards: vec![],
                positions: None,
            }),
            16,
        ),
        (Frame::CommitOk(RequestId(17)), 17),
        (Frame::Error(body(18)), 18),
        (
            Frame::HelloOk(HelloOk {
                version: 1,
                capabilities: Capabilities::ALL,
                limits: Limits::default(),
                core: felix_proto::CoreId(0),
                core_count: 1,
            }),
            0,
        ),
        (Frame::SubscriptionStart(SubscriptionId(1)), 0),
        (
            Frame::EventBatch(EventBatch {
                shard: ShardId(0),
                base_offset: Offset(0),
                timestamp_ms: 0,
                records: vec![Record::unkeyed(Bytes::from_static(b"v"))],
            }),
            0,
        ),
        // Between brokers only (capability REPLICATION, which no client is offered).
        (
            Frame::Replicate(felix_proto::Replicate {
                stream: "a/b/c".into(),
                shard: ShardId(0),
                from: 1,
                epoch: 1,
                body: felix_proto::ReplicaBody::EpochQuery { last_epoch: 0 },
            }),
            0,
        ),
    ];
    let mut wire = Vec::new();
    for (frame, _) in &sent {
        wire.extend_from_slice(&frame.to_bytes());
    }
    // A Pong gets no answer: the Ping's Pong follows the last refusal directly.
    wire.extend_from_slice(&Frame::Pong(7).to_bytes());
    wire.extend_from_slice(&Frame::Ping(8).to_bytes());
    let answers = lane.ask(&wire, sent.len() + 1).await;
    assert_eq!(answers.len(), sent.len() + 1, "{answers:?}");
    for ((frame, id), answer) in sent.iter().zip(&answers) {
        assert_eq!(error_of(answer), (ERROR, *id, ErrorCode::InvalidArgument), "{frame:?}");
    }
    assert_eq!(answers[sent.len()], Frame::Pong(8));
}
