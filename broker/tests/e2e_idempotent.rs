//! Idempotent publishing across kill -9: a client keeps publishing (many batches in flight)
//! while the broker is killed and restarted on the same address and data directory. Every
//! batch is sent again on the new connection with its producer tag, so every record the
//! application sent is acked, and stored exactly once, in order per key, with dense offsets.
//!
//! Without the producer tags this fails: a batch written before the kill (O_DIRECT writes
//! survive a killed process) but not yet acked is stored again by its retry.

mod e2e_support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use e2e_support::{
    connect_when_up, free_addr, retrying_client_config, spawn_felix, ReadBack, TestBroker, WAIT,
};
use felix_client::{
    AckMode, ClientConfig, PublishSettings, Receipt, Record, StartAt, SubscribeOptions,
};

const TRIALS: u64 = 3;
const KEYS: u32 = 6;
const STREAM: &str = "acme/app/idem";

/// The smallest segments storage allows (a header block and one full write).
const SEGMENT_FLAGS: [&str; 2] = ["--segment-bytes", "4198400"];

fn client_config(addr: &str, dir: &std::path::Path) -> ClientConfig {
    retrying_client_config(addr, &dir.join("dev-cert.pem"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_batches_after_kill_9_are_stored_exactly_once() {
    let seed: u64 =
        std::env::var("FELIX_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    println!("idempotent kill -9 test seed {seed} (rerun with FELIX_TEST_SEED={seed})");
    let mut rng = seed;
    for trial in 0..TRIALS {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let kill_after = Duration::from_millis(200 + (rng >> 33) % 500);
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let child = spawn_felix(dir.path(), &addr, &SEGMENT_FLAGS);
        let client = connect_when_up(&addr, dir.path(), client_config).await;
        client.create_stream(STREAM, 4, Default::default()).await.unwrap();
        let publisher = client.publisher(STREAM).await.unwrap();

        // Send without waiting for acks, so that batches are in flight at the kill.
        let started = Instant::now();
        let mut tickets = Vec::new();
        let mut sent = 0u32;
        let mut child = Some(child);
        let mut killed_at = None;
        while started.elapsed() < kill_after + Duration::from_millis(600) {
            for key in 0..KEYS {
                let rec = Record::keyed(format!("key-{key}"), sent.to_be_bytes().to_vec());
                tickets.push((key, sent, publisher.send(rec).await.unwrap()));
            }
            sent += 1;
            if killed_at.is_none() && started.elapsed() >= kill_after {
                drop(child.take()); // SIGKILL
                killed_at = Some(Instant::now());
                tokio::time::sleep(Duration::from_millis(200)).await;
                child = Some(spawn_felix(dir.path(), &addr, &SEGMENT_FLAGS));
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let mut acked = 0;
        for (key, seq, ticket) in tickets {
            match tokio::time::timeout(Duration::from_secs(40), ticket).await {
                Ok(Ok(Some(Receipt { .. }))) => acked += 1,
                other => panic!("trial {trial} seed {seed}: ({key}, {seq}) not acked: {other:?}"),
            }
        }
        client.close();
        drop(child);

        let broker = TestBroker::start(dir.path(), 2, &SEGMENT_FLAGS);
        let reader = broker.client().await;
        let mut sub =
            reader.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
        let what = format!("trial {trial} seed {seed}");
        let mut back = ReadBack::default();
        let total = KEYS as usize * sent as usize;
        let deadline = Instant::now() + WAIT;
        while back.all.len() < total && Instant::now() < deadline {
            let Ok(next) = tokio::time::timeout(Duration::from_secs(2), sub.next()).await else {
                break;
            };
            back.add(&next.unwrap().expect("subscription ended"), &what);
        }
        // Nothing more than what was sent (a duplicate would show up as a later record).
        if let Ok(Ok(Some(r))) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await
        {
            panic!("{what}: a record beyond those sent: {r:?}");
        }
        assert_eq!(back.all.len(), total, "{what}: records missing");
        back.assert_ordered_and_dense(&what);
        println!(
            "trial {trial}: killed after {kill_after:?}, {} sent, {acked} acked, {} stored",
            total,
            back.all.len()
        );
    }
}

/// Unkeyed idempotent batches go to their producer's shard (`producer id mod shards`); the
/// client draws each unkeyed producer's id so that shard lives on the core its connection
/// reached, so no batch crosses cores inside the broker, and every record is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_idempotent_batches_stay_on_the_core_they_reach() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    client.create_stream(STREAM, 6, Default::default()).await.unwrap();
    let settings = PublishSettings {
        ack_mode: AckMode::Durable,
        linger_us: 50,
        batch_records_max: 4,
        ..PublishSettings::default()
    };
    let publisher = client.publisher_with(STREAM, settings).await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..400u32 {
        tickets.push(publisher.send(Record::unkeyed(i.to_be_bytes().to_vec())).await.unwrap());
    }
    publisher.flush().await.unwrap();
    let mut shards = HashSet::new();
    for t in tickets {
        let receipt = tokio::time::timeout(WAIT, t).await.unwrap().unwrap().expect("acked");
        shards.insert(receipt.shard.0);
    }
    assert!(broker.counter("publishes") >= 100, "the records went in batches");
    assert_eq!(broker.counter("forwarded_out"), 0, "an unkeyed batch crossed cores");
    assert_eq!(broker.counter("publish_duplicates"), 0);
    // Both cores' connections published (the client covers every core).
    let cores: HashSet<u32> = shards.iter().map(|s| s % 2).collect();
    assert_eq!(cores.len(), 2, "shards used: {shards:?}");
    let mut sub =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    let mut seen = HashSet::new();
    while seen.len() < 400 {
        let r = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().expect("record");
        assert!(seen.insert(u32::from_be_bytes(r.value[..4].try_into().unwrap())), "twice");
    }
}
