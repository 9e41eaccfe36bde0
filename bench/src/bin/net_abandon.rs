//! Abandoned-connection generator for the memory benchmark (bench/abandon.sh).
//!
//! `net_abandon <addr> <dev-cert.pem> <handshakes> <conns> [subscribe]` runs one round:
//! - `handshakes` half-open handshakes: each from its own UDP socket, one client Initial is sent
//!   and the socket is closed at once, so the broker accepts the connection, answers with its
//!   flight, and hears nothing more;
//! - `conns` full connections, all on one client endpoint and socket: each completes the
//!   handshake, sends Hello on a bidirectional stream and reads HelloOk (so the broker's
//!   application holds a session and a stream reader for it), then the endpoint and socket are
//!   dropped without a CONNECTION_CLOSE. The broker only learns by its idle timeout. With
//!   `subscribe`, each also subscribes to `bench/abandon/s` from the latest offset and waits for
//!   SubscribeOk first, so the broker holds a subscription (pumps, a tail waiter) for it too.
//!
//! The client is quinn-proto driven by hand (no runtime), so nothing is sent after the
//! generator decides to abandon a connection. Prints one JSON line with what it did.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
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

/// The stream the `subscribe` mode subscribes to (auto-created by the broker).
const SUBSCRIBE_STREAM: &str = "bench/abandon/s";
/// Longest a round of full connections may take before the stragglers are abandoned as they are.
const ROUND_DEADLINE: Duration = Duration::from_secs(30);
/// Largest UDP datagram the client receives.
const RECV_BUF_BYTES: usize = 64 * 1024;
/// Client socket receive buffer: the broker's answers to a burst of handshakes arrive together.
const SOCKET_RCVBUF_BYTES: usize = 8 << 20;
/// Longest the event loop sleeps in `recv` when no timer is due sooner.
const MAX_POLL_WAIT: Duration = Duration::from_millis(5);

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 5 || (args.len() == 6 && args[5] == "subscribe"),
        "usage: net_abandon <addr> <dev-cert.pem> <handshakes> <conns> [subscribe]"
    );
    let subscribe = args.len() == 6;
    let addr: SocketAddr = args[1].parse()?;
    let client = client_config(std::path::Path::new(&args[2]))?;
    let handshakes: usize = args[3].parse()?;
    let conns: usize = args[4].parse()?;

    let t0 = Instant::now();
    let initials = half_open(addr, &client, handshakes)?;
    let t1 = Instant::now();
    let full = full_connections(addr, &client, conns, subscribe)?;
    println!(
        "{}",
        serde_json::json!({
            "half_open_sent": initials,
            "half_open_s": (t1 - t0).as_secs_f64(),
            "full_connected": full.connected,
            "full_hello_ok": full.hello_ok,
            "full_subscribed": full.subscribed,
            "full_s": t1.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

/// A client configuration trusting only the broker's development certificate, with no idle
/// timeout of its own (the broker's decides) and no keep-alives.
fn client_config(cert: &std::path::Path) -> anyhow::Result<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(cert)? {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut config = ClientConfig::new(Arc::new(crypto));
    let mut transport = TransportConfig::default();
    transport.max_idle_timeout(None).keep_alive_interval(None);
    config.transport_config(Arc::new(transport));
    Ok(config)
}

fn new_endpoint() -> Endpoint {
    Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None)
}

/// Sends `n` client Initials, each from a fresh socket closed right after. Returns how many
/// were sent.
fn half_open(addr: SocketAddr, client: &ClientConfig, n: usize) -> anyhow::Result<usize> {
    let mut sent = 0;
    let mut buf = Vec::with_capacity(RECV_BUF_BYTES);
    for _ in 0..n {
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        let mut endpoint = new_endpoint();
        let now = Instant::now();
        let (_, mut conn) = endpoint.connect(now, client.clone(), addr, "localhost")?;
        buf.clear();
        if let Some(t) = conn.poll_transmit(now, 1, &mut buf) {
            socket.send_to(&buf[..t.size], t.destination)?;
            sent += 1;
        }
        // `conn`, `endpoint` and `socket` drop here: the handshake is abandoned after the
        // first flight.
    }
    Ok(sent)
}

struct FullRound {
    connected: usize,
    hello_ok: usize,
    subscribed: usize,
}

/// One client connection of the full round.
struct Client {
    conn: quinn_proto::Connection,
    stream: Option<StreamId>,
    decoder: FrameDecoder,
    connected: bool,
    hello_ok: bool,
    subscribed: bool,
    lost: bool,
}

impl Client {
    /// Whether this connection got as far as the round asks.
    fn done(&self, subscribe: bool) -> bool {
        self.lost || if subscribe { self.subscribed } else { self.hello_ok }
    }
}

/// Opens `n` connections on one endpoint, says Hello on each, reads HelloOk (and SubscribeOk
/// when `subscribe`), and abandons them.
fn full_connections(
    addr: SocketAddr,
    client: &ClientConfig,
    n: usize,
    subscribe: bool,
) -> anyhow::Result<FullRound> {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    // Best effort: the kernel caps it at net.core.rmem_max.
    let _ = socket.set_recv_buffer_size(SOCKET_RCVBUF_BYTES);
    socket.bind(&"127.0.0.1:0".parse::<SocketAddr>()?.into())?;
    let socket: UdpSocket = socket.into();
    let local = socket.local_addr()?;
    let mut endpoint = new_endpoint();
    let mut clients: HashMap<ConnectionHandle, Client> = HashMap::new();
    let start = Instant::now();
    for _ in 0..n {
        let (ch, conn) = endpoint.connect(start, client.clone(), addr, "localhost")?;
        clients.insert(
            ch,
            Client {
                conn,
                stream: None,
                decoder: FrameDecoder::new(Limits::default(), Capabilities::ALL),
                connected: false,
                hello_ok: false,
                subscribed: false,
                lost: false,
            },
        );
    }
    let mut hello = BytesMut::new();
    Frame::Hello(Hello { version: PROTOCOL_VERSION, capabilities: Capabilities::ALL, token: None })
        .encode(&mut hello);
    if subscribe {
        Frame::Subscribe(Subscribe {
            request_id: RequestId(1),
            stream: SUBSCRIBE_STREAM.to_owned(),
            shards: None,
            start: StartAt::Latest,
            group: None,
            positions: None,
        })
        .encode(&mut hello);
    }
    let mut buf = Vec::with_capacity(RECV_BUF_BYTES);
    let mut recv = vec![0u8; RECV_BUF_BYTES];
    loop {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for (&ch, c) in clients.iter_mut() {
            if c.conn.poll_timeout().is_some_and(|t| t <= now) {
                c.conn.handle_timeout(now);
            }
            step(ch, c, &mut endpoint, &hello);
            loop {
                buf.clear();
                let Some(t) = c.conn.poll_transmit(now, 1, &mut buf) else { break };
                // A full socket buffer loses the datagram; QUIC retransmits it.
                let _ = socket.send_to(&buf[..t.size], t.destination);
            }
            if let Some(t) = c.conn.poll_timeout() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        if clients.values().all(|c| c.done(subscribe)) || start.elapsed() > ROUND_DEADLINE {
            break;
        }
        let wait = next
            .map_or(MAX_POLL_WAIT, |t| t.saturating_duration_since(Instant::now()))
            .clamp(Duration::from_micros(100), MAX_POLL_WAIT);
        socket.set_read_timeout(Some(wait))?;
        // Drain what arrived, the first receive waiting up to `wait`.
        while let Ok((len, from)) = socket.recv_from(&mut recv) {
            socket.set_nonblocking(true)?;
            buf.clear();
            let data = BytesMut::from(&recv[..len]);
            match endpoint.handle(Instant::now(), from, Some(local.ip()), None, data, &mut buf) {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(c) = clients.get_mut(&ch) {
                        c.conn.handle_event(ev);
                    }
                }
                Some(DatagramEvent::Response(t)) => {
                    let _ = socket.send_to(&buf[..t.size], t.destination);
                }
                Some(DatagramEvent::NewConnection(_)) | None => {}
            }
        }
        socket.set_nonblocking(false)?;
    }
    let round = FullRound {
        connected: clients.values().filter(|c| c.connected).count(),
        hello_ok: clients.values().filter(|c| c.hello_ok).count(),
        subscribed: clients.values().filter(|c| c.subscribed).count(),
    };
    // Abandon: drop connections, endpoint and socket without sending anything more.
    drop(clients);
    drop(endpoint);
    drop(socket);
    Ok(round)
}

/// Endpoint events, application events and the Hello/HelloOk (and Subscribe/SubscribeOk)
/// exchange of one connection. `first` is what the client sends on its stream.
fn step(ch: ConnectionHandle, c: &mut Client, endpoint: &mut Endpoint, first: &[u8]) {
    while let Some(ev) = c.conn.poll_endpoint_events() {
        if let Some(conn_ev) = endpoint.handle_event(ch, ev) {
            c.conn.handle_event(conn_ev);
        }
    }
    while let Some(ev) = c.conn.poll() {
        match ev {
            Event::Connected => {
                c.connected = true;
                if let Some(id) = c.conn.streams().open(Dir::Bi) {
                    // A fresh stream's send buffer takes a Hello whole.
                    let _ = c.conn.send_stream(id).write(first);
                    c.stream = Some(id);
                }
            }
            Event::ConnectionLost { .. } => c.lost = true,
            Event::Stream(StreamEvent::Readable { id }) if Some(id) == c.stream => {
                let mut stream = c.conn.recv_stream(id);
                if let Ok(mut chunks) = stream.read(true) {
                    while let Ok(Some(chunk)) = chunks.next(RECV_BUF_BYTES) {
                        c.decoder.handle_chunk(chunk.bytes);
                    }
                    let _ = chunks.finalize();
                }
                while let Some(frame) = c.decoder.poll_frame() {
                    match frame {
                        Ok(Frame::HelloOk(_)) => c.hello_ok = true,
                        Ok(Frame::SubscribeOk(_)) => c.subscribed = true,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}
