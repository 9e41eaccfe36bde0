//! Shared harness of the broker's end-to-end tests: an in-process broker on a free loopback
//! port with 2 cores, clients that trust its development certificate, and a raw QUIC
//! connection for sending hand-made bytes.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use felix_broker::app::Broker;
use felix_broker::config;
use felix_client::{Client, ClientConfig, PublishSettings, Trust};

/// Bound on every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(20);

/// A broker running in this process.
pub struct TestBroker {
    pub broker: Option<Broker>,
    pub addr: std::net::SocketAddr,
    pub dir: PathBuf,
}

/// The free-space floor the tests' brokers run with (see `--min-free-bytes`).
pub const TEST_FLOOR_BYTES: &str = "16777216";

impl TestBroker {
    /// Starts a broker with `cores` cores on `dir` (extra flags appended).
    pub fn start(dir: &Path, cores: usize, extra: &[&str]) -> TestBroker {
        Self::start_at("127.0.0.1:0", dir, cores, extra)
    }

    /// [`TestBroker::start`] listening on `listen`.
    pub fn start_at(listen: &str, dir: &Path, cores: usize, extra: &[&str]) -> TestBroker {
        let cores_s = cores.to_string();
        let dir_s = dir.display().to_string();
        let mut args = vec![
            "felix",
            "--listen",
            listen,
            "--data-dir",
            &dir_s,
            "--cores",
            &cores_s,
            "--metrics",
            "off",
            "--no-pin",
        ];
        // Tests write megabytes: a floor of their own keeps them independent of how full the
        // host's disk is (the default floor is 5 % of it, up to 4 GiB), unless a test sets one.
        if !extra.contains(&"--min-free-bytes") {
            args.extend_from_slice(&["--min-free-bytes", TEST_FLOOR_BYTES]);
        }
        args.extend_from_slice(extra);
        let serve = config::parse_serve(&args).expect("config");
        let broker = Broker::start(&serve).expect("broker start");
        TestBroker { addr: broker.local_addr(), broker: Some(broker), dir: dir.to_owned() }
    }

    /// A client configuration for this broker.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            addr: self.addr.to_string(),
            trust: Some(Trust::CaFile(self.dir.join("dev-cert.pem"))),
            publish: PublishSettings { linger_us: 200, ..PublishSettings::default() },
            ..ClientConfig::default()
        }
    }

    /// A connected client.
    pub async fn client(&self) -> Client {
        self.client_with(self.client_config()).await
    }

    /// A client connected with `config` (built from [`TestBroker::client_config`]).
    pub async fn client_with(&self, config: ClientConfig) -> Client {
        tokio::time::timeout(WAIT, Client::connect(config))
            .await
            .expect("connect timed out")
            .expect("connect")
    }

    /// The sum over cores of a broker counter.
    pub fn counter(&self, name: &str) -> u64 {
        self.counter_per_core(name).iter().sum()
    }

    /// A broker counter of each core, in core order.
    pub fn counter_per_core(&self, name: &str) -> Vec<u64> {
        let b = self.broker.as_ref().expect("running");
        b.stats
            .iter()
            .map(|s| s.counters.fields().iter().find(|f| f.0 == name).map_or(0, |f| f.2))
            .collect()
    }

    /// The sum over cores of a network counter (`felix_net_*`), read now.
    pub fn net_counter(&self, name: &str) -> u64 {
        let b = self.broker.as_ref().expect("running");
        b.refresh();
        let net = b.net.lock().expect("network counters");
        net.iter().flat_map(|core| core.iter()).filter(|f| f.0 == name).map(|f| f.1).sum()
    }

    /// Stops the broker gracefully.
    pub fn stop(&mut self) {
        if let Some(b) = self.broker.take() {
            b.shutdown();
        }
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A raw QUIC connection (quinn) to the broker, for hand-made bytes.
pub async fn raw_connection(addr: std::net::SocketAddr, dir: &Path) -> quinn::Connection {
    try_raw_connection(addr, &dir.join("dev-cert.pem"), None).await.expect("handshake")
}

/// A raw connection trusting the certificates in `ca` (PEM), presenting, with `identity`, the
/// certificate and key (PEM) as its client certificate, as a broker of a cluster does; the
/// handshake's error otherwise.
pub async fn try_raw_connection(
    addr: std::net::SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<quinn::Connection, quinn::ConnectionError> {
    use rustls::pki_types::pem::PemObject;
    let certs = felix_client::tls::read_ca_file(ca).expect("CA file");
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots);
    let mut tls = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = rustls::pki_types::CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .expect("client certificate");
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).expect("client key");
            builder.with_client_auth_cert(chain, key).expect("client auth")
        }
    };
    tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic tls");
    let mut endpoint = quinn::Endpoint::client(
        if addr.ip().is_loopback() { "127.0.0.1:0" } else { "0.0.0.0:0" }.parse().unwrap(),
    )
    .expect("endpoint");
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    tokio::time::timeout(WAIT, endpoint.connect(addr, "localhost").expect("connect"))
        .await
        .expect("handshake timed out")
}

/// A raw connection whose first stream said Hello (every capability) and got HelloOk: the
/// connection may send any request on any stream now. The stream is returned to keep it open.
pub async fn raw_session(
    addr: std::net::SocketAddr,
    dir: &Path,
) -> (quinn::Connection, quinn::SendStream, quinn::RecvStream) {
    use felix_proto::{Capabilities, Frame, Hello, PROTOCOL_VERSION};
    let conn = raw_connection(addr, dir).await;
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    let hello = Hello { version: PROTOCOL_VERSION, capabilities: Capabilities::ALL, token: None };
    send.write_all(&Frame::Hello(hello).to_bytes()).await.expect("write Hello");
    match &read_frames(&mut recv, 1).await[..] {
        [Frame::HelloOk(_)] => {}
        other => panic!("Hello answered {other:?}"),
    }
    (conn, send, recv)
}

/// A CommitOffset of `group` on shard 0 of `stream` at `offset`, correlated by `request`.
pub fn commit_frame(stream: &str, group: &str, request: u64, offset: u64) -> felix_proto::Frame {
    felix_proto::Frame::CommitOffset(felix_proto::CommitOffset {
        request_id: felix_proto::RequestId(request),
        stream: stream.into(),
        group: group.into(),
        shard: felix_proto::ShardId(0),
        offset: felix_proto::Offset(offset),
    })
}

/// A randomised test's seed: `FELIX_TEST_SEED`, else the clock; printed with how to rerun.
pub fn test_seed(what: &str) -> u64 {
    let seed =
        std::env::var("FELIX_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    println!("{what} seed {seed} (rerun with FELIX_TEST_SEED={seed})");
    seed
}

/// Reads frames from `recv` until `n` arrived or the stream ended. The flags of every capability
/// are accepted: the tests' raw clients advertise them all (a test that advertises less checks
/// what the broker sent itself).
pub async fn read_frames(recv: &mut quinn::RecvStream, n: usize) -> Vec<felix_proto::Frame> {
    let mut decoder = felix_proto::FrameDecoder::new(
        felix_proto::Limits::default(),
        felix_proto::Capabilities::ALL,
    );
    let mut out = Vec::new();
    while out.len() < n {
        let chunk =
            tokio::time::timeout(WAIT, recv.read_chunk(65536, true)).await.expect("read timed out");
        match chunk {
            Ok(Some(c)) => decoder.handle_chunk(c.bytes),
            _ => break,
        }
        while let Some(f) = decoder.poll_frame() {
            out.push(f.expect("broker sent a bad frame"));
        }
    }
    out
}

/// A `felix serve` process; dropping it kills it with SIGKILL (the crash tests' kill -9).
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Killed {
    /// Stops the broker gracefully (SIGTERM, as a service manager does) and waits for its
    /// exit, which must be clean.
    pub fn terminate(mut self) {
        let pid = libc::pid_t::try_from(self.0.id()).expect("a pid");
        // SAFETY: kill(2) with a pid of our own child and a valid signal has no memory effect.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM");
        let status = self.0.wait().expect("wait for the broker");
        assert!(status.success(), "graceful stop exited with {status}");
    }
}

/// A free loopback address (`127.0.0.1:port`) below the kernel's ephemeral port range, for a
/// broker restarted on its address: while it is down, a client's reconnect attempts bind
/// ephemeral ports and may take an address handed out from that range.
///
/// Each call of one test process starts at a port of its own (the tests run in parallel: a
/// port free while one broker restarts must not go to another).
pub fn free_addr_for_restarts() -> String {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let start = std::process::id().wrapping_mul(31).wrapping_add(call * 1_009) % 12_000;
    (0..2_000u32)
        .map(|i| (20_000 + (start + i * 7) % 12_000) as u16)
        .find_map(|port| {
            let addr = format!("127.0.0.1:{port}");
            std::net::UdpSocket::bind(&addr).ok().map(|_| addr)
        })
        .expect("a free port below the ephemeral range")
}

/// A free loopback address (`127.0.0.1:port`) for a broker process.
pub fn free_addr() -> String {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

/// Starts the `felix` binary serving `dir` on `addr` with 2 cores, unpinned, no metrics and
/// the tests' free-space floor, plus `extra` flags; its output is discarded.
pub fn spawn_felix(dir: &Path, addr: &str, extra: &[&str]) -> Killed {
    spawn_felix_cores(dir, addr, 2, extra)
}

/// Like [`spawn_felix`], with `cores` cores.
pub fn spawn_felix_cores(dir: &Path, addr: &str, cores: usize, extra: &[&str]) -> Killed {
    let cores = cores.to_string();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_felix"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FELIX_")) {
        cmd.env_remove(k);
    }
    cmd.args(["serve", "--listen", addr, "--cores", &cores, "--no-pin", "--metrics", "off"])
        .args(["--min-free-bytes", TEST_FLOOR_BYTES])
        .args(extra)
        .arg("--data-dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    Killed(cmd.spawn().expect("spawn felix"))
}

/// Connects with `config(addr, dir)` once the broker at `addr` wrote its development
/// certificate into `dir` and answers, retrying for at most [`WAIT`].
pub async fn connect_when_up(
    addr: &str,
    dir: &Path,
    config: impl Fn(&str, &Path) -> ClientConfig,
) -> Client {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if dir.join("dev-cert.pem").exists() {
            if let Ok(client) = Client::connect(config(addr, dir)).await {
                return client;
            }
        }
        assert!(std::time::Instant::now() < deadline, "broker did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A read-back of records published as `Record::keyed("key-<k>", <seq as u32 big-endian>..)`:
/// what was stored, per key in order and per shard by offset, checked as records arrive (none
/// twice) and at the end (each key's sequence numbers in order from 0, each shard's offsets
/// dense from 0). `what` names the trial in every failure.
#[derive(Default)]
pub struct ReadBack {
    /// Every (key, seq) stored.
    pub all: std::collections::HashSet<(u32, u32)>,
    seqs: std::collections::HashMap<u32, Vec<u32>>,
    offsets: std::collections::HashMap<u32, Vec<u64>>,
    /// Where each (key, seq) was read: (shard, offset).
    at: std::collections::HashMap<(u32, u32), (u32, u64)>,
    /// What was read at each (shard, offset) of the lenient keys (see `add_keyed`).
    positions: std::collections::HashMap<(u32, u64), (u32, u32)>,
}

impl ReadBack {
    /// Records one received record; a (key, seq) seen before fails the test.
    pub fn add(&mut self, r: &felix_client::ReceivedRecord, what: &str) {
        let key: u32 =
            String::from_utf8_lossy(r.key.as_ref().unwrap())["key-".len()..].parse().unwrap();
        let seq = u32::from_be_bytes(r.value[..4].try_into().unwrap());
        assert!(self.all.insert((key, seq)), "{what}: ({key}, {seq}) stored twice");
        self.seqs.entry(key).or_default().push(seq);
        self.offsets.entry(r.shard.0).or_default().push(r.offset.0);
        self.at.insert((key, seq), (r.shard.0, r.offset.0));
    }

    /// [`ReadBack::add`], except for the keys `lenient` picks (a producer that is not
    /// idempotent): those may be stored twice and are left out of the order check, but count
    /// for the offsets and positions.
    pub fn add_keyed(
        &mut self,
        r: &felix_client::ReceivedRecord,
        lenient: impl Fn(u32) -> bool,
        what: &str,
    ) {
        let key: u32 =
            String::from_utf8_lossy(r.key.as_ref().unwrap())["key-".len()..].parse().unwrap();
        if !lenient(key) {
            return self.add(r, what);
        }
        let seq = u32::from_be_bytes(r.value[..4].try_into().unwrap());
        self.all.insert((key, seq));
        self.offsets.entry(r.shard.0).or_default().push(r.offset.0);
        self.positions.insert((r.shard.0, r.offset.0), (key, seq));
    }

    /// Every record read, by position: (shard, offset) -> (key, seq).
    pub fn by_position(&self) -> std::collections::HashMap<(u32, u64), (u32, u32)> {
        let mut all: std::collections::HashMap<_, _> =
            self.at.iter().map(|(k, at)| (*at, *k)).collect();
        all.extend(self.positions.iter().map(|(at, k)| (*at, *k)));
        all
    }

    /// Every record of `acked` stored; each key's records in publish order (seq numbers
    /// increasing: a record never acked may be missing); each shard's offsets dense from 0.
    pub fn assert_acked_in_order_and_dense(
        &self,
        acked: &std::collections::HashSet<(u32, u32)>,
        what: &str,
    ) {
        let missing: Vec<_> = acked.difference(&self.all).take(10).collect();
        assert!(missing.is_empty(), "{what}: acked records not stored, e.g. {missing:?}");
        for (key, seqs) in &self.seqs {
            if let Some(w) = seqs.windows(2).find(|w| w[0] >= w[1]) {
                let at = |s: u32| self.at.get(&(*key, s)).copied();
                panic!(
                    "{what}: order of key {key}: seq {} at {:?} before seq {} at {:?} (shard, offset)",
                    w[0],
                    at(w[0]),
                    w[1],
                    at(w[1])
                );
            }
        }
        for (shard, offs) in &self.offsets {
            let want: Vec<u64> = (0..offs.len() as u64).collect();
            assert_eq!(*offs, want, "{what}: offsets of shard {shard}");
        }
    }

    /// Each key's records in publish order from seq 0, each shard's offsets dense from 0.
    pub fn assert_ordered_and_dense(&self, what: &str) {
        for (key, seqs) in &self.seqs {
            let want: Vec<u32> = (0..seqs.len() as u32).collect();
            assert_eq!(*seqs, want, "{what}: order of key {key}");
        }
        for (shard, offs) in &self.offsets {
            let want: Vec<u64> = (0..offs.len() as u64).collect();
            assert_eq!(*offs, want, "{what}: offsets of shard {shard}");
        }
    }
}

/// A client of the broker at `addr` (trusting `ca`) that publishes durable, idempotent, keyed
/// batches of 8 records and keeps retrying them across faults: short timeouts, quick
/// reconnects, 25 s of retries.
pub fn retrying_client_config(addr: &str, ca: &Path) -> ClientConfig {
    ClientConfig {
        addr: addr.to_owned(),
        trust: Some(Trust::CaFile(ca.to_owned())),
        connect_timeout_ms: 1000,
        ack_timeout_ms: 2_000,
        idle_timeout_ms: 2_000,
        reconnect_attempts_max: 100,
        reconnect_backoff_min_ms: 20,
        reconnect_backoff_max_ms: 200,
        publish: PublishSettings {
            ack_mode: felix_client::AckMode::Durable,
            linger_us: 200,
            batch_records_max: 8,
            in_flight_batches_max: 32,
            idempotent: true,
            retry_timeout_ms: 25_000,
            ..PublishSettings::default()
        },
        ..ClientConfig::default()
    }
}
