//! The Rust client through a leader failover, as a user of `felix publish --addr b1,b2,b3`
//! meets it: three `felix serve` processes (each in a network namespace of its own where the
//! test may make them), a replicated stream (replication factor 3, lease TTL 2 s), a client
//! with the default configuration but for its trust, and two idempotent publishers at a fixed
//! rate (one keyed, one unkeyed, as the command publishes plain lines). The leader of the
//! stream's shard is killed (`kill -9`), then stopped (SIGTERM), each time restarted after the
//! failover.
//!
//! Required: every record acked, none failed, each stored exactly once (read back from the
//! earliest offset), each key's records in order, and the longest pause between two acks of a
//! publisher under [`GAP_BOUND`]: a correctness bound (the client stalled 20-46 s before it
//! learned to leave a dead broker), not a timing; `bench/failover.sh` measures the pauses.

mod cluster_support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::{Hosts, Node, TTL_S};
use felix_client::{Client, ClientConfig, Record, StartAt, SubscribeOptions, Trust};
use felix_cluster::testing::Etcd;

const STREAM: &str = "acme/app/failover";
/// Records per second of each publisher.
const RATE_PER_S: u64 = 50;
/// The longest pause between two acks allowed: well above a failover (lease TTL + election
/// + the client finding the new leader), far below the old stall.
const GAP_BOUND: Duration = Duration::from_secs(8);
/// Bound on every other wait.
const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    Term,
}

/// What one publisher sent and got back.
#[derive(Default)]
struct Outcome {
    sent: u64,
    acked: HashSet<u64>,
    failed: Vec<String>,
    /// When each ack came back.
    acks_at: Vec<Instant>,
}

impl Outcome {
    /// The longest pause between two consecutive acks (from the first ack on).
    fn longest_gap(&self) -> Duration {
        self.longest_gap_since(None)
    }

    /// The longest pause between two consecutive acks from the last ack before `since`.
    fn longest_gap_since(&self, since: Option<Instant>) -> Duration {
        let mut at = self.acks_at.clone();
        at.sort();
        let from = since.and_then(|s| at.iter().rposition(|a| *a < s)).unwrap_or(0);
        at[from..].windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

/// Publishes `RATE_PER_S` records a second, each `"<name>-<n>"` (keyed by `key` when given),
/// until `stop`; every ticket is awaited in a task of its own.
async fn publish(
    client: Client,
    name: &'static str,
    key: Option<&'static str>,
    out: Arc<Mutex<Outcome>>,
    stop: Arc<AtomicBool>,
) {
    let publisher = client.publisher(STREAM).await.expect("publisher");
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_S));
    let mut waiting = tokio::task::JoinSet::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let value = format!("{name}-{n}");
        let record = match key {
            Some(k) => Record::keyed(k, value),
            None => Record::unkeyed(value),
        };
        out.lock().unwrap().sent += 1;
        let ticket = match publisher.send(record).await {
            Ok(t) => t,
            Err(e) => {
                out.lock().unwrap().failed.push(format!("{name}-{n} send: {e}"));
                n += 1;
                continue;
            }
        };
        let out = out.clone();
        waiting.spawn(async move {
            let r = ticket.await;
            let mut o = out.lock().unwrap();
            match r {
                Ok(Some(_)) => {
                    o.acked.insert(n);
                    o.acks_at.push(Instant::now());
                }
                other => o.failed.push(format!("{name}-{n}: {other:?}")),
            }
        });
        n += 1;
        while waiting.try_join_next().is_some() {}
    }
    while waiting.join_next().await.is_some() {}
    publisher.close().await.expect("close");
}

/// The leader of shard 0 of STREAM and whether every shard has three in-sync replicas under a
/// live leader.
async fn leader(etcd: &str) -> (Option<String>, bool) {
    let cluster = felix_broker::config::DEFAULT_CLUSTER_NAME;
    let Ok(st) = felix_cluster::cluster_status(&[etcd.to_owned()], cluster).await else {
        return (None, false);
    };
    let Some(stream) = st.streams.iter().find(|s| s.name == STREAM) else { return (None, false) };
    let healthy = !stream.groups.is_empty()
        && stream.groups.iter().all(|g| g.leader_live && g.isr.len() == 3);
    let leader = stream.groups.iter().find(|g| g.shard == 0).and_then(|g| g.leader.as_ref());
    (leader.map(|l| l.to_string()), healthy)
}

async fn wait_healthy(etcd: &str, nodes: &[Node], what: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let (Some(l), true) = leader(etcd).await {
            return l;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = nodes.iter().map(|n| n.log_text()).collect();
            panic!("{what}: never healthy\nlogs:\n{}", logs.join("\n----\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts b1-b3; b2 and b3 get b1's development certificate, so one CA file trusts all three.
fn start_brokers(hosts: &std::rc::Rc<Hosts>, root: &std::path::Path, etcd: &str) -> Vec<Node> {
    let first = Node::start_with(hosts, 0, "b1", root, etcd, &[]);
    let deadline = Instant::now() + WAIT;
    while !(first.dir.join("dev-cert.pem").exists() && first.dir.join("dev-key.pem").exists()) {
        assert!(Instant::now() < deadline, "b1 made no certificate: {}", first.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut nodes = vec![first];
    for i in 1..3 {
        let id = format!("b{}", i + 1);
        let dir = root.join(&id);
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["dev-cert.pem", "dev-key.pem"] {
            std::fs::copy(nodes[0].dir.join(f), dir.join(f)).unwrap();
        }
        nodes.push(Node::start_with(hosts, i, &id, root, etcd, &[]));
    }
    nodes
}

/// The default client configuration with every broker as a seed, as
/// `felix publish --addr b1,b2,b3` has it.
fn client_config(nodes: &[Node]) -> ClientConfig {
    let addr: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
    ClientConfig {
        addr: addr.join(","),
        trust: Some(Trust::CaFile(nodes[0].dir.join("dev-cert.pem"))),
        ..ClientConfig::default()
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_publishers_ride_out_a_killed_and_a_stopped_leader() {
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
    client.create_stream_with(STREAM, 1, Default::default(), Some(3)).await.expect("create");
    wait_healthy(&url, &nodes, "after creation").await;

    let stop = Arc::new(AtomicBool::new(false));
    let keyed = Arc::new(Mutex::new(Outcome::default()));
    let unkeyed = Arc::new(Mutex::new(Outcome::default()));
    let publishers = [
        tokio::spawn(publish(connect(&nodes).await, "k", Some("key"), keyed.clone(), stop.clone())),
        tokio::spawn(publish(connect(&nodes).await, "u", None, unkeyed.clone(), stop.clone())),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;

    for fault in [Fault::Kill, Fault::Term] {
        let leader = wait_healthy(&url, &nodes, &format!("before {fault:?}")).await;
        let at = nodes.iter().position(|n| n.id == leader).expect("leader is a node");
        let acks_before = keyed.lock().unwrap().acked.len() + unkeyed.lock().unwrap().acked.len();
        let struck = Instant::now();
        tracing::info!(?fault, leader, "strike");
        match fault {
            Fault::Kill => nodes[at].kill9(),
            Fault::Term => {
                nodes[at].signal("TERM");
                assert!(nodes[at].wait_exit(WAIT), "{leader} did not stop on SIGTERM");
                println!("{leader} stopped {:?} after SIGTERM", struck.elapsed());
            }
        }
        // Acks come back from the next leader; then the struck broker rejoins.
        let deadline = struck + WAIT;
        loop {
            let after = |o: &Arc<Mutex<Outcome>>| {
                o.lock().unwrap().acks_at.iter().any(|t| *t > struck + Duration::from_secs(TTL_S))
            };
            if after(&keyed) && after(&unkeyed) {
                break;
            }
            assert!(Instant::now() < deadline, "{fault:?} of {leader}: acks never resumed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        nodes[at].spawn();
        let acks = keyed.lock().unwrap().acked.len() + unkeyed.lock().unwrap().acked.len();
        println!(
            "{fault:?} of {leader}: {} acks since; longest pauses since: keyed {:?}, unkeyed {:?}",
            acks - acks_before,
            keyed.lock().unwrap().longest_gap_since(Some(struck)),
            unkeyed.lock().unwrap().longest_gap_since(Some(struck))
        );
    }
    wait_healthy(&url, &nodes, "at the end").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for p in publishers {
        tokio::time::timeout(WAIT, p).await.expect("publisher stalled").unwrap();
    }

    // Every record acked, none failed, pauses bounded.
    let mut published = BTreeMap::new();
    for (name, o) in [("k", &keyed), ("u", &unkeyed)] {
        let o = o.lock().unwrap();
        assert!(o.failed.is_empty(), "{name}: records failed: {:?}", &o.failed);
        assert_eq!(o.acked.len() as u64, o.sent, "{name}: not every record acked");
        let gap = o.longest_gap();
        println!("{name}: {} records acked, longest pause between acks {gap:?}", o.sent);
        assert!(gap < GAP_BOUND, "{name}: acks paused for {gap:?}");
        published.insert(name, o.sent);
    }

    // Each record stored exactly once (one shard; the keyed records in order).
    let reader = connect(&nodes).await;
    let options = SubscribeOptions::new(STREAM).start(StartAt::Earliest);
    let mut sub = reader.subscribe(options).await.expect("subscribe");
    let total: u64 = published.values().sum();
    let mut seen: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut read = 0u64;
    let deadline = Instant::now() + WAIT;
    while read < total {
        assert!(Instant::now() < deadline, "read {read} of {total} records");
        let Ok(next) = tokio::time::timeout(Duration::from_secs(5), sub.next()).await else {
            continue;
        };
        let r = next.expect("read").expect("subscription ended");
        let value = String::from_utf8(r.value.to_vec()).unwrap();
        let (name, n) = value.split_once('-').unwrap();
        let name = if name == "k" { "k" } else { "u" };
        seen.entry(name).or_default().push(n.parse().unwrap());
        read += 1;
    }
    // Nothing more than what was published.
    if let Ok(Ok(Some(r))) = tokio::time::timeout(Duration::from_secs(1), sub.next()).await {
        panic!("a record more than published: {:?}", String::from_utf8_lossy(&r.value));
    }
    for (name, sent) in published {
        let mut got = seen.remove(name).unwrap_or_default();
        // Unkeyed records promise no order; a key's do.
        if name == "u" {
            got.sort_unstable();
        }
        assert_eq!(
            got,
            (0..sent).collect::<Vec<_>>(),
            "{name}: stored once each (keyed: in order)"
        );
    }
    reader.close();
    client.close();
    drop(nodes);
    drop(etcd);
}
