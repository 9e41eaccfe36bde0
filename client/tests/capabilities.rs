//! Capability negotiation: a flag bit or capability is used only after the broker advertised
//! it; where it was not, the client fails the operation with a typed error and sends nothing.

mod support;

use felix_client::{
    AckMode, Capabilities, Client, ClientError, Offset, PublishSettings, Record, ShardId, StartAt,
    SubscribeOptions,
};
use support::{BrokerOptions, TestBroker};

const STREAM: &str = "acme/app/orders";

async fn broker_with(caps: Capabilities) -> (TestBroker, Client) {
    let broker =
        TestBroker::start(BrokerOptions { capabilities: caps, ..Default::default() }).await;
    broker.create_stream(STREAM, 4);
    let client = Client::connect(broker.client_config()).await.unwrap();
    assert_eq!(client.capabilities(), caps);
    (broker, client)
}

/// Exercises every operation that can carry a flag or needs a capability.
async fn exercise_everything(client: &Client) -> Vec<Result<(), ClientError>> {
    let mut results = Vec::new();
    for mode in [AckMode::None, AckMode::Written, AckMode::Durable] {
        let settings = PublishSettings { ack_mode: mode, ..Default::default() };
        let r = async {
            let p = client.publisher_with(STREAM, settings).await?;
            p.publish(Record::unkeyed("u")).await?;
            p.publish(Record::keyed("k", "v")).await?;
            p.publish(Record::keyed("", "empty key")).await?;
            p.flush().await
        }
        .await;
        results.push(r);
    }
    let r = async {
        let mut s = client
            .subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest).group("g"))
            .await?;
        s.commit(ShardId(0), Offset(0)).await?;
        s.commit_consumed().await
    }
    .await;
    results.push(r);
    results
}

#[tokio::test]
async fn a_broker_that_advertises_nothing_never_receives_a_flag() {
    let (broker, client) = broker_with(Capabilities::NONE).await;
    let results = exercise_everything(&client).await;
    // Unacked, unkeyed publishes work; the keyed record fails cleanly.
    assert_eq!(results[0], Err(ClientError::Unsupported("keyed publish")));
    assert_eq!(results[1], Err(ClientError::Unsupported("acked publish")));
    assert_eq!(results[2], Err(ClientError::Unsupported("acked publish")));
    assert_eq!(results[3], Err(ClientError::Unsupported("consumer groups")));
    // The unacked, unkeyed record is stored (no ack: wait for the broker to have it).
    support::wait_until(&broker.state, "unkeyed publish stored", |o| {
        o.streams[STREAM].shards.iter().map(Vec::len).sum::<usize>() == 1
    })
    .await;
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn without_keyed_acked_unkeyed_publishes_still_work() {
    let caps = Capabilities(Capabilities::PUBLISH_ACKED.0 | Capabilities::CONSUMER_GROUPS.0);
    let (broker, client) = broker_with(caps).await;
    let p = client.publisher(STREAM).await.unwrap();
    let receipt = p.publish(Record::unkeyed("u")).await.unwrap();
    assert!(receipt.is_some());
    assert_eq!(
        p.send(Record::keyed("k", "v")).await.unwrap_err(),
        ClientError::Unsupported("keyed publish")
    );
    let results = exercise_everything(&client).await;
    assert!(results
        .iter()
        .all(|r| r.as_ref().err() != Some(&ClientError::Unsupported("acked publish"))));
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn without_acked_keyed_unacked_publishes_still_work() {
    let caps = Capabilities(Capabilities::PUBLISH_KEYED.0 | Capabilities::CONSUMER_GROUPS.0);
    let (broker, client) = broker_with(caps).await;
    let results = exercise_everything(&client).await;
    assert_eq!(results[0], Ok(()));
    assert_eq!(results[1], Err(ClientError::Unsupported("acked publish")));
    assert_eq!(results[2], Err(ClientError::Unsupported("acked publish")));
    assert_eq!(results[3], Ok(()));
    assert!(broker.state.lock().publishes >= 3);
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn without_groups_only_groups_fail() {
    let caps = Capabilities(Capabilities::PUBLISH_KEYED.0 | Capabilities::PUBLISH_ACKED.0);
    let (broker, client) = broker_with(caps).await;
    let results = exercise_everything(&client).await;
    assert_eq!(&results[..3], &[Ok(()), Ok(()), Ok(())]);
    assert_eq!(results[3], Err(ClientError::Unsupported("consumer groups")));
    // A plain subscription works.
    let mut s =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), s.next()).await.unwrap();
    assert!(first.unwrap().is_some());
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn with_everything_advertised_every_bit_is_used() {
    let (broker, client) = broker_with(Capabilities::ALL).await;
    let results = exercise_everything(&client).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // The check above can fail: the broker did see every Publish bit (ACKED, KEYED,
    // PRODUCER: acked batches are idempotent by default, and OLDEST_PENDING: a batch with no
    // earlier one of its producer unresolved), and the harness records them.
    assert_eq!(broker.state.lock().flags_seen, 0x0027);
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn the_harness_notices_an_unadvertised_bit() {
    // Guards the tests above: a keyed, acked Publish written raw to a broker that advertises
    // neither bit is recorded as a violation.
    let broker =
        TestBroker::start(BrokerOptions { capabilities: Capabilities::NONE, ..Default::default() })
            .await;
    broker.create_stream(STREAM, 1);
    let (_endpoint, mut send, _recv) = broker.raw_session().await;
    let publish = felix_proto::Frame::Publish(felix_proto::Publish {
        oldest_pending: false,
        ack: Some(felix_proto::AckRequest {
            request_id: felix_proto::RequestId(1),
            mode: AckMode::Durable,
        }),
        key: Some(bytes::Bytes::from_static(b"k")),
        producer: None,
        stream: STREAM.into(),
        records: vec![bytes::Bytes::from_static(b"v").into()],
    });
    send.write_all(&publish.to_bytes()).await.unwrap();
    support::wait_until(&broker.state, "violation recorded", |o| !o.violations.is_empty()).await;
    assert_eq!(broker.state.lock().flags_seen, 0x0003);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        broker.assert_no_unadvertised_bits()
    }));
    assert!(caught.is_err(), "assert_no_unadvertised_bits must fail here");
}
