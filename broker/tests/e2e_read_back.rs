//! Durability read-back at volume: every acked record of a shard whose log spans many
//! segments is delivered once, in offset order, to a subscriber from the earliest offset,
//! before and after a restart, across the sparse index, the dense index and the live tail.

mod e2e_support;

use bytes::Bytes;
use e2e_support::{raw_connection, read_frames, TestBroker, WAIT};
use felix_client::{StartAt, SubscribeOptions};
use felix_proto::{
    AckMode, AckRequest, Capabilities, Frame, Hello, Publish, RequestId, PROTOCOL_VERSION,
};

const STREAM: &str = "acme/app/readback";
/// Smallest segments the storage allows (one header block and one full write).
const SEGMENT_BYTES: &str = "4198400";
/// Batches published: far more than the dense index holds, over several segments.
const BATCHES: u64 = 9_000;

/// The value of record `offset`: its offset, padded to a size that varies per batch so that
/// a read's byte budget stops at every kind of boundary.
fn value(offset: u64, batch: u64) -> Bytes {
    let mut v = format!("r{offset}").into_bytes();
    v.resize(200 + (batch * 337 % 1400) as usize, b'.');
    Bytes::from(v)
}

/// Publishes `BATCHES` unacked batches of 1-4 records on one stream, then one durable acked
/// batch; returns the number of records. Frames on one stream are stored in order, so the
/// final ack covers everything before it.
async fn publish_all(broker: &TestBroker) -> u64 {
    let conn = raw_connection(broker.addr, &broker.dir).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Hello { version: PROTOCOL_VERSION, capabilities: Capabilities::ALL, token: None };
    send.write_all(&Frame::Hello(hello).to_bytes()).await.unwrap();
    assert!(matches!(read_frames(&mut recv, 1).await[0], Frame::HelloOk(_)));
    let mut next = 0u64;
    for batch in 0..=BATCHES {
        let n = 1 + batch % 4;
        let records = (next..next + n).map(|o| value(o, batch).into()).collect();
        next += n;
        let ack = (batch == BATCHES)
            .then_some(AckRequest { request_id: RequestId(1), mode: AckMode::Durable });
        let publish = Publish {
            oldest_pending: false,
            ack,
            key: None,
            producer: None,
            stream: STREAM.into(),
            records,
        };
        send.write_all(&Frame::Publish(publish).to_bytes()).await.unwrap();
    }
    match &read_frames(&mut recv, 1).await[..] {
        [Frame::PublishAck(a)] => assert_eq!(a.base_offset.0 + u64::from(a.count), next),
        other => panic!("expected the final ack, got {other:?}"),
    }
    conn.close(0u32.into(), b"done");
    next
}

/// Reads every record from the earliest offset and checks each one.
async fn read_all(broker: &TestBroker, records: u64) {
    let client = broker.client().await;
    let opts = SubscribeOptions::new(STREAM).start(StartAt::Earliest);
    let mut sub = client.subscribe(opts).await.unwrap();
    let mut at = 0u64;
    while at < records {
        let r = match tokio::time::timeout(WAIT, sub.next()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("after {at} of {records} records: {other:?}"),
        };
        assert_eq!(r.offset.0, at, "offsets jump");
        let tag = format!("r{at}");
        assert_eq!(&r.value[..tag.len()], tag.as_bytes(), "record {at} has another's value");
        at += 1;
    }
    client.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_from_earliest_reads_every_record_across_many_segments_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--segment-bytes", SEGMENT_BYTES];
    let mut broker = TestBroker::start(dir.path(), 1, &flags);
    broker.client().await.create_stream(STREAM, 1, Default::default()).await.unwrap();
    let records = publish_all(&broker).await;
    let segments = std::fs::read_dir(dir.path().join("core-0"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .filter(|f| f.as_ref().unwrap().path().extension().is_some_and(|e| e == "log"))
        .count();
    assert!(segments >= 3, "only {segments} segments");
    read_all(&broker, records).await;
    broker.stop();
    let broker = TestBroker::start(dir.path(), 1, &flags);
    read_all(&broker, records).await;
}
