//! End to end, real QUIC on loopback with 2 cores: publish in each ack mode, keyed routing
//! across cores, restart, and the command line.

mod e2e_support;

use std::collections::HashMap;

use bytes::Bytes;
use e2e_support::{TestBroker, WAIT};
use felix_client::{AckMode, PublishSettings, Record, StartAt, SubscribeOptions};

async fn read_n(sub: &mut felix_client::Subscriber, n: usize) -> Vec<felix_client::ReceivedRecord> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(WAIT, sub.next()).await {
            Ok(Ok(Some(r))) => out.push(r),
            other => panic!("after {} of {n} records: {other:?}", out.len()),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_ack_in_each_mode() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    client.create_stream("acme/app/modes", 2, Default::default()).await.unwrap();
    let mut total = 0;
    for mode in [AckMode::None, AckMode::Written, AckMode::Durable] {
        let settings =
            PublishSettings { ack_mode: mode, linger_us: 100, ..PublishSettings::default() };
        let publisher = client.publisher_with("acme/app/modes", settings).await.unwrap();
        let mut tickets = Vec::new();
        for i in 0..40 {
            let rec = Record::keyed(format!("k{}", i % 4), format!("{mode:?}-{i}"));
            tickets.push(publisher.send(rec).await.unwrap());
        }
        publisher.flush().await.unwrap();
        for t in tickets {
            let receipt = tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
            match mode {
                AckMode::None => assert!(receipt.is_none()),
                _ => assert!(receipt.is_some(), "{mode:?} gave no receipt"),
            }
        }
        total += 40;
    }
    // Everything, the unacked batches included, is stored and readable.
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/modes").start(StartAt::Earliest))
        .await
        .unwrap();
    let got = read_n(&mut sub, total).await;
    for prefix in ["None", "Written", "Durable"] {
        assert_eq!(
            got.iter().filter(|r| r.value.starts_with(prefix.as_bytes())).count(),
            40,
            "{prefix}"
        );
    }
    assert!(broker.counter("acks") > 0);
    assert_eq!(broker.counter("publish_errors"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_batches_are_forwarded_across_cores_and_keep_per_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    // One connection, on one core: keys whose shards live on the other core must be forwarded
    // (a client that covers every core would route them to the owner itself).
    let mut config = broker.client_config();
    config.connections = Some(1);
    config.cover_cores = false;
    let client = felix_client::Client::connect(config).await.unwrap();
    client.create_stream("acme/app/keyed", 12, Default::default()).await.unwrap();
    let settings =
        PublishSettings { ack_mode: AckMode::Durable, linger_us: 50, ..PublishSettings::default() };
    let publisher = client.publisher_with("acme/app/keyed", settings).await.unwrap();
    let mut tickets = Vec::new();
    for seq in 0..30u32 {
        for key in 0..12 {
            let rec = Record::keyed(format!("key-{key}"), seq.to_be_bytes().to_vec());
            tickets.push(publisher.send(rec).await.unwrap());
        }
    }
    publisher.flush().await.unwrap();
    for t in tickets {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
    }
    assert!(broker.counter("forwarded_out") > 0, "no batch crossed cores");
    assert_eq!(broker.counter("forwarded_out"), broker.counter("forwarded_in"));
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/keyed").start(StartAt::Earliest))
        .await
        .unwrap();
    let got = read_n(&mut sub, 30 * 12).await;
    let mut per_key: HashMap<Bytes, Vec<u32>> = HashMap::new();
    let mut shards = std::collections::HashSet::new();
    for r in got {
        shards.insert(r.shard);
        let key = r.key.clone().expect("keyed");
        assert_eq!(r.shard, felix_proto::shard_for_key(&key, 12), "wrong shard for {key:?}");
        per_key.entry(key).or_default().push(u32::from_be_bytes(r.value[..4].try_into().unwrap()));
    }
    assert!(shards.len() > 1, "only one shard used");
    assert_eq!(per_key.len(), 12);
    for (key, seqs) in per_key {
        assert_eq!(seqs, (0..30).collect::<Vec<_>>(), "order of {key:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let broker = TestBroker::start(dir.path(), 2, &[]);
        let client = broker.client().await;
        let publisher = client.publisher("acme/app/restart").await.unwrap();
        for i in 0..100 {
            publisher.publish(Record::unkeyed(format!("r{i}"))).await.unwrap();
        }
        client.close();
    }
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/restart").start(StartAt::Earliest))
        .await
        .unwrap();
    let got = read_n(&mut sub, 100).await;
    let mut values: Vec<String> =
        got.iter().map(|r| String::from_utf8_lossy(&r.value).into_owned()).collect();
    values.sort();
    let mut want: Vec<String> = (0..100).map(|i| format!("r{i}")).collect();
    want.sort();
    assert_eq!(values, want);
}

#[test]
fn a_different_core_count_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(TestBroker::start(dir.path(), 2, &[]));
    let d = dir.path().display().to_string();
    let serve = felix_broker::config::parse_serve(&[
        "felix",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &d,
        "--cores",
        "3",
        "--metrics",
        "off",
        "--no-pin",
    ])
    .unwrap();
    let err = felix_broker::app::Broker::start(&serve).err().expect("must refuse").to_string();
    assert!(err.contains("laid out for 2 cores"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_export_per_core_counters_and_p99() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let b = broker.broker.as_ref().unwrap();
    let admin = felix_broker::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        b.stats.clone(),
        b.net.clone(),
        b.ready.clone(),
    )
    .unwrap();
    let client = broker.client().await;
    let p = client.publisher("acme/app/metrics").await.unwrap();
    for i in 0..50 {
        p.publish(Record::unkeyed(vec![i as u8; 100])).await.unwrap();
    }
    // Histograms are published once a second; counters at once.
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    b.refresh();
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(admin).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    };
    let health = get("/health");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let text = get("/metrics");
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).map(|v| v.trim().parse::<f64>().unwrap()))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    let stored = value("felix_storage_append_bytes_total{core=\"0\"}")
        + value("felix_storage_append_bytes_total{core=\"1\"}");
    assert_eq!(stored, 5000.0);
    let p99 = value("felix_publish_ack_latency_us{core=\"0\",quantile=\"0.99\"}")
        .max(value("felix_publish_ack_latency_us{core=\"1\",quantile=\"0.99\"}"));
    assert!(p99 > 0.0, "no latency recorded");
    assert!(
        value("felix_net_datagrams_in{core=\"0\"}") + value("felix_net_datagrams_in{core=\"1\"}")
            > 0.0
    );
    value("felix_net_misrouted{core=\"1\"}");
    value("felix_storage_flush_latency_us{core=\"0\",quantile=\"0.99\"}");
    let writes = value("felix_storage_write_latency_us_count{core=\"0\"}")
        + value("felix_storage_write_latency_us_count{core=\"1\"}");
    assert!(writes > 0.0, "the writes' latency is recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_inflight_budgets_push_back_without_losing_or_deadlocking() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(
        dir.path(),
        2,
        &["--inflight-bytes-per-conn", "8192", "--inflight-bytes-per-core", "16384"],
    );
    let client = broker.client().await;
    let p = client.publisher("acme/app/budget").await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..300u32 {
        tickets.push(p.send(Record::keyed(format!("k{}", i % 5), vec![1u8; 4096])).await.unwrap());
    }
    p.flush().await.unwrap();
    for t in tickets {
        tokio::time::timeout(WAIT, t).await.expect("ack timed out").unwrap();
    }
    assert_eq!(broker.counter("storage_append_bytes"), 300 * (4096 + 2));
    assert_eq!(broker.counter("inflight_bytes"), 0);
}

/// On a path with a 9000-byte MTU (`--max-udp-payload 8952` on both ends; loopback carries it)
/// the client's datagrams grow to 8952 bytes and stay there: quinn sent up to 10 datagrams in
/// one GSO send, so past 6550 bytes every full send failed with `EMSGSIZE`, and path MTU
/// discovery took the losses for a black hole and fell back to 1200 bytes (the client's socket
/// now caps a send at 7 such datagrams). The broker's datagrams to a subscriber grow too (the
/// client tells it what it takes). Everything published
/// is read back. (No assertion on losses: a busy machine's socket buffers may drop a few, which
/// is not what this checks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jumbo_path_carries_large_datagrams_both_ways_without_losses() {
    const RECORDS: usize = 4000;
    const VALUE: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &["--max-udp-payload", "8952"]);
    let client = broker
        .client_with(felix_client::ClientConfig { max_udp_payload: 8952, ..broker.client_config() })
        .await;
    client.create_stream("acme/app/jumbo", 1, Default::default()).await.unwrap();
    let p = client.publisher("acme/app/jumbo").await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..RECORDS {
        let mut value = vec![(i % 251) as u8; VALUE];
        value[..8].copy_from_slice(&(i as u64).to_le_bytes());
        // One key: its records keep their order (unkeyed batches may land in any order).
        tickets.push(p.send(Record::keyed("jumbo", value)).await.unwrap());
    }
    p.flush().await.unwrap();
    for t in tickets {
        tokio::time::timeout(WAIT, t).await.expect("ack timed out").unwrap();
    }
    let q = client.quic_stats();
    assert_eq!(q.black_holes, 0, "path MTU discovery saw a black hole: {q:?}");
    assert_eq!(q.mtu_min, 8952, "{q:?}");
    let sent_datagrams = q.packets_sent;
    let published = (RECORDS * VALUE) as u64;
    assert!(
        published / sent_datagrams > 1452,
        "{sent_datagrams} packets for {published} bytes: no larger than a 1500-byte path's"
    );

    let before = broker.net_counter("datagrams_out");
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/jumbo").start(StartAt::Earliest))
        .await
        .unwrap();
    let got = read_n(&mut sub, RECORDS).await;
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.offset.0, i as u64);
        assert_eq!(r.value.len(), VALUE);
        assert_eq!(r.key.as_deref(), Some(&b"jumbo"[..]));
        assert_eq!(r.value[..8], (i as u64).to_le_bytes(), "record {i}");
    }
    let delivered_datagrams = broker.net_counter("datagrams_out") - before;
    assert!(
        published / delivered_datagrams > 1472,
        "{delivered_datagrams} datagrams delivered {published} bytes: the client's default \
         1472-byte limit still holds"
    );
    assert_eq!(client.quic_stats().black_holes, 0);
    // The broker's view (sampled once a second): its datagrams to the client reached 8952.
    let deadline = std::time::Instant::now() + WAIT;
    while broker.net_counter("quic_mtu_min") != 8952 {
        assert!(
            std::time::Instant::now() < deadline,
            "the broker's path MTU: {}",
            broker.net_counter("quic_mtu_min")
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(broker.net_counter("quic_black_holes"), 0);
}

/// With `send_in_write_order` the client's streams are sent one after another instead of
/// round-robin (quinn's `send_fairness` off): every batch of several keys on several lanes is
/// acked and read back in each key's order, and a request on the control stream made while
/// megabytes of batches are queued is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_sent_in_write_order_are_all_stored_in_key_order() {
    const KEYS: usize = 4;
    const PER_KEY: usize = 600;
    const VALUE: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &[]);
    let client = broker
        .client_with(felix_client::ClientConfig {
            send_in_write_order: true,
            ..broker.client_config()
        })
        .await;
    client.create_stream("acme/app/ordered", 1, Default::default()).await.unwrap();
    let p = client.publisher("acme/app/ordered").await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            let mut value = vec![k as u8; VALUE];
            value[..8].copy_from_slice(&(i as u64).to_le_bytes());
            tickets.push(p.send(Record::keyed(format!("k{k}"), value)).await.unwrap());
        }
        if i == PER_KEY / 2 {
            // Behind the batches queued so far: the control stream goes first.
            let other = tokio::time::timeout(
                WAIT,
                client.create_stream("acme/app/other", 1, Default::default()),
            )
            .await
            .expect("a request behind queued batches timed out");
            other.unwrap();
        }
    }
    p.flush().await.unwrap();
    for t in tickets {
        tokio::time::timeout(WAIT, t).await.expect("ack timed out").unwrap();
    }
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/ordered").start(StartAt::Earliest))
        .await
        .unwrap();
    let got = read_n(&mut sub, KEYS * PER_KEY).await;
    let mut next: HashMap<Vec<u8>, u64> = HashMap::new();
    for r in &got {
        let key = r.key.as_deref().expect("keyed").to_vec();
        let seq = u64::from_le_bytes(r.value[..8].try_into().unwrap());
        let want = next.entry(key.clone()).or_insert(0);
        assert_eq!(seq, *want, "key {:?}: out of order", String::from_utf8_lossy(&key));
        *want += 1;
        assert_eq!(r.value.len(), VALUE);
    }
    assert_eq!(next.len(), KEYS);
    assert!(next.values().all(|&n| n == PER_KEY as u64), "{next:?}");
}

/// `felix_publish_receive_span_us` counts Publish frames only, from the first read of a
/// frame's bytes to the last: a frame whose second half arrives 300 ms after its first half
/// records about 300 ms, a frame sent whole records almost nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_span_is_the_time_a_publish_frame_took_to_arrive() {
    use e2e_support::{raw_connection, read_frames};
    use felix_proto::{AckRequest, Capabilities, Frame, Hello, Publish, RequestId};

    const PAUSE: std::time::Duration = std::time::Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let conn = raw_connection(broker.addr, dir.path()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Hello {
        version: felix_proto::PROTOCOL_VERSION,
        capabilities: Capabilities::ALL,
        token: None,
    };
    send.write_all(&Frame::Hello(hello).to_bytes()).await.unwrap();
    assert!(matches!(read_frames(&mut recv, 1).await[0], Frame::HelloOk(_)));
    let publish = |id: u64| {
        Frame::Publish(Publish {
            oldest_pending: false,
            ack: Some(AckRequest {
                request_id: RequestId(id),
                mode: felix_proto::AckMode::Written,
            }),
            key: None,
            producer: None,
            stream: "acme/app/span".into(),
            records: vec![Bytes::from(vec![7u8; 3000]).into(); 4],
        })
        .to_bytes()
    };
    // One frame in two halves, PAUSE apart; then one sent whole; a Ping is not a Publish.
    let split = publish(1);
    send.write_all(&split[..split.len() / 2]).await.unwrap();
    tokio::time::sleep(PAUSE).await;
    send.write_all(&split[split.len() / 2..]).await.unwrap();
    send.write_all(&publish(2)).await.unwrap();
    send.write_all(&Frame::Ping(3).to_bytes()).await.unwrap();
    let answers = read_frames(&mut recv, 3).await;
    assert!(matches!(answers[0], Frame::PublishAck(ref a) if a.request_id == RequestId(1)));
    assert!(matches!(answers[1], Frame::PublishAck(ref a) if a.request_id == RequestId(2)));
    assert_eq!(answers[2], Frame::Pong(3));

    // The cores publish their histograms once a second.
    let deadline = std::time::Instant::now() + WAIT;
    let spans = loop {
        let mut all = felix_broker::app::stats::new_histogram();
        for core in broker.broker.as_ref().unwrap().stats.iter() {
            all.add(&*core.receive_span_us.lock().unwrap()).unwrap();
        }
        if all.len() >= 2 || std::time::Instant::now() > deadline {
            break all;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(spans.len(), 2, "two Publish frames, nothing else");
    let pause_us = PAUSE.as_micros() as u64;
    assert!(spans.max() >= pause_us * 97 / 100, "split frame: max {} us", spans.max());
    assert!(spans.min() < pause_us / 2, "whole frame: min {} us", spans.min());

    // The ack latency is published twice over: once per batch, and once per record of it.
    let published = |pick: fn(&felix_broker::app::stats::AppStats) -> &std::sync::Mutex<_>| {
        let mut all = felix_broker::app::stats::new_histogram();
        for core in broker.broker.as_ref().unwrap().stats.iter() {
            all.add(&*pick(core).lock().unwrap()).unwrap();
        }
        all
    };
    let per_batch = published(|s| &s.ack_latency_us);
    let per_record = published(|s| &s.ack_record_latency_us);
    assert_eq!(per_batch.len(), 2, "two acked batches");
    assert_eq!(per_record.len(), 8, "of four records each");
    assert_eq!(per_record.max(), per_batch.max(), "the same latencies, each four times");
    assert_eq!(per_record.min(), per_batch.min());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reaches_every_core_with_one_handshake_each() {
    // Each connection after the first names the core it wants in its Initial's destination
    // connection ID, so 4 handshakes cover 4 cores (the kernel's hash alone covers them in
    // 4!/4^4 = 9 % of tries, and each miss costs another handshake).
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 4, &[]);
    for _ in 0..3 {
        let before = broker.counter("connections_accepted");
        let client = broker.client().await;
        assert_eq!(client.cores_reached(), (0..4).map(felix_proto::CoreId).collect::<Vec<_>>());
        assert_eq!(client.connection_count(), 4);
        assert_eq!(broker.counter("connections_accepted") - before, 4, "extra handshakes");
        client.close();
    }
}

/// A client that makes a publisher per task and drops it: each dropped publisher's lanes are
/// finished, the broker ends its side, and the connection's stream credit comes back (the
/// broker allows 256 streams a connection; 400 publishers one after another would stall at
/// about 128 a connection if they leaked, as they did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_made_and_dropped_one_after_another_do_not_use_up_streams() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &[]);
    let client = felix_client::Client::connect(broker.client_config()).await.unwrap();
    client.create_stream("acme/app/many", 1, Default::default()).await.unwrap();
    for i in 0..400 {
        let publisher = client.publisher("acme/app/many").await.unwrap();
        let record = felix_client::Record::unkeyed(format!("r{i}"));
        let acked =
            tokio::time::timeout(std::time::Duration::from_secs(10), publisher.publish(record))
                .await;
        assert!(matches!(acked, Ok(Ok(Some(_)))), "publisher {i}: {acked:?}");
    }
    client.close();
}
