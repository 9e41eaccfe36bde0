//! Subscriptions across restarts of a `felix serve` process (kill -9 and SIGTERM), restarted on
//! its data directory and address: a subscription from the latest record and one from the
//! earliest, each over a 4-shard stream split over the broker's 2 cores, while a publisher
//! publishes before, during and after each restart. Every record stored after a
//! subscription's start must come exactly once, in offset order per shard. The same across a
//! kill -9 of a shard leader in a cluster of three. And `felix subscribe` (from the latest
//! record) keeps following across a kill -9.
//!
//! The subscribers' clients give up a reconnect after 2 attempts of 500 ms
//! (`reconnect_attempts_max`), far less than the broker's absence: a subscription retries for
//! as long as it lives, whatever the pool's bound.

mod cluster_support;
mod e2e_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cluster_support::{Hosts, Node, TTL_S};
use e2e_support::{connect_when_up, free_addr_for_restarts, spawn_felix, Killed, WAIT};
use felix_client::{
    AckMode, Client, ClientConfig, PublishSettings, Record, StartAt, SubscribeOptions, Subscriber,
    Trust,
};
use felix_cluster::testing::Etcd;

const STREAM: &str = "acme/app/resume";
const SHARDS: u32 = 4;
/// Keys of the published records (spread over the shards).
const KEYS: usize = 16;
/// How long the broker stays away at each restart.
const OUTAGE: Duration = Duration::from_secs(3);

/// How the broker is stopped before each restart.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// kill -9: the subscribers notice when their connection idles out.
    Kill,
    /// SIGTERM: the broker resets its subscription streams with `ShuttingDown`.
    Term,
}

/// The publisher's client: durable, idempotent batches retried across the restarts.
fn publisher_config(addr: &str, dir: &Path) -> ClientConfig {
    ClientConfig {
        addr: addr.to_owned(),
        trust: Some(Trust::CaFile(dir.join("dev-cert.pem"))),
        connect_timeout_ms: 1_000,
        idle_timeout_ms: 1_000,
        reconnect_attempts_max: 1_000,
        reconnect_backoff_min_ms: 20,
        reconnect_backoff_max_ms: 200,
        publish: PublishSettings {
            ack_mode: AckMode::Durable,
            linger_us: 100,
            idempotent: true,
            retry_timeout_ms: 60_000,
            ..PublishSettings::default()
        },
        ..ClientConfig::default()
    }
}

/// The subscribers' client: a dead connection is noticed after 1 s; a reconnect gives up after
/// 2 attempts of at most 500 ms (the subscription must not).
fn subscriber_config(addr: &str, dir: &Path) -> ClientConfig {
    ClientConfig {
        addr: addr.to_owned(),
        trust: Some(Trust::CaFile(dir.join("dev-cert.pem"))),
        connect_timeout_ms: 500,
        idle_timeout_ms: 1_000,
        reconnect_attempts_max: 2,
        reconnect_backoff_min_ms: 20,
        reconnect_backoff_max_ms: 200,
        ..ClientConfig::default()
    }
}

/// Stops `broker` as `how` says, leaves it away for [`OUTAGE`], and starts it again on its
/// directory and address (without blocking the runtime: the subscribers go on).
async fn restart(broker: Killed, how: Stop, dir: &Path, addr: &str) -> Killed {
    let (dir, addr) = (dir.to_owned(), addr.to_owned());
    tokio::task::spawn_blocking(move || {
        match how {
            Stop::Kill => drop(broker),
            Stop::Term => broker.terminate(),
        }
        std::thread::sleep(OUTAGE);
        spawn_felix(&dir, &addr, &[])
    })
    .await
    .expect("restart")
}

/// Publishes keyed records `from..from + n` and waits for every ack; returns the next offset of
/// each shard after them.
async fn publish_all(client: &Client, from: usize, n: usize) -> BTreeMap<u32, u64> {
    let p = client.publisher(STREAM).await.unwrap();
    let mut tickets = Vec::new();
    for i in from..from + n {
        let record = Record::keyed(format!("k{}", i % KEYS), format!("v{i}"));
        tickets.push(p.send(record).await.unwrap());
    }
    let mut ends = BTreeMap::new();
    for ticket in tickets {
        let r = ticket.await.expect("publish").expect("an acked publish");
        let end = ends.entry(r.shard.0).or_insert(0);
        *end = (r.offset.0 + 1).max(*end);
    }
    ends
}

/// Publishes keyed records from `from` on, one at a time, until `stop`. A record whose publish
/// fails (a broker refusing it while it stops) is published again. Returns the next offset of
/// each shard after every acked record.
fn publish_until(
    client: Client,
    from: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<u32, u64>> {
    tokio::spawn(async move {
        let p = client.publisher(STREAM).await.unwrap();
        let mut ends = BTreeMap::new();
        let mut i = from;
        while !stop.load(Ordering::Relaxed) {
            match p.publish(Record::keyed(format!("k{}", i % KEYS), format!("v{i}"))).await {
                Ok(r) => {
                    let r = r.expect("an acked publish");
                    let end = ends.entry(r.shard.0).or_insert(0);
                    *end = (r.offset.0 + 1).max(*end);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        client.close();
        ends
    })
}

/// Every record of the stream, by (shard, offset), read with `client` from the earliest once
/// the brokers stay up: at least up to `acked` on each shard, and whatever follows within a
/// second.
async fn read_log(client: Client, acked: &BTreeMap<u32, u64>) -> BTreeMap<(u32, u64), Bytes> {
    let mut sub =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    let mut log = BTreeMap::new();
    let mut ends = BTreeMap::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let done = acked.iter().all(|(s, end)| ends.get(s).is_some_and(|e| e >= end));
        let wait = if done { Duration::from_secs(1) } else { deadline - Instant::now() };
        match tokio::time::timeout(wait, sub.next()).await {
            Ok(Ok(Some(r))) => {
                assert!(log.insert((r.shard.0, r.offset.0), r.value).is_none(), "read twice");
                ends.insert(r.shard.0, r.offset.0 + 1);
            }
            Err(_) if done => break,
            other => panic!("reading the log back: {other:?}"),
        }
    }
    client.close();
    log
}

/// What a subscriber received, in order: (shard, offset, value); and the error that ended it.
#[derive(Default)]
struct Received {
    records: Vec<(u32, u64, Bytes)>,
    error: Option<String>,
}

/// Reads `sub` into `into` until `stop` or an error (or the end, which is an error here).
fn read_until(
    mut sub: Subscriber,
    into: Arc<Mutex<Received>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Subscriber> {
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                n = sub.next() => n,
                _ = stop.wait_for(|stop| *stop) => return sub,
            };
            let mut got = into.lock().unwrap();
            match next {
                Ok(Some(r)) => got.records.push((r.shard.0, r.offset.0, r.value)),
                Ok(None) => got.error = Some("the subscription ended".into()),
                Err(e) => got.error = Some(format!("{e} ({e:?})")),
            }
            if got.error.is_some() {
                return sub;
            }
        }
    })
}

/// The next offset of each shard after the records of `log`, which must be dense from 0.
fn ends(log: &BTreeMap<(u32, u64), Bytes>) -> BTreeMap<u32, u64> {
    let mut ends = BTreeMap::new();
    for &(shard, offset) in log.keys() {
        let end = ends.entry(shard).or_insert(0);
        assert_eq!(offset, *end, "the offsets of shard {shard} are not dense");
        *end = offset + 1;
    }
    ends
}

/// Whether `got` reached `ends` on every shard.
fn reached(got: &Received, ends: &BTreeMap<u32, u64>) -> bool {
    ends.iter().all(|(shard, end)| {
        got.records.iter().rev().find(|r| r.0 == *shard).is_some_and(|r| r.1 + 1 >= *end)
    })
}

/// Checks that `got` holds, per shard, exactly the records `starts[shard]..ends[shard]` of
/// `log`, in offset order, each once.
fn check_exactly(
    what: &str,
    got: &Received,
    starts: &BTreeMap<u32, u64>,
    ends: &BTreeMap<u32, u64>,
    log: &BTreeMap<(u32, u64), Bytes>,
) -> Result<(), String> {
    if let Some(e) = &got.error {
        return Err(format!(
            "{what}: the subscription failed after {} records: {e}",
            got.records.len()
        ));
    }
    for (shard, end) in ends {
        let start = starts.get(shard).copied().unwrap_or(0);
        let offsets: Vec<u64> = got.records.iter().filter(|r| r.0 == *shard).map(|r| r.1).collect();
        let want: Vec<u64> = (start..*end).collect();
        if offsets != want {
            let wrong = offsets.iter().zip(&want).position(|(a, b)| a != b);
            let at = wrong.unwrap_or(offsets.len().min(want.len()));
            return Err(format!(
                "{what}: shard {shard} should have offsets {start}..{end} once each, in order; \
                 got {} records, the first difference at index {at}: got {:?}, expected {:?}",
                offsets.len(),
                offsets.get(at),
                want.get(at),
            ));
        }
        for (s, offset, value) in got.records.iter().filter(|r| r.0 == *shard) {
            if Some(value) != log.get(&(*s, *offset)) {
                return Err(format!("{what}: shard {s} offset {offset}: {value:?} is not stored"));
            }
        }
    }
    Ok(())
}

/// A subscription from the latest record and one from the earliest, each read by a task of
/// its own.
struct Readers {
    readers: Vec<(StartAt, Arc<Mutex<Received>>, tokio::task::JoinHandle<Subscriber>)>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Readers {
    async fn start(client: &Client) -> Readers {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut readers = Vec::new();
        for start in [StartAt::Latest, StartAt::Earliest] {
            let sub = client.subscribe(SubscribeOptions::new(STREAM).start(start)).await.unwrap();
            assert!(sub.parts() > 1, "{start:?}: the subscription has a part per core or owner");
            let got = Arc::new(Mutex::new(Received::default()));
            readers.push((start, got.clone(), read_until(sub, got, stop_rx.clone())));
        }
        Readers { readers, stop }
    }

    /// Waits until each subscription reached the end of `log` (or failed), then checks that
    /// each returned exactly the records of `log` after its start (the one from the latest
    /// record: from `before`), and resumed at least `resumes` times.
    async fn check(
        self,
        what: &str,
        before: &BTreeMap<u32, u64>,
        log: &BTreeMap<(u32, u64), Bytes>,
        resumes: u64,
    ) {
        let ends = ends(log);
        let deadline = Instant::now() + WAIT * 2;
        for (_, got, _) in &self.readers {
            while Instant::now() < deadline {
                let done = {
                    let got = got.lock().unwrap();
                    got.error.is_some() || reached(&got, &ends)
                };
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.stop.send_replace(true);
        let none = BTreeMap::new();
        let mut failures = Vec::new();
        for (start, got, reader) in self.readers {
            let sub = reader.await.unwrap();
            let what = format!("{what}, from {start:?}");
            let starts = if start == StartAt::Latest { before } else { &none };
            if let Err(e) = check_exactly(&what, &got.lock().unwrap(), starts, &ends, log) {
                failures.push(e);
            } else if sub.resumes() < resumes || sub.skipped() != 0 {
                let (r, s) = (sub.resumes(), sub.skipped());
                failures.push(format!("{what}: {r} resumes, {s} skipped"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// Two restarts of the broker stopped with `how`, while a subscription from the latest record
/// and one from the earliest read a 4-shard stream and a publisher publishes all along.
async fn subscriptions_resume_across_restarts(how: Stop) {
    const RESTARTS: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr_for_restarts();
    let mut broker = spawn_felix(dir.path(), &addr, &[]);
    let publisher = connect_when_up(&addr, dir.path(), publisher_config).await;
    publisher.create_stream(STREAM, SHARDS, Default::default()).await.unwrap();
    // Before the subscriptions: records the one from the latest record must not see.
    let before = publish_all(&publisher, 0, 200).await;
    assert_eq!(before.len(), SHARDS as usize, "every shard holds records before: {before:?}");

    let subscriber = connect_when_up(&addr, dir.path(), subscriber_config).await;
    let readers = Readers::start(&subscriber).await;

    // During and after: published all along, across the restarts.
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let publishing = publish_until(publisher, 200, stop_publishing.clone());
    for _ in 0..RESTARTS {
        tokio::time::sleep(Duration::from_millis(700)).await;
        broker = restart(broker, how, dir.path(), &addr).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop_publishing.store(true, Ordering::Relaxed);
    let acked = tokio::time::timeout(WAIT * 3, publishing).await.expect("publisher").unwrap();
    let reader = connect_when_up(&addr, dir.path(), publisher_config).await;
    let log = read_log(reader, &acked).await;
    readers.check(&format!("{how:?}"), &before, &log, RESTARTS as u64).await;
    subscriber.close();
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_from_latest_and_earliest_resume_across_kill_9() {
    subscriptions_resume_across_restarts(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_from_latest_and_earliest_resume_across_sigterm() {
    subscriptions_resume_across_restarts(Stop::Term).await;
}

/// `felix subscribe` from the latest record, as a user runs it, with the subscribers' settings
/// in its environment; its stdout and stderr collected by threads.
struct Cli {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Cli {
    fn subscribe(addr: &str, dir: &Path) -> Cli {
        use std::io::{BufRead, Read};
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_felix"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FELIX_")) {
            cmd.env_remove(k);
        }
        let ca = dir.join("dev-cert.pem");
        cmd.args(["subscribe", "--stream", STREAM, "--json", "--addr", addr, "--ca-file"])
            .arg(ca)
            .env("FELIX_CLIENT_IDLE_TIMEOUT_MS", "1000")
            .env("FELIX_CONNECT_TIMEOUT_MS", "500")
            .env("FELIX_RECONNECT_ATTEMPTS_MAX", "2")
            .env("FELIX_RECONNECT_BACKOFF_MIN_MS", "20")
            .env("FELIX_RECONNECT_BACKOFF_MAX_MS", "200")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("spawn felix subscribe");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (out, into) = (child.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                into.lock().unwrap().push(line);
            }
        });
        let (mut err, into) = (child.stderr.take().unwrap(), stderr.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                into.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Cli { child, lines, stderr }
    }

    /// What it printed so far, as records.
    fn received(&self) -> Received {
        let mut got = Received::default();
        for line in self.lines.lock().unwrap().iter() {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let (shard, offset) = (v["shard"].as_u64().unwrap(), v["offset"].as_u64().unwrap());
            let value = Bytes::from(v["value"].as_str().unwrap().to_owned());
            got.records.push((u32::try_from(shard).unwrap(), offset, value));
        }
        got
    }

    /// Fails the test with what it printed on stderr, when it exited.
    fn assert_running(&mut self, what: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{what}: felix subscribe exited with {status}: {}", self.stderr.lock().unwrap());
        }
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn felix_subscribe_keeps_following_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr_for_restarts();
    let broker = spawn_felix(dir.path(), &addr, &[]);
    let publisher = connect_when_up(&addr, dir.path(), publisher_config).await;
    publisher.create_stream(STREAM, SHARDS, Default::default()).await.unwrap();
    publish_all(&publisher, 0, 100).await;
    let mut cli = Cli::subscribe(&addr, dir.path());
    // From the latest record: published until it printed a record of every shard; from then
    // on, each shard's records must all come.
    let mut i = 100;
    let deadline = Instant::now() + WAIT;
    let starts = loop {
        let got = cli.received();
        let mut starts = BTreeMap::new();
        for r in &got.records {
            starts.entry(r.0).or_insert(r.1);
        }
        if starts.len() == SHARDS as usize {
            break starts;
        }
        cli.assert_running("before the kill");
        assert!(Instant::now() < deadline, "felix subscribe printed {:?}", got.records);
        publish_all(&publisher, i, 4).await;
        i += 4;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let publishing = publish_until(publisher, i, stop_publishing.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let broker = restart(broker, Stop::Kill, dir.path(), &addr).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop_publishing.store(true, Ordering::Relaxed);
    let acked = tokio::time::timeout(WAIT * 3, publishing).await.expect("publisher").unwrap();
    let reader = connect_when_up(&addr, dir.path(), publisher_config).await;
    let log = read_log(reader, &acked).await;
    let ends = ends(&log);
    let deadline = Instant::now() + WAIT * 2;
    while !reached(&cli.received(), &ends) && Instant::now() < deadline {
        cli.assert_running("after the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cli.assert_running("at the end");
    check_exactly("felix subscribe", &cli.received(), &starts, &ends, &log).unwrap();
    // It said on stderr, once, that the broker was away, and once that it is back; nothing else.
    let stderr = cli.stderr.lock().unwrap().clone();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "stderr: {stderr}");
    assert!(lines[0].ends_with("; resuming the subscription"), "stderr: {stderr}");
    assert!(lines[1].starts_with("felix: subscription resumed after "), "stderr: {stderr}");
    // Ctrl-C still ends it cleanly.
    let pid = libc::pid_t::try_from(cli.child.id()).unwrap();
    // SAFETY: kill(2) with the pid of our own child and a valid signal has no memory effect.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = tokio::task::spawn_blocking(move || {
        let status = cli.child.wait().unwrap();
        drop(cli);
        status
    })
    .await
    .unwrap();
    assert!(status.success(), "felix subscribe after Ctrl-C: {status}");
    drop(broker);
}

/// The shards of [`STREAM`] as etcd holds them: (shard, leader, leader live, in-sync count).
async fn groups(etcd: &str) -> Vec<(u32, String, bool, usize)> {
    let cluster = felix_broker::config::DEFAULT_CLUSTER_NAME;
    let Ok(st) = felix_cluster::cluster_status(&[etcd.to_owned()], cluster).await else {
        return Vec::new();
    };
    let Some(stream) = st.streams.iter().find(|s| s.name == STREAM) else { return Vec::new() };
    let leader = |g: &felix_cluster::GroupStatus| g.leader.as_ref().map(|l| l.to_string());
    stream
        .groups
        .iter()
        .map(|g| (g.shard, leader(g).unwrap_or_default(), g.leader_live, g.isr.len()))
        .collect()
}

/// Waits until every shard has a live leader and `nodes` in-sync replicas.
async fn wait_healthy(etcd: &str, nodes: &[Node], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let g = groups(etcd).await;
        let healthy = |(_, _, live, isr): &(u32, String, bool, usize)| *live && *isr == nodes.len();
        if g.len() == CLUSTER_SHARDS as usize && g.iter().all(healthy) {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = nodes.iter().map(Node::log_text).collect();
            panic!("{what}: never healthy: {g:?}\nlogs:\n{}", logs.join("\n----\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cluster variant's shards: two per broker, each replicated on all three.
const CLUSTER_SHARDS: u32 = 6;

/// Three `felix serve` processes (each in a network namespace of its own where the test may
/// make them, see `cluster_support`) and an etcd of the test's own; a 6-shard stream with 3
/// replicas. While a subscription from the latest record and one from the earliest read every
/// shard (a part per leader, with its shards) and a publisher publishes, the broker that leads
/// the most shards is killed with kill -9, and started again once other replicas lead them.
/// Both subscriptions must return exactly the log's records after their start: the lost parts
/// resume at the new leaders, each shard at its next offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_resume_across_a_leader_kill_9_in_a_cluster() {
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else {
        eprintln!("SKIPPED: no etcd");
        return;
    };
    let url = etcd.client_url.clone();
    let root = tempfile::tempdir().unwrap();
    // b1 first, for its development certificate; b2 and b3 serve the same one, so one CA file
    // trusts them all.
    let mut nodes = vec![Node::start_with(&hosts, 0, "b1", root.path(), &url, &[])];
    let deadline = Instant::now() + WAIT;
    while !(nodes[0].dir.join("dev-cert.pem").exists() && nodes[0].dir.join("dev-key.pem").exists())
    {
        assert!(Instant::now() < deadline, "b1 made no certificate: {}", nodes[0].log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 1..3 {
        let id = format!("b{}", i + 1);
        let dir = root.path().join(&id);
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["dev-cert.pem", "dev-key.pem"] {
            std::fs::copy(nodes[0].dir.join(f), dir.join(f)).unwrap();
        }
        nodes.push(Node::start_with(&hosts, i, &id, root.path(), &url, &[]));
    }
    let seeds: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
    let seeds = seeds.join(",");
    let ca = nodes[0].dir.clone();
    let connect = |config: fn(&str, &Path) -> ClientConfig| {
        let (seeds, ca) = (seeds.clone(), ca.clone());
        async move {
            let deadline = Instant::now() + WAIT;
            loop {
                // A broker that is down is left for the shard's next leader, not waited for.
                let config = ClientConfig { reconnect_attempts_max: 2, ..config(&seeds, &ca) };
                match Client::connect(config).await {
                    Ok(c) => return c,
                    Err(e) => assert!(Instant::now() < deadline, "no client: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let publisher = connect(publisher_config).await;
    publisher
        .create_stream_with(STREAM, CLUSTER_SHARDS, Default::default(), Some(3))
        .await
        .expect("create");
    wait_healthy(&url, &nodes, "after creation").await;
    let before = publish_all(&publisher, 0, 200).await;
    assert_eq!(before.len(), CLUSTER_SHARDS as usize, "every shard holds records: {before:?}");

    let subscriber = connect(subscriber_config).await;
    let readers = Readers::start(&subscriber).await;
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let publishing = publish_until(publisher, 200, stop_publishing.clone());
    tokio::time::sleep(Duration::from_millis(700)).await;

    // The broker leading the most shards: its part of each subscription reads several.
    let led = groups(&url).await;
    let leads = |id: &str| led.iter().filter(|g| g.1 == id).count();
    let at = (0..nodes.len()).max_by_key(|&i| leads(&nodes[i].id)).unwrap();
    let leader = nodes[at].id.clone();
    assert!(leads(&leader) >= 2, "{leader} leads several shards: {led:?}");
    nodes[at].kill9();
    let deadline = Instant::now() + Duration::from_secs(TTL_S + 20);
    while groups(&url).await.iter().any(|g| g.1 == leader || !g.2) {
        assert!(Instant::now() < deadline, "{leader}'s shards have no new leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    nodes[at].spawn();
    wait_healthy(&url, &nodes, "after the restart").await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop_publishing.store(true, Ordering::Relaxed);
    let acked = tokio::time::timeout(WAIT * 3, publishing).await.expect("publisher").unwrap();
    let log = read_log(connect(publisher_config).await, &acked).await;
    readers.check(&format!("kill -9 of the leader {leader}"), &before, &log, 1).await;
    subscriber.close();
    drop(nodes);
    drop(etcd);
}
