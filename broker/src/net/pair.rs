//! An in-memory test pair, in the spirit of quinn-proto's `Pair`: the [`CoreState`]s of N
//! cores sharing one server address, a quinn-proto client [`Endpoint`], a network in memory
//! with a fixed one-way latency, and a clock only the test moves. No socket, thread or sleep:
//! a test is a sequence of inputs, and the endpoints' and CID generators' RNGs are seeded, so
//! every run takes the same path (only TLS key shares differ).
//!
//! The pair plays the parts of the glommio shell: it delivers datagrams to the core the
//! "kernel" picks ([`Steer`]), hands forwarded datagrams to their owner core, runs the driver
//! of every connection a core started and sends what the cores queued. The application is the
//! test itself, through the real handles ([`Connection`], polled once with a no-op waker).

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use felix_proto::CoreId;
use quinn_proto::{ClientConfig, ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, Event};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::cid::{steered_core_of_datagram, CoreCidGenerator};
use super::config::{NetConfig, TlsSource};
use super::conn::Connection;
use super::core::{CoreLimits, CoreState, Datagram, DriveOutcome};
use super::server::{base_endpoint_config, quic_server_config};
use super::stats::{CoreStats, CoreStatsSnapshot};
use super::tls::{ServerIdentity, ALPN};

/// The address every core's socket has.
pub(crate) const SERVER_ADDR: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 4433);
/// One-way delay of every datagram.
pub(crate) const LATENCY: Duration = Duration::from_millis(5);
/// Most steps one `run_*` call takes before the test fails (a loop that never settles).
const STEPS_MAX: usize = 200_000;
/// Seed of the endpoints' and CID generators' RNGs.
const SEED: u64 = 0x5eed_f311c;

/// A client address on the test network.
pub(crate) fn client_addr(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), port)
}

/// How the "kernel" picks the core for a datagram sent to the server address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Steer {
    /// SO_REUSEPORT without steering: a hash of the 4-tuple, here the client port modulo the
    /// core count (so a test picks a core by picking a port).
    Port,
    /// BPF steering: a short header goes to the core its CID's config bits and core byte name
    /// (the check value is not read), a long header as `Port`.
    Cid,
    /// Everything to this core.
    Core(usize),
}

/// One core as the pair runs it.
pub(crate) struct TestCore {
    /// The core's sans-IO state.
    pub(crate) state: CoreState,
    /// Connections whose driver "task" was started and has not ended.
    tasks: Vec<ConnectionHandle>,
    /// While true, every send finds the socket buffer full (WouldBlock).
    pub(crate) socket_full: bool,
}

impl TestCore {
    /// A copy of the core's counters.
    pub(crate) fn stats(&self) -> CoreStatsSnapshot {
        self.state.stats().snapshot()
    }

    /// The next connection the application accepts, if one is queued.
    pub(crate) fn accept(&mut self) -> Option<Connection> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.state.poll_accept(&mut cx) {
            Poll::Ready(c) => c,
            Poll::Pending => None,
        }
    }
}

/// One client connection and what it saw.
pub(crate) struct ClientConn {
    /// The quinn-proto connection.
    pub(crate) conn: quinn_proto::Connection,
    /// The address it sends from (changed by [`Pair::migrate`]).
    pub(crate) addr: SocketAddr,
    /// Every application event it produced, in order.
    pub(crate) events: Vec<Event>,
}

impl ClientConn {
    /// The handshake completed.
    pub(crate) fn is_connected(&self) -> bool {
        self.events.iter().any(|e| matches!(e, Event::Connected))
    }

    /// Why the connection was lost, if it was.
    pub(crate) fn lost(&self) -> Option<&quinn_proto::ConnectionError> {
        self.events.iter().find_map(|e| match e {
            Event::ConnectionLost { reason } => Some(reason),
            _ => None,
        })
    }
}

/// One datagram on the wire.
struct Packet {
    at: Instant,
    from: SocketAddr,
    to: SocketAddr,
    data: Vec<u8>,
}

/// N cores, one client endpoint, the network between them and the clock.
pub(crate) struct Pair {
    /// The cores, by index.
    pub(crate) cores: Vec<TestCore>,
    /// The client's connections.
    pub(crate) clients: BTreeMap<ConnectionHandle, ClientConn>,
    /// How datagrams to the server are spread over the cores.
    pub(crate) steer: Steer,
    /// The clock.
    pub(crate) now: Instant,
    epoch: Instant,
    client: Endpoint,
    client_config: ClientConfig,
    /// Datagrams in flight.
    pub(crate) wire: Wire,
}

/// The network: datagrams in flight, in order of arrival (the latency is fixed).
#[derive(Default)]
pub(crate) struct Wire {
    queue: VecDeque<Packet>,
    /// Datagrams ever sent (a step that sent nothing leaves it unchanged).
    sent: u64,
    /// When set to `n`, every `n`-th datagram the cores send is lost on the way.
    pub(crate) lose_every_nth_from_cores: Option<u64>,
    /// Datagrams the cores sent, counted for `lose_every_nth_from_cores`.
    from_cores: u64,
    /// Datagrams lost on the way.
    pub(crate) lost: u64,
}

impl Wire {
    fn push(&mut self, at: Instant, from: SocketAddr, to: SocketAddr, data: Vec<u8>) {
        self.queue.push_back(Packet { at, from, to, data });
        self.sent += 1;
    }
}

impl Pair {
    /// `cores` cores with the default configuration changed by `tweak`.
    pub(crate) fn new(cores: usize, tweak: impl FnOnce(&mut NetConfig)) -> Self {
        let mut config = NetConfig::new(
            SERVER_ADDR,
            cores,
            TlsSource::Dev { data_dir: "/nonexistent-felix-pair".into() },
        );
        // The network layer's tests drive it with client-opened unidirectional streams.
        config.peer_uni_streams = true;
        tweak(&mut config);
        config.validate().expect("test config is valid");
        let (identity, cert) = identity();
        let server_config = Arc::new(quic_server_config(&config, &identity).expect("config"));
        let base = base_endpoint_config(&config).expect("endpoint config");
        let now = Instant::now();
        let cores = (0..cores)
            .map(|i| {
                let core = CoreId(i as u16);
                let mut endpoint_config = base.clone();
                endpoint_config.cid_generator(move || {
                    let rng = StdRng::seed_from_u64(SEED + u64::from(core.0));
                    Box::new(CoreCidGenerator::with_rng(core, rng).expect("core in range"))
                });
                let endpoint = Endpoint::new(
                    Arc::new(endpoint_config),
                    Some(server_config.clone()),
                    true,
                    Some(seed_bytes(SEED + 100 + i as u64)),
                );
                let stats = Arc::new(CoreStats::default());
                let state = CoreState::new(
                    core,
                    config.cores,
                    endpoint,
                    stats,
                    CoreLimits::new(&config),
                    1,
                    now,
                );
                TestCore { state, tasks: Vec::new(), socket_full: false }
            })
            .collect();
        let client =
            Endpoint::new(Arc::new(EndpointConfig::default()), None, true, Some(seed_bytes(SEED)));
        Self {
            cores,
            clients: BTreeMap::new(),
            steer: Steer::Port,
            now,
            epoch: now,
            client,
            client_config: client_config(cert),
            wire: Wire::default(),
        }
    }

    /// Time since the pair was made.
    pub(crate) fn elapsed(&self) -> Duration {
        self.now - self.epoch
    }

    /// Starts a handshake from `addr` (nothing is sent until the pair runs).
    pub(crate) fn connect(&mut self, addr: SocketAddr) -> ConnectionHandle {
        let config = self.client_config.clone();
        self.connect_with(addr, config)
    }

    /// Starts a handshake from `addr` whose Initial carries the destination CID `dcid` (a
    /// client that picks its own, as aioquic's 8 random bytes or a Felix client naming a core).
    pub(crate) fn connect_with_dcid(&mut self, addr: SocketAddr, dcid: &[u8]) -> ConnectionHandle {
        let mut config = self.client_config.clone();
        let dcid = quinn_proto::ConnectionId::new(dcid);
        config.initial_dst_cid_provider(Arc::new(move || dcid));
        self.connect_with(addr, config)
    }

    fn connect_with(&mut self, addr: SocketAddr, config: ClientConfig) -> ConnectionHandle {
        let (ch, conn) = self
            .client
            .connect(self.now, config, SERVER_ADDR, "localhost")
            .expect("client connects");
        self.clients.insert(ch, ClientConn { conn, addr, events: Vec::new() });
        ch
    }

    /// Connects from `addr` and runs until the handshake completed on both sides.
    pub(crate) fn connect_and_wait(&mut self, addr: SocketAddr) -> ConnectionHandle {
        let handshakes = self.handshakes();
        let ch = self.connect(addr);
        let done = self.run_until(Duration::from_secs(5), |p| {
            p.clients[&ch].is_connected() && p.handshakes() > handshakes
        });
        assert!(done, "handshake from {addr} completes");
        ch
    }

    /// Handshakes completed on every core together.
    pub(crate) fn handshakes(&self) -> u64 {
        self.cores.iter().map(|c| c.stats().handshakes).sum()
    }

    /// The client connection `ch`.
    pub(crate) fn client(&mut self, ch: ConnectionHandle) -> &mut quinn_proto::Connection {
        &mut self.clients.get_mut(&ch).expect("known client connection").conn
    }

    /// The client connection `ch` now sends from `addr` (a NAT rebinding or a new network).
    pub(crate) fn migrate(&mut self, ch: ConnectionHandle, addr: SocketAddr) {
        self.clients.get_mut(&ch).expect("known client connection").addr = addr;
    }

    /// Runs for `d` of simulated time.
    pub(crate) fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        self.run_until_time(end, |_| false);
    }

    /// Runs until `done` holds (true) or `limit` of simulated time passed (false).
    pub(crate) fn run_until(&mut self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let end = self.now + limit;
        self.run_until_time(end, done)
    }

    fn run_until_time(&mut self, end: Instant, done: impl Fn(&Self) -> bool) -> bool {
        for _ in 0..STEPS_MAX {
            if done(self) {
                return true;
            }
            if self.step() {
                continue;
            }
            match self.next_event() {
                Some(t) if t <= end => self.now = self.now.max(t),
                _ => {
                    self.now = end;
                    return done(self);
                }
            }
        }
        panic!("the pair did not settle within {STEPS_MAX} steps at {:?}", self.elapsed());
    }

    /// Everything due now: delivers datagrams, runs the cores and the client. Returns whether
    /// a datagram moved.
    fn step(&mut self) -> bool {
        let sent = self.wire.sent;
        let mut moved = false;
        while self.wire.queue.front().is_some_and(|p| p.at <= self.now) {
            let Some(p) = self.wire.queue.pop_front() else { break };
            self.deliver(p);
            moved = true;
        }
        for i in 0..self.cores.len() {
            self.drive_core(i);
        }
        self.drive_client();
        moved || self.wire.sent != sent
    }

    /// The earliest time something is due: a datagram arrives or a timer fires.
    fn next_event(&mut self) -> Option<Instant> {
        let mut next = self.wire.queue.front().map(|p| p.at);
        let mut consider = |t: Option<Instant>| {
            next = match (next, t) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        for core in &mut self.cores {
            for &ch in &core.tasks {
                consider(core.state.poll_timeout(ch));
            }
        }
        for c in self.clients.values_mut() {
            consider(c.conn.poll_timeout());
        }
        next
    }

    fn deliver(&mut self, p: Packet) {
        if p.to == SERVER_ADDR {
            let i = self.pick_core(&p);
            let d = Datagram {
                data: BytesMut::from(&p.data[..]),
                remote: p.from,
                local_ip: None,
                ecn: None,
            };
            CoreStats::add(&self.cores[i].state.stats().datagrams_in, 1);
            self.cores[i].state.handle_datagram(self.now, d);
            self.flush_core(i);
            return;
        }
        // A client address no connection uses any more is gone (the old port after a rebind).
        if !self.clients.values().any(|c| c.addr == p.to) {
            return;
        }
        let mut buf = Vec::new();
        let data = BytesMut::from(&p.data[..]);
        match self.client.handle(self.now, p.from, None, None, data, &mut buf) {
            Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                if let Some(c) = self.clients.get_mut(&ch) {
                    c.conn.handle_event(ev);
                }
            }
            Some(DatagramEvent::Response(t)) => {
                buf.truncate(t.size);
                self.send(p.to, t.destination, buf);
            }
            Some(DatagramEvent::NewConnection(incoming)) => self.client.ignore(incoming),
            None => {}
        }
    }

    fn pick_core(&self, p: &Packet) -> usize {
        let n = self.cores.len();
        let by_port = usize::from(p.from.port()) % n;
        match self.steer {
            Steer::Port => by_port,
            Steer::Core(i) => i,
            // As the programs do: bytes 1 and 2 of a short header, no check value.
            Steer::Cid => match steered_core_of_datagram(&p.data) {
                Some(c) if usize::from(c.0) < n => usize::from(c.0),
                _ => by_port,
            },
        }
    }

    fn send(&mut self, from: SocketAddr, to: SocketAddr, data: Vec<u8>) {
        self.wire.push(self.now + LATENCY, from, to, data);
    }

    /// Runs the driver of every connection core `i` started.
    fn drive_core(&mut self, i: usize) {
        let tasks = self.cores[i].tasks.clone();
        for ch in tasks {
            loop {
                let outcome = self.cores[i].state.drive(ch, self.now);
                self.flush_core(i);
                match outcome {
                    DriveOutcome::Gone => {
                        self.cores[i].tasks.retain(|&t| t != ch);
                        break;
                    }
                    DriveOutcome::Pending { keep_going: true } => {}
                    DriveOutcome::Pending { keep_going: false } => break,
                }
            }
        }
    }

    /// Does what core `i` queued: sends, forwards, starts driver tasks (as the shell does).
    fn flush_core(&mut self, i: usize) {
        let now = self.now;
        let mut forwards = Vec::new();
        let core = &mut self.cores[i];
        while let Some(t) = core.state.poll_transmit() {
            if core.socket_full {
                CoreStats::add(&core.state.stats().send_would_block, 1);
                core.state.handle_send_blocked(t, now);
                continue;
            }
            for d in t.datagrams() {
                self.wire.from_cores += 1;
                let n = self.wire.lose_every_nth_from_cores.unwrap_or(0);
                if n > 0 && self.wire.from_cores.is_multiple_of(n) {
                    self.wire.lost += 1;
                    continue;
                }
                self.wire.push(now + LATENCY, SERVER_ADDR, t.destination, d.to_vec());
            }
            CoreStats::add(&core.state.stats().datagrams_out, t.datagrams().count() as u64);
            core.state.recycle(t);
        }
        while let Some(f) = core.state.poll_forward() {
            CoreStats::add(&core.state.stats().forwarded_out, 1);
            forwards.push(f);
        }
        while let Some(ch) = core.state.poll_new_conn() {
            core.tasks.push(ch);
        }
        for (owner, d) in forwards {
            let owner = usize::from(owner.0);
            self.cores[owner].state.handle_forwarded(now, d);
            self.flush_core(owner);
        }
    }

    /// Runs every client connection: timers, transmits, endpoint and application events.
    fn drive_client(&mut self) {
        let now = self.now;
        let mut out = Vec::new();
        for (&ch, c) in &mut self.clients {
            if c.conn.poll_timeout().is_some_and(|t| t <= now) {
                c.conn.handle_timeout(now);
            }
            loop {
                let mut buf = Vec::new();
                let Some(t) = c.conn.poll_transmit(now, 1, &mut buf) else { break };
                buf.truncate(t.size);
                out.push((c.addr, t.destination, buf));
            }
            while let Some(ev) = c.conn.poll_endpoint_events() {
                if let Some(conn_ev) = self.client.handle_event(ch, ev) {
                    c.conn.handle_event(conn_ev);
                }
            }
            while let Some(ev) = c.conn.poll() {
                c.events.push(ev);
            }
        }
        for (from, to, data) in out {
            self.send(from, to, data);
        }
    }
}

/// Polls `f` once with a waker that does nothing (the pair drives everything itself).
pub(crate) fn poll_once<F: Future>(f: F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    pin!(f).poll(&mut cx)
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s
}

/// A self-signed certificate for `localhost`, in memory.
fn identity() -> (ServerIdentity, CertificateDer<'static>) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("rcgen");
    let cert = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let identity = ServerIdentity {
        certs: vec![cert.clone()],
        key,
        fingerprint: String::new(),
        generated: true,
    };
    (identity, cert)
}

/// A client configuration trusting `cert`, ALPN `felix/1`.
fn client_config(cert: CertificateDer<'static>) -> ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).expect("test certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
    ClientConfig::new(Arc::new(quic))
}
