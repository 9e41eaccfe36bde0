//! Abandoned clients leave nothing behind: handshakes dropped right after the client Initial,
//! and connections dropped without a CONNECTION_CLOSE after Hello and a Subscribe, are reaped by
//! the idle timeout, and every per-connection count the broker keeps (the network layer's
//! connection table, the application's open sessions) returns to zero, round after round.
//!
//! The client here is quinn-proto driven by hand over a std UDP socket, so nothing at all is
//! sent once a connection is abandoned. The memory curve of the same load at scale (500 + 500
//! per round) is `bench/abandon.sh`, results in `bench/results/2026-11-30-abandon/`.

mod e2e_support;

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use e2e_support::{TestBroker, WAIT};
use felix_proto::{
    Capabilities, Frame, FrameDecoder, Hello, Limits, RequestId, StartAt, Subscribe,
    PROTOCOL_VERSION,
};
use quinn_proto::{
    ClientConfig, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig, Event,
    StreamEvent, StreamId, TransportConfig,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The broker's idle timeout in this test.
const IDLE_TIMEOUT_MS: &str = "300";
/// Handshakes abandoned after the client Initial, per round.
const HALF_OPEN: usize = 12;
/// Connections abandoned after Hello and Subscribe, per round.
const ABANDONED: usize = 12;
/// Rounds: state left by one round would show in the next round's counts.
const ROUNDS: u64 = 3;

#[test]
fn abandoned_handshakes_and_connections_leave_no_state() {
    let dir = tempfile::tempdir().unwrap();
    // The stream the connections subscribe to (a Subscribe never creates one), made by a
    // broker of its own so that its client's connection is not counted below.
    let mut maker = TestBroker::start(dir.path(), 2, &[]);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let c = maker.client().await;
        c.create_stream("test/abandon/s", 2, Default::default()).await.unwrap();
        c.close();
    });
    maker.stop();
    let broker = TestBroker::start(dir.path(), 2, &["--idle-timeout-ms", IDLE_TIMEOUT_MS]);
    let client = client_config(&dir.path().join("dev-cert.pem"));
    for round in 1..=ROUNDS {
        assert_eq!(half_open(broker.addr, &client, HALF_OPEN), HALF_OPEN);
        let subscribed = abandon_subscribed(broker.addr, &client, ABANDONED);
        assert_eq!(subscribed, ABANDONED, "round {round}: every connection subscribed");
        let per_round = ABANDONED as u64;
        assert_eq!(broker.counter("connections_accepted"), round * per_round);
        assert!(broker.counter("subscriptions") >= round * per_round);

        // Nothing more is sent: only the idle timeout can end them.
        let deadline = Instant::now() + WAIT;
        while live(&broker) != (0, 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(live(&broker), (0, 0), "round {round}: (net connections, sessions) left");
        // Every abandoned connection, half-open ones included, ended by the idle timeout.
        let ended = round * (HALF_OPEN + ABANDONED) as u64;
        assert_eq!(net_counter(&broker, "idle_timeouts"), ended, "round {round}");
        assert_eq!(net_counter(&broker, "handshakes"), round * per_round, "round {round}");
    }
}

/// (connections in the network layer's table, sessions the application holds open), summed
/// over cores.
fn live(broker: &TestBroker) -> (u64, u64) {
    (net_counter(broker, "connections"), broker.counter("connections_open"))
}

fn net_counter(broker: &TestBroker, name: &str) -> u64 {
    let b = broker.broker.as_ref().expect("running");
    b.refresh();
    let net = b.net.lock().unwrap().clone();
    net.iter().map(|core| core.iter().find(|f| f.0 == name).map_or(0, |f| f.1)).sum()
}

/// Trusts the broker's development certificate; no idle timeout or keep-alive of its own.
fn client_config(cert: &Path) -> ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(cert).expect("dev cert")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut config = ClientConfig::new(Arc::new(crypto));
    let mut transport = TransportConfig::default();
    transport.max_idle_timeout(None).keep_alive_interval(None);
    config.transport_config(Arc::new(transport));
    config
}

fn endpoint() -> Endpoint {
    Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None)
}

/// Sends `n` client Initials, each from its own socket, closed at once. Returns how many went.
fn half_open(addr: SocketAddr, client: &ClientConfig, n: usize) -> usize {
    let mut sent = 0;
    for _ in 0..n {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut endpoint = endpoint();
        let now = Instant::now();
        let (_, mut conn) = endpoint.connect(now, client.clone(), addr, "localhost").unwrap();
        let mut buf = Vec::new();
        if let Some(t) = conn.poll_transmit(now, 1, &mut buf) {
            socket.send_to(&buf[..t.size], t.destination).unwrap();
            sent += 1;
        }
    }
    sent
}

struct Abandoned {
    conn: quinn_proto::Connection,
    stream: Option<StreamId>,
    decoder: FrameDecoder,
    subscribed: bool,
}

/// Opens `n` connections on one endpoint; on each sends Hello and a Subscribe (from latest, to
/// an auto-created stream), waits for SubscribeOk, then drops everything without a close.
/// Returns how many got SubscribeOk.
fn abandon_subscribed(addr: SocketAddr, client: &ClientConfig, n: usize) -> usize {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = socket.local_addr().unwrap();
    let mut endpoint = endpoint();
    let start = Instant::now();
    let mut conns: HashMap<ConnectionHandle, Abandoned> = (0..n)
        .map(|_| {
            let (ch, conn) = endpoint.connect(start, client.clone(), addr, "localhost").unwrap();
            let decoder = FrameDecoder::new(Limits::default(), Capabilities::ALL);
            (ch, Abandoned { conn, stream: None, decoder, subscribed: false })
        })
        .collect();
    let mut first = BytesMut::new();
    Frame::Hello(Hello { version: PROTOCOL_VERSION, capabilities: Capabilities::ALL, token: None })
        .encode(&mut first);
    Frame::Subscribe(Subscribe {
        request_id: RequestId(1),
        stream: "test/abandon/s".to_owned(),
        shards: None,
        start: StartAt::Latest,
        group: None,
        positions: None,
    })
    .encode(&mut first);
    let mut buf = Vec::new();
    let mut recv = vec![0u8; 64 * 1024];
    while !conns.values().all(|c| c.subscribed) && start.elapsed() < WAIT {
        let now = Instant::now();
        for (&ch, c) in conns.iter_mut() {
            if c.conn.poll_timeout().is_some_and(|t| t <= now) {
                c.conn.handle_timeout(now);
            }
            step(ch, c, &mut endpoint, &first);
            loop {
                buf.clear();
                let Some(t) = c.conn.poll_transmit(now, 1, &mut buf) else { break };
                let _ = socket.send_to(&buf[..t.size], t.destination);
            }
        }
        socket.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
        while let Ok((len, from)) = socket.recv_from(&mut recv) {
            socket.set_nonblocking(true).unwrap();
            let data = BytesMut::from(&recv[..len]);
            buf.clear();
            match endpoint.handle(Instant::now(), from, Some(local.ip()), None, data, &mut buf) {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(c) = conns.get_mut(&ch) {
                        c.conn.handle_event(ev);
                    }
                }
                Some(DatagramEvent::Response(t)) => {
                    let _ = socket.send_to(&buf[..t.size], t.destination);
                }
                _ => {}
            }
        }
        socket.set_nonblocking(false).unwrap();
    }
    conns.values().filter(|c| c.subscribed).count()
    // `conns`, `endpoint` and `socket` drop here: abandoned, nothing more is sent.
}

fn step(ch: ConnectionHandle, c: &mut Abandoned, endpoint: &mut Endpoint, first: &[u8]) {
    while let Some(ev) = c.conn.poll_endpoint_events() {
        if let Some(conn_ev) = endpoint.handle_event(ch, ev) {
            c.conn.handle_event(conn_ev);
        }
    }
    while let Some(ev) = c.conn.poll() {
        match ev {
            Event::Connected => {
                let id = c.conn.streams().open(Dir::Bi).expect("a first stream");
                let written = c.conn.send_stream(id).write(first).expect("write");
                assert_eq!(written, first.len(), "a fresh stream takes Hello and Subscribe");
                c.stream = Some(id);
            }
            Event::Stream(StreamEvent::Readable { id }) if Some(id) == c.stream => {
                let mut stream = c.conn.recv_stream(id);
                if let Ok(mut chunks) = stream.read(true) {
                    while let Ok(Some(chunk)) = chunks.next(usize::MAX) {
                        c.decoder.handle_chunk(chunk.bytes);
                    }
                    let _ = chunks.finalize();
                }
                while let Some(frame) = c.decoder.poll_frame() {
                    match frame.expect("the broker sends valid frames") {
                        Frame::SubscribeOk(_) => c.subscribed = true,
                        Frame::HelloOk(_) => {}
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
            _ => {}
        }
    }
}
