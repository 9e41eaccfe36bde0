//! Bad input gets a correlated, typed error and other connections carry on.

mod e2e_support;

use bytes::{BufMut, Bytes, BytesMut};
use e2e_support::{raw_connection, read_frames, TestBroker};
use felix_proto::{
    AckMode, AckRequest, Capabilities, ErrorCode, Frame, Hello, Publish, RequestId, HEADER_LEN,
    PROTOCOL_VERSION,
};

fn hello() -> Bytes {
    Frame::Hello(Hello { version: PROTOCOL_VERSION, capabilities: Capabilities::ALL, token: None })
        .to_bytes()
}

fn acked_publish(id: u64, records: Vec<Bytes>) -> Frame {
    Frame::Publish(Publish {
        oldest_pending: false,
        ack: Some(AckRequest { request_id: RequestId(id), mode: AckMode::Written }),
        key: None,
        producer: None,
        stream: "acme/app/bad".into(),
        records: records.into_iter().map(Into::into).collect(),
    })
}

fn error_of(frame: &Frame) -> (RequestId, ErrorCode) {
    match frame {
        Frame::Error(e) | Frame::PublishError(e) => (e.request_id, e.code),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_correlated_typed_errors_and_others_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let good = broker.client().await;
    let publisher = good.publisher("acme/app/bad").await.unwrap();
    publisher.publish(felix_client::Record::unkeyed("before")).await.unwrap();

    let conn = raw_connection(broker.addr, dir.path()).await;
    // Control stream: Hello first.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&hello()).await.unwrap();
    let frames = read_frames(&mut recv, 1).await;
    assert!(matches!(frames[0], Frame::HelloOk(_)), "{frames:?}");

    // Unknown flag bit on a Ping: rejected (not masked), and the stream carries on.
    let mut ping = BytesMut::from(&Frame::Ping(9).to_bytes()[..]);
    ping[4] |= 0x80;
    send.write_all(&ping).await.unwrap();
    send.write_all(&Frame::Ping(10).to_bytes()).await.unwrap();
    let frames = read_frames(&mut recv, 2).await;
    assert_eq!(error_of(&frames[0]).1, ErrorCode::UnknownFlags);
    assert_eq!(frames[1], Frame::Pong(10));

    // An over-limit batch: more records than the broker's limit; correlated by request id.
    let mut over =
        BytesMut::from(&acked_publish(77, vec![Bytes::from_static(b"x")]).to_bytes()[..]);
    let count_at = HEADER_LEN + 9 + 2 + "acme/app/bad".len();
    over[count_at..count_at + 4].copy_from_slice(&100_000u32.to_be_bytes());
    send.write_all(&over).await.unwrap();
    let frames = read_frames(&mut recv, 1).await;
    assert_eq!(error_of(&frames[0]), (RequestId(77), ErrorCode::TooManyRecords));

    // A malformed body (bad ack mode) is still answered with its request id.
    let mut bad_mode =
        BytesMut::from(&acked_publish(78, vec![Bytes::from_static(b"y")]).to_bytes()[..]);
    bad_mode[HEADER_LEN + 8] = 9;
    send.write_all(&bad_mode).await.unwrap();
    let frames = read_frames(&mut recv, 1).await;
    assert_eq!(error_of(&frames[0]), (RequestId(78), ErrorCode::InvalidArgument));

    // A good publish on the same stream still works.
    send.write_all(&acked_publish(79, vec![Bytes::from_static(b"ok")]).to_bytes()).await.unwrap();
    let frames = read_frames(&mut recv, 1).await;
    assert!(
        matches!(&frames[0], Frame::PublishAck(a) if a.request_id == RequestId(79)),
        "{frames:?}"
    );

    // A frame cut short: the stream ends inside it.
    let (mut send2, mut recv2) = conn.open_bi().await.unwrap();
    let full = acked_publish(80, vec![Bytes::from_static(b"zzzz")]).to_bytes();
    send2.write_all(&full[..full.len() - 2]).await.unwrap();
    send2.finish().unwrap();
    let frames = read_frames(&mut recv2, 1).await;
    assert_eq!(error_of(&frames[0]), (RequestId(80), ErrorCode::Malformed));

    // Garbage bytes: framing lost, a Malformed error, the stream is closed.
    let (mut send3, mut recv3) = conn.open_bi().await.unwrap();
    send3.write_all(b"GET / HTTP/1.1\r\nHost: felix\r\n\r\n").await.unwrap();
    let frames = read_frames(&mut recv3, 2).await;
    assert_eq!(frames.len(), 1, "the stream must end after a framing error: {frames:?}");
    assert_eq!(error_of(&frames[0]).1, ErrorCode::Malformed);

    // The raw connection itself and the well-behaved client carry on.
    let (mut send4, mut recv4) = conn.open_bi().await.unwrap();
    send4.write_all(&Frame::Ping(11).to_bytes()).await.unwrap();
    assert_eq!(read_frames(&mut recv4, 1).await, vec![Frame::Pong(11)]);
    publisher.publish(felix_client::Record::unkeyed("after")).await.unwrap();
    assert!(broker.counter("rejected_frames") >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_before_hello_and_unsupported_versions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let conn = raw_connection(broker.addr, dir.path()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&acked_publish(5, vec![Bytes::from_static(b"x")]).to_bytes()).await.unwrap();
    let frames = read_frames(&mut recv, 1).await;
    assert_eq!(error_of(&frames[0]), (RequestId(5), ErrorCode::Unauthenticated));
    let mut v9 = BytesMut::new();
    Frame::Hello(Hello { version: 9, capabilities: Capabilities::ALL, token: None })
        .encode(&mut v9);
    v9.put_slice(&[]);
    send.write_all(&v9).await.unwrap();
    let frames = read_frames(&mut recv, 1).await;
    assert_eq!(error_of(&frames[0]).1, ErrorCode::UnsupportedVersion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn reserved_names_and_impossible_shard_counts_are_refused_and_restart_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    // The broker's own tenant is not reachable by clients.
    let err =
        client.create_stream("felix-internal/offsets/v1", 1, Default::default()).await.unwrap_err();
    assert!(err.to_string().contains("InvalidStreamName"), "{err}");
    let err = match client.publisher("felix-internal/offsets/v1").await {
        Err(e) => e.to_string(),
        Ok(p) => p.publish(felix_client::Record::unkeyed("x")).await.unwrap_err().to_string(),
    };
    assert!(err.contains("InvalidStreamName"), "{err}");
    // More shards than one log per core can hold: refused before anything is written.
    let err =
        client.create_stream("acme/app/huge", 2 * 254 + 1, Default::default()).await.unwrap_err();
    assert!(err.to_string().contains("InvalidArgument"), "{err}");
    client.create_stream("acme/app/ok", 2 * 254, Default::default()).await.unwrap();
    client.close();
    broker.stop();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let names = client.list_streams("").await.unwrap();
    assert_eq!(names, vec!["acme/app/ok".to_owned()]);
}
