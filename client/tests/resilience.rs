//! Pool, reconnect with backoff, and timeouts on connect and on acks.

mod support;

use std::time::Duration;

use felix_client::{
    Capabilities, Client, ClientError, CoreId, Record, COVER_ATTEMPTS_PER_CONNECTION,
};
use support::{BrokerOptions, TestBroker};

const STREAM: &str = "acme/app/orders";

#[tokio::test]
async fn the_pool_opens_one_connection_per_core_by_default_and_covers_every_core() {
    // Connections land on cores 0,0,0,0 first; fresh ones then land on 1, 0, 2, 3.
    let options = BrokerOptions {
        core_count: 4,
        core_sequence: vec![0, 0, 0, 0, 1, 0, 2, 3],
        ..Default::default()
    };
    let broker = TestBroker::start(options).await;
    let client = Client::connect(broker.client_config()).await.unwrap();
    assert_eq!(client.connection_count(), 4);
    assert_eq!(client.core_count(), 4);
    assert_eq!(client.cores_reached(), (0..4).map(CoreId).collect::<Vec<_>>());
    let o = broker.state.lock();
    assert_eq!(o.hellos, 8);
    // Each connection has its own endpoint (socket and driver task): distinct client ports.
    let mut ports: Vec<u16> = o.hello_from.iter().map(|a| a.port()).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 8, "connections share a socket: {:?}", o.hello_from);
}

#[tokio::test]
async fn covering_is_bounded_and_can_be_turned_off() {
    let options = BrokerOptions { core_count: 4, core_sequence: vec![0], ..Default::default() };
    let broker = TestBroker::start(options).await;
    let mut config = broker.client_config();
    config.connections = Some(2);
    let client = Client::connect(config.clone()).await.unwrap();
    assert_eq!(client.cores_reached(), vec![CoreId(0)]);
    assert_eq!(broker.state.lock().hellos, 2 + 2 * COVER_ATTEMPTS_PER_CONNECTION);
    config.cover_cores = false;
    let before = broker.state.lock().hellos;
    let client = Client::connect(config).await.unwrap();
    assert_eq!(client.connection_count(), 2);
    assert_eq!(broker.state.lock().hellos - before, 2);
}

#[tokio::test]
async fn keyed_batches_prefer_the_connection_of_the_owning_core() {
    let options = BrokerOptions { core_count: 2, core_sequence: vec![0, 1], ..Default::default() };
    let broker = TestBroker::start(options).await;
    broker.create_stream(STREAM, 4);
    let client = Client::connect(broker.client_config()).await.unwrap();
    assert_eq!(client.cores_reached(), vec![CoreId(0), CoreId(1)]);
    let publisher = client.publisher(STREAM).await.unwrap();
    for i in 0..20 {
        publisher.publish(Record::keyed(format!("k{i}"), "v")).await.unwrap();
    }
    let o = broker.state.lock();
    assert_eq!(o.publish_cores.len(), 20);
    for (key, core) in &o.publish_cores {
        let shard = felix_proto::shard_for_key(key.as_ref().unwrap(), 4);
        assert_eq!(u32::from(*core), shard.0 % 2, "key {key:?} went to core {core}");
    }
}

#[tokio::test]
async fn a_refused_port_does_not_use_up_a_reconnect_attempt() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let mut config = broker.client_config();
    config.connections = Some(1);
    config.reconnect_attempts_max = 1;
    config.connect_timeout_ms = 10_000;
    let client = Client::connect(config).await.unwrap();
    client.list_streams("").await.unwrap();
    let stopped = broker.stop().await;
    let restart = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stopped.restart().await
    });
    // The one reconnect attempt meets a refused port (fast) for half a second, then the
    // broker: within its connect timeout it keeps trying, as a handshake's retransmits would.
    client.list_streams("").await.expect("reconnected within the one attempt");
    let broker = restart.await.unwrap();
    assert!(broker.state.lock().hellos >= 2, "the client reconnected");
}

#[tokio::test]
async fn the_client_reconnects_with_backoff_after_a_broker_restart() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 1);
    let mut config = broker.client_config();
    config.connections = Some(1);
    config.reconnect_backoff_min_ms = 20;
    config.reconnect_backoff_max_ms = 200;
    config.reconnect_attempts_max = 100;
    config.connect_timeout_ms = 1_000;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    publisher.publish(Record::unkeyed("before")).await.unwrap();

    let stopped = broker.stop().await;
    // While the broker is down, a publish fails (lost connection or failed reconnects) or
    // waits in the reconnect loop; start the broker again meanwhile.
    let restart = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stopped.restart().await
    });
    let mut stored_after = false;
    for _ in 0..20 {
        match publisher.publish(Record::unkeyed("after")).await {
            Ok(r) => {
                assert!(r.is_some());
                stored_after = true;
                break;
            }
            Err(e) => assert!(
                matches!(
                    e,
                    ClientError::ConnectionLost(_)
                        | ClientError::Timeout { .. }
                        | ClientError::Connect(_)
                        | ClientError::PortUnreachable { .. }
                ),
                "{e}"
            ),
        }
    }
    assert!(stored_after, "publishing never recovered");
    let broker = restart.await.unwrap();
    assert!(broker.state.lock().hellos >= 2, "the client reconnected");
    client.list_streams("").await.unwrap();
}

#[tokio::test]
async fn an_ack_that_never_comes_times_out() {
    let options = BrokerOptions { swallow_acks: true, ..Default::default() };
    let broker = TestBroker::start(options).await;
    broker.create_stream(STREAM, 1);
    let mut config = broker.client_config();
    config.ack_timeout_ms = 200;
    config.publish.idempotent = false;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let err = publisher.publish(Record::unkeyed("lost")).await.unwrap_err();
    assert_eq!(err, ClientError::Timeout { what: "ack", after_ms: 200 });
    assert_eq!(broker.state.lock().publishes, 1, "an untagged batch is sent once");
}

#[tokio::test]
async fn an_idempotent_batch_is_sent_again_until_its_retry_time_is_over() {
    let options = BrokerOptions { swallow_acks: true, ..Default::default() };
    let broker = TestBroker::start(options).await;
    broker.create_stream(STREAM, 1);
    let mut config = broker.client_config();
    config.ack_timeout_ms = 200;
    config.publish.retry_timeout_ms = 1_000;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let started = std::time::Instant::now();
    let err = publisher.publish(Record::unkeyed("lost")).await.unwrap_err();
    assert_eq!(err, ClientError::Timeout { what: "ack", after_ms: 200 });
    assert!(started.elapsed() >= std::time::Duration::from_millis(1_000), "retried until the end");
    let sent = broker.state.lock().publishes;
    assert!((3..=10).contains(&sent), "a timed-out tagged batch is sent again: {sent} sends");
}

#[tokio::test]
async fn one_producer_has_at_most_its_window_of_batches_unresolved() {
    let options = BrokerOptions { swallow_acks: true, ..Default::default() };
    let broker = TestBroker::start(options).await;
    broker.create_stream(STREAM, 1);
    let mut config = broker.client_config();
    config.ack_timeout_ms = 10_000;
    config.connections = Some(1);
    config.publish.batch_records_max = 1;
    config.publish.linger_us = 0;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..20 {
        tickets.push(publisher.send(Record::keyed("k", format!("v{i}"))).await.unwrap());
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // One key, one shard, one stream: one producer, whose window is full and unanswered.
    assert_eq!(
        broker.state.lock().publishes,
        felix_client::publisher::PRODUCER_IN_FLIGHT_MAX,
        "a producer's batches beyond its window wait"
    );
    client.close();
}

#[tokio::test]
async fn connecting_to_a_silent_port_times_out() {
    // A bound UDP socket that never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let mut config = broker.client_config();
    config.addr = silent.local_addr().unwrap().to_string();
    config.connect_timeout_ms = 300;
    let err = Client::connect(config).await.err().unwrap();
    assert_eq!(err, ClientError::Timeout { what: "connect", after_ms: 300 });
}

#[tokio::test]
async fn a_seed_slower_than_one_attempt_is_still_reached() {
    // Two seeds: one silent, one that answers Hello after 800 ms, longer than the 500 ms a
    // first attempt gets. Each round of attempts gets twice as long as the last, so the second
    // (1 s) reaches it; with the same 500 ms every round it never would, within the 5 s.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let options =
        BrokerOptions { hello_delay: Some(Duration::from_millis(800)), ..Default::default() };
    let broker = TestBroker::start(options).await;
    let mut config = broker.client_config();
    config.addr = format!("{},{}", silent.local_addr().unwrap(), config.addr);
    config.connect_attempt_timeout_ms = 500;
    config.connect_timeout_ms = 5_000;
    let started = std::time::Instant::now();
    let client = Client::connect(config).await.expect("the slow seed is reached");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    client.close();
}

#[tokio::test]
async fn a_closed_client_does_not_reconnect() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let client = Client::connect(broker.client_config()).await.unwrap();
    let hellos = broker.state.lock().hellos;
    client.close();
    assert_eq!(client.list_streams("").await, Err(ClientError::Closed));
    assert_eq!(broker.state.lock().hellos, hellos);
}

/// A client whose reconnects wait long enough for a test broker restart.
fn patient(broker: &TestBroker) -> felix_client::ClientConfig {
    let mut config = broker.client_config();
    config.connections = Some(1);
    config.reconnect_backoff_min_ms = 20;
    config.reconnect_backoff_max_ms = 200;
    config.reconnect_attempts_max = 100;
    config.connect_timeout_ms = 1_000;
    config
}

async fn next_value(sub: &mut felix_client::Subscriber) -> Result<String, ClientError> {
    let r = tokio::time::timeout(Duration::from_secs(20), sub.next()).await.expect("stalled")?;
    Ok(String::from_utf8(r.expect("ended").value.to_vec()).unwrap())
}

/// Restarts the broker after a short pause, in the background.
fn restart_later(broker: TestBroker) -> tokio::task::JoinHandle<TestBroker> {
    tokio::spawn(async move {
        let stopped = broker.stop().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        stopped.restart().await
    })
}

#[tokio::test]
async fn a_group_subscription_resumes_after_a_restart_without_duplicates_or_gaps() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(patient(&broker)).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    for i in 0..6 {
        publisher.publish(Record::keyed(format!("k{}", i % 2), format!("{i}"))).await.unwrap();
    }
    let options = felix_client::SubscribeOptions::new(STREAM)
        .start(felix_client::StartAt::Earliest)
        .group("g");
    let mut sub = client.subscribe(options).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next_value(&mut sub).await.unwrap());
    }
    let restarted = restart_later(broker);
    // Records stored while the subscriber reconnects are not missed either.
    let broker = restarted.await.unwrap();
    publisher.publish(Record::keyed("k0", "6")).await.unwrap();
    while seen.len() < 7 {
        seen.push(next_value(&mut sub).await.unwrap());
    }
    seen.sort();
    assert_eq!(seen, ["0", "1", "2", "3", "4", "5", "6"]);
    assert_eq!(sub.resumes(), 1);
    drop(broker);
}

#[tokio::test]
async fn a_single_shard_subscription_resumes_at_its_next_offset() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 1);
    let client = Client::connect(patient(&broker)).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let mut sub = client.subscribe(felix_client::SubscribeOptions::new(STREAM)).await.unwrap();
    publisher.publish(Record::unkeyed("a")).await.unwrap();
    assert_eq!(next_value(&mut sub).await.unwrap(), "a");
    let broker = restart_later(broker).await.unwrap();
    publisher.publish(Record::unkeyed("b")).await.unwrap();
    assert_eq!(next_value(&mut sub).await.unwrap(), "b");
    assert_eq!(sub.resumes(), 1);
    drop(broker);
}

#[tokio::test]
async fn a_group_from_latest_resumes_once_it_committed_every_shard() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(patient(&broker)).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let options = felix_client::SubscribeOptions::new(STREAM).group("g");
    let mut sub = client.subscribe(options).await.unwrap();
    // Keys over both shards; every record read, then committed.
    for i in 0..16 {
        publisher.publish(Record::keyed(format!("k{i}"), format!("{i}"))).await.unwrap();
    }
    for _ in 0..16 {
        next_value(&mut sub).await.unwrap();
    }
    sub.commit_consumed().await.unwrap();
    let broker = restart_later(broker).await.unwrap();
    // Stored before the subscriber is back: not missed.
    publisher.publish(Record::keyed("k0", "after")).await.unwrap();
    assert_eq!(next_value(&mut sub).await.unwrap(), "after");
    assert_eq!(sub.resumes(), 1);
    drop(broker);
}

#[tokio::test]
async fn a_subscription_from_latest_resumes_each_shard_where_it_was() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(patient(&broker)).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    // Records before the subscription, on both shards: not to be seen.
    for i in 0..8 {
        publisher.publish(Record::keyed(format!("k{i}"), "before")).await.unwrap();
    }
    let mut sub = client.subscribe(felix_client::SubscribeOptions::new(STREAM)).await.unwrap();
    // Shard 0 returns a record; shard 1 none, so only the broker's SubscribeOk said where it
    // started.
    let on_shard = |s: u32| {
        (0..64)
            .map(|i| format!("k{i}"))
            .find(|k| publisher.shard_for_key(k.as_bytes()) == Some(felix_client::ShardId(s)))
            .unwrap()
    };
    publisher.publish(Record::keyed(on_shard(0), "a")).await.unwrap();
    assert_eq!(next_value(&mut sub).await.unwrap(), "a");
    // Stored on both shards while the subscriber's broker is away.
    let stopped = broker.stop().await;
    {
        let mut o = stopped.state.lock();
        let data = o.streams.get_mut(STREAM).unwrap();
        for (shard, value) in [(0, "b0"), (1, "b1")] {
            let value = bytes::Bytes::from_static(value.as_bytes());
            data.shards[shard].push(support::Stored { timestamp_ms: 1, key: None, value });
        }
    }
    let broker = stopped.restart().await;
    let mut after = vec![next_value(&mut sub).await.unwrap(), next_value(&mut sub).await.unwrap()];
    after.sort();
    assert_eq!(after, ["b0", "b1"]);
    let more = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(more.is_err(), "nothing else: {more:?}");
    assert_eq!(sub.resumes(), 1);
    drop(broker);
}

#[tokio::test]
async fn without_positions_subscriptions_that_cannot_resume_exactly_report_the_lost_connection() {
    // A broker that cannot start each shard at an offset of its own (no SUBSCRIBE_POSITIONS).
    let capabilities = Capabilities(support::SINGLE_NODE.0 & !Capabilities::SUBSCRIBE_POSITIONS.0);
    let broker = TestBroker::start(BrokerOptions { capabilities, ..Default::default() }).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(patient(&broker)).await.unwrap();
    // Several shards from Latest without a group: a resume could miss records.
    let mut latest = client.subscribe(felix_client::SubscribeOptions::new(STREAM)).await.unwrap();
    // A group from Latest that committed nothing: the broker would start its shards at the
    // end of the log as of the resume.
    let mut group_latest =
        client.subscribe(felix_client::SubscribeOptions::new(STREAM).group("fresh")).await.unwrap();
    let broker = restart_later(broker).await.unwrap();
    for sub in [&mut latest, &mut group_latest] {
        let err = tokio::time::timeout(Duration::from_secs(20), sub.next()).await.unwrap();
        assert!(matches!(err, Err(ClientError::ConnectionLost(_))), "{err:?}");
        assert_eq!(sub.resumes(), 0);
    }
    broker.assert_no_unadvertised_bits();
    drop(broker);
}

#[tokio::test]
async fn a_subscription_with_resuming_off_reports_the_lost_connection() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let client = Client::connect(patient(&broker)).await.unwrap();
    let options =
        felix_client::SubscribeOptions::new(STREAM).start(felix_client::StartAt::Earliest);
    let mut sub = client.subscribe(options.resume(false)).await.unwrap();
    let broker = restart_later(broker).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(20), sub.next()).await.unwrap();
    assert!(matches!(err, Err(ClientError::ConnectionLost(_))), "{err:?}");
    assert_eq!(sub.resumes(), 0);
    drop(broker);
}

#[tokio::test]
async fn each_part_of_a_subscription_split_by_core_resumes_on_its_own() {
    // 2 cores, one connection on each: the subscription is one part per core.
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream(STREAM, 2);
    let mut config = patient(&broker);
    config.connections = None;
    let client = Client::connect(config).await.unwrap();
    assert_eq!(client.cores_reached(), vec![CoreId(0), CoreId(1)]);
    let publisher = client.publisher(STREAM).await.unwrap();
    for i in 0..8 {
        publisher.publish(Record::keyed(format!("k{i}"), format!("{i}"))).await.unwrap();
    }
    let options = felix_client::SubscribeOptions::new(STREAM)
        .start(felix_client::StartAt::Earliest)
        .group("g");
    let mut sub = client.subscribe(options).await.unwrap();
    assert_eq!(sub.parts(), 2);
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(next_value(&mut sub).await.unwrap());
    }
    let broker = restart_later(broker).await.unwrap();
    // After the restart both shards get records: both parts must come back.
    for i in 8..16 {
        publisher.publish(Record::keyed(format!("k{i}"), format!("{i}"))).await.unwrap();
    }
    while seen.len() < 16 {
        seen.push(next_value(&mut sub).await.unwrap());
    }
    seen.sort_by_key(|v| v.parse::<u32>().unwrap());
    assert_eq!(seen, (0..16).map(|i| i.to_string()).collect::<Vec<_>>(), "lost or twice");
    assert_eq!((sub.parts(), sub.resumes()), (2, 2), "each part resumed once");
    let o = broker.state.lock();
    let mut asked: Vec<_> = o.subscribes.iter().flatten().cloned().collect();
    asked.sort();
    let own = |s| vec![felix_client::ShardId(s)];
    // The broker's state outlives the restart: the first Subscribes, then the resumes.
    assert_eq!(asked, [own(0), own(0), own(1), own(1)], "each part asked for its own shard");
    drop(o);
    drop(broker);
}

#[tokio::test]
async fn publishers_made_and_dropped_one_after_another_do_not_use_up_streams() {
    // Each publisher opens QUIC streams (its lanes); a dropped one must give them back, or a
    // client that makes a publisher per task runs out of the broker's stream credit.
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream("a/b/c", 2);
    let client = Client::connect(broker.client_config()).await.unwrap();
    for i in 0..300 {
        let publisher = client.publisher("a/b/c").await.unwrap();
        let acked = tokio::time::timeout(
            Duration::from_secs(10),
            publisher.publish(felix_client::Record::unkeyed(format!("r{i}"))),
        )
        .await;
        assert!(matches!(acked, Ok(Ok(Some(_)))), "publisher {i}: {acked:?}");
    }
    client.close();
}
