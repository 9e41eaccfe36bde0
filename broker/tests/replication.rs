//! Replicated streams on three `felix serve` processes, each in a network namespace of its own,
//! with an etcd of the test's own (docs/replication.md). Several producers publish durable,
//! idempotent, keyed records without pause while the leader of a shard is hit by a fault:
//! kill -9 (then restarted), cut off the network (its link down, then up again), paused past
//! its lease (SIGSTOP, then SIGCONT), or cut off from etcd and the other brokers while its
//! clients still reach it (nftables rules in its namespace, then removed). After every trial the cluster heals (every group's
//! in-sync set full again); at the end a subscriber reads every shard from offset 0 and the
//! checker requires every acked record exactly once, each key's records in order, offsets
//! dense per shard, and nothing that was never published. Failover time (from the fault to
//! the first ack of the new leader) is printed per trial, with the median and the maximum.
//!
//! Also: a follower behind the leader's archive catches up from its stored log, and no replica
//! starts from a deposed controller's group records before the stream is placed.
//!
//! `FELIX_REPLICATION_TRIALS` sets the number of trials (default 24; the faults take turns:
//! four kinds with network namespaces and `nft`, fewer without);
//! `FELIX_TEST_KEEP=1` keeps the brokers' data directories and logs.

mod cluster_support;
mod e2e_support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::{status, Hosts, Node, TTL_S};
use e2e_support::{retrying_client_config, ReadBack, WAIT};
use felix_client::{Client, ClientConfig, Record, StartAt, SubscribeOptions};
use felix_cluster::testing::Etcd;

const STREAM: &str = "acme/app/replicated";
const SHARDS: u32 = 3;
const KEYS: u32 = 6;
const PRODUCERS: u32 = 2;
/// Keys `KEYS..KEYS + PLAIN_KEYS` come from a producer that is not idempotent: its batches in
/// flight at a fault fail (or, refused after the leader wrote them, may be stored twice), so
/// only what a subscriber saw of them is checked (it must be in the final log: a leader cut
/// off keeps taking such batches it can never commit, and they must stay invisible).
const PLAIN_KEYS: u32 = 2;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    /// Its link down: cut off from everything.
    Partition,
    Pause,
    /// nftables rules: cut off from etcd and the other brokers, still reached by clients (it
    /// keeps taking appends it cannot commit until its lease runs out; a subscriber there
    /// must not see them, and after the heal they are truncated).
    Isolate,
}

/// Starts b1-b3 with replication factor 3; b2 and b3 get b1's development certificate, so
/// the brokers verify each other (and clients verify all of them) with one certificate.
fn start_brokers(hosts: &std::rc::Rc<Hosts>, root: &std::path::Path, etcd: &str) -> Vec<Node> {
    let mut nodes = start_first(hosts, root, etcd);
    for i in 1..3 {
        start_next(hosts, root, etcd, &mut nodes, i);
    }
    nodes
}

/// The extra `felix serve` arguments of these tests' brokers.
const EXTRA: [&str; 4] = ["--segment-bytes", "4198400", "--replica-resident-bytes", "65536"];

/// Starts b1, and waits for its development certificate.
fn start_first(hosts: &std::rc::Rc<Hosts>, root: &std::path::Path, etcd: &str) -> Vec<Node> {
    start_first_with(hosts, root, etcd, &EXTRA)
}

/// [`start_first`] with these `felix serve` arguments.
fn start_first_with(
    hosts: &std::rc::Rc<Hosts>,
    root: &std::path::Path,
    etcd: &str,
    extra: &[&str],
) -> Vec<Node> {
    // The test's stream asks for its replicas itself (CreateStream flag REPLICAS); the brokers
    // keep their default (3 in a cluster of three), which a second stream checks.
    // A small resident set (64 KiB of payloads), so replicas archive old batches and a
    // follower that fell behind catches up from the leader's stored log (`FetchFromLog`).
    let first = Node::start_with(hosts, 0, "b1", root, etcd, extra);
    let deadline = Instant::now() + WAIT;
    while !(first.dir.join("dev-cert.pem").exists() && first.dir.join("dev-key.pem").exists()) {
        assert!(Instant::now() < deadline, "b1 made no certificate: {}", first.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    vec![first]
}

/// Starts broker `b<i + 1>` on host `i` with b1's certificate.
fn start_next(
    hosts: &std::rc::Rc<Hosts>,
    root: &std::path::Path,
    etcd: &str,
    nodes: &mut Vec<Node>,
    i: usize,
) {
    start_next_with(hosts, root, etcd, nodes, i, &EXTRA);
}

/// [`start_next`] with these `felix serve` arguments.
fn start_next_with(
    hosts: &std::rc::Rc<Hosts>,
    root: &std::path::Path,
    etcd: &str,
    nodes: &mut Vec<Node>,
    i: usize,
    extra: &[&str],
) {
    let id = format!("b{}", i + 1);
    let dir = root.join(&id);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["dev-cert.pem", "dev-key.pem"] {
        std::fs::copy(nodes[0].dir.join(f), dir.join(f)).unwrap();
    }
    nodes.push(Node::start_with(hosts, i, &id, root, etcd, extra));
}

fn client_config(nodes: &[Node]) -> ClientConfig {
    let addr = nodes[0].addr.to_string();
    let mut config = retrying_client_config(&addr, &nodes[0].dir.join("dev-cert.pem"));
    // A broker that is down is left for the shard's next leader, not waited for.
    config.reconnect_attempts_max = 2;
    config.publish.in_flight_batches_max = 16;
    config.publish.retry_timeout_ms = 30_000;
    config
}

async fn connect(nodes: &[Node]) -> Client {
    let deadline = Instant::now() + WAIT;
    loop {
        match Client::connect(client_config(nodes)).await {
            Ok(c) => return c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no client: {e}; b1: {}", nodes[0].log_text());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The groups of STREAM as etcd holds them: (shard, leader, live, in-sync count).
async fn groups(etcd: &str) -> Vec<(u32, String, bool, usize)> {
    let cluster = felix_broker::config::DEFAULT_CLUSTER_NAME;
    let Ok(st) = felix_cluster::cluster_status(&[etcd.to_owned()], cluster).await else {
        return Vec::new();
    };
    let Some(stream) = st.streams.iter().find(|s| s.name == STREAM) else { return Vec::new() };
    stream
        .groups
        .iter()
        .map(|g| {
            let leader = g.leader.as_ref().map_or_else(String::new, |l| l.to_string());
            (g.shard, leader, g.leader_live, g.isr.len())
        })
        .collect()
}

/// Waits until every shard has a live leader and three in-sync replicas.
async fn wait_healthy(etcd: &str, nodes: &[Node], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let g = groups(etcd).await;
        if g.len() == SHARDS as usize && g.iter().all(|(_, _, live, isr)| *live && *isr == 3) {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = nodes.iter().map(|n| n.log_text()).collect();
            panic!("{what}: never healthy: {g:?}\nlogs:\n{}", logs.join("\n----\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the producers sent and what was acked, shared with the test.
#[derive(Default)]
struct Sent {
    sent: HashSet<(u32, u32)>,
    acked: HashSet<(u32, u32)>,
    failed: Vec<String>,
    /// Acks of records of shard 0's keys, with when they came back.
    acks_at: Vec<Instant>,
    /// Records of the plain producer that failed.
    plain_failed: u64,
}

/// One producer: keys `key0 + k * PRODUCERS`, each record `seq` of its key, until `stop`.
async fn produce(
    client: Client,
    keys: Vec<u32>,
    sent: Arc<Mutex<Sent>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let publisher = client.publisher(STREAM).await.unwrap();
    let plain = keys.iter().any(|k| *k >= KEYS);
    let mut seq = 0u32;
    let mut waiting = tokio::task::JoinSet::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for &key in &keys {
            let rec = Record::keyed(format!("key-{key}"), seq.to_be_bytes().to_vec());
            sent.lock().unwrap().sent.insert((key, seq));
            let ticket = match publisher.send(rec).await {
                Ok(t) => t,
                Err(_) if plain => continue,
                Err(e) => {
                    sent.lock().unwrap().failed.push(format!("({key}, {seq}) send: {e}"));
                    continue;
                }
            };
            let sent = sent.clone();
            waiting.spawn(async move {
                let r = ticket.await;
                let mut s = sent.lock().unwrap();
                match r {
                    Ok(Some(_)) if plain => {}
                    Err(_) if plain => s.plain_failed += 1,
                    Ok(Some(receipt)) => {
                        s.acked.insert((key, seq));
                        if receipt.shard.0 == 0 {
                            s.acks_at.push(Instant::now());
                        }
                    }
                    other => s.failed.push(format!("({key}, {seq}): {other:?}")),
                }
            });
        }
        seq += 1;
        // Bounded: at most a few hundred records waiting for acks.
        while waiting.len() > 256 {
            waiting.join_next().await;
        }
        // About 150 records a second per producer: the test is about faults, and etcd,
        // three debug-built brokers and the clients share two CPUs.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while waiting.join_next().await.is_some() {}
}

/// What a subscriber saw while the faults struck: (shard, offset) -> (key, seq). A record is
/// visible only once committed, so nothing seen here may differ from the final log.
type Seen = Arc<Mutex<std::collections::HashMap<(u32, u64), (u32, u32)>>>;

/// Subscribes from the earliest offset and records every delivery, subscribing again after an
/// error (a leader gone), until `stop`.
async fn watch(client: Client, seen: Seen, stop: Arc<std::sync::atomic::AtomicBool>) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let opts = SubscribeOptions::new(STREAM).start(StartAt::Earliest);
        let Ok(mut sub) = client.subscribe(opts).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
                Ok(Ok(Some(r))) => {
                    let key: u32 = String::from_utf8_lossy(r.key.as_ref().unwrap())["key-".len()..]
                        .parse()
                        .unwrap();
                    let seq = u32::from_be_bytes(r.value[..4].try_into().unwrap());
                    let mut seen = seen.lock().unwrap();
                    let before = seen.insert((r.shard.0, r.offset.0), (key, seq));
                    assert!(
                        before.is_none_or(|b| b == (key, seq)),
                        "({}, {}) delivered as {before:?} and later as {:?}",
                        r.shard.0,
                        r.offset.0,
                        (key, seq)
                    );
                }
                Ok(Ok(None)) | Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_records_survive_leader_faults_exactly_once() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let trials: usize =
        std::env::var("FELIX_REPLICATION_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(24);
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let url = etcd.client_url.clone();
    // FELIX_TEST_KEEP=1 keeps the brokers' data directories and logs.
    let root = tempfile::tempdir().unwrap();
    let (root, _remove) = match std::env::var_os("FELIX_TEST_KEEP") {
        Some(_) => {
            let kept = root.keep();
            println!("keeping {}", kept.display());
            (kept, None)
        }
        None => (root.path().to_owned(), Some(root)),
    };
    let mut nodes = start_brokers(&hosts, &root, &url);
    let client = connect(&nodes).await;
    client.create_stream_with(STREAM, SHARDS, Default::default(), Some(3)).await.expect("create");
    let again = client.create_stream_with(STREAM, SHARDS, Default::default(), Some(1)).await;
    assert!(
        matches!(
            again,
            Err(felix_client::ClientError::Broker {
                code: felix_proto::ErrorCode::StreamExists,
                ..
            })
        ),
        "{again:?}"
    );
    wait_healthy(&url, &nodes, "after creation").await;
    // Without a factor, a stream created in a cluster of three gets three replicas.
    client.create_stream("acme/app/defaulted", 1, Default::default()).await.expect("create");
    let cluster = felix_broker::config::DEFAULT_CLUSTER_NAME;
    let st = felix_cluster::cluster_status(std::slice::from_ref(&url), cluster).await.unwrap();
    let defaulted = st.streams.iter().find(|s| s.name == "acme/app/defaulted").unwrap();
    assert_eq!(defaulted.replicas, 3, "the default replication factor in a cluster");

    let sent = Arc::new(Mutex::new(Sent::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let c = connect(&nodes).await;
        let keys = (0..KEYS).filter(|k| k % PRODUCERS == p).collect();
        producers.push(tokio::spawn(produce(c, keys, sent.clone(), stop.clone())));
    }
    let mut plain = client_config(&nodes);
    plain.publish.idempotent = false;
    let plain = Client::connect(plain).await.expect("plain client");
    let keys = (KEYS..KEYS + PLAIN_KEYS).collect();
    producers.push(tokio::spawn(produce(plain, keys, sent.clone(), stop.clone())));
    let seen: Seen = Arc::default();
    let watcher = tokio::spawn(watch(connect(&nodes).await, seen.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let etcd_port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
    let nft =
        hosts.isolated() && std::process::Command::new("nft").arg("--version").output().is_ok();
    let kinds: Vec<Fault> = match (hosts.isolated(), nft) {
        (true, true) => vec![Fault::Kill, Fault::Partition, Fault::Pause, Fault::Isolate],
        (true, false) => vec![Fault::Kill, Fault::Partition, Fault::Pause],
        _ => vec![Fault::Kill, Fault::Pause],
    };
    println!("faults: {kinds:?}");
    let mut failovers = Vec::new();
    for trial in 0..trials {
        let fault = kinds[trial % kinds.len()];
        let leader = groups(&url).await.into_iter().find(|g| g.0 == 0).map(|g| g.1).unwrap();
        let at = nodes.iter().position(|n| n.id == leader).unwrap();
        let struck = Instant::now();
        match fault {
            Fault::Kill => nodes[at].kill9(),
            Fault::Partition => assert!(hosts.cut(at)),
            Fault::Pause => nodes[at].signal("STOP"),
            Fault::Isolate => assert!(hosts.isolate(at, etcd_port)),
        }
        // Past the lease: another replica leads, and acks again.
        let deadline = struck + Duration::from_secs(TTL_S + 20);
        let failover = loop {
            let first = sent
                .lock()
                .unwrap()
                .acks_at
                .iter()
                .copied()
                .find(|t| *t > struck + Duration::from_millis(200));
            let new_leader = groups(&url)
                .await
                .into_iter()
                .find(|g| g.0 == 0)
                .is_some_and(|g| g.1 != leader && g.2);
            if let (Some(t), true) = (first, new_leader) {
                break t - struck;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = nodes.iter().map(|n| n.log_text()).collect();
                let now_groups = groups(&url).await;
                let s = sent.lock().unwrap();
                let pending: Vec<(u32, Option<u32>, Option<u32>)> = (0..KEYS)
                    .map(|k| {
                        let unacked = s
                            .sent
                            .iter()
                            .filter(|(key, q)| *key == k && !s.acked.contains(&(k, *q)))
                            .map(|x| x.1)
                            .min();
                        let acked = s.acked.iter().filter(|(key, _)| *key == k).map(|x| x.1).max();
                        (k, unacked, acked)
                    })
                    .collect();
                panic!(
                    "trial {trial} ({fault:?} of {leader}): no new leader acked: {:?}; {} sent, {} acked, {} shard-0 acks, failed {:?}; per key (first unacked, last acked) {pending:?}\nlogs:\n{}",
                    now_groups,
                    s.sent.len(),
                    s.acked.len(),
                    s.acks_at.len(),
                    s.failed.iter().take(5).collect::<Vec<_>>(),
                    logs.join("\n----\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        failovers.push(failover);
        match fault {
            Fault::Kill => nodes[at].spawn(),
            Fault::Partition => assert!(hosts.heal(at)),
            Fault::Pause => nodes[at].signal("CONT"),
            Fault::Isolate => assert!(hosts.unisolate(at)),
        }
        wait_healthy(&url, &nodes, &format!("trial {trial} ({fault:?} of {leader})")).await;
        let s = sent.lock().unwrap();
        println!(
            "trial {trial}: {fault:?} of {leader}: failover {failover:?}; {} sent, {} acked, {} failed {:?}",
            s.sent.len(),
            s.acked.len(),
            s.failed.len(),
            s.failed.iter().take(3).collect::<Vec<_>>()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for p in producers {
        p.await.unwrap();
    }
    watcher.await.unwrap();
    let s = std::mem::take(&mut *sent.lock().unwrap());
    assert!(s.failed.is_empty(), "records failed: {:?}", &s.failed[..s.failed.len().min(10)]);

    // Read back everything, from offset 0 of every shard.
    let reader = connect(&nodes).await;
    let mut sub =
        reader.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    let mut back = ReadBack::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !s.acked.is_subset(&back.all) && Instant::now() < deadline {
        let Ok(next) = tokio::time::timeout(Duration::from_secs(5), sub.next()).await else {
            break;
        };
        let r = next.unwrap().expect("subscription ended");
        back.add_keyed(&r, |k| k >= KEYS, "read-back");
    }
    while let Ok(Ok(Some(r))) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        back.add_keyed(&r, |k| k >= KEYS, "read-back");
    }
    // Nothing a subscriber saw during the faults was taken back or changed.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(!seen.is_empty(), "the subscriber saw nothing during the faults");
    let stored = back.by_position();
    for (at, record) in &seen {
        assert_eq!(stored.get(at), Some(record), "seen at (shard, offset) {at:?}");
    }
    // Issue 41, item 7: the plain producer's client resends only what the brokers said was
    // not stored (ShardUnavailable, NotOwner); a batch a leader appended and then could not
    // commit is `OutcomeUnknown` and fails instead. So none of its records is stored twice.
    let mut plain_copies: std::collections::HashMap<(u32, u32), u32> = Default::default();
    for record in stored.values().filter(|(key, _)| *key >= KEYS) {
        *plain_copies.entry(*record).or_default() += 1;
    }
    let twice: Vec<_> = plain_copies.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(twice.is_empty(), "records of the plain producer stored twice: {twice:?}");
    let never_sent: Vec<_> = back.all.difference(&s.sent).take(10).collect();
    assert!(never_sent.is_empty(), "stored but never published: {never_sent:?}");
    back.assert_acked_in_order_and_dense(&s.acked, "read-back");

    // `felix cluster status` shows each follower's lag from the leaders' metrics: every
    // shard's two followers, caught up.
    let deadline = Instant::now() + WAIT;
    loop {
        let st = status(&url);
        let lags = st["lag"].as_array().cloned().unwrap_or_default();
        let caught_up = (0..SHARDS).all(|shard| {
            let of: Vec<_> =
                lags.iter().filter(|l| l["shard"] == shard && l["stream"] == STREAM).collect();
            of.len() == 2 && of.iter().all(|l| l["records"] == 0 && l["bytes"] == 0)
        });
        if caught_up {
            break;
        }
        assert!(Instant::now() < deadline, "lag never 0 for every follower: {lags:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // How much of the log the replicas archived and served from storage (counters since each
    // broker's last restart; whether a trial crosses the archive depends on its rate, so this
    // is reported; `a_follower_behind_the_archive_catches_up_from_the_leaders_log` asserts it).
    let sum = |metric: &str| nodes.iter().map(|n| n.metric_sum(metric)).sum::<f64>();
    let archived = sum("felix_broker_replication_batches_archived_total");
    let from_log = sum("felix_broker_replication_fetches_from_log_total");
    println!("batches archived {archived}, fetch replies read from storage {from_log}");

    failovers.sort();
    let median = failovers.get(failovers.len() / 2).copied().unwrap_or_default();
    let max = failovers.last().copied().unwrap_or_default();
    println!(
        "{} trials: {} records sent, {} idempotent ones acked, {} stored, {} seen live, {} plain ones failed; failover median {median:?}, max {max:?} (lease TTL {TTL_S} s)",
        failovers.len(),
        s.sent.len(),
        s.acked.len(),
        back.all.len(),
        seen.len(),
        s.plain_failed
    );
    reader.close();
    client.close();
    drop(nodes);
    drop(etcd);
}

/// A follower paused while the leader takes 3,000 one-record batches (far past its resident
/// 64 KiB and the 1,024-batch archiving step) falls behind the leader's archived prefix; once
/// resumed it is answered from the leader's stored log (`FetchFromLog`), rejoins every in-sync
/// set and its lag returns to 0; then, with the old leader killed, the cluster still serves
/// every acked record of the shard from offset 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_archive_catches_up_from_the_leaders_log() {
    const BATCHES: u32 = 3_000;
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let url = etcd.client_url.clone();
    let root = tempfile::tempdir().unwrap();
    let mut nodes = start_brokers(&hosts, root.path(), &url);
    let client = connect(&nodes).await;
    client.create_stream_with(STREAM, SHARDS, Default::default(), Some(3)).await.expect("create");
    wait_healthy(&url, &nodes, "after creation").await;
    let leader = groups(&url).await.into_iter().find(|g| g.0 == 0).map(|g| g.1).unwrap();
    let at = nodes.iter().position(|n| n.id == leader).unwrap();
    let paused = (at + 1) % nodes.len();
    nodes[paused].signal("STOP");

    // Keys of shard 0, one record per batch.
    let keys: Vec<String> = (0..)
        .map(|k| format!("k{k}"))
        .filter(|k| felix_proto::shard_for_key(k.as_bytes(), SHARDS).0 == 0)
        .take(4)
        .collect();
    let settings = felix_client::PublishSettings {
        batch_records_max: 1,
        linger_us: 0,
        ..client_config(&nodes).publish
    };
    let publisher = client.publisher_with(STREAM, settings).await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..BATCHES {
        let key = &keys[i as usize % keys.len()];
        tickets.push(publisher.send(Record::keyed(key.clone(), vec![7u8; 100])).await.unwrap());
    }
    for t in tickets {
        let acked = tokio::time::timeout(Duration::from_secs(60), t).await.expect("ack stalled");
        assert!(matches!(acked, Ok(Some(_))), "{acked:?}");
    }
    nodes[paused].signal("CONT");
    wait_healthy(&url, &nodes, "after the paused follower resumed").await;

    let sum = |metric: &str| nodes.iter().map(|n| n.metric_sum(metric)).sum::<f64>();
    let deadline = Instant::now() + WAIT;
    loop {
        let lag = sum("felix_replica_lag_records");
        let from_log = sum("felix_broker_replication_fetches_from_log_total");
        let archived = sum("felix_broker_replication_batches_archived_total");
        if lag == 0.0 && from_log > 0.0 {
            println!("archived {archived} batches, {from_log} fetch replies read from storage");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lag {lag}, fetch replies from storage {from_log}, archived {archived}; logs:\n{}",
            nodes.iter().map(|n| n.log_text()).collect::<Vec<_>>().join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The leader gone, a follower leads (the resumed one or the other) and still holds every
    // acked batch of shard 0 from offset 0.
    nodes[at].kill9();
    let deadline = Instant::now() + Duration::from_secs(TTL_S + 20);
    while !groups(&url).await.iter().any(|g| g.0 == 0 && g.1 != leader && g.2) {
        assert!(Instant::now() < deadline, "no new leader of shard 0");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reader = connect(&nodes[paused..=paused]).await;
    let options = SubscribeOptions::new(STREAM)
        .start(StartAt::Earliest)
        .shards(vec![felix_proto::ShardId(0)]);
    let mut sub = reader.subscribe(options).await.expect("subscribe after the kill");
    for offset in 0..u64::from(BATCHES) {
        let r = tokio::time::timeout(Duration::from_secs(30), sub.next())
            .await
            .expect("read-back stalled")
            .expect("read-back")
            .expect("ended");
        assert_eq!((r.shard.0, r.offset.0), (0, offset));
    }
    reader.close();

    // The old leader restarts from its replica checkpoint (it archived most of shard 0): it
    // reads only the batches after the checkpoint, and rejoins the in-sync set.
    let before = nodes[at].log_text().len();
    nodes[at].spawn();
    wait_healthy(&url, &nodes, "after the old leader restarted").await;
    // The log may be coloured: drop the escape sequences (ESC [ ... m).
    let mut log = String::new();
    let mut escaped = false;
    for c in nodes[at].log_text()[before..].chars() {
        match (escaped, c) {
            (false, '\u{1b}') => escaped = true,
            (true, 'm') => escaped = false,
            (true, _) => {}
            (false, c) => log.push(c),
        }
    }
    let field = |line: &str, name: &str| -> Option<u64> {
        let rest = &line[line.find(&format!("{name}="))? + name.len() + 1..];
        rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let shard0 = log
        .lines()
        .rev()
        .find(|l| l.contains("replica log recovered") && field(l, "shard") == Some(0))
        .unwrap_or_else(|| panic!("no recovery line for shard 0: {log}"));
    let (end, after) = (field(shard0, "checkpoint_end"), field(shard0, "batches_after"));
    println!("restarted from a checkpoint ending at {end:?}, {after:?} batches read after it");
    assert!(end.is_some_and(|e| e > 0), "not from a checkpoint: {shard0}");
    assert!(after.is_some_and(|a| a < u64::from(BATCHES)), "read everything: {shard0}");
    client.close();
    drop(nodes);
    drop(etcd);
}

/// A deposed controller's group records of a stream it never placed (it wrote them, then
/// crashed before the placement): [b0, b1, b2], b0 gone. The brokers must not start replicas
/// from them (docs/replication.md, "The controller on etcd": an unplaced stream's groups are
/// neither served nor elected on); once a third broker joins, the controller places the stream
/// with groups of its own (other replicas, so other replica numbers) and a durable publish to
/// every shard succeeds. Before the host checked the placement, b1 and b2 kept replicas
/// numbered by the old records, following b0, and every shard refused writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_start_only_once_their_stream_is_placed() {
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let url = etcd.client_url.clone();
    let root = tempfile::tempdir().unwrap();
    let mut nodes = start_first(&hosts, root.path(), &url);
    start_next(&hosts, root.path(), &url, &mut nodes, 1);

    let cluster = felix_broker::config::DEFAULT_CLUSTER_NAME;
    let mut kv = etcd_client::Client::connect([url.as_str()], None).await.unwrap();
    let members = format!("/felix/{cluster}/members/");
    let deadline = Instant::now() + WAIT;
    loop {
        let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
        if kv.get(members.as_str(), Some(opts)).await.unwrap().count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "b1 and b2 never registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Three replicas: not placeable while two brokers are live.
    let def = serde_json::json!({
        "shards": SHARDS, "retention_bytes": 0, "retention_ms": 0, "replicas": 3
    });
    kv.put(format!("/felix/{cluster}/streams/{STREAM}"), def.to_string(), None).await.unwrap();
    let replicas: Vec<felix_cluster::NodeId> =
        ["b0", "b1", "b2"].iter().map(|n| felix_cluster::NodeId::new(n).unwrap()).collect();
    for shard in 0..SHARDS {
        let group = felix_cluster::ShardGroup::initial(replicas.clone(), Some(1));
        kv.put(format!("/felix/{cluster}/groups/{STREAM}/{shard}"), group.to_json(), None)
            .await
            .unwrap();
    }
    // The hosts look at the view every 10 ms: ample time to (wrongly) start replicas.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in &nodes {
        let log = n.log_text();
        assert!(
            !log.contains("replica started"),
            "{}: a replica of an unplaced stream: {log}",
            n.id
        );
    }

    start_next(&hosts, root.path(), &url, &mut nodes, 2);
    let b0 = felix_cluster::NodeId::new("b0").unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let placed =
            felix_cluster::cluster_status(std::slice::from_ref(&url), cluster).await.ok().and_then(
                |st| st.streams.into_iter().find(|s| s.name == STREAM && s.placement.is_some()),
            );
        if placed.is_some_and(|s| s.groups.iter().all(|g| !g.replicas.contains(&b0))) {
            break;
        }
        assert!(Instant::now() < deadline, "never placed: {}", status(&url));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let client = connect(&nodes).await;
    let settings =
        felix_client::PublishSettings { retry_timeout_ms: 15_000, ..client_config(&nodes).publish };
    let publisher = client.publisher_with(STREAM, settings).await.unwrap();
    let mut tickets = Vec::new();
    for shard in 0..SHARDS {
        let key = (0..)
            .map(|k| format!("k{k}"))
            .find(|k| felix_proto::shard_for_key(k.as_bytes(), SHARDS).0 == shard)
            .unwrap();
        tickets.push((shard, publisher.send(Record::keyed(key, b"v".to_vec())).await.unwrap()));
    }
    for (shard, t) in tickets {
        let acked = tokio::time::timeout(Duration::from_secs(20), t).await;
        assert!(
            matches!(acked, Ok(Ok(Some(_)))),
            "shard {shard}: {acked:?}; logs:\n{}",
            nodes.iter().map(|n| n.log_text()).collect::<Vec<_>>().join("\n----\n")
        );
    }
    client.close();
    drop(nodes);
    drop(etcd);
}

/// An idempotent producer idle past `--producer-expiry` is forgotten by every replica of its
/// shard (decided from the log: another producer's later batch moves the log's clock), and its
/// next batch is acked at once: the client says nothing earlier of it is pending
/// (`OLDEST_PENDING`), so the leader takes it at its sequence number instead of refusing it with
/// `OutOfOrderSequence` until the publisher's retry timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_producer_expires_on_every_replica_and_publishes_again_at_once() {
    const EXPIRING: &str = "acme/app/expiring";
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let url = etcd.client_url.clone();
    let root = tempfile::tempdir().unwrap();
    let extra: Vec<&str> = EXTRA.iter().copied().chain(["--producer-expiry", "2s"]).collect();
    let mut nodes = start_first_with(&hosts, root.path(), &url, &extra);
    for i in 1..3 {
        start_next_with(&hosts, root.path(), &url, &mut nodes, i, &extra);
    }
    let client = connect(&nodes).await;
    let deadline = Instant::now() + WAIT;
    while let Err(e) = client.create_stream_with(EXPIRING, 1, Default::default(), Some(3)).await {
        assert!(Instant::now() < deadline, "create: {e}; {}", status(&url));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let settings =
        felix_client::PublishSettings { retry_timeout_ms: 15_000, ..client_config(&nodes).publish };
    let send = |publisher: &felix_client::Publisher, value: &'static str| {
        let publisher = publisher.clone();
        async move {
            let ticket = publisher.send(Record::keyed("k", value.as_bytes().to_vec())).await;
            let started = Instant::now();
            let acked = tokio::time::timeout(Duration::from_secs(30), ticket.unwrap()).await;
            assert!(matches!(acked, Ok(Ok(Some(_)))), "{value}: {acked:?}");
            started.elapsed()
        }
    };
    let old = client.publisher_with(EXPIRING, settings.clone()).await.unwrap();
    send(&old, "a1").await;
    send(&old, "a2").await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let other = client.publisher_with(EXPIRING, settings).await.unwrap();
    send(&other, "b1").await;

    // Every replica forgot the idle producer: the leader and both followers.
    let sum = |metric: &str| nodes.iter().map(|n| n.metric_sum(metric)).sum::<f64>();
    let deadline = Instant::now() + WAIT;
    while sum("felix_broker_replication_producers_expired") < 3.0 {
        assert!(
            Instant::now() < deadline,
            "expired: {}, known: {}",
            sum("felix_broker_replication_producers_expired"),
            sum("felix_broker_replication_producers")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(sum("felix_broker_replication_producers"), 3.0, "one producer per replica left");

    let took = send(&old, "a3").await;
    println!("the expired producer's next batch was acked in {took:?}");
    assert!(took < Duration::from_secs(5), "acked only after {took:?}");

    let opts = SubscribeOptions::new(EXPIRING).start(StartAt::Earliest);
    let mut sub = client.subscribe(opts).await.expect("subscribe");
    let mut values = Vec::new();
    while values.len() < 4 {
        match tokio::time::timeout(Duration::from_secs(10), sub.next()).await {
            Ok(Ok(Some(r))) => values.push(String::from_utf8_lossy(&r.value).into_owned()),
            other => panic!("after {values:?}: {other:?}"),
        }
    }
    assert_eq!(values, ["a1", "a2", "b1", "a3"], "each stored once, in order");
    client.close();
    drop(nodes);
    drop(etcd);
}

/// Whether any broker's data directory still holds something of `stream` (its definition or a
/// log directory).
fn copies_of(nodes: &[Node], stream: &str) -> Vec<std::path::PathBuf> {
    let name = felix_storage::stream_dir_name(stream).unwrap();
    let mut found = Vec::new();
    for n in nodes {
        let mut dirs = vec![n.dir.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.file_name().is_some_and(|f| f.to_string_lossy().contains(&name)) {
                    found.push(p.clone());
                }
                if p.is_dir() {
                    dirs.push(p);
                }
            }
        }
    }
    found
}

/// Deleting a replicated stream through one broker: every broker deletes its copy (one of them
/// while down, when it comes back), the live subscription ends with `StreamNotFound`, and the
/// name used again is a new, empty stream that reads only its own records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_replicated_stream_leaves_no_copy_and_its_name_starts_empty() {
    const DOOMED: &str = "acme/app/doomed";
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let url = etcd.client_url.clone();
    let root = tempfile::tempdir().unwrap();
    let mut nodes = start_brokers(&hosts, root.path(), &url);
    let client = connect(&nodes).await;
    let deadline = Instant::now() + WAIT;
    while let Err(e) = client.create_stream_with(DOOMED, SHARDS, Default::default(), Some(3)).await
    {
        assert!(Instant::now() < deadline, "create: {e}; {}", status(&url));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let publisher = client.publisher(DOOMED).await.unwrap();
    for i in 0..60u32 {
        let key = format!("k{}", i % 6);
        publisher.publish(Record::keyed(key, format!("old{i}"))).await.expect("acked");
    }
    let opts = SubscribeOptions::new(DOOMED).start(StartAt::Earliest);
    let mut sub = client.subscribe(opts.clone()).await.expect("subscribe");
    for n in 0..60 {
        match tokio::time::timeout(WAIT, sub.next()).await {
            Ok(Ok(Some(_))) => {}
            other => panic!("after {n} of 60: {other:?}"),
        }
    }
    assert!(copies_of(&nodes, DOOMED).len() >= 6, "a definition and a log on each broker");
    // The per-stream series: each shard counted once, by its leader.
    let sum = |metric: &str| nodes.iter().map(|n| n.metric_sum(metric)).sum::<f64>();
    let deadline = Instant::now() + WAIT;
    while sum("felix_stream_records_in_total") != 60.0 || sum("felix_stream_end_offset") != 60.0 {
        assert!(
            Instant::now() < deadline,
            "records in {}, end offsets {}",
            sum("felix_stream_records_in_total"),
            sum("felix_stream_end_offset")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The status through a broker (no etcd) names the stream, its groups and its leaders; its
    // placement column shows each shard's current leader.
    let via = cluster_support::status_via(&nodes[1]);
    let stream = via["streams"].as_array().unwrap().iter().find(|s| s["name"] == DOOMED).unwrap();
    assert_eq!(stream["groups"].as_array().unwrap().len(), SHARDS as usize, "{via}");
    assert_eq!(via["members"].as_array().unwrap().len(), 3, "{via}");
    let leaders: Vec<String> = stream["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["leader"].as_str().unwrap_or("none").to_owned())
        .collect();
    let text = cluster_support::status_text_via(&nodes[0]);
    let line = text.lines().find(|l| l.starts_with(DOOMED)).unwrap_or_default();
    for (shard, leader) in leaders.iter().enumerate() {
        assert!(
            line.contains(&format!("{leader}:")) && line.contains(&shard.to_string()),
            "{text}"
        );
    }
    // b3 is down through the delete and the re-creation (its lease gone, so that the new
    // stream is placed on the two others).
    nodes[2].kill9();
    let deadline = Instant::now() + WAIT;
    while status(&url)["members"].as_array().map_or(0, Vec::len) != 2 {
        assert!(Instant::now() < deadline, "b3 still a member: {}", status(&url));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone = client.delete_stream(DOOMED).await.expect("delete");
    assert_eq!(gone.shards, SHARDS);
    match tokio::time::timeout(WAIT, sub.next()).await {
        Ok(Err(felix_client::ClientError::Broker { code, .. })) => {
            assert_eq!(code, felix_proto::ErrorCode::StreamNotFound)
        }
        other => {
            let logs: Vec<String> = nodes[..2].iter().map(|n| n.log_text()).collect();
            panic!(
                "the subscription of a deleted stream goes on: {other:?}\n{}",
                logs.join("\n----\n")
            )
        }
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let left = copies_of(&nodes[..2], DOOMED);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "copies left on the live brokers: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = status(&url);
    assert!(!st["streams"].to_string().contains(DOOMED), "etcd still names it: {st}");

    // The name again, for a new replicated stream on the two live brokers.
    let deadline = Instant::now() + WAIT;
    while let Err(e) = client.create_stream_with(DOOMED, 1, Default::default(), Some(2)).await {
        assert!(Instant::now() < deadline, "re-create: {e}; {}", status(&url));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // b3 comes back: its copy is of the deleted incarnation, and goes.
    nodes[2].spawn();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = copies_of(&nodes[2..], DOOMED);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "b3 kept its old copy: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let publisher = client.publisher(DOOMED).await.unwrap();
    for i in 0..5u32 {
        publisher.publish(Record::keyed("k", format!("new{i}"))).await.expect("acked");
    }
    let mut sub = match client.subscribe(opts).await {
        Ok(sub) => sub,
        Err(e) => {
            let logs: Vec<String> = nodes.iter().map(|n| n.log_text()).collect();
            panic!("subscribe again: {e}\n{}; {}", logs.join("\n----\n"), status(&url))
        }
    };
    let mut values = Vec::new();
    while values.len() < 5 {
        match tokio::time::timeout(WAIT, sub.next()).await {
            Ok(Ok(Some(r))) => values.push(String::from_utf8_lossy(&r.value).into_owned()),
            other => panic!("after {values:?}: {other:?}"),
        }
    }
    assert_eq!(values, ["new0", "new1", "new2", "new3", "new4"], "only the new stream's records");
    client.close();
    drop(nodes);
    drop(etcd);
}

/// Each broker's count of the shards of `stream` it leads (with a live lease), and whether
/// every shard has a leader and its full in-sync set.
async fn leaders_of(etcd: &str, stream: &str) -> (std::collections::BTreeMap<String, usize>, bool) {
    let cluster = felix_broker::config::DEFAULT_CLUSTER_NAME;
    let mut by = std::collections::BTreeMap::new();
    let Ok(st) = felix_cluster::cluster_status(&[etcd.to_owned()], cluster).await else {
        return (by, false);
    };
    let Some(s) = st.streams.iter().find(|s| s.name == stream) else { return (by, false) };
    let mut healthy = !s.groups.is_empty();
    for g in &s.groups {
        match (&g.leader, g.leader_live) {
            (Some(l), true) => *by.entry(l.to_string()).or_default() += 1,
            _ => healthy = false,
        }
        healthy &= g.isr.len() == g.replicas.len();
    }
    (by, healthy)
}

/// Leader balance: after each of the three brokers is restarted in turn (kill -9, its shards
/// led elsewhere meanwhile), leadership returns to each shard's preferred replica, so each
/// broker leads its third of the shards again, while an idempotent publisher's every record
/// is acked (the largest gap between acks is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_returns_to_the_preferred_replicas_after_restarts() {
    const BALANCED: &str = "acme/app/balanced";
    const SHARDS_12: u32 = 12;
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let url = etcd.client_url.clone();
    let root = tempfile::tempdir().unwrap();
    let mut nodes = start_brokers(&hosts, root.path(), &url);
    let client = connect(&nodes).await;
    let deadline = Instant::now() + WAIT;
    while let Err(e) =
        client.create_stream_with(BALANCED, SHARDS_12, Default::default(), Some(3)).await
    {
        assert!(Instant::now() < deadline, "create: {e}; {}", status(&url));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let balanced = |by: &std::collections::BTreeMap<String, usize>| {
        by.len() == 3 && by.values().all(|&n| (3..=5).contains(&n))
    };
    let wait_balanced = |what: String| {
        let url = url.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let (by, healthy) = leaders_of(&url, BALANCED).await;
                if healthy && balanced(&by) {
                    return by;
                }
                assert!(Instant::now() < deadline, "{what}: leaders {by:?}, healthy {healthy}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let logs = |nodes: &[Node]| {
        nodes
            .iter()
            .flat_map(|n| {
                n.log_text()
                    .lines()
                    .filter(|l| l.contains("handed") || l.contains("refused") || l.contains("role"))
                    .map(|l| format!("{}: {l}", n.id))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let _ = &logs;
    let first = wait_balanced("after creation".into()).await;
    println!("leaders after creation: {first:?}");

    // A publisher the whole time: every record acked, none failed.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = client.publisher(BALANCED).await.unwrap();
    let (stop2, publisher2) = (stop.clone(), publisher.clone());
    let producing = tokio::spawn(async move {
        let (mut acked, mut gap, mut last) = (0u64, Duration::ZERO, Instant::now());
        let mut i = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let key = format!("k{}", i % 24);
            publisher2.publish(Record::keyed(key, format!("v{i}"))).await.expect("acked");
            gap = gap.max(last.elapsed());
            last = Instant::now();
            acked += 1;
            i += 1;
        }
        (acked, gap)
    });
    for i in 0..3 {
        nodes[i].kill9();
        // Its shards are led elsewhere once its lease is gone.
        let deadline = Instant::now() + WAIT;
        loop {
            let (by, _) = leaders_of(&url, BALANCED).await;
            if !by.contains_key(&nodes[i].id) && by.values().sum::<usize>() == SHARDS_12 as usize {
                break;
            }
            assert!(Instant::now() < deadline, "{} still leads: {by:?}", nodes[i].id);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        nodes[i].spawn();
        let by = wait_balanced(format!("after restarting {}", nodes[i].id)).await;
        if std::env::var_os("FELIX_TEST_LOGS").is_some() {
            println!("{}", logs(&nodes));
        }
        println!("leaders after restarting {}: {by:?}", nodes[i].id);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acked, gap) = producing.await.unwrap();
    println!("{acked} records acked through three restarts; largest gap between acks {gap:?}");
    assert!(acked > 0);
    client.close();
    drop(nodes);
    drop(etcd);
}

/// Bytes the files under `dir` whose path names `stream`'s log directory take on disk.
fn stream_bytes_on_disk(dir: &std::path::Path, stream: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let name = felix_storage::stream_dir_name(stream).unwrap();
    let (mut total, mut dirs) = (0, vec![(dir.to_path_buf(), false)]);
    while let Some((d, inside)) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let inside = inside || p.file_name().is_some_and(|f| f.to_string_lossy() == name);
            match e.metadata() {
                Ok(m) if m.is_dir() => dirs.push((p, inside)),
                Ok(m) if inside => total += m.blocks() * 512,
                _ => {}
            }
        }
    }
    total
}

/// Retention on a replicated stream (RF 3, 2 MiB per shard, 4 MiB segments): about 70 MB
/// published under a durable, idempotent publisher while the leader of shard 0 is killed
/// (kill -9) and restarted mid-way. Every publish is acked; every broker's copy of the stream
/// shrinks to within its shards' retention plus two segments per shard; a reader from the
/// earliest offset starts each shard past 0 (at its log start), reads densely to the last
/// acked record, and finds every acked record from there on, with at least the retention's
/// worth of each shard.
///
/// `FELIX_RETENTION_MIB` and `FELIX_RETENTION_PUBLISH_MB` scale it (the 64 MiB per
/// shard and 1 GB: `FELIX_RETENTION_MIB=64 FELIX_RETENTION_PUBLISH_MB=1000`, in release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_a_replicated_stream_bounds_every_brokers_disk() {
    let env = |name: &str, default: u64| {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    };
    let retention_mib = env("FELIX_RETENTION_MIB", 2);
    let publish_mb = env("FELIX_RETENTION_PUBLISH_MB", 70);
    let (retention_bytes, records) = (retention_mib << 20, (publish_mb * 1_000_000 / 4096) as u32);
    const SEGMENT: u64 = 4_198_400;
    const RECORD: usize = 4096;
    let extra = ["--segment-bytes", "4198400", "--replica-resident-bytes", "262144"];
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let url = etcd.client_url.clone();
    let root = tempfile::tempdir().unwrap();
    let mut nodes = start_first_with(&hosts, root.path(), &url, &extra);
    for i in 1..3 {
        start_next_with(&hosts, root.path(), &url, &mut nodes, i, &extra);
    }
    let client = connect(&nodes).await;
    let retention = felix_proto::Retention { bytes_max: Some(retention_bytes), age_max_ms: None };
    client.create_stream_with(STREAM, SHARDS, retention, Some(3)).await.expect("create");
    wait_healthy(&url, &nodes, "after creation").await;
    let leader = groups(&url).await.into_iter().find(|g| g.0 == 0).map(|g| g.1).unwrap();
    let victim = nodes.iter().position(|n| n.id == leader).unwrap();

    // Four keys per shard, taken in turn, so the shards grow alike (a core's shards share its
    // segments: a segment goes once every shard's start passed it, docs/replication.md).
    let keys: Vec<String> = (0..SHARDS)
        .flat_map(|shard| {
            (0..)
                .map(|k| format!("k{k}"))
                .filter(move |k| felix_proto::shard_for_key(k.as_bytes(), SHARDS).0 == shard)
                .take(4)
        })
        .collect();
    let publisher = client.publisher(STREAM).await.unwrap();
    let publishing = Instant::now();
    let mut waiting = tokio::task::JoinSet::new();
    let acked: Arc<Mutex<Vec<(u32, u64, u32)>>> = Arc::default();
    let mut restarted = false;
    for i in 0..records {
        let mut value = vec![0u8; RECORD];
        value[..4].copy_from_slice(&i.to_be_bytes());
        let key = keys[i as usize % keys.len()].clone();
        let ticket = publisher.send(Record::keyed(key, value)).await.unwrap();
        let acked = acked.clone();
        waiting.spawn(async move {
            let r = ticket.await;
            match r {
                Ok(Some(receipt)) => {
                    acked.lock().unwrap().push((receipt.shard.0, receipt.offset.0, i));
                    Ok(())
                }
                other => Err(format!("record {i}: {other:?}")),
            }
        });
        while waiting.len() > 512 {
            waiting.join_next().await.unwrap().unwrap().expect("acked");
        }
        // Down for a tenth of the run, back for half of it: the segments it wrote while
        // catching up (its shards' data interleaved otherwise than in the leaders' logs) have
        // aged out by the end.
        if i == records * 2 / 5 {
            nodes[victim].kill9();
        }
        if i == records / 2 && !restarted {
            nodes[victim].spawn();
            restarted = true;
        }
    }
    while let Some(r) = waiting.join_next().await {
        r.unwrap().expect("acked");
    }
    let secs = publishing.elapsed().as_secs_f64();
    println!("{records} records of {RECORD} bytes acked in {secs:.1} s");
    wait_healthy(&url, &nodes, "after the publishes").await;

    // Every broker deletes its segments below the log starts within a few retention passes:
    // what stays is within the retention plus two segments per shard, the retention counted
    // as stored (record payloads, which retention counts, plus storage's framing and its
    // aligned writes' padding: at most a quarter more here; 244 MB on disk for 201 MB of
    // retained payload at 64 MiB per shard).
    let bound = u64::from(SHARDS) * (retention_bytes * 5 / 4 + 2 * SEGMENT);
    assert!(u64::from(records) * RECORD as u64 > 2 * bound, "publishes too little to tell");
    // Waits for the deletions to settle (the same sizes three seconds running) as well.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (Vec::new(), 0);
    loop {
        let sizes: Vec<u64> = nodes.iter().map(|n| stream_bytes_on_disk(&n.dir, STREAM)).collect();
        last = if sizes == last.0 { (sizes.clone(), last.1 + 1) } else { (sizes.clone(), 0) };
        if sizes.iter().all(|s| *s <= bound) && last.1 >= 3 {
            println!("the stream's bytes on each broker: {sizes:?} (bound {bound})");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stream's bytes on the brokers {sizes:?}, over {bound}; logs:\n{}",
            nodes.iter().map(|n| n.log_text()).collect::<Vec<_>>().join("\n----\n")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let deleted = nodes
        .iter()
        .map(|n| n.metric_sum("felix_broker_replication_retention_bytes_deleted_total"))
        .sum::<f64>();
    assert!(deleted > 0.0, "no replicated retention deletion counted");

    // Readers from the earliest offset start at each shard's log start and read densely.
    let acked = acked.lock().unwrap().clone();
    let reader = connect(&nodes).await;
    for shard in 0..SHARDS {
        let mut mine: Vec<(u64, u32)> =
            acked.iter().filter(|a| a.0 == shard).map(|a| (a.1, a.2)).collect();
        mine.sort_unstable();
        let end = mine.last().map_or(0, |m| m.0 + 1);
        let options = SubscribeOptions::new(STREAM)
            .start(StartAt::Earliest)
            .shards(vec![felix_proto::ShardId(shard)]);
        let mut sub = reader.subscribe(options).await.expect("subscribe");
        let mut first = None;
        let mut next = 0;
        let mut read = std::collections::HashMap::new();
        while next < end {
            let r = tokio::time::timeout(Duration::from_secs(30), sub.next())
                .await
                .expect("read-back stalled")
                .expect("read-back")
                .expect("ended");
            let at = r.offset.0;
            if first.is_none() {
                first = Some(at);
            } else {
                assert_eq!(at, next, "shard {shard}: not dense after {first:?}");
            }
            read.insert(at, u32::from_be_bytes(r.value[..4].try_into().unwrap()));
            next = at + 1;
        }
        let first = first.unwrap_or(end);
        assert!(first > 0, "shard {shard}: retention deleted nothing");
        for (offset, i) in mine.iter().filter(|m| m.0 >= first) {
            assert_eq!(read.get(offset), Some(i), "shard {shard}: acked record {i} at {offset}");
        }
        // A record's payload is its value, its key and their lengths: at least the
        // retention's worth of them stays.
        let kept_bytes = (end - first) * RECORD as u64;
        let at_least = retention_bytes / (RECORD as u64 + 16);
        assert!(end - first >= at_least, "shard {shard}: only {kept_bytes} bytes kept");
        // The start is the leader's stored log start: a segment and a mark (1 MiB) at most
        // before its log start.
        let at_most = retention_bytes + 2 * SEGMENT + (1 << 20);
        assert!(kept_bytes <= at_most, "shard {shard}: {kept_bytes} bytes kept");
        println!("shard {shard}: reads from {first} to {end} ({kept_bytes} bytes of records)");
    }
    reader.close();
    client.close();
    drop(nodes);
    drop(etcd);
}
