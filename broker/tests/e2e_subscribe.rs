//! End to end with 2 cores: subscribe from each start position, fanout, consumer groups;
//! with 1 core: resumes across graceful restarts and past retention, and the slots of dropped
//! subscriptions.

mod e2e_support;

use std::time::Duration;

use e2e_support::{Killed, TestBroker, WAIT};
use felix_client::{
    AckMode, Client, ClientError, Offset, PublishSettings, Record, ShardId, StartAt,
    SubscribeOptions,
};
use felix_proto::ErrorCode;

async fn publish(client: &Client, stream: &str, from: usize, n: usize) {
    let settings =
        PublishSettings { ack_mode: AckMode::Durable, linger_us: 50, ..PublishSettings::default() };
    let p = client.publisher_with(stream, settings).await.unwrap();
    for i in from..from + n {
        p.publish(Record::unkeyed(format!("v{i}"))).await.unwrap();
    }
}

async fn values(sub: &mut felix_client::Subscriber, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(WAIT, sub.next()).await {
            Ok(Ok(Some(r))) => out.push(String::from_utf8_lossy(&r.value).into_owned()),
            other => panic!("after {} of {n}: {other:?}", out.len()),
        }
    }
    out
}

async fn nothing_more(sub: &mut felix_client::Subscriber) {
    if let Ok(r) = tokio::time::timeout(Duration::from_millis(600), sub.next()).await {
        panic!("unexpected record {r:?}");
    }
}

fn vals(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("v{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_from_each_start_position() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    // One shard, so offsets and order are global to the stream.
    client.create_stream("acme/app/pos", 1, Default::default()).await.unwrap();
    publish(&client, "acme/app/pos", 0, 10).await;
    let opts = |s| SubscribeOptions::new("acme/app/pos").start(s);

    let mut earliest = client.subscribe(opts(StartAt::Earliest)).await.unwrap();
    assert_eq!(values(&mut earliest, 10).await, vals(0..10));

    let mut at_offset = client.subscribe(opts(StartAt::Offset(Offset(7)))).await.unwrap();
    assert_eq!(values(&mut at_offset, 3).await, vals(7..10));

    let mut latest = client.subscribe(opts(StartAt::Latest)).await.unwrap();
    nothing_more(&mut latest).await;

    tokio::time::sleep(Duration::from_millis(30)).await;
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
        as u64;
    tokio::time::sleep(Duration::from_millis(30)).await;
    publish(&client, "acme/app/pos", 10, 5).await;
    // Latest sees only what came after it subscribed; the live tail reaches the others too.
    assert_eq!(values(&mut latest, 5).await, vals(10..15));
    assert_eq!(values(&mut earliest, 5).await, vals(10..15));
    let mut by_time = client.subscribe(opts(StartAt::Timestamp(t))).await.unwrap();
    assert_eq!(values(&mut by_time, 5).await, vals(10..15));

    // An offset beyond the end is a typed error.
    let err =
        client.subscribe(opts(StartAt::Offset(Offset(1000)))).await.err().expect("out of range");
    assert!(err.to_string().contains("OffsetOutOfRange"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_to_three_subscribers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    client.create_stream("acme/app/fan", 4, Default::default()).await.unwrap();
    let mut subs = Vec::new();
    for _ in 0..3 {
        let c = broker.client().await;
        let s = c
            .subscribe(SubscribeOptions::new("acme/app/fan").start(StartAt::Latest))
            .await
            .unwrap();
        subs.push((c, s));
    }
    publish(&client, "acme/app/fan", 0, 60).await;
    for (_, s) in &mut subs {
        let mut got = values(s, 60).await;
        got.sort();
        let mut want = vals(0..60);
        want.sort();
        assert_eq!(got, want);
    }
    assert!(broker.counter("subscriptions") >= 3);
    // Subscribers at the live tail were served from memory, and each batch was encoded once
    // for all three.
    assert_eq!(broker.counter("log_batches"), 0, "the live tail re-read the log");
    let served = broker.counter("tail_batches");
    let encodes = broker.counter("tail_encodes");
    assert!(encodes > 0 && served >= 3 * encodes, "{served} batches served, {encodes} encodes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_group_resumes_from_its_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    // Two shards, one per core: commits are stored by each shard's owner.
    client.create_stream("acme/app/grp", 2, Default::default()).await.unwrap();
    let p = client.publisher("acme/app/grp").await.unwrap();
    for i in 0..20 {
        p.publish(Record::keyed(format!("k{}", i % 2), format!("v{i}"))).await.unwrap();
    }
    let opts = || SubscribeOptions::new("acme/app/grp").start(StartAt::Earliest).group("billing");
    let mut sub = client.subscribe(opts()).await.unwrap();
    let mut first = Vec::new();
    for _ in 0..20 {
        first.push(tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap());
    }
    // Commit half of each shard.
    for shard in [ShardId(0), ShardId(1)] {
        let n = first.iter().filter(|r| r.shard == shard).count() as u64;
        sub.commit(shard, Offset(n / 2)).await.unwrap();
    }
    drop(sub);
    client.close();
    broker.stop();
    // Restart: the positions are durable.
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let mut again = client.subscribe(opts()).await.unwrap();
    let mut rest = Vec::new();
    for _ in 0..10 {
        rest.push(tokio::time::timeout(WAIT, again.next()).await.unwrap().unwrap().unwrap());
    }
    for shard in [ShardId(0), ShardId(1)] {
        let n = first.iter().filter(|r| r.shard == shard).count() as u64;
        let offsets: Vec<u64> =
            rest.iter().filter(|r| r.shard == shard).map(|r| r.offset.0).collect();
        assert_eq!(offsets, (n / 2..n).collect::<Vec<_>>(), "{shard}");
    }
    nothing_more(&mut again).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_group_positions_are_capped_per_core_and_kept_ones_still_move() {
    use felix_client::ClientError;
    use felix_proto::ErrorCode;
    let limit = ["--max-group-positions-per-core", "3"];
    let dir = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start(dir.path(), 1, &limit);
    let client = broker.client().await;
    client.create_stream("acme/app/cap", 2, Default::default()).await.unwrap();
    publish(&client, "acme/app/cap", 0, 4).await;
    let group = |g: &str| {
        SubscribeOptions::new("acme/app/cap").start(StartAt::Earliest).group(g.to_owned())
    };
    let g1 = client.subscribe(group("g1")).await.unwrap();
    let g2 = client.subscribe(group("g2")).await.unwrap();
    g1.commit(ShardId(0), Offset(1)).await.unwrap();
    g1.commit(ShardId(1), Offset(1)).await.unwrap();
    g2.commit(ShardId(0), Offset(1)).await.unwrap();
    let refused = |r: Result<(), ClientError>| match r {
        Err(ClientError::Broker { code: ErrorCode::LimitReached, message }) => {
            assert!(message.contains("--max-group-positions-per-core"), "{message}");
        }
        other => panic!("a fourth position: {other:?}"),
    };
    refused(g2.commit(ShardId(1), Offset(1)).await);
    // The three kept positions still move.
    g1.commit(ShardId(0), Offset(2)).await.unwrap();
    g2.commit(ShardId(0), Offset(2)).await.unwrap();
    drop((g1, g2));
    client.close();
    broker.stop();
    // After a restart the core counts the positions it read back.
    let broker = TestBroker::start(dir.path(), 1, &limit);
    let client = broker.client().await;
    let g2 = client.subscribe(group("g2")).await.unwrap();
    refused(g2.commit(ShardId(1), Offset(1)).await);
    g2.commit(ShardId(0), Offset(3)).await.unwrap();
}

/// Commits of new positions in flight at once do not pass the cap between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_of_new_positions_do_not_pass_the_cap() {
    use felix_proto::{ErrorCode, Frame};
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &["--max-group-positions-per-core", "3"]);
    let client = broker.client().await;
    client.create_stream("acme/app/race", 1, Default::default()).await.unwrap();
    let (conn, _hello_send, _hello_recv) = e2e_support::raw_session(broker.addr, dir.path()).await;
    let mut streams = Vec::new();
    for _ in 0..8 {
        streams.push(conn.open_bi().await.unwrap());
    }
    // Eight new groups at once, each on a stream of its own.
    for (i, (send, _)) in streams.iter_mut().enumerate() {
        let commit = e2e_support::commit_frame("acme/app/race", &format!("g{i}"), 1, 0);
        send.write_all(&commit.to_bytes()).await.unwrap();
    }
    let (mut ok, mut refused) = (0, 0);
    for (_, recv) in streams.iter_mut() {
        match &e2e_support::read_frames(recv, 1).await[..] {
            [Frame::CommitOk(_)] => ok += 1,
            [Frame::Error(e)] if e.code == ErrorCode::LimitReached => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ok, refused), (3, 5));
}

/// Every commit appends a record to the core's offsets log; once about a segment of them has
/// been written since the last snapshot, the positions are written again and the segments
/// below deleted. Here ~1.6 segments of commits leave one segment, and every group resumes
/// from its last commit after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offsets_log_is_compacted_and_the_newest_positions_survive_a_restart() {
    use felix_proto::{Frame, RequestId};
    const GROUPS: usize = 60;
    const ROUNDS: u64 = 400;
    let segment = ["--segment-bytes", "4198400"];
    let dir = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start(dir.path(), 1, &segment);
    let client = broker.client().await;
    client.create_stream("acme/app/pos", 1, Default::default()).await.unwrap();
    publish(&client, "acme/app/pos", 0, ROUNDS as usize + 10).await;
    // Long group names, so that a segment fills in ~15,000 commits.
    let group = |i: usize| format!("g{i:03}-{}", "x".repeat(196));
    let (conn, _hello_send, _hello_recv) = e2e_support::raw_session(broker.addr, dir.path()).await;
    // One stream per group, all at once: each commits offsets 1..=ROUNDS in order.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..GROUPS {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let group = group(i);
        tasks.spawn(async move {
            for r in 1..=ROUNDS {
                let commit = e2e_support::commit_frame("acme/app/pos", &group, r, r);
                send.write_all(&commit.to_bytes()).await.unwrap();
                match &e2e_support::read_frames(&mut recv, 1).await[..] {
                    [Frame::CommitOk(id)] => assert_eq!(*id, RequestId(r)),
                    other => panic!("{group} round {r}: {other:?}"),
                }
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    let segments = || {
        let mut found = Vec::new();
        let mut dirs = vec![dir.path().to_owned()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "log")
                    && p.to_string_lossy().contains("offsets")
                {
                    found.push(p);
                }
            }
        }
        found
    };
    // 24,000 commits of ~300 bytes fill about two 4 MiB segments; the first goes (the
    // snapshot runs in a task of its own), and at most two are left.
    let deadline = std::time::Instant::now() + WAIT;
    let left = loop {
        let left = segments();
        let first = left.iter().any(|p| p.ends_with("00000000000000000000.log"));
        if !first || std::time::Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let first = left.iter().any(|p| p.ends_with("00000000000000000000.log"));
    assert!(!first && left.len() <= 2, "offsets segments left: {left:?}");
    drop(conn);
    client.close();
    broker.stop();
    let broker = TestBroker::start(dir.path(), 1, &segment);
    let client = broker.client().await;
    for i in [0, GROUPS / 2, GROUPS - 1] {
        let opts = SubscribeOptions::new("acme/app/pos").start(StartAt::Earliest).group(group(i));
        let mut sub = client.subscribe(opts).await.unwrap();
        let r = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(r.offset, Offset(ROUNDS), "group {i} resumes after its last commit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_disconnected_as_slow() {
    use felix_proto::{Capabilities, Frame, Hello, RequestId, Subscribe, PROTOCOL_VERSION};
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &["--slow-consumer-secs", "1"]);
    let client = broker.client().await;
    client.create_stream("acme/app/slow", 1, Default::default()).await.unwrap();
    // A raw subscriber that never reads its subscription stream.
    let conn = e2e_support::raw_connection(broker.addr, dir.path()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Frame::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::ALL,
        token: None,
    });
    send.write_all(&hello.to_bytes()).await.unwrap();
    let sub = Frame::Subscribe(Subscribe {
        request_id: RequestId(1),
        stream: "acme/app/slow".into(),
        shards: None,
        start: StartAt::Latest,
        group: None,
        positions: None,
    });
    send.write_all(&sub.to_bytes()).await.unwrap();
    let frames = e2e_support::read_frames(&mut recv, 2).await;
    assert!(matches!(frames.last(), Some(Frame::SubscribeOk(_))), "{frames:?}");
    let mut uni = conn.accept_uni().await.unwrap();
    // Far more than QUIC's windows hold.
    let p = client.publisher("acme/app/slow").await.unwrap();
    let payload = vec![7u8; 32 << 10];
    for _ in 0..400 {
        p.send(Record::unkeyed(payload.clone())).await.unwrap();
    }
    p.flush().await.unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while broker.counter("slow_consumers") == 0 {
        assert!(std::time::Instant::now() < deadline, "the slow subscriber was never disconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Reading now ends in a reset carrying SlowConsumer (18).
    let mut buf = vec![0u8; 1 << 20];
    let code = loop {
        match tokio::time::timeout(WAIT, uni.read(&mut buf)).await.unwrap() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream finished instead of reset"),
            Err(quinn::ReadError::Reset(code)) => break code.into_inner(),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(code, felix_proto::ErrorCode::SlowConsumer as u64);
}

/// A client whose pool reaches both of the broker's cores (its second connection asks for the
/// core the first did not land on).
async fn client_on_both_cores(broker: &TestBroker, per_core: bool) -> Client {
    let mut config = broker.client_config();
    config.subscribe_per_core = per_core;
    let client = broker.client_with(config).await;
    assert_eq!(client.cores_reached().len(), 2);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_core_sends_its_own_shards_to_a_subscription_split_by_core() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments (4 MiB): the subscriptions read 16 MB of log across its segment rolls.
    let broker = TestBroker::start(dir.path(), 2, &["--segment-bytes", "4198400"]);
    let stream = "acme/app/split";
    let (keys, per_key) = (16u32, 1000u32);
    {
        let client = broker.client().await;
        client.create_stream(stream, 4, Default::default()).await.unwrap();
        let p = client.publisher(stream).await.unwrap();
        let mut tickets = Vec::new();
        for seq in 0..per_key {
            for key in 0..keys {
                let mut value = seq.to_be_bytes().to_vec();
                value.resize(1000, key as u8);
                tickets.push(p.send(Record::keyed(format!("key-{key}"), value)).await.unwrap());
            }
        }
        for t in tickets {
            tokio::time::timeout(WAIT, t).await.unwrap().unwrap().expect("acked");
        }
    }
    let total = (keys * per_key) as usize;
    for per_core in [true, false] {
        let client = client_on_both_cores(&broker, per_core).await;
        let before = broker.counter_per_core("event_bytes");
        let options = SubscribeOptions::new(stream).start(StartAt::Earliest);
        let mut sub = client.subscribe(options).await.unwrap();
        assert_eq!(sub.parts(), if per_core { 2 } else { 1 });
        assert_eq!(sub.shards(), (0..4).map(ShardId).collect::<Vec<_>>());
        let mut read = e2e_support::ReadBack::default();
        for _ in 0..total {
            match tokio::time::timeout(WAIT, sub.next()).await {
                Ok(Ok(Some(r))) => read.add(&r, "split"),
                other => panic!("per_core {per_core}: {other:?}"),
            }
        }
        read.assert_ordered_and_dense(&format!("per_core {per_core}"));
        nothing_more(&mut sub).await;
        let sent: Vec<u64> = broker
            .counter_per_core("event_bytes")
            .iter()
            .zip(&before)
            .map(|(after, before)| after - before)
            .collect();
        match per_core {
            // Each core sent its own two shards' records.
            true => assert!(sent.iter().all(|&b| b > 1_000_000), "sent per core {sent:?}"),
            // One connection: its core sent every shard's records, the other core none.
            false => assert!(sent.iter().filter(|&&b| b > 0).count() == 1, "{sent:?}"),
        }
        client.close();
    }
}

/// A client of the broker at `addr` (trusting the development certificate in `dir`) on one
/// connection, that reconnects quickly and patiently (restarts).
fn patient_config(addr: &str, dir: &std::path::Path) -> felix_client::ClientConfig {
    felix_client::ClientConfig {
        addr: addr.to_owned(),
        trust: Some(felix_client::Trust::CaFile(dir.join("dev-cert.pem"))),
        connections: Some(1),
        connect_timeout_ms: 1_000,
        reconnect_attempts_max: 200,
        reconnect_backoff_min_ms: 20,
        reconnect_backoff_max_ms: 100,
        publish: PublishSettings { linger_us: 200, ..PublishSettings::default() },
        ..felix_client::ClientConfig::default()
    }
}

/// Stops the broker process gracefully (SIGTERM) and starts a new one on its address and
/// directory, without blocking the test's runtime (subscribers go on reading).
async fn restart(broker: Killed, dir: &std::path::Path, addr: &str, extra: &[&str]) -> Killed {
    let (dir, addr) = (dir.to_owned(), addr.to_owned());
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        broker.terminate();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        e2e_support::spawn_felix_cores(&dir, &addr, 1, &extra)
    })
    .await
    .expect("restart")
}

/// The offset of the next record of `sub`, which must come: never the end of the subscription.
fn offset_of(
    next: Result<Result<Option<felix_client::ReceivedRecord>, ClientError>, impl std::fmt::Debug>,
    read: usize,
) -> u64 {
    match next {
        Ok(Ok(Some(r))) => r.offset.0,
        Ok(Ok(None)) => panic!("the subscription ended (Ok(None)) after {read} records"),
        other => panic!("after {read} records: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_resumes_across_graceful_restarts_without_loss_or_duplicates() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    // A stopping broker used to finish its subscription streams before it closed their
    // connections, and a subscriber often read that as the end of its subscription: with
    // several restarts, at least one of them shows it.
    const RESTARTS: usize = 6;
    const STREAM: &str = "acme/app/restarts";
    let dir = tempfile::tempdir().unwrap();
    let addr = e2e_support::free_addr_for_restarts();
    let mut broker = e2e_support::spawn_felix_cores(dir.path(), &addr, 1, &[]);
    let client = e2e_support::connect_when_up(&addr, dir.path(), patient_config).await;
    client.create_stream(STREAM, 1, Default::default()).await.unwrap();
    // A publish loop, across the restarts; `acked` is one past the highest acked offset.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let publisher = {
        let (stop, acked) = (stop.clone(), acked.clone());
        let producer = e2e_support::connect_when_up(&addr, dir.path(), patient_config).await;
        tokio::spawn(async move {
            let settings = PublishSettings {
                ack_mode: AckMode::Durable,
                linger_us: 50,
                ..PublishSettings::default()
            };
            let p = producer.publisher_with(STREAM, settings).await.unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let sent = p.publish(Record::unkeyed(format!("v{i}")));
                match tokio::time::timeout(Duration::from_secs(5), sent).await {
                    Ok(Ok(Some(receipt))) => {
                        acked.fetch_max(receipt.offset.0 + 1, Ordering::Relaxed);
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
                i += 1;
            }
        })
    };
    let mut sub = client.subscribe(SubscribeOptions::new(STREAM)).await.unwrap();
    let mut offsets: Vec<u64> = Vec::new();
    for round in 0..=RESTARTS {
        // Some records from this broker first.
        let until = offsets.len() + 20;
        while offsets.len() < until {
            let next = tokio::time::timeout(WAIT, sub.next()).await;
            offsets.push(offset_of(next, offsets.len()));
        }
        if round == RESTARTS {
            break;
        }
        // Stopped gracefully and started again on its address, while the subscriber reads.
        let mut restarted = std::pin::pin!(restart(broker, dir.path(), &addr, &[]));
        broker = loop {
            tokio::select! {
                b = &mut restarted => break b,
                next = tokio::time::timeout(WAIT, sub.next()) => {
                    offsets.push(offset_of(next, offsets.len()));
                }
            }
        };
    }
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();
    let end = acked.load(Ordering::Relaxed);
    while offsets.last().is_none_or(|o| o + 1 < end) {
        let next = tokio::time::timeout(WAIT, sub.next()).await;
        offsets.push(offset_of(next, offsets.len()));
    }
    for w in offsets.windows(2) {
        assert_eq!(w[1], w[0] + 1, "records lost or repeated across a restart");
    }
    assert!(sub.resumes() >= RESTARTS as u64, "resumes: {}", sub.resumes());
    assert_eq!(sub.skipped(), 0);
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_subscriptions_on_a_quiet_stream_free_their_slots() {
    use felix_broker::app::subscribe::SUBSCRIPTIONS_PER_CONN_MAX;
    const STREAM: &str = "acme/app/quiet";
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &[]);
    let client = broker.client_with(patient_config(&broker.addr.to_string(), dir.path())).await;
    client.create_stream(STREAM, 1, Default::default()).await.unwrap();
    // Each dropped subscriber stops its stream; no record ever comes to end it otherwise. The
    // broker may see a Subscribe before the previous stream's STOP_SENDING: a subscription
    // refused for the limit is asked again for a while.
    for i in 0..SUBSCRIPTIONS_PER_CONN_MAX + 16 {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match client.subscribe(SubscribeOptions::new(STREAM)).await {
                Ok(sub) => break drop(sub),
                Err(ClientError::Broker { code: ErrorCode::LimitReached, .. })
                    if std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("subscription {i}: {e}"),
            }
        }
    }
    // Every slot but the one taken here is free: SUBSCRIPTIONS_PER_CONN_MAX - 1 more fit.
    let mut subs = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while subs.len() < SUBSCRIPTIONS_PER_CONN_MAX {
        match client.subscribe(SubscribeOptions::new(STREAM)).await {
            Ok(sub) => subs.push(sub),
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(matches!(e, ClientError::Broker { code: ErrorCode::LimitReached, .. }));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("after {} subscriptions: {e}", subs.len()),
        }
    }
    publish(&client, STREAM, 0, 1).await;
    for sub in &mut subs {
        assert_eq!(values(sub, 1).await, vals(0..1));
    }
    assert!(client.subscribe(SubscribeOptions::new(STREAM)).await.is_err(), "over the limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_shard_resume_past_retention_continues_at_the_oldest_retained_record() {
    const STREAM: &str = "acme/app/retained";
    const SEGMENT_BYTES: &str = "4198400";
    let flags = ["--segment-bytes", SEGMENT_BYTES];
    let dir = tempfile::tempdir().unwrap();
    let addr = e2e_support::free_addr_for_restarts();
    let broker = e2e_support::spawn_felix_cores(dir.path(), &addr, 1, &flags);
    let client = e2e_support::connect_when_up(&addr, dir.path(), patient_config).await;
    let retention = felix_client::Retention { bytes_max: Some(4198400), age_max_ms: None };
    client.create_stream(STREAM, 1, retention).await.unwrap();
    publish(&client, STREAM, 0, 10).await;
    let mut sub =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    assert_eq!(values(&mut sub, 5).await, vals(0..5));
    // The subscriber's connection is lost (a restart); while it is away, retention deletes
    // the records after those it read.
    let _broker = restart(broker, dir.path(), &addr, &flags).await;
    let writer = e2e_support::connect_when_up(&addr, dir.path(), patient_config).await;
    let settings = PublishSettings { ack_mode: AckMode::Durable, ..PublishSettings::default() };
    let p = writer.publisher_with(STREAM, settings).await.unwrap();
    let payload = "x".repeat(4000);
    let deadline = std::time::Instant::now() + 2 * WAIT;
    let mut published = 10u64;
    loop {
        // Over three segments' worth, then retention runs (every 10 s).
        if published < 3_500 {
            let mut tickets = Vec::new();
            for _ in 0..100 {
                tickets.push(p.send(Record::unkeyed(payload.clone())).await.unwrap());
            }
            for t in tickets {
                t.await.unwrap();
            }
            published += 100;
            continue;
        }
        let probe = SubscribeOptions::new(STREAM).start(StartAt::Offset(Offset(10))).resume(false);
        let answer = writer.subscribe(probe).await;
        if matches!(answer, Err(ClientError::Broker { code: ErrorCode::OffsetOutOfRange, .. })) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "retention deleted nothing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The subscriber continues at the oldest retained record, and counts what it skipped.
    let mut read = 5u64;
    let first = loop {
        let r = tokio::time::timeout(WAIT, sub.next()).await.expect("stalled");
        let r = r.expect("resumed").expect("not ended");
        if r.offset.0 < 10 {
            assert_eq!(r.offset.0, read, "read from before the restart");
            read += 1;
            continue;
        }
        break r;
    };
    assert!(first.offset.0 > read, "{first:?} was deleted");
    assert_eq!(sub.skipped(), first.offset.0 - read);
    assert!(sub.resumes() >= 1);
    let r = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(r.offset.0, first.offset.0 + 1);
}
