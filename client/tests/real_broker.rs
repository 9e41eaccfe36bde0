//! Interoperability with the real broker: the `felix` binary's `felix serve` (quinn-proto on
//! glommio) on loopback, driven by this client (quinn on tokio).
//!
//! The binary is found next to this test's executable (`target/<profile>/felix`); `cargo test
//! --workspace` builds it. When it is missing, or exits before serving (a build without the
//! broker), the test says so on stdout and returns: the broker crate's own tests, which can use
//! `env!("CARGO_BIN_EXE_felix")`, are where this check belongs once the broker is assembled.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use felix_client::{
    AckMode, CertFingerprint, Client, ClientConfig, ClientError, PublishSettings, Record,
    Retention, StartAt, SubscribeOptions, Trust,
};

/// Bound on the broker's start and on every wait (a hang fails instead of blocking CI).
const WAIT: Duration = Duration::from_secs(30);

struct RealBroker {
    child: Child,
    addr: String,
    fingerprint: CertFingerprint,
    data_dir: std::sync::Arc<tempfile::TempDir>,
}

impl RealBroker {
    /// Stops the broker (SIGKILL: the logs recover) and starts it again on the same address
    /// and data directory, hence the same certificate.
    fn restart(mut self) -> RealBroker {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (addr, data_dir) = (self.addr.clone(), self.data_dir.clone());
        drop(self);
        // The port can stay taken for a moment (a client endpoint may even get it while the
        // broker is down): retry, bounded.
        for _ in 0..50 {
            match start_broker_on(addr.clone(), data_dir.clone()) {
                Ok(b) => return b,
                Err(why) => println!("restart: {why}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the broker started once but does not start again");
    }
}

impl Drop for RealBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn felix_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/real_broker-<hash> -> target/<profile>/felix
    let bin = exe.parent()?.parent()?.join("felix");
    bin.exists().then_some(bin)
}

/// Starts `felix serve` with 2 cores on a free loopback port; `None` (with a message) when no
/// serving broker is available.
fn start_broker() -> Option<RealBroker> {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let data_dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    match start_broker_on(format!("127.0.0.1:{port}"), data_dir) {
        Ok(b) => Some(b),
        Err(why) => {
            println!("SKIPPED: no serving broker ({why}); cargo test --workspace builds it");
            None
        }
    }
}

/// Starts `felix serve` on `addr` with `data_dir` (a restart reuses both).
fn start_broker_on(
    addr: String,
    data_dir: std::sync::Arc<tempfile::TempDir>,
) -> Result<RealBroker, String> {
    let Some(bin) = felix_binary() else {
        return Err("no felix binary next to the test executable".into());
    };
    let mut cmd = Command::new(&bin);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FELIX_")) {
        cmd.env_remove(k);
    }
    cmd.args(["serve", "--listen", &addr, "--cores", "2", "--no-pin", "--metrics", "off"])
        .args(["--min-free-bytes", "16777216"])
        .arg("--data-dir")
        .arg(data_dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    let fingerprint = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(rest) = line.split("certificate sha256 ").nth(1) {
                    let hex = rest.split_whitespace().next().unwrap_or_default();
                    break hex.parse::<CertFingerprint>().expect("the broker's fingerprint parses");
                }
                seen.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().unwrap();
                return Err(format!(
                    "{} exited ({status}) before serving:\n{}",
                    bin.display(),
                    seen.join("\n")
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "broker silent:\n{}",
                    seen.join("\n")
                );
            }
        }
    };
    // Keep draining stderr so the broker never blocks on a full pipe.
    std::thread::spawn(move || while rx.recv().is_ok() {});
    Ok(RealBroker { child, addr, fingerprint, data_dir })
}

async fn connect(broker: &mut RealBroker, config: ClientConfig) -> Client {
    // The broker may print its fingerprint a moment before its sockets serve.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match Client::connect(config.clone()).await {
            Ok(c) => return c,
            Err(
                e @ (ClientError::Timeout { .. }
                | ClientError::Connect(_)
                | ClientError::PortUnreachable { .. }),
            ) => {
                if let Ok(Some(status)) = broker.child.try_wait() {
                    panic!("the broker exited ({status}) after printing its fingerprint: {e}");
                }
                assert!(std::time::Instant::now() < deadline, "never connected: {e}");
            }
            Err(e) => panic!("connect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_works_against_the_real_broker() {
    let Some(mut broker) = start_broker() else { return };
    let mut config = ClientConfig::new(&broker.addr, Trust::Fingerprint(broker.fingerprint));
    config.connect_timeout_ms = 2_000;
    config.ack_timeout_ms = 20_000;
    let client = connect(&mut broker, config.clone()).await;
    assert_eq!(client.core_count(), 2);
    assert!(!client.cores_reached().is_empty());
    println!(
        "real broker: capabilities {:?}, cores reached {:?}",
        client.capabilities(),
        client.cores_reached()
    );

    // Trust: the dev certificate as a CA file works; a wrong pin is refused.
    let mut by_ca = config.clone();
    by_ca.trust = Some(Trust::CaFile(broker.data_dir.path().join("dev-cert.pem")));
    connect(&mut broker, by_ca).await.list_streams("").await.unwrap();
    let mut wrong = broker.fingerprint.0;
    wrong[31] ^= 1;
    let mut pinned_wrong = config.clone();
    pinned_wrong.trust = Some(Trust::Fingerprint(CertFingerprint(wrong)));
    let err = Client::connect(pinned_wrong).await.err().expect("a wrong pin must not connect");
    assert!(matches!(err, ClientError::CertificateRejected(_)), "{err}");

    // Streams.
    let stream = "acme/interop/orders";
    let created = client.create_stream(stream, 4, Retention::default()).await.unwrap();
    assert_eq!(created.shards, 4);
    assert_eq!(client.describe_stream(stream).await.unwrap().shards, 4);
    assert!(client.list_streams("acme/").await.unwrap().contains(&stream.to_owned()));

    // Publish: durable and written acks with offsets, keys on their shard, unacked.
    let caps = client.capabilities();
    let mut expected = 0usize;
    for mode in [AckMode::Durable, AckMode::Written] {
        if !caps.contains(felix_client::Capabilities::PUBLISH_ACKED) {
            break;
        }
        let settings = PublishSettings { ack_mode: mode, ..Default::default() };
        let publisher = client.publisher_with(stream, settings).await.unwrap();
        let mut tickets = Vec::new();
        for i in 0..20 {
            let record = if caps.contains(felix_client::Capabilities::PUBLISH_KEYED) {
                Record::keyed(format!("key-{}", i % 5), format!("{mode:?}-{i}"))
            } else {
                Record::unkeyed(format!("{mode:?}-{i}"))
            };
            let key = record.key.clone();
            tickets.push((
                key,
                tokio::time::timeout(WAIT, publisher.send(record)).await.unwrap().unwrap(),
            ));
        }
        for (key, t) in tickets {
            let receipt = tokio::time::timeout(WAIT, t).await.unwrap().unwrap().expect("acked");
            if let Some(k) = key {
                assert_eq!(receipt.shard, felix_proto::shard_for_key(&k, 4));
            }
        }
        expected += 20;
        publisher.close().await.unwrap();
    }
    let unacked = PublishSettings { ack_mode: AckMode::None, ..Default::default() };
    let publisher = client.publisher_with(stream, unacked).await.unwrap();
    assert_eq!(publisher.publish(Record::unkeyed("fire-and-forget")).await.unwrap(), None);
    publisher.close().await.unwrap();
    expected += 1;

    // Subscribe from the earliest record, as a group when groups are advertised.
    let groups = caps.contains(felix_client::Capabilities::CONSUMER_GROUPS);
    let mut options = SubscribeOptions::new(stream).start(StartAt::Earliest);
    if groups {
        options = options.group("interop");
    }
    let mut sub = client.subscribe(options.clone()).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < expected {
        let r = tokio::time::timeout(WAIT, sub.next()).await.expect("records stalled").unwrap();
        let r = r.expect("subscription ended");
        assert!(seen.insert((r.shard, r.offset)), "record seen twice: {r:?}");
    }
    if groups {
        sub.commit_consumed().await.unwrap();
        drop(sub);
        // The group resumes after its commits: only a new record arrives.
        let p = client.publisher(stream).await.unwrap();
        let receipt = p.publish(Record::unkeyed("after-commit")).await.unwrap().unwrap();
        let mut again = client.subscribe(options).await.unwrap();
        let r = tokio::time::timeout(WAIT, again.next()).await.unwrap().unwrap().unwrap();
        assert_eq!((r.shard, r.offset), (receipt.shard, receipt.offset));
        assert_eq!(&r.value[..], b"after-commit");
    }
    client.close();

    // Restart: a client reconnects with backoff, a group subscription resumes without
    // duplicates, and the durable records survived.
    if !groups {
        return;
    }
    config.connections = Some(1);
    config.reconnect_backoff_min_ms = 50;
    config.reconnect_attempts_max = 200;
    // SIGKILL sends no CONNECTION_CLOSE: the client notices through its idle timeout.
    config.idle_timeout_ms = 1_500;
    let client = connect(&mut broker, config).await;
    let mut sub = client
        .subscribe(SubscribeOptions::new(stream).start(StartAt::Earliest).group("restart"))
        .await
        .unwrap();
    let total = expected + 1;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let r = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
        assert!(seen.insert((r.shard, r.offset)));
    }
    let broker = broker.restart();
    // A record stored by the new broker process reaches the subscriber only through a resume.
    let publisher = client.publisher(stream).await.unwrap();
    let mut stored = false;
    for _ in 0..20 {
        if let Ok(Some(_)) = publisher.publish(Record::unkeyed("after-restart")).await {
            stored = true;
            break;
        }
    }
    assert!(stored, "publishing never recovered after the restart");
    let mut after_restart = false;
    while seen.len() < total + 1 {
        let r = tokio::time::timeout(WAIT, sub.next()).await.expect("stalled after restart");
        let r = r.unwrap().expect("subscription ended");
        assert!(seen.insert((r.shard, r.offset)), "record seen twice after resume: {r:?}");
        after_restart |= &r.value[..] == b"after-restart";
    }
    assert!(after_restart);
    assert!(sub.resumes() >= 1);
    client.close();
    drop(broker);
}
