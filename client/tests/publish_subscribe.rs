//! Publish and subscribe paths against the scripted test broker on loopback.

mod support;

use std::time::Duration;

use bytes::Bytes;
use felix_client::publisher::PRODUCER_IN_FLIGHT_MAX;
use felix_client::{
    AckMode, Client, ClientError, Offset, PublishSettings, Publisher, Record, Retention, ShardId,
    StartAt, SubscribeOptions,
};
use felix_proto::{shard_for_key, ErrorCode};
use support::{BrokerOptions, TestBroker};

const STREAM: &str = "acme/app/orders";
/// Bound on every wait in these tests (not a timing assertion: a hang fails instead of blocking).
const WAIT: Duration = Duration::from_secs(20);

async fn next_n(sub: &mut felix_client::Subscriber, n: usize) -> Vec<felix_client::ReceivedRecord> {
    let mut out = Vec::new();
    while out.len() < n {
        let r = tokio::time::timeout(WAIT, sub.next()).await.expect("subscription stalled");
        out.push(r.unwrap().expect("subscription ended"));
    }
    out
}

#[tokio::test]
async fn admin_requests_create_describe_list() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let client = Client::connect(broker.client_config()).await.unwrap();
    let retention = Retention { bytes_max: Some(1 << 20), age_max_ms: None };
    let created = client.create_stream(STREAM, 4, retention).await.unwrap();
    assert_eq!((created.name.as_str(), created.shards, created.retention), (STREAM, 4, retention));
    client.create_stream("acme/app/users", 1, Retention::default()).await.unwrap();
    client.create_stream("other/app/x", 1, Retention::default()).await.unwrap();
    assert_eq!(client.describe_stream(STREAM).await.unwrap().shards, 4);
    let err = client.describe_stream("acme/app/none").await.unwrap_err();
    assert!(matches!(err, ClientError::Broker { code: ErrorCode::StreamNotFound, .. }), "{err}");
    let err = client.create_stream(STREAM, 5, Retention::default()).await.unwrap_err();
    assert!(matches!(err, ClientError::Broker { code: ErrorCode::StreamExists, .. }), "{err}");
    assert_eq!(
        client.list_streams("acme/").await.unwrap(),
        vec!["acme/app/orders", "acme/app/users"]
    );
    assert_eq!(client.list_streams("").await.unwrap().len(), 3);
    assert!(matches!(client.describe_stream("bad name").await, Err(ClientError::InvalidName(_))));
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn acked_publishes_return_offsets_in_every_ack_mode() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(broker.client_config()).await.unwrap();
    for mode in [AckMode::Durable, AckMode::Written] {
        let settings = PublishSettings { ack_mode: mode, ..PublishSettings::default() };
        let publisher = client.publisher_with(STREAM, settings).await.unwrap();
        let mut tickets = Vec::new();
        for i in 0..10 {
            tickets.push(publisher.send(Record::unkeyed(format!("m{i}"))).await.unwrap());
        }
        let mut receipts = Vec::new();
        for t in tickets {
            receipts.push(t.await.unwrap().expect("acked publish has a receipt"));
        }
        // Offsets are dense per shard and every record has its own.
        let mut per_shard: std::collections::BTreeMap<ShardId, Vec<u64>> = Default::default();
        for r in &receipts {
            per_shard.entry(r.shard).or_default().push(r.offset.0);
        }
        for offsets in per_shard.values() {
            let mut sorted = offsets.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), offsets.len(), "duplicate offsets {offsets:?}");
        }
        publisher.close().await.unwrap();
    }
    let settings = PublishSettings { ack_mode: AckMode::None, ..PublishSettings::default() };
    let publisher = client.publisher_with(STREAM, settings).await.unwrap();
    assert_eq!(publisher.publish(Record::unkeyed("fire")).await.unwrap(), None);
    publisher.flush().await.unwrap();
    support::wait_until(&broker.state, "21 records stored", |o| {
        o.streams[STREAM].shards.iter().map(Vec::len).sum::<usize>() == 21
    })
    .await;
    let o = broker.state.lock();
    assert!(o.ack_modes.contains(&AckMode::Durable) && o.ack_modes.contains(&AckMode::Written));
    assert!(!o.ack_modes.contains(&AckMode::None), "mode none must not send the ACKED flag");
    drop(o);
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn keyed_records_go_to_their_shard_in_order() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 8);
    let client = Client::connect(broker.client_config()).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..40 {
        let key = format!("user-{}", i % 4);
        tickets
            .push((key.clone(), publisher.send(Record::keyed(key, format!("{i}"))).await.unwrap()));
    }
    let mut last: std::collections::HashMap<String, u64> = Default::default();
    for (key, t) in tickets {
        let r = t.await.unwrap().unwrap();
        assert_eq!(r.shard, shard_for_key(key.as_bytes(), 8), "key {key}");
        if let Some(prev) = last.insert(key.clone(), r.offset.0) {
            assert!(r.offset.0 > prev, "key {key} reordered");
        }
    }
    assert_eq!(publisher.shard_for_key(b"user-1"), Some(shard_for_key(b"user-1", 8)));
    // The empty key is a key.
    let r = publisher.publish(Record::keyed(Bytes::new(), "e")).await.unwrap().unwrap();
    assert_eq!(r.shard, shard_for_key(b"", 8));
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn batching_respects_linger_and_size_limits() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 1);
    let mut config = broker.client_config();
    config.connections = Some(1);
    config.publish.linger_us = 200_000;
    config.publish.batch_records_max = 10;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..95 {
        tickets.push(publisher.send(Record::unkeyed(format!("{i}"))).await.unwrap());
    }
    for t in tickets {
        t.await.unwrap();
    }
    let sizes = broker.state.lock().batch_sizes.clone();
    assert_eq!(sizes.iter().sum::<usize>(), 95);
    assert!(sizes.iter().all(|n| *n <= 10), "{sizes:?}");
    // With a long linger, records wait for full batches: at most the 9 full ones plus a tail
    // (+1 slack for a batch split by a linger expiry).
    assert!(sizes.len() <= 11, "{sizes:?}");
    // Byte limit: 3 records of 40 bytes do not fit in 100 bytes.
    let settings =
        PublishSettings { batch_bytes_max: 100, linger_us: 200_000, ..Default::default() };
    let small = client.publisher_with(STREAM, settings).await.unwrap();
    let before = broker.state.lock().batch_sizes.len();
    let mut tickets = Vec::new();
    for _ in 0..6 {
        tickets.push(small.send(Record::unkeyed(vec![7u8; 40])).await.unwrap());
    }
    for t in tickets {
        t.await.unwrap();
    }
    let sizes = broker.state.lock().batch_sizes[before..].to_vec();
    assert_eq!(sizes.iter().sum::<usize>(), 6);
    assert!(sizes.iter().all(|n| *n <= 2), "{sizes:?}");
    // Keys count towards the byte limit: 30-byte key + 40-byte value, one record per batch.
    let before = broker.state.lock().batch_sizes.len();
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(small.send(Record::keyed(vec![b'k'; 30], vec![7u8; 40])).await.unwrap());
    }
    for t in tickets {
        t.await.unwrap();
    }
    assert_eq!(broker.state.lock().batch_sizes[before..], [1, 1, 1]);
}

#[tokio::test]
async fn oversized_keys_and_records_are_refused_before_sending() {
    let options = BrokerOptions {
        limits: felix_proto::Limits {
            max_key_bytes: 8,
            max_frame_bytes: 4096,
            ..Default::default()
        },
        ..BrokerOptions::default()
    };
    let broker = TestBroker::start(options).await;
    broker.create_stream(STREAM, 1);
    let client = Client::connect(broker.client_config()).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let err = publisher.send(Record::keyed("123456789", "v")).await.unwrap_err();
    assert_eq!(err, ClientError::KeyTooLong { len: 9, max: 8 });
    let err = publisher.send(Record::unkeyed(vec![0u8; 5000])).await.unwrap_err();
    assert!(matches!(err, ClientError::RecordTooLarge { len: 5000, .. }), "{err}");
    assert_eq!(broker.state.lock().publishes, 0);
}

#[tokio::test]
async fn subscribe_from_every_start_position() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 1);
    let client = Client::connect(broker.client_config()).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    for i in 0..5 {
        publisher.publish(Record::keyed("k", format!("old-{i}"))).await.unwrap();
    }
    let mut earliest =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    let mut latest =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Latest)).await.unwrap();
    let mut from3 = client
        .subscribe(SubscribeOptions::new(STREAM).start(StartAt::Offset(Offset(3))))
        .await
        .unwrap();
    let mut by_time =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Timestamp(0))).await.unwrap();
    assert_eq!(earliest.shards(), &[ShardId(0)]);
    publisher.publish(Record::keyed("k", "new")).await.unwrap();

    let got = next_n(&mut earliest, 6).await;
    let values: Vec<_> = got.iter().map(|r| r.value.clone()).collect();
    assert_eq!(values[0], Bytes::from("old-0"));
    assert_eq!(values[5], Bytes::from("new"));
    assert_eq!(got.iter().map(|r| r.offset.0).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
    assert!(got.iter().all(|r| r.key.as_deref() == Some(&b"k"[..]) && r.shard == ShardId(0)));

    let got = next_n(&mut latest, 1).await;
    assert_eq!((got[0].offset, got[0].value.clone()), (Offset(5), Bytes::from("new")));

    let got = next_n(&mut from3, 3).await;
    assert_eq!(got.iter().map(|r| r.offset.0).collect::<Vec<_>>(), vec![3, 4, 5]);

    let got = next_n(&mut by_time, 6).await;
    assert_eq!(got[0].offset, Offset(0));
}

#[tokio::test]
async fn consumer_group_commits_and_resumes() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(broker.client_config()).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    for i in 0..10 {
        publisher.publish(Record::keyed(format!("k{}", i % 3), format!("{i}"))).await.unwrap();
    }
    let options = SubscribeOptions::new(STREAM).start(StartAt::Earliest).group("billing");
    let mut sub = client.subscribe(options.clone()).await.unwrap();
    let first = next_n(&mut sub, 4).await;
    sub.commit_consumed().await.unwrap();
    drop(sub);
    {
        let o = broker.state.lock();
        for r in &first {
            let committed = o.commits[&(STREAM.to_owned(), "billing".to_owned(), r.shard.0)];
            assert!(committed > r.offset.0);
        }
    }
    // A new member of the group resumes after the committed records: nothing is seen twice.
    let mut again = client.subscribe(options).await.unwrap();
    let rest = next_n(&mut again, 6).await;
    let mut seen: Vec<(ShardId, Offset)> =
        first.iter().chain(rest.iter()).map(|r| (r.shard, r.offset)).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 10);
    // Explicit commit of one shard.
    again.commit(ShardId(0), Offset(0)).await.unwrap();
    assert_eq!(broker.state.lock().commits[&(STREAM.to_owned(), "billing".to_owned(), 0)], 0);
    // Commit without a group is a typed error, nothing sent.
    let plain = client.subscribe(SubscribeOptions::new(STREAM)).await.unwrap();
    assert!(matches!(
        plain.commit(ShardId(0), Offset(1)).await,
        Err(ClientError::InvalidArgument(_))
    ));
    broker.assert_no_unadvertised_bits();
}

#[tokio::test]
async fn publishing_to_a_missing_stream_fails_with_the_brokers_code() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let client = Client::connect(broker.client_config()).await.unwrap();
    // The test broker does not auto-create: the publisher starts without a routing hint and
    // the broker's refusal reaches the record.
    let publisher = client.publisher("acme/app/missing").await.unwrap();
    assert_eq!(publisher.shard_for_key(b"k"), None);
    let err = publisher.publish(Record::keyed("k", "v")).await.unwrap_err();
    assert!(matches!(err, ClientError::Broker { code: ErrorCode::StreamNotFound, .. }), "{err}");
}

#[tokio::test]
async fn a_reset_subscription_stream_reports_the_brokers_code() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 1);
    let client = Client::connect(broker.client_config()).await.unwrap();
    client.publisher(STREAM).await.unwrap().publish(Record::unkeyed("x")).await.unwrap();
    let mut sub =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    next_n(&mut sub, 1).await;
    broker.state.reset_subscriptions(ErrorCode::SlowConsumer);
    let err = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap_err();
    assert!(matches!(err, ClientError::Broker { code: ErrorCode::SlowConsumer, .. }), "{err}");
    assert_eq!(sub.next().await, Ok(None), "a reset subscription stays ended");
}

#[tokio::test]
async fn out_of_range_subscriptions_are_refused_before_sending() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 1);
    let client = Client::connect(broker.client_config()).await.unwrap();
    for shards in [vec![], vec![ShardId(0); 4097]] {
        let options = SubscribeOptions::new(STREAM).shards(shards);
        assert!(matches!(client.subscribe(options).await, Err(ClientError::InvalidArgument(_))));
    }
    let too_long_group = SubscribeOptions::new(STREAM).group("g".repeat(256));
    assert!(matches!(client.subscribe(too_long_group).await, Err(ClientError::InvalidName(_))));
    let err = client.subscribe(SubscribeOptions::new(STREAM).shards(vec![ShardId(3)])).await;
    assert!(matches!(err, Err(ClientError::Broker { code: ErrorCode::InvalidShard, .. })));
}

#[tokio::test]
async fn quic_stats_count_the_packets_the_connections_sent() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(broker.client_config()).await.unwrap();
    let before = client.quic_stats();
    assert!(before.packets_sent > 0, "the handshake and Hello were sent: {before:?}");
    let publisher = client.publisher(STREAM).await.unwrap();
    for i in 0..200u32 {
        let ticket = publisher.send(Record::unkeyed(vec![7u8; 4096])).await.unwrap();
        if i % 50 == 49 {
            tokio::time::timeout(WAIT, ticket).await.expect("ack").unwrap();
        }
    }
    let after = client.quic_stats();
    // 200 records of 4 KiB are at least 560 full packets more.
    assert!(after.packets_sent >= before.packets_sent + 560, "{before:?} -> {after:?}");
    assert!(after.packets_lost <= after.packets_sent && after.bytes_lost >= after.packets_lost);
    // 800 KB on one stream is within quinn's default stream window (1.25 MB): never held back.
    assert_eq!(after.flow_control_blocked, 0, "{after:?}");
}

#[tokio::test]
async fn quic_stats_count_the_times_the_brokers_flow_control_held_the_client_back() {
    // A 16 KiB stream window against batches of up to 64 records of 4 KiB: a batch cannot be
    // sent before the broker has read most of it.
    let options = BrokerOptions { stream_receive_window: Some(16 << 10), ..Default::default() };
    let broker = TestBroker::start(options).await;
    broker.create_stream(STREAM, 1);
    let client = Client::connect(broker.client_config()).await.unwrap();
    assert_eq!(client.quic_stats().flow_control_blocked, 0, "nothing sent yet");
    let publisher = client.publisher(STREAM).await.unwrap();
    let mut last = None;
    for _ in 0..128 {
        last = Some(publisher.send(Record::unkeyed(vec![7u8; 4096])).await.unwrap());
    }
    tokio::time::timeout(WAIT, last.expect("sent")).await.expect("ack").unwrap();
    let after = client.quic_stats();
    assert!(after.flow_control_blocked > 0, "512 KiB through a 16 KiB window: {after:?}");
    let stored: usize = broker.state.lock().streams[STREAM].shards.iter().map(Vec::len).sum();
    assert_eq!(stored, 128, "everything arrived");
}

/// A broker that acks each batch 30 ms after it arrives, and a publisher whose batches are
/// one record each, all of one key (one worker, one stream).
async fn slow_acks(settings: PublishSettings) -> (TestBroker, Publisher) {
    let options =
        BrokerOptions { ack_delay: Some(Duration::from_millis(30)), ..Default::default() };
    let broker = TestBroker::start(options).await;
    broker.create_stream(STREAM, 1);
    let client = Client::connect(broker.client_config()).await.unwrap();
    let publisher = client.publisher_with(STREAM, settings).await.unwrap();
    (broker, publisher)
}

fn one_record_batches() -> PublishSettings {
    PublishSettings { batch_records_max: 1, linger_us: 0, ..Default::default() }
}

#[tokio::test]
async fn send_stats_count_the_batches_that_waited_for_an_in_flight_slot() {
    let settings =
        PublishSettings { in_flight_batches_max: 1, idempotent: false, ..one_record_batches() };
    let (broker, publisher) = slow_acks(settings).await;
    let reader = publisher.send_stats_reader();
    let before = publisher.send_stats();
    assert_eq!((before.batches, before.in_flight_waits), (0, 0), "{before:?}");
    let mut tickets = Vec::new();
    for i in 0..6u8 {
        tickets
            .push(publisher.send(Record::keyed(Bytes::from_static(b"k"), vec![i])).await.unwrap());
    }
    for t in tickets {
        tokio::time::timeout(WAIT, t).await.expect("ack").unwrap();
    }
    let s = publisher.send_stats();
    assert_eq!(s.batches, 6, "{s:?}");
    // One slot: each batch after the first waited for its predecessor's ack (>= 30 ms).
    assert!(s.in_flight_waits >= 5, "{s:?}");
    assert!(s.in_flight_wait_us >= 5 * 30_000, "{s:?}");
    assert_eq!((s.window_waits, s.window_wait_us), (0, 0), "untagged batches: {s:?}");
    // The last batch was ready at once and written after five acks.
    assert!(s.delay_us.max() >= 5 * 30_000, "{}", s.delay_us.max());
    assert_eq!(broker.state.lock().streams[STREAM].shards[0].len(), 6);
    // A reader sees the same, and outlives the publisher.
    drop(publisher);
    let read = reader.read();
    assert_eq!((read.batches, read.in_flight_waits), (s.batches, s.in_flight_waits));
}

#[tokio::test]
async fn send_stats_count_the_batches_that_waited_for_their_producers_window() {
    let (broker, publisher) = slow_acks(one_record_batches()).await;
    let records = PRODUCER_IN_FLIGHT_MAX + 4;
    let mut tickets = Vec::new();
    for i in 0..records {
        let value = vec![i as u8];
        tickets.push(publisher.send(Record::keyed(Bytes::from_static(b"k"), value)).await.unwrap());
    }
    for t in tickets {
        tokio::time::timeout(WAIT, t).await.expect("ack").unwrap();
    }
    let s = publisher.send_stats();
    assert_eq!(s.batches, records as u64, "{s:?}");
    // One producer, one key: the batches past its window waited for the oldest to resolve.
    assert!(s.window_waits >= 1, "{s:?}");
    assert!(s.window_wait_us >= 30_000, "{s:?}");
    assert_eq!(s.in_flight_waits, 0, "64 slots, {records} batches: {s:?}");
    assert_eq!(broker.state.lock().streams[STREAM].shards[0].len(), records);
}

#[tokio::test]
async fn send_stats_count_no_wait_when_no_limit_is_reached() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(broker.client_config()).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    for i in 0..20u8 {
        let t = publisher.send(Record::keyed(Bytes::from(vec![i]), vec![i; 100])).await.unwrap();
        tokio::time::timeout(WAIT, t).await.expect("ack").unwrap();
    }
    let s = publisher.send_stats();
    assert_eq!(s.batches, 20, "one record acked before the next: {s:?}");
    assert_eq!(s.delay_us.len(), 20);
    assert_eq!((s.window_waits, s.in_flight_waits), (0, 0), "{s:?}");
}
