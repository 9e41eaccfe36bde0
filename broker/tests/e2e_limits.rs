//! Per-connection limits hold under concurrency.

mod e2e_support;

use bytes::Bytes;
use e2e_support::{raw_connection, read_frames, TestBroker};
use felix_proto::{
    Capabilities, ErrorCode, Frame, Hello, RequestId, StartAt, Subscribe, PROTOCOL_VERSION,
};

fn hello() -> Frame {
    Frame::Hello(Hello { version: PROTOCOL_VERSION, capabilities: Capabilities::ALL, token: None })
}

/// Regression (hardening #5): 100 Subscribes sent at once on one connection, each on its own
/// bidirectional stream, used to all start because a subscription was counted only once its
/// writer ran. Exactly the limit may be accepted; the rest get LimitReached with their ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_subscribes_cannot_exceed_the_per_connection_limit() {
    const SUBSCRIBES: u64 = 100;
    let limit = felix_broker::app::subscribe::SUBSCRIPTIONS_PER_CONN_MAX;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    client.create_stream("acme/app/limits", 4, Default::default()).await.unwrap();

    let conn = raw_connection(broker.addr, dir.path()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&hello().to_bytes()).await.unwrap();
    assert!(matches!(read_frames(&mut recv, 1).await[0], Frame::HelloOk(_)));

    // Open every stream and write every request before reading any answer.
    let mut streams = Vec::new();
    for id in 1..=SUBSCRIBES {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let sub = Frame::Subscribe(Subscribe {
            request_id: RequestId(id),
            stream: "acme/app/limits".into(),
            shards: None,
            start: StartAt::Earliest,
            group: None,
            positions: None,
        });
        let bytes: Bytes = sub.to_bytes();
        send.write_all(&bytes).await.unwrap();
        streams.push((id, send, recv));
    }
    let (mut accepted, mut refused) = (0usize, 0usize);
    for (id, _send, mut recv) in streams {
        match &read_frames(&mut recv, 1).await[..] {
            [Frame::SubscribeOk(ok)] => {
                assert_eq!(ok.request_id, RequestId(id));
                accepted += 1;
            }
            [Frame::Error(e)] => {
                assert_eq!((e.request_id, e.code), (RequestId(id), ErrorCode::LimitReached));
                refused += 1;
            }
            other => panic!("request {id}: unexpected answer {other:?}"),
        }
    }
    assert_eq!(accepted, limit, "{accepted} subscriptions accepted, limit {limit}");
    assert_eq!(refused, SUBSCRIBES as usize - limit);
}

/// A valid stream name of `len` bytes (three segments of `[a-z0-9]`).
fn name_of(len: usize) -> String {
    let seg = len - 2;
    let a = seg.div_ceil(3);
    let b = (seg - a).div_ceil(2);
    let c = seg - a - b;
    let part = |n: usize, ch: char| std::iter::repeat_n(ch, n).collect::<String>();
    format!("{}/{}/{}", part(a, 't'), part(b, 'n'), part(c, 's'))
}

/// Regression (hardening #4): names of 122 bytes or more got `Internal` (their definition's
/// file name passed the file system's limit). Every name up to the protocol's one limit works
/// end to end: create, describe, auto-create by publish, subscribe, and the data survives a
/// restart; one byte more is InvalidArgument at the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_name_within_the_protocol_limit_works_end_to_end() {
    use felix_client::{Record, StartAt, SubscribeOptions};
    let max = felix_proto::limits::MAX_STREAM_NAME_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let lens = [121, 122, 125, 160, max - 1, max];
    for len in lens {
        let name = name_of(len);
        assert_eq!(name.len(), len);
        client.create_stream(&name, 2, Default::default()).await.unwrap_or_else(|e| {
            panic!("create of a {len}-byte name: {e}");
        });
        assert_eq!(client.describe_stream(&name).await.unwrap().shards, 2);
        let p = client.publisher(&name).await.unwrap();
        p.publish(Record::unkeyed(format!("v{len}"))).await.unwrap();
        // Auto-create through a publish to a new long name.
        let auto = format!("a{}", &name[1..]);
        let p = client.publisher(&auto).await.unwrap();
        p.publish(Record::unkeyed("auto")).await.unwrap_or_else(|e| {
            panic!("publish to a new {len}-byte name: {e}");
        });
    }
    drop(client);
    broker.stop();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    for len in lens {
        let name = name_of(len);
        let mut sub =
            client.subscribe(SubscribeOptions::new(&name).start(StartAt::Earliest)).await.unwrap();
        let r = tokio::time::timeout(e2e_support::WAIT, sub.next()).await.unwrap().unwrap();
        let r = r.expect("a record");
        assert_eq!(&r.value[..], format!("v{len}").as_bytes());
    }
    let listed = client.list_streams("").await.unwrap();
    assert_eq!(listed.len(), lens.len() * 2, "{listed:?}");

    // The client refuses it locally; the broker refuses it at the edge too.
    let too_long = name_of(max + 1);
    assert!(client.create_stream(&too_long, 1, Default::default()).await.is_err());
    let conn = raw_connection(broker.addr, dir.path()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&hello().to_bytes()).await.unwrap();
    let create = Frame::CreateStream(felix_proto::CreateStream {
        request_id: RequestId(31),
        stream: too_long,
        shards: 1,
        retention: Default::default(),
        replicas: None,
    });
    send.write_all(&create.to_bytes()).await.unwrap();
    let frames = read_frames(&mut recv, 2).await;
    assert!(matches!(frames[0], Frame::HelloOk(_)), "{frames:?}");
    match &frames[1] {
        Frame::Error(e) => {
            assert_eq!((e.request_id, e.code), (RequestId(31), ErrorCode::InvalidArgument))
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
