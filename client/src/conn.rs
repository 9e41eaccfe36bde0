//! One connection to the broker: its own endpoint (UDP socket and driver task), the Hello
//! handshake, request lanes, and the acceptor of subscription streams.
//!
//! Call order: [`Conn::open`] (QUIC handshake, control stream, Hello → HelloOk), then
//! [`Conn::request`] on the control lane or [`Conn::open_lane`] for publish lanes, and
//! [`Conn::take_subscription_stream`] after a SubscribeOk. Every frame the client writes goes
//! through [`Conn::encode_checked`], which refuses any flag or frame the broker did not
//! advertise: that function is the single place the capability invariant is enforced.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use felix_proto::{
    decode_frame, Capabilities, CoreId, Frame, FrameDecoder, FrameType, Hello, HelloOk, Limits,
    RequestId, SubscriptionId, HEADER_LEN, PROTOCOL_VERSION,
};
use tokio::sync::oneshot;

use crate::error::ClientError;
use crate::socket::GsoCapped;
use crate::tls::RejectionNote;

/// The capabilities this client implements and offers in Hello (`CLUSTER` included: a broker in
/// a cluster then answers `NotOwner` instead of an error, and `Metadata`).
pub const CLIENT_CAPABILITIES: Capabilities = Capabilities::ALL;
/// The largest HelloOk (or Error answering Hello) accepted, header included.
const HELLO_ANSWER_BYTES_MAX: usize = HEADER_LEN + 8 + 4096 + 2;
/// The most subscription streams kept while their SubscribeOk has not been processed yet.
const ORPHAN_SUB_STREAMS_MAX: usize = 64;
/// How long the broker has to send SubscriptionStart on a new unidirectional stream.
const SUBSCRIPTION_START_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes asked of quinn per read.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// The largest frame this client decodes, whatever a broker advertises (16 MiB; Felix brokers
/// advertise about 4 MiB): what one stream may make it buffer.
pub const DECODE_FRAME_BYTES_MAX: u32 = 16 << 20;
/// The most records per batch this client decodes, whatever a broker advertises.
pub const DECODE_BATCH_RECORDS_MAX: u32 = 65_536;
/// A subscription stream's first frame, SubscriptionStart: a header and a u64. Until it
/// arrived a stream is decoded with this as its frame limit, so a stream that names no
/// subscription holds at most this much.
const SUBSCRIPTION_START_FRAME_BYTES: u32 = (HEADER_LEN + 8) as u32;

/// The limits this client decodes the broker's frames with: the broker's, capped.
fn decode_limits(broker: Limits) -> Limits {
    Limits {
        max_frame_bytes: broker.max_frame_bytes.min(DECODE_FRAME_BYTES_MAX),
        max_batch_records: broker.max_batch_records.min(DECODE_BATCH_RECORDS_MAX),
        ..broker
    }
}

/// An established connection.
pub(crate) struct Conn {
    connection: quinn::Connection,
    /// Kept so that the endpoint (socket + driver) lives as long as the connection.
    endpoint: quinn::Endpoint,
    hello: HelloOk,
    control: Arc<Lane>,
    next_request: AtomicU64,
    subs: Arc<SubRegistry>,
    ack_timeout: Duration,
    /// Connection-level errors (request id 0), e.g. refused unacked batches.
    pub(crate) unacked_errors: Arc<AtomicU64>,
    /// When the broker last answered a liveness probe on this connection (in a cluster,
    /// `cluster::conn_answers`); held while a probe runs, so waiters share it.
    pub(crate) probed: tokio::sync::Mutex<Option<std::time::Instant>>,
}

/// Receive buffer asked for on each endpoint's UDP socket (the kernel caps it at
/// `net.core.rmem_max`). A subscription's data arrives as fast as the broker's congestion window
/// allows; the default buffer (about 208 KiB) overflows whenever the client's thread is busy
/// for a millisecond or two, and every datagram dropped there halves the broker's window.
pub const SOCKET_RECV_BUFFER_BYTES: usize = 8 << 20;

/// An Initial destination connection ID naming broker core `core` in the broker's layout (with
/// its check value, which `felix_proto::cid::cid_for_core` computes), its other bits random
/// (from the TLS provider's generator, as quinn's own Initial IDs are); `None` when the core
/// cannot be named or no random bytes could be had (the connection then takes quinn's own).
fn initial_dcid_for(core: CoreId) -> Option<[u8; felix_proto::cid::CID_LEN]> {
    let mut random = [0u8; felix_proto::cid::CID_LEN];
    rustls::crypto::ring::default_provider().secure_random.fill(&mut random).ok()?;
    felix_proto::cid::cid_for_core(core, random)
}

/// A client endpoint bound to `bind`, its socket's receive buffer raised to
/// [`SOCKET_RECV_BUFFER_BYTES`] (best effort: a smaller buffer is not an error). It tells the
/// broker it takes datagrams of up to `max_udp_payload` bytes (QUIC's `max_udp_payload_size`),
/// so that the broker's path MTU discovery may grow what it sends to that, and its GSO sends stay
/// within the kernel's limit for datagrams that large ([`GsoCapped`]). The socket is
/// connected to `peer`, the one address its connection talks to, so that a refused port is
/// reported on it: the endpoint comes with a second descriptor of its socket, for
/// `socket::refused` (none when it cannot be duplicated).
fn client_endpoint(
    bind: SocketAddr,
    peer: SocketAddr,
    max_udp_payload: u16,
) -> std::io::Result<(quinn::Endpoint, Option<std::net::UdpSocket>)> {
    let socket = std::net::UdpSocket::bind(bind)?;
    socket.connect(peer)?;
    let watch = socket.try_clone().ok();
    let state = quinn::udp::UdpSocketState::new((&socket).into())?;
    if let Err(e) = state.set_recv_buffer_size((&socket).into(), SOCKET_RECV_BUFFER_BYTES) {
        tracing::debug!(error = %e, "cannot raise the UDP receive buffer");
    }
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(max_udp_payload)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let socket = GsoCapped::new(runtime.wrap_udp_socket(socket)?, max_udp_payload);
    let endpoint =
        quinn::Endpoint::new_with_abstract_socket(config, None, Arc::new(socket), runtime)?;
    Ok((endpoint, watch))
}

/// [`crate::socket::refused`] of `socket`; never without one.
async fn refused_if_watched(socket: Option<std::net::UdpSocket>) {
    match socket {
        Some(s) => crate::socket::refused(s).await,
        None => std::future::pending().await,
    }
}

/// Connection parameters that do not change across reconnects.
#[derive(Clone)]
pub(crate) struct ConnParams {
    pub addr: SocketAddr,
    pub server_name: String,
    pub quic: quinn::ClientConfig,
    pub rejection: RejectionNote,
    pub token: Option<Bytes>,
    pub connect_timeout: Duration,
    pub ack_timeout: Duration,
    /// The largest UDP payload this client takes and sends (its path MTU discovery's ceiling).
    pub max_udp_payload: u16,
}

impl Conn {
    /// The broker's address.
    pub(crate) fn peer(&self) -> std::net::SocketAddr {
        self.connection.remote_address()
    }
}

impl Conn {
    /// Opens a connection: QUIC handshake, control stream, Hello and HelloOk, all within the
    /// connect timeout. Each connection gets its own endpoint, so no task carries the packets of
    /// more than one connection and each connection has its own 4-tuple.
    pub(crate) async fn open(p: &ConnParams) -> Result<Arc<Self>, ClientError> {
        Self::open_on(p, None).await
    }

    /// [`Conn::open`], asking for broker core `core`: the Initial's destination connection ID
    /// names it (`felix_proto::cid`), and the broker hands the handshake to that core, which
    /// then owns the connection (`docs/connection-ids.md`). Where the broker does not, the
    /// connection lands where the kernel's hash puts it: `hello().core` says where.
    pub(crate) async fn open_on(
        p: &ConnParams,
        core: Option<CoreId>,
    ) -> Result<Arc<Self>, ClientError> {
        let limit_ms = p.connect_timeout.as_millis() as u64;
        match tokio::time::timeout(p.connect_timeout, Self::open_inner(p, core)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout { what: "connect", after_ms: limit_ms }),
        }
    }

    async fn open_inner(p: &ConnParams, core: Option<CoreId>) -> Result<Arc<Self>, ClientError> {
        let bind: SocketAddr = if p.addr.is_ipv6() {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let (endpoint, watch) = client_endpoint(bind, p.addr, p.max_udp_payload)
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        let mut quic = p.quic.clone();
        if let Some(dcid) = core.and_then(initial_dcid_for) {
            quic.initial_dst_cid_provider(Arc::new(move || quinn::ConnectionId::new(&dcid)));
        }
        let connecting = endpoint
            .connect_with(quic, p.addr, &p.server_name)
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        let connected = tokio::select! {
            c = connecting => c,
            () = refused_if_watched(watch) => {
                return Err(ClientError::PortUnreachable { addr: p.addr });
            }
        };
        let connection = match connected {
            Ok(c) => c,
            Err(e) => return Err(handshake_error(e, &p.rejection)),
        };
        let (mut send, mut recv) = connection.open_bi().await.map_err(lost)?;
        send.set_priority(crate::config::CONTROL_STREAM_PRIORITY).map_err(lost)?;
        let hello = Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            capabilities: CLIENT_CAPABILITIES,
            token: p.token.clone(),
        });
        send.write_all(&hello.to_bytes()).await.map_err(lost)?;
        let hello = match read_hello_answer(&mut recv).await? {
            Frame::HelloOk(h) if h.version == PROTOCOL_VERSION => h,
            Frame::HelloOk(h) => {
                return Err(ClientError::Protocol(format!("HelloOk with version {}", h.version)))
            }
            Frame::Error(e) => {
                return Err(ClientError::Refused { code: e.code, message: e.message })
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "{:?} instead of HelloOk",
                    other.frame_type()
                )))
            }
        };
        let unacked_errors = Arc::new(AtomicU64::new(0));
        let decode = decode_limits(hello.limits);
        let control = Lane::start(send, recv, decode, unacked_errors.clone());
        let subs = Arc::new(SubRegistry::default());
        tokio::spawn(accept_subscription_streams(connection.clone(), decode, subs.clone()));
        Ok(Arc::new(Self {
            connection,
            endpoint,
            hello,
            control,
            next_request: AtomicU64::new(1),
            subs,
            ack_timeout: p.ack_timeout,
            unacked_errors,
            probed: tokio::sync::Mutex::new(None),
        }))
    }

    /// The broker's HelloOk on this connection.
    pub(crate) fn hello(&self) -> &HelloOk {
        &self.hello
    }

    /// The broker's advertised capabilities, as far as this client implements them.
    pub(crate) fn capabilities(&self) -> Capabilities {
        self.hello.capabilities.intersect(CLIENT_CAPABILITIES)
    }

    /// Whether the connection is closed (by either side, or lost).
    pub(crate) fn is_closed(&self) -> bool {
        self.connection.close_reason().is_some()
    }

    /// QUIC's statistics of the connection: its path's (packets sent and lost, congestion
    /// events) and the frames sent and received (flow-control blocked frames among them).
    pub(crate) fn stats(&self) -> quinn::ConnectionStats {
        self.connection.stats()
    }

    /// Waits until the connection is closed (by either side, or lost), for at most `limit`.
    pub(crate) async fn closed_within(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.connection.closed()).await;
    }

    /// The ack and request limit.
    pub(crate) fn ack_timeout(&self) -> Duration {
        self.ack_timeout
    }

    /// A fresh request id, unique on this connection.
    pub(crate) fn next_request_id(&self) -> RequestId {
        RequestId(self.next_request.fetch_add(1, Ordering::Relaxed))
    }

    /// Encodes `frame` after checking it against the broker's capabilities and limits.
    pub(crate) fn encode_checked(&self, frame: &Frame) -> Result<Bytes, ClientError> {
        encode_checked(self.capabilities(), &self.hello.limits, frame)
    }

    /// Sends `frame` (whose request id is `id`) on the control lane and waits for its answer.
    pub(crate) async fn request(&self, id: RequestId, frame: &Frame) -> Result<Frame, ClientError> {
        let bytes = self.encode_checked(frame)?;
        let rx = self.control.send_request(id, bytes).await?;
        self.control.wait(id, rx, self.ack_timeout, "request").await
    }

    /// Opens another bidirectional stream for requests (publish lanes).
    pub(crate) async fn open_lane(&self) -> Result<Arc<Lane>, ClientError> {
        let (send, recv) = self.connection.open_bi().await.map_err(lost)?;
        Ok(Lane::start(send, recv, decode_limits(self.hello.limits), self.unacked_errors.clone()))
    }

    /// The unidirectional stream of subscription `id`, waiting for it if it has not arrived.
    pub(crate) async fn take_subscription_stream(
        &self,
        id: SubscriptionId,
    ) -> Result<SubStream, ClientError> {
        let rx = match self.subs.take_or_wait(id) {
            Ok(stream) => return Ok(stream),
            Err(rx) => rx,
        };
        // A stream that never comes (timeout, or this future dropped) leaves no slot behind.
        struct Forget<'a>(&'a SubRegistry, SubscriptionId);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.forget_waiting(self.1);
            }
        }
        let _forget = Forget(&self.subs, id);
        let after_ms = self.ack_timeout.as_millis() as u64;
        match tokio::time::timeout(self.ack_timeout, rx).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(_)) => {
                Err(ClientError::ConnectionLost("subscription stream acceptor ended".into()))
            }
            Err(_) => Err(ClientError::Timeout { what: "subscription stream", after_ms }),
        }
    }

    /// Closes the connection and its endpoint.
    pub(crate) fn close(&self) {
        self.connection.close(0u32.into(), b"client closed");
        self.endpoint.close(0u32.into(), b"client closed");
    }
}

/// The last handle gone, nothing can use the connection: close it, so that its reader tasks and
/// keep-alives stop too.
impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

/// Checks `frame` against `caps` and `limits`, then encodes it into one buffer (a Publish into
/// one of its exact size: copied once, record by record, never reallocated). quinn takes the
/// buffer as it is; sharing each payload instead costs more than the copy, because quinn's
/// send buffer looks a range up by walking its chunks one by one.
///
/// Refuses, before anything is written: a flag bit the broker did not advertise, a Subscribe
/// with a group or a CommitOffset without `CONSUMER_GROUPS`, Metadata without `CLUSTER`, and a
/// frame over the broker's `max_frame_bytes`.
pub(crate) fn encode_checked(
    caps: Capabilities,
    limits: &Limits,
    frame: &Frame,
) -> Result<Bytes, ClientError> {
    let flags = frame.flags();
    let allowed = caps.allowed_flags(frame.frame_type());
    let unadvertised = flags.0 & !allowed.0;
    if unadvertised & felix_proto::Flags::ACKED.0 != 0 {
        return Err(ClientError::Unsupported("acked publish"));
    }
    if unadvertised & felix_proto::Flags::KEYED.0 != 0 {
        return Err(ClientError::Unsupported("keyed publish"));
    }
    if unadvertised != 0 {
        return Err(ClientError::Unsupported("a flag bit the broker did not advertise"));
    }
    let needs_groups = match frame {
        Frame::Subscribe(s) => s.group.is_some(),
        Frame::CommitOffset(_) => true,
        _ => false,
    };
    if needs_groups && !caps.contains(Capabilities::CONSUMER_GROUPS) {
        return Err(ClientError::Unsupported("consumer groups"));
    }
    if matches!(frame, Frame::Metadata(_)) && !caps.contains(Capabilities::CLUSTER) {
        return Err(ClientError::Unsupported("cluster metadata"));
    }
    let max = limits.max_frame_bytes as usize;
    const SMALL_FRAME_BYTES: usize = 256;
    let size = match frame {
        Frame::Publish(p) => p.encoded_len(),
        _ => SMALL_FRAME_BYTES,
    };
    if size > max {
        return Err(ClientError::RecordTooLarge { len: size, max });
    }
    let mut buf = BytesMut::with_capacity(size);
    frame.encode(&mut buf);
    if buf.len() > max {
        return Err(ClientError::RecordTooLarge { len: buf.len(), max });
    }
    Ok(buf.freeze())
}

/// One bidirectional stream carrying requests; its reader task routes answers by request id.
pub(crate) struct Lane {
    send: Arc<tokio::sync::Mutex<quinn::SendStream>>,
    pending: Arc<Pending>,
}

type Answer = Result<Frame, ClientError>;

#[derive(Default)]
struct Pending {
    state: Mutex<PendingState>,
}

#[derive(Default)]
struct PendingState {
    /// Set once the lane is dead; later requests fail with it.
    closed: Option<ClientError>,
    waiting: HashMap<RequestId, oneshot::Sender<Answer>>,
}

impl Lane {
    fn start(
        send: quinn::SendStream,
        recv: quinn::RecvStream,
        limits: Limits,
        unacked_errors: Arc<AtomicU64>,
    ) -> Arc<Self> {
        let lane = Arc::new(Self {
            send: Arc::new(tokio::sync::Mutex::new(send)),
            pending: Arc::new(Pending::default()),
        });
        let reader =
            Reader { pending: lane.pending.clone(), send: lane.send.clone(), unacked_errors };
        tokio::spawn(read_answers(recv, limits, reader));
        lane
    }

    /// Registers `id` (when non-zero) and writes `bytes`, an encoded frame; returns where the
    /// answer will come. The buffer is handed to quinn as it is (no copy into its send buffer).
    pub(crate) async fn send_request(
        &self,
        id: RequestId,
        bytes: Bytes,
    ) -> Result<oneshot::Receiver<Answer>, ClientError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.pending.lock();
            if let Some(e) = &state.closed {
                return Err(e.clone());
            }
            if id.0 != 0 {
                state.waiting.insert(id, tx);
            }
        }
        let written = self.send.lock().await.write_all_chunks(&mut [bytes]).await;
        if let Err(e) = written {
            self.pending.lock().waiting.remove(&id);
            return Err(lost(e));
        }
        Ok(rx)
    }

    /// Waits for the answer to `id` for at most `limit`.
    pub(crate) async fn wait(
        &self,
        id: RequestId,
        rx: oneshot::Receiver<Answer>,
        limit: Duration,
        what: &'static str,
    ) -> Result<Frame, ClientError> {
        wait_answer(&self.pending, id, rx, limit, what).await
    }

    /// A handle that can wait for answers without borrowing the lane.
    pub(crate) fn waiter(&self) -> LaneWaiter {
        LaneWaiter { pending: self.pending.clone() }
    }

    /// Whether the lane can no longer carry requests.
    pub(crate) fn is_closed(&self) -> bool {
        self.pending.lock().closed.is_some()
    }
}

/// Waits for answers of one lane (held by ack tasks).
pub(crate) struct LaneWaiter {
    pending: Arc<Pending>,
}

impl LaneWaiter {
    /// Waits for the answer to `id` for at most `limit`.
    pub(crate) async fn wait(
        &self,
        id: RequestId,
        rx: oneshot::Receiver<Answer>,
        limit: Duration,
        what: &'static str,
    ) -> Result<Frame, ClientError> {
        wait_answer(&self.pending, id, rx, limit, what).await
    }
}

async fn wait_answer(
    pending: &Pending,
    id: RequestId,
    rx: oneshot::Receiver<Answer>,
    limit: Duration,
    what: &'static str,
) -> Result<Frame, ClientError> {
    // However the wait ends (an answer, a timeout, the future dropped), the request is no
    // longer waited for: an answer that never comes leaves no entry behind.
    struct Forget<'a>(&'a Pending, RequestId);
    impl Drop for Forget<'_> {
        fn drop(&mut self) {
            self.0.lock().waiting.remove(&self.1);
        }
    }
    let _forget = Forget(pending, id);
    match tokio::time::timeout(limit, rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(ClientError::ConnectionLost("answer stream ended".into())),
        Err(_) => Err(ClientError::Timeout { what, after_ms: limit.as_millis() as u64 }),
    }
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, PendingState> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts and
        // removes), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resolve(&self, id: RequestId, answer: Answer) {
        let tx = self.lock().waiting.remove(&id);
        match tx {
            Some(tx) => {
                let _ = tx.send(answer);
            }
            None => tracing::debug!(request = id.0, "answer for no waiting request (timed out?)"),
        }
    }

    fn close(&self, why: ClientError) {
        let waiting = {
            let mut state = self.lock();
            state.closed.get_or_insert(why.clone());
            std::mem::take(&mut state.waiting)
        };
        for (_, tx) in waiting {
            let _ = tx.send(Err(why.clone()));
        }
    }
}

/// The lane's last handle gone (its worker stopped: a publisher dropped or closed): finish its
/// send side, so the broker ends its side too, the reader task sees the stream end and drops
/// its handle of the send side, and the stream's credit returns to the connection. Without
/// it each dropped publisher left its streams open for the connection's life, and a client
/// that made publishers one after another stalled once the broker's stream limit was reached.
impl Drop for Lane {
    fn drop(&mut self) {
        if let Ok(mut s) = self.send.try_lock() {
            let _ = s.finish();
            return;
        }
        // A write (a Pong) in progress: finish once it is done.
        let send = self.send.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = send.lock().await.finish();
            });
        }
    }
}

/// What the reader task of a lane needs.
struct Reader {
    pending: Arc<Pending>,
    /// To answer the broker's Ping.
    send: Arc<tokio::sync::Mutex<quinn::SendStream>>,
    unacked_errors: Arc<AtomicU64>,
}

/// Reads answers from one lane and hands each to the request that waits for it.
async fn read_answers(mut recv: quinn::RecvStream, limits: Limits, reader: Reader) {
    let Reader { pending, send, unacked_errors } = reader;
    // The broker's answers may carry the flags of what this client advertised.
    let mut decoder = FrameDecoder::new(limits, CLIENT_CAPABILITIES);
    let why = loop {
        let chunk = match recv.read_chunk(READ_CHUNK_BYTES, true).await {
            Ok(Some(chunk)) => chunk.bytes,
            Ok(None) => break ClientError::ConnectionLost("the broker finished the stream".into()),
            Err(e) => break lost(e),
        };
        decoder.handle_chunk(chunk);
        let mut fatal = None;
        while let Some(item) = decoder.poll_frame() {
            match item {
                Ok(Frame::Ping(nonce)) => {
                    let pong = Frame::Pong(nonce).to_bytes();
                    if let Err(e) = send.lock().await.write_all(&pong).await {
                        fatal = Some(lost(e));
                        break;
                    }
                }
                Ok(frame) => route_answer(frame, &pending, &unacked_errors),
                Err(e) if e.fatal => {
                    fatal = Some(ClientError::Protocol(format!("framing lost: {e}")));
                    break;
                }
                Err(e) => match e.request_id {
                    Some(id) => pending.resolve(id, Err(ClientError::Protocol(e.to_string()))),
                    None => tracing::warn!(error = %e, "undecodable frame from the broker"),
                },
            }
        }
        if let Some(why) = fatal {
            break why;
        }
    };
    pending.close(why);
}

fn route_answer(frame: Frame, pending: &Pending, unacked_errors: &AtomicU64) {
    let (id, answer) = match frame {
        Frame::PublishAck(a) => (a.request_id, Ok(Frame::PublishAck(a))),
        Frame::StreamInfo(s) => (s.request_id, Ok(Frame::StreamInfo(s))),
        Frame::StreamList(s) => (s.request_id, Ok(Frame::StreamList(s))),
        Frame::SubscribeOk(s) => (s.request_id, Ok(Frame::SubscribeOk(s))),
        Frame::CommitOk(id) => (id, Ok(Frame::CommitOk(id))),
        Frame::MetadataOk(m) => (m.request_id, Ok(Frame::MetadataOk(m))),
        Frame::NotOwner(n) if n.request_id.0 != 0 => {
            let felix_proto::NotOwner { request_id, stream, shard, owner } = n;
            (request_id, Err(ClientError::NotOwner { stream, shard, owner }))
        }
        Frame::PublishError(e) | Frame::Error(e) if e.request_id.0 != 0 => {
            (e.request_id, Err(ClientError::from_broker(e.code, e.message)))
        }
        Frame::PublishError(e) | Frame::Error(e) => {
            unacked_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(code = ?e.code, message = %e.message, "connection-level broker error");
            return;
        }
        Frame::Pong(_) => return,
        other => {
            tracing::warn!(frame = ?other.frame_type(), "unexpected frame on a request stream");
            return;
        }
    };
    pending.resolve(id, answer);
}

/// Reads the first frame of the control stream: at most one small frame.
async fn read_hello_answer(recv: &mut quinn::RecvStream) -> Result<Frame, ClientError> {
    let mut head = [0u8; HEADER_LEN];
    recv.read_exact(&mut head).await.map_err(|e| lost_read(e, "Hello answer"))?;
    let body_len = u32::from_be_bytes([head[6], head[7], head[8], head[9]]) as usize;
    if HEADER_LEN + body_len > HELLO_ANSWER_BYTES_MAX {
        return Err(ClientError::Protocol(format!("Hello answer of {body_len} bytes")));
    }
    let mut buf = BytesMut::zeroed(HEADER_LEN + body_len);
    buf[..HEADER_LEN].copy_from_slice(&head);
    recv.read_exact(&mut buf[HEADER_LEN..]).await.map_err(|e| lost_read(e, "Hello answer"))?;
    decode_frame(buf.freeze(), &Limits::default(), Capabilities::NONE)
        .map_err(|e| ClientError::Protocol(format!("Hello answer: {e}")))
}

/// A subscription's unidirectional stream, after its SubscriptionStart.
pub(crate) struct SubStream {
    pub recv: quinn::RecvStream,
    pub decoder: FrameDecoder,
}

enum SubSlot {
    Waiting(oneshot::Sender<SubStream>),
    Arrived(SubStream),
}

/// Matches subscription streams (which may arrive before SubscribeOk) with their subscriber.
#[derive(Default)]
struct SubRegistry {
    slots: Mutex<HashMap<SubscriptionId, SubSlot>>,
}

impl SubRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SubscriptionId, SubSlot>> {
        // Single inserts and removes: a poisoned map is still consistent.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_or_wait(&self, id: SubscriptionId) -> Result<SubStream, oneshot::Receiver<SubStream>> {
        let mut slots = self.lock();
        if let Some(SubSlot::Arrived(s)) = slots.remove(&id) {
            return Ok(s);
        }
        let (tx, rx) = oneshot::channel();
        slots.insert(id, SubSlot::Waiting(tx));
        Err(rx)
    }

    /// Removes the slot of `id` if a subscriber still waits there.
    fn forget_waiting(&self, id: SubscriptionId) {
        let mut slots = self.lock();
        if matches!(slots.get(&id), Some(SubSlot::Waiting(_))) {
            slots.remove(&id);
        }
    }

    /// Slots held (waiting subscribers and unclaimed streams).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn arrive(&self, id: SubscriptionId, stream: SubStream) {
        let mut slots = self.lock();
        match slots.remove(&id) {
            Some(SubSlot::Waiting(tx)) => {
                let _ = tx.send(stream);
            }
            _ => {
                let orphans = slots.values().filter(|s| matches!(s, SubSlot::Arrived(_))).count();
                if orphans < ORPHAN_SUB_STREAMS_MAX {
                    slots.insert(id, SubSlot::Arrived(stream));
                } else {
                    tracing::warn!(subscription = id.0, "too many unclaimed subscription streams");
                }
            }
        }
    }
}

/// Accepts the broker's unidirectional streams and files each under its subscription id.
async fn accept_subscription_streams(
    connection: quinn::Connection,
    limits: Limits,
    subs: Arc<SubRegistry>,
) {
    while let Ok(mut recv) = connection.accept_uni().await {
        let subs = subs.clone();
        tokio::spawn(async move {
            let first_limits = Limits { max_frame_bytes: SUBSCRIPTION_START_FRAME_BYTES, ..limits };
            let mut decoder = FrameDecoder::new(first_limits, Capabilities::NONE);
            let first = tokio::time::timeout(SUBSCRIPTION_START_TIMEOUT, async {
                loop {
                    if let Some(frame) = decoder.poll_frame() {
                        return Some(frame);
                    }
                    // No more than the first frame still needs: what follows it is read once
                    // the stream is known.
                    let wanted = decoder.wanted_bytes().min(READ_CHUNK_BYTES);
                    match recv.read_chunk(wanted, true).await {
                        Ok(Some(chunk)) => decoder.handle_chunk(chunk.bytes),
                        _ => return None,
                    }
                }
            })
            .await;
            match first {
                Ok(Some(Ok(Frame::SubscriptionStart(id)))) => {
                    decoder.set_limits(limits);
                    subs.arrive(id, SubStream { recv, decoder })
                }
                other => tracing::warn!(?other, "unidirectional stream without SubscriptionStart"),
            }
        });
    }
}

fn handshake_error(e: quinn::ConnectionError, rejection: &RejectionNote) -> ClientError {
    if let Some(why) = rejection.lock().ok().and_then(|mut n| n.take()) {
        return ClientError::CertificateRejected(why);
    }
    let text = e.to_string();
    let tls_refusal = matches!(&e, quinn::ConnectionError::TransportError(t)
        if t.code.to_string().contains("crypto") || text.contains("certificate"));
    if tls_refusal {
        ClientError::CertificateRejected(text)
    } else {
        ClientError::Connect(text)
    }
}

pub(crate) fn lost(e: impl std::fmt::Display) -> ClientError {
    ClientError::ConnectionLost(e.to_string())
}

fn lost_read(e: quinn::ReadExactError, what: &str) -> ClientError {
    ClientError::ConnectionLost(format!("reading {what}: {e}"))
}

/// The error for an answer of the wrong type.
pub(crate) fn unexpected(frame: &Frame, wanted: FrameType) -> ClientError {
    ClientError::Protocol(format!("{:?} where {wanted:?} was expected", frame.frame_type()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_proto::{AckMode, AckRequest, Publish, Subscribe};

    #[test]
    fn an_initial_dcid_names_its_core_for_the_broker() {
        // The broker hands the Initial to the core only when `core_of` decodes the DCID
        // (config bits, core byte and check value).
        for core in [0u16, 1, 7, 254] {
            let dcid = initial_dcid_for(CoreId(core)).expect("random bytes");
            assert_eq!(felix_proto::cid::core_of(&dcid), Some(CoreId(core)));
            assert_ne!(initial_dcid_for(CoreId(core)), Some(dcid), "random bits");
        }
        assert_eq!(initial_dcid_for(CoreId(255)), None);
    }

    #[tokio::test]
    async fn a_request_given_up_leaves_no_entry_behind() {
        let pending = Pending::default();
        let wait = |id: u64| {
            let (tx, rx) = oneshot::channel();
            pending.lock().waiting.insert(RequestId(id), tx);
            rx
        };
        // Timed out.
        let rx = wait(1);
        let out = wait_answer(&pending, RequestId(1), rx, Duration::from_millis(5), "t").await;
        assert!(matches!(out, Err(ClientError::Timeout { .. })), "{out:?}");
        // Dropped while waiting (a cancelled request).
        let rx = wait(2);
        let fut = wait_answer(&pending, RequestId(2), rx, Duration::from_secs(60), "t");
        let mut fut = Box::pin(fut);
        assert!(tokio::time::timeout(Duration::from_millis(5), &mut fut).await.is_err());
        assert_eq!(pending.lock().waiting.len(), 1, "still waited for while the future lives");
        drop(fut);
        assert!(pending.lock().waiting.is_empty(), "entries left behind");
    }

    #[test]
    fn a_subscription_stream_given_up_leaves_no_slot_behind() {
        let subs = SubRegistry::default();
        let Err(rx) = subs.take_or_wait(SubscriptionId(5)) else { panic!("nothing arrived") };
        assert_eq!(subs.len(), 1);
        drop(rx);
        subs.forget_waiting(SubscriptionId(5));
        subs.forget_waiting(SubscriptionId(6));
        assert_eq!(subs.len(), 0);
    }

    #[test]
    fn a_brokers_advertised_limits_are_capped_for_decoding() {
        let huge =
            Limits { max_frame_bytes: u32::MAX, max_batch_records: u32::MAX, max_key_bytes: 9 };
        let l = decode_limits(huge);
        assert_eq!(
            (l.max_frame_bytes, l.max_batch_records, l.max_key_bytes),
            (DECODE_FRAME_BYTES_MAX, DECODE_BATCH_RECORDS_MAX, 9)
        );
        let felix = Limits::default();
        assert_eq!(decode_limits(felix), felix, "a Felix broker's limits are under the caps");
        assert_eq!(
            SUBSCRIPTION_START_FRAME_BYTES as usize,
            Frame::SubscriptionStart(felix_proto::SubscriptionId(u64::MAX)).to_bytes().len()
        );
    }

    fn publish(acked: bool, keyed: bool) -> Frame {
        Frame::Publish(Publish {
            oldest_pending: false,
            ack: acked.then_some(AckRequest { request_id: RequestId(1), mode: AckMode::Durable }),
            key: keyed.then(|| Bytes::from_static(b"k")),
            producer: None,
            stream: "a/b/c".into(),
            records: vec![Bytes::from_static(b"x").into()],
        })
    }

    #[test]
    fn unadvertised_flags_are_never_encoded() {
        let l = Limits::default();
        assert_eq!(
            encode_checked(Capabilities::PUBLISH_KEYED, &l, &publish(true, false)),
            Err(ClientError::Unsupported("acked publish"))
        );
        assert_eq!(
            encode_checked(Capabilities::PUBLISH_ACKED, &l, &publish(false, true)),
            Err(ClientError::Unsupported("keyed publish"))
        );
        assert!(encode_checked(Capabilities::NONE, &l, &publish(false, false)).is_ok());
        assert!(encode_checked(Capabilities::ALL, &l, &publish(true, true)).is_ok());
    }

    #[test]
    fn groups_need_the_capability() {
        let sub = Frame::Subscribe(Subscribe {
            request_id: RequestId(1),
            stream: "a/b/c".into(),
            shards: None,
            start: felix_proto::StartAt::Earliest,
            group: Some("g".into()),
            positions: None,
        });
        let l = Limits::default();
        assert_eq!(
            encode_checked(Capabilities::PUBLISH_ACKED, &l, &sub),
            Err(ClientError::Unsupported("consumer groups"))
        );
        assert!(encode_checked(Capabilities::CONSUMER_GROUPS, &l, &sub).is_ok());
    }

    #[test]
    fn metadata_needs_the_cluster_capability() {
        let m = Frame::Metadata(felix_proto::Metadata {
            request_id: RequestId(1),
            stream: "a/b/c".into(),
        });
        let l = Limits::default();
        let single_node = Capabilities(Capabilities::ALL.0 & !Capabilities::CLUSTER.0);
        assert_eq!(
            encode_checked(single_node, &l, &m),
            Err(ClientError::Unsupported("cluster metadata"))
        );
        assert!(encode_checked(Capabilities::CLUSTER, &l, &m).is_ok());
    }

    #[test]
    fn publish_frames_are_encoded_into_a_buffer_of_their_exact_size() {
        for (acked, keyed) in [(false, false), (true, false), (false, true), (true, true)] {
            for producer in [false, true] {
                let mut frame = publish(acked, keyed);
                if let Frame::Publish(p) = &mut frame {
                    p.records =
                        (0..40).map(|i| Bytes::from(vec![i as u8; i * 37]).into()).collect();
                    p.producer = producer.then_some(felix_proto::ProducerTag {
                        producer: felix_proto::ProducerId(5),
                        seq: 1,
                    });
                }
                let bytes = encode_checked(Capabilities::ALL, &Limits::default(), &frame).unwrap();
                assert_eq!(bytes, frame.to_bytes());
                let Frame::Publish(p) = &frame else { unreachable!() };
                assert_eq!(p.encoded_len(), bytes.len(), "acked {acked} keyed {keyed} {producer}");
            }
        }
    }

    #[test]
    fn frames_over_the_broker_limit_are_refused() {
        let l = Limits { max_frame_bytes: 20, ..Limits::default() };
        assert!(matches!(
            encode_checked(Capabilities::ALL, &l, &publish(false, false)),
            Err(ClientError::RecordTooLarge { .. })
        ));
    }
}
