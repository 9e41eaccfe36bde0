//! The per-core driver: one quinn-proto `Endpoint` and its `Connection`s on one glommio
//! executor.
//!
//! Tasks on a core (all `spawn_local`, nothing `Send`):
//! - the receive task ([`recv_loop`]): awaits readability (glommio `peek_from` on a dup of the
//!   socket), drains the socket with quinn-udp (`recvmmsg` + GRO) until WouldBlock, feeds every
//!   datagram to the endpoint (or hands it to its owner core over the mesh), then yields so the
//!   connection drivers it woke run before the next receive;
//! - one mesh task per peer core ([`mesh_loop`]): datagrams other cores received for our CIDs;
//! - one driver task per connection ([`drive_connection`]): endpoint events, application events
//!   (wakes stream readers/writers), transmits (GSO, `sendmsg`), and the connection's timer.
//!
//! All of a core's state is one [`CoreState`] behind `Rc<RefCell<_>>`; every borrow is short and
//! never held across an `.await`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_proto::CoreId;
use glommio::channels::shared_channel::ConnectedSender;
use glommio::timer::Timer;
use quinn_proto::{
    ConnectionError, ConnectionHandle, DatagramEvent, Dir, EcnCodepoint, Endpoint, Event,
    StreamEvent, StreamId, Transmit, VarInt,
};
use quinn_udp::{RecvMeta, UdpSocketState, BATCH_SIZE};
use socket2::Socket;

use super::cid::{core_of_datagram, CID_LEN};
use super::conn::Connection;
use super::stats::CoreStats;

/// How long a send that found the socket buffer full waits before it is retried.
pub const SEND_RETRY_US: u64 = 200;
/// Most transmits one connection sends per driver run before it yields to other tasks.
const MAX_TRANSMITS_PER_DRIVE: usize = 32;
/// Most `recvmmsg` calls per readiness wake-up before the receive task yields.
const MAX_RECV_CALLS_PER_WAKE: usize = 8;
/// Largest GRO buffer: the kernel coalesces at most 64 KiB into one receive.
const MAX_GRO_BYTES: usize = 64 * 1024;
/// How long the receive task backs off after the socket reported an error.
const SOCKET_ERROR_BACKOFF_MS: u64 = 1;
/// How often shutdown looks whether every connection has drained.
const SHUTDOWN_DRAIN_POLL_MS: u64 = 5;

/// A datagram received by one core for a connection another core owns.
#[derive(Debug)]
pub struct ForwardedDatagram {
    /// The UDP payload.
    pub data: BytesMut,
    /// The peer's address.
    pub remote: SocketAddr,
    /// The local address the datagram was sent to.
    pub local_ip: Option<IpAddr>,
    /// ECN codepoint of the IP header.
    pub ecn: Option<EcnCodepoint>,
}

/// The socket as the send and receive paths see it.
pub(crate) struct SocketIo {
    pub(crate) socket: Socket,
    pub(crate) state: UdpSocketState,
}

/// Limits applied by a core.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoreLimits {
    pub(crate) max_conns: usize,
    pub(crate) handshakes_per_sec: u32,
}

/// Hasher for small integer ids (quinn-proto connection handles, stream ids): one multiply
/// instead of SipHash on the per-datagram path. Keys are slab indices or stream ids bounded by
/// `max_streams_per_conn`, so a peer cannot grow a map enough for collisions to matter.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by small integer ids.
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Application-side wakers and state of one connection.
#[derive(Default)]
pub(crate) struct Waiters {
    pub(crate) readers: IdMap<StreamId, Waker>,
    pub(crate) writers: IdMap<StreamId, Waker>,
    pub(crate) accept: [Vec<Waker>; 2],
    pub(crate) open: [Vec<Waker>; 2],
    pub(crate) closed: Vec<Waker>,
}

impl Waiters {
    fn wake_all(&mut self) {
        self.readers.drain().for_each(|(_, w)| w.wake());
        self.writers.drain().for_each(|(_, w)| w.wake());
        for v in self.accept.iter_mut().chain(self.open.iter_mut()) {
            v.drain(..).for_each(Waker::wake);
        }
        self.closed.drain(..).for_each(Waker::wake);
    }
}

pub(crate) fn dir_index(dir: Dir) -> usize {
    match dir {
        Dir::Bi => 0,
        Dir::Uni => 1,
    }
}

/// One connection as its core holds it.
pub(crate) struct ConnState {
    pub(crate) conn: quinn_proto::Connection,
    /// Unique on this core for the server's lifetime (handles are reused by quinn-proto).
    pub(crate) uid: u64,
    pub(crate) driver: Option<Waker>,
    pub(crate) waiters: Waiters,
    /// Shared with the application's handles, so they see the error after the state is gone.
    pub(crate) error: Rc<RefCell<Option<ConnectionError>>>,
    /// A transmit the socket refused with WouldBlock, retried first.
    blocked: Option<OwnedTransmit>,
    retry_at: Option<Instant>,
    announced: bool,
}

impl ConnState {
    pub(crate) fn wake_driver(&mut self) {
        if let Some(w) = &self.driver {
            w.wake_by_ref();
        }
    }
}

struct OwnedTransmit {
    destination: SocketAddr,
    ecn: Option<EcnCodepoint>,
    contents: Vec<u8>,
    segment_size: Option<usize>,
    src_ip: Option<IpAddr>,
}

/// A token bucket for handshakes from unvalidated addresses.
struct HandshakeBucket {
    tokens: f64,
    rate_per_sec: f64,
    last: Instant,
}

impl HandshakeBucket {
    fn new(rate_per_sec: u32, now: Instant) -> Self {
        Self { tokens: f64::from(rate_per_sec), rate_per_sec: f64::from(rate_per_sec), last: now }
    }

    fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate_per_sec).min(self.rate_per_sec.max(1.0));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Everything one core owns for networking.
pub(crate) struct CoreState {
    pub(crate) core: CoreId,
    cores: usize,
    endpoint: Endpoint,
    pub(crate) conns: IdMap<ConnectionHandle, ConnState>,
    io: Rc<SocketIo>,
    pub(crate) stats: Arc<CoreStats>,
    limits: CoreLimits,
    mesh: Vec<Option<ConnectedSender<ForwardedDatagram>>>,
    buf: Vec<u8>,
    next_uid: u64,
    bucket: HandshakeBucket,
    pub(crate) accept_queue: VecDeque<Connection>,
    pub(crate) accept_waiters: Vec<Waker>,
    pub(crate) shutting_down: bool,
    self_ref: Weak<RefCell<CoreState>>,
}

/// Shared handle to a core's state.
pub(crate) type CoreRef = Rc<RefCell<CoreState>>;

impl CoreState {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        core: CoreId,
        cores: usize,
        endpoint: Endpoint,
        io: Rc<SocketIo>,
        stats: Arc<CoreStats>,
        limits: CoreLimits,
        mesh: Vec<Option<ConnectedSender<ForwardedDatagram>>>,
    ) -> CoreRef {
        Rc::new_cyclic(|self_ref| {
            RefCell::new(Self {
                core,
                cores,
                endpoint,
                conns: IdMap::default(),
                io,
                stats,
                limits,
                mesh,
                buf: Vec::new(),
                next_uid: 0,
                bucket: HandshakeBucket::new(limits.handshakes_per_sec, Instant::now()),
                accept_queue: VecDeque::new(),
                accept_waiters: Vec::new(),
                shutting_down: false,
                self_ref: self_ref.clone(),
            })
        })
    }

    /// Handles one received datagram: forwards it to its owner core if its CID names another
    /// core (the safety net), else feeds it to this core's endpoint.
    pub(crate) fn handle_datagram(&mut self, now: Instant, d: ForwardedDatagram, from_mesh: bool) {
        if !from_mesh && self.cores > 1 {
            if let Some(owner) = core_of_datagram(&d.data, CID_LEN) {
                if owner != self.core {
                    self.forward(owner, d);
                    return;
                }
            }
        }
        let ForwardedDatagram { data, remote, local_ip, ecn } = d;
        let mut buf = std::mem::take(&mut self.buf);
        match self.endpoint.handle(now, remote, local_ip, ecn, data, &mut buf) {
            Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                if let Some(cs) = self.conns.get_mut(&ch) {
                    cs.conn.handle_event(event);
                    cs.wake_driver();
                }
            }
            Some(DatagramEvent::NewConnection(incoming)) => {
                self.handle_incoming(now, incoming, &mut buf);
            }
            Some(DatagramEvent::Response(t)) => {
                self.send_response(&t, &buf);
            }
            None => {}
        }
        buf.clear();
        self.buf = buf;
    }

    fn forward(&mut self, owner: CoreId, d: ForwardedDatagram) {
        debug_assert_ne!(owner, self.core, "a core forwards only datagrams of other cores");
        CoreStats::add(&self.stats.misrouted, 1);
        let Some(Some(tx)) = self.mesh.get(usize::from(owner.0)) else {
            CoreStats::add(&self.stats.dropped_bad_core, 1);
            return;
        };
        match tx.try_send(d) {
            Ok(()) => CoreStats::add(&self.stats.forwarded_out, 1),
            Err(_) => CoreStats::add(&self.stats.dropped_mesh_full, 1),
        }
    }

    fn handle_incoming(
        &mut self,
        now: Instant,
        incoming: quinn_proto::Incoming,
        buf: &mut Vec<u8>,
    ) {
        if self.shutting_down || self.conns.len() >= self.limits.max_conns {
            CoreStats::add(&self.stats.refused_conn_limit, 1);
            let t = self.endpoint.refuse(incoming, buf);
            self.send_response(&t, buf);
            return;
        }
        // Past the handshake rate, unvalidated clients get a stateless retry; a client that
        // already went through one (validated, or may not retry again) is accepted.
        if !incoming.remote_address_validated()
            && incoming.may_retry()
            && !self.bucket.try_take(now)
        {
            match self.endpoint.retry(incoming, buf) {
                Ok(t) => {
                    CoreStats::add(&self.stats.retries, 1);
                    self.send_response(&t, buf);
                }
                Err(e) => self.endpoint.ignore(e.into_incoming()),
            }
            return;
        }
        match self.endpoint.accept(incoming, now, buf, None) {
            Ok((ch, conn)) => {
                self.next_uid += 1;
                self.conns.insert(
                    ch,
                    ConnState {
                        conn,
                        uid: self.next_uid,
                        driver: None,
                        waiters: Waiters::default(),
                        error: Rc::new(RefCell::new(None)),
                        blocked: None,
                        retry_at: None,
                        announced: false,
                    },
                );
                debug_assert!(
                    self.conns.len() <= self.limits.max_conns,
                    "a core holds at most max_conns connections"
                );
                CoreStats::set(&self.stats.connections, self.conns.len() as u64);
                if let Some(core) = self.self_ref.upgrade() {
                    glommio::spawn_local(drive_connection(core, ch)).detach();
                }
            }
            Err(e) => {
                if let Some(t) = e.response {
                    self.send_response(&t, buf);
                }
            }
        }
    }

    fn send_response(&mut self, t: &Transmit, buf: &[u8]) {
        // Endpoint responses (retry, refuse, stateless reset, version negotiation) are
        // best-effort: a dropped one is repeated by the peer.
        let _ = self.send(t, &buf[..t.size]);
    }

    /// Sends one transmit; `Err` only for WouldBlock.
    fn send(&self, t: &Transmit, contents: &[u8]) -> io::Result<()> {
        let tx = quinn_udp::Transmit {
            destination: t.destination,
            ecn: t.ecn.and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
            contents,
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        };
        send_udp(&self.io, &self.stats, &tx)
    }

    /// One run of a connection's driver: handles its timer, queues its transmits and hands
    /// its events to the application. Returns `Gone` once the connection is drained and
    /// forgotten, else when its timer is due and whether it has more work right away.
    fn drive(&mut self, ch: ConnectionHandle, now: Instant, cx: &mut Context<'_>) -> DriveOutcome {
        let Self {
            endpoint,
            conns,
            io,
            stats,
            buf,
            accept_queue,
            accept_waiters,
            self_ref,
            core,
            shutting_down,
            ..
        } = self;
        let Some(cs) = conns.get_mut(&ch) else {
            return DriveOutcome::Gone;
        };
        if !cs.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            cs.driver = Some(cx.waker().clone());
        }

        if cs.conn.poll_timeout().is_some_and(|t| t <= now) {
            cs.conn.handle_timeout(now);
        }
        if cs.retry_at.is_some_and(|t| t <= now) {
            cs.retry_at = None;
        }

        // Transmits: the blocked one first, then fresh ones, at most a batch per run.
        let mut keep_going = false;
        if cs.retry_at.is_none() {
            if let Some(b) = cs.blocked.take() {
                let tx = quinn_udp::Transmit {
                    destination: b.destination,
                    ecn: b.ecn.and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
                    contents: &b.contents,
                    segment_size: b.segment_size,
                    src_ip: b.src_ip,
                };
                if send_udp(io, stats, &tx).is_err() {
                    cs.blocked = Some(b);
                    cs.retry_at = Some(now + Duration::from_micros(SEND_RETRY_US));
                }
            }
        }
        let max_gso = io.state.max_gso_segments().max(1);
        let mut sent = 0;
        while cs.blocked.is_none() {
            buf.clear();
            let Some(t) = cs.conn.poll_transmit(now, max_gso, buf) else {
                break;
            };
            let tx = quinn_udp::Transmit {
                destination: t.destination,
                ecn: t.ecn.and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
                contents: &buf[..t.size],
                segment_size: t.segment_size,
                src_ip: t.src_ip,
            };
            if send_udp(io, stats, &tx).is_err() {
                cs.blocked = Some(OwnedTransmit {
                    destination: t.destination,
                    ecn: t.ecn,
                    contents: buf[..t.size].to_vec(),
                    segment_size: t.segment_size,
                    src_ip: t.src_ip,
                });
                cs.retry_at = Some(now + Duration::from_micros(SEND_RETRY_US));
                break;
            }
            sent += 1;
            if sent >= MAX_TRANSMITS_PER_DRIVE {
                keep_going = true;
                break;
            }
        }

        // Endpoint events (CID issue/retire, drained).
        let mut drained = false;
        while let Some(ev) = cs.conn.poll_endpoint_events() {
            drained |= ev.is_drained();
            if let Some(conn_ev) = endpoint.handle_event(ch, ev) {
                cs.conn.handle_event(conn_ev);
                keep_going = true;
            }
        }

        // Application events.
        while let Some(ev) = cs.conn.poll() {
            match ev {
                Event::HandshakeDataReady | Event::DatagramReceived | Event::DatagramsUnblocked => {
                }
                Event::Connected => {
                    CoreStats::add(&stats.handshakes, 1);
                    if !cs.announced {
                        cs.announced = true;
                        if let Some(core_ref) = self_ref.upgrade() {
                            if *shutting_down
                                || accept_queue.len() >= super::config::ACCEPT_QUEUE_DEPTH
                            {
                                CoreStats::add(&stats.dropped_accept_full, 1);
                                cs.conn.close(
                                    now,
                                    VarInt::from_u32(0),
                                    Bytes::from_static(b"busy"),
                                );
                                keep_going = true;
                            } else {
                                let peer = cs.conn.remote_address();
                                accept_queue.push_back(Connection::new(
                                    core_ref,
                                    *core,
                                    ch,
                                    cs.uid,
                                    peer,
                                    cs.error.clone(),
                                ));
                                accept_waiters.drain(..).for_each(Waker::wake);
                            }
                        }
                    }
                }
                Event::ConnectionLost { reason } => {
                    if matches!(reason, ConnectionError::TimedOut) {
                        CoreStats::add(&stats.idle_timeouts, 1);
                    }
                    *cs.error.borrow_mut() = Some(reason);
                    cs.waiters.wake_all();
                }
                Event::Stream(StreamEvent::Opened { dir }) => {
                    cs.waiters.accept[dir_index(dir)].drain(..).for_each(Waker::wake);
                }
                Event::Stream(StreamEvent::Readable { id }) => {
                    if let Some(w) = cs.waiters.readers.remove(&id) {
                        w.wake();
                    }
                }
                Event::Stream(
                    StreamEvent::Writable { id }
                    | StreamEvent::Finished { id }
                    | StreamEvent::Stopped { id, .. },
                ) => {
                    if let Some(w) = cs.waiters.writers.remove(&id) {
                        w.wake();
                    }
                }
                Event::Stream(StreamEvent::Available { dir }) => {
                    cs.waiters.open[dir_index(dir)].drain(..).for_each(Waker::wake);
                }
            }
        }

        if drained || cs.conn.is_drained() {
            if let Some(mut cs) = conns.remove(&ch) {
                let frames = cs.conn.stats().frame_rx;
                CoreStats::add(
                    &stats.streams_blocked_rx,
                    frames.streams_blocked_bidi + frames.streams_blocked_uni,
                );
                if cs.error.borrow().is_none() {
                    *cs.error.borrow_mut() = Some(ConnectionError::LocallyClosed);
                }
                cs.waiters.wake_all();
            }
            CoreStats::set(&stats.connections, conns.len() as u64);
            return DriveOutcome::Gone;
        }

        let deadline = match (cs.conn.poll_timeout(), cs.retry_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        DriveOutcome::Pending { deadline, keep_going }
    }
}

/// What one run of [`CoreState::drive`] left for the connection's driver task.
enum DriveOutcome {
    /// The connection is drained and forgotten: the task ends.
    Gone,
    /// The connection lives on.
    Pending {
        /// When its timer is due (`None`: no timer).
        deadline: Option<Instant>,
        /// Whether it has more to do at once (the task yields and runs again).
        keep_going: bool,
    },
}

fn send_udp(io: &SocketIo, stats: &CoreStats, tx: &quinn_udp::Transmit<'_>) -> io::Result<()> {
    match io.state.send((&io.socket).into(), tx) {
        Ok(()) => {
            let segments = tx.segment_size.map_or(1, |s| tx.contents.len().div_ceil(s.max(1)));
            CoreStats::add(&stats.datagrams_out, segments as u64);
            CoreStats::add(&stats.send_calls, 1);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            CoreStats::add(&stats.send_would_block, 1);
            Err(e)
        }
        Err(_) => {
            // quinn-udp already swallows (and logs) non-fatal send errors; anything else is
            // counted and treated like a lost datagram.
            CoreStats::add(&stats.socket_errors, 1);
            Ok(())
        }
    }
}

/// Drives one connection until it is drained: its timer, transmits and events.
pub(crate) async fn drive_connection(core: CoreRef, ch: ConnectionHandle) {
    // glommio polls a task once inside `spawn_local`, and we are spawned while the core state
    // is borrowed: do nothing in that first poll.
    futures_lite::future::yield_now().await;
    let mut timer: Option<(Instant, Timer)> = None;
    std::future::poll_fn(|cx| loop {
        let now = Instant::now();
        let outcome = core.borrow_mut().drive(ch, now, cx);
        match outcome {
            DriveOutcome::Gone => return Poll::Ready(()),
            DriveOutcome::Pending { deadline, keep_going } => {
                if keep_going {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                // The armed timer is only moved earlier, never later: a timer that fires before
                // the connection's real deadline costs one empty driver run, while resetting it
                // on every ACK (each moves the loss-detection deadline) costs a reactor update
                // per packet.
                if let Some(d) = deadline {
                    let now = Instant::now();
                    match &mut timer {
                        Some((at, t)) => {
                            if d < *at || *at <= now {
                                *at = d;
                                t.reset(d.saturating_duration_since(now));
                            }
                            if Pin::new(t).poll(cx).is_ready() {
                                continue;
                            }
                        }
                        None => {
                            let mut t = Timer::new(d.saturating_duration_since(now));
                            let ready = Pin::new(&mut t).poll(cx).is_ready();
                            timer = Some((d, t));
                            if ready {
                                continue;
                            }
                        }
                    }
                }
                return Poll::Pending;
            }
        }
    })
    .await
}

/// The receive task: waits for readability, drains the socket in batches, feeds the endpoint.
pub(crate) async fn recv_loop(core: CoreRef, io: Rc<SocketIo>, ready: glommio::net::UdpSocket) {
    let chunk = MAX_GRO_BYTES;
    let mut storage = vec![0u8; chunk * BATCH_SIZE];
    let mut metas = [RecvMeta::default(); BATCH_SIZE];
    let stats = core.borrow().stats.clone();
    let mut probe = [0u8; 1];
    loop {
        if core.borrow().shutting_down && core.borrow().conns.is_empty() {
            return;
        }
        if ready.peek_from(&mut probe).await.is_err() {
            CoreStats::add(&stats.socket_errors, 1);
            glommio::timer::sleep(Duration::from_millis(SOCKET_ERROR_BACKOFF_MS)).await;
            continue;
        }
        for _ in 0..MAX_RECV_CALLS_PER_WAKE {
            let mut chunks = storage.chunks_mut(chunk);
            let mut iovs: [IoSliceMut<'_>; BATCH_SIZE] = std::array::from_fn(|_| {
                // Cannot fail: `storage` holds exactly BATCH_SIZE chunks.
                IoSliceMut::new(chunks.next().unwrap_or_default())
            });
            let n = match io.state.recv((&io.socket).into(), &mut iovs, &mut metas) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    CoreStats::add(&stats.socket_errors, 1);
                    break;
                }
            };
            CoreStats::add(&stats.recv_calls, 1);
            let now = Instant::now();
            let mut st = core.borrow_mut();
            for (meta, iov) in metas.iter().zip(iovs.iter()).take(n) {
                let mut data: BytesMut = iov[..meta.len].into();
                let stride = meta.stride.max(1);
                let ecn = meta.ecn.and_then(|e| EcnCodepoint::from_bits(e as u8));
                while !data.is_empty() {
                    let seg = data.split_to(stride.min(data.len()));
                    CoreStats::add(&stats.datagrams_in, 1);
                    st.handle_datagram(
                        now,
                        ForwardedDatagram {
                            data: seg,
                            remote: meta.addr,
                            local_ip: meta.dst_ip,
                            ecn,
                        },
                        false,
                    );
                }
            }
        }
        // Let the connection drivers woken above run (and send their ACKs) before the next
        // receive; glommio's `peek_from` may complete without yielding under load.
        futures_lite::future::yield_now().await;
    }
}

/// Receives datagrams another core forwarded to this one.
pub(crate) async fn mesh_loop(
    core: CoreRef,
    rx: glommio::channels::shared_channel::ConnectedReceiver<ForwardedDatagram>,
) {
    let stats = core.borrow().stats.clone();
    while let Some(d) = rx.recv().await {
        CoreStats::add(&stats.forwarded_in, 1);
        core.borrow_mut().handle_datagram(Instant::now(), d, true);
    }
}

/// Closes every connection (application code 0, reason "shutdown") and waits, bounded, until
/// they are drained.
pub(crate) async fn shutdown(core: &CoreRef, grace: Duration) {
    let queued: Vec<Connection> = {
        let mut st = core.borrow_mut();
        st.shutting_down = true;
        st.accept_waiters.drain(..).for_each(Waker::wake);
        let now = Instant::now();
        for cs in st.conns.values_mut() {
            cs.conn.close(now, VarInt::from_u32(0), Bytes::from_static(b"shutdown"));
            cs.wake_driver();
        }
        st.accept_queue.drain(..).collect()
    };
    drop(queued);
    let start = Instant::now();
    while !core.borrow().conns.is_empty() && start.elapsed() < grace {
        glommio::timer::sleep(Duration::from_millis(SHUTDOWN_DRAIN_POLL_MS)).await;
    }
}

/// Future returned by [`CoreContext::accept`](super::server::CoreContext::accept).
pub(crate) fn poll_accept(core: &CoreRef, cx: &mut Context<'_>) -> Poll<Option<Connection>> {
    let mut st = core.borrow_mut();
    if let Some(c) = st.accept_queue.pop_front() {
        return Poll::Ready(Some(c));
    }
    if st.shutting_down {
        return Poll::Ready(None);
    }
    st.accept_waiters.push(cx.waker().clone());
    Poll::Pending
}
