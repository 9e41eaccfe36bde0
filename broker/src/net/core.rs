//! One core's QUIC state, sans-IO: [`CoreState`] owns the core's quinn-proto `Endpoint`, the
//! handshake budget, the limits and the accept queue, and shares the connection table with the
//! application's handles ([`super::conn::ConnTable`]). It reads no clock (every input takes
//! `now`), touches no socket and starts no task: what it wants done goes into its outbox
//! (transmits, datagrams for other cores, connection tasks to start), which the glommio shell
//! ([`super::driver`]) or the in-memory test pair drains.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_proto::CoreId;
use quinn_proto::{
    ConnectionError, ConnectionHandle, ConnectionIdGenerator, DatagramEvent, EcnCodepoint,
    Endpoint, Event, VarInt,
};

use super::cid::{core_of_datagram, is_long_header, CoreCidGenerator, CID_LEN};
use super::config::{NetConfig, ACCEPT_QUEUE_DEPTH};
use super::conn::{ConnState, ConnTable, ConnTableRef, Connection};
use super::stats::CoreStats;
use super::transmit::OutTransmit;

/// How long a send that found the socket buffer full waits before it is retried.
pub const SEND_RETRY_US: u64 = 200;
/// Most transmits one connection queues per driver run before it yields to other tasks.
pub(crate) const MAX_TRANSMITS_PER_DRIVE: usize = 32;
/// Transmit buffers the outbox keeps for reuse (each grows to one GSO batch at most).
const TRANSMIT_BUFFERS_POOLED_MAX: usize = MAX_TRANSMITS_PER_DRIVE;

/// A received UDP datagram, and what the core mesh carries to the owner core.
#[derive(Debug)]
pub struct Datagram {
    /// The UDP payload.
    pub data: BytesMut,
    /// The peer's address.
    pub remote: SocketAddr,
    /// The local address the datagram was sent to.
    pub local_ip: Option<IpAddr>,
    /// ECN codepoint of the IP header.
    pub ecn: Option<EcnCodepoint>,
}

/// Limits applied by a core.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoreLimits {
    /// Connections one core holds at most; more are refused.
    pub(crate) max_conns: usize,
    /// Handshakes per second from unvalidated addresses before stateless retries.
    pub(crate) handshakes_per_sec: u32,
}

impl CoreLimits {
    /// The limits `config` sets for each core.
    pub(crate) fn new(config: &NetConfig) -> Self {
        Self {
            max_conns: config.max_conns_per_core,
            handshakes_per_sec: config.handshakes_per_sec_per_core,
        }
    }
}

/// What one run of [`CoreState::drive`] left for the connection's driver task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DriveOutcome {
    /// The connection is drained and forgotten: the task ends.
    Gone,
    /// The connection lives on; `keep_going`: it has more to do at once (the task yields and
    /// runs again), else it waits for its waker or [`CoreState::poll_timeout`].
    Pending {
        /// Whether the run stopped at a batch limit with work left.
        keep_going: bool,
    },
}

/// Everything one core owns for networking.
///
/// Call order:
/// 1. inputs: [`CoreState::handle_datagram`] for each datagram the socket received,
///    [`CoreState::handle_forwarded`] for each one another core forwarded,
///    [`CoreState::drive`] for a connection whose task was woken or whose timer passed,
///    [`CoreState::begin_shutdown`] once;
/// 2. outputs, after each input: [`CoreState::poll_transmit`] until `None` (a sent transmit
///    goes back through [`CoreState::recycle`], one the socket refused through
///    [`CoreState::handle_send_blocked`]), then [`CoreState::poll_forward`] and
///    [`CoreState::poll_new_conn`] until `None`;
/// 3. after `drive` and its transmits: [`CoreState::poll_timeout`], when to drive it next.
pub(crate) struct CoreState {
    core: CoreId,
    cores: usize,
    endpoint: Endpoint,
    conns: ConnTableRef,
    stats: Arc<CoreStats>,
    limits: CoreLimits,
    /// Most datagrams one transmit may carry (the socket's GSO segments; 1 without GSO).
    max_gso_segments: usize,
    next_uid: u64,
    bucket: HandshakeBucket,
    accept_queue: VecDeque<Connection>,
    accept_waiters: Vec<Waker>,
    shutting_down: bool,
    outbox: Outbox,
    /// The path statistics of the connections that ended, summed.
    ended_paths: PathTotals,
}

/// QUIC path statistics summed over connections: what `quic_*` in [`CoreStats`] export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PathTotals {
    pub(crate) packets_sent: u64,
    pub(crate) packets_lost: u64,
    pub(crate) bytes_lost: u64,
    pub(crate) congestion_events: u64,
    pub(crate) black_holes: u64,
}

impl PathTotals {
    fn add(&mut self, path: &quinn_proto::PathStats) {
        self.packets_sent += path.sent_packets;
        self.packets_lost += path.lost_packets;
        self.bytes_lost += path.lost_bytes;
        self.congestion_events += path.congestion_events;
        self.black_holes += path.black_holes_detected;
    }
}

impl CoreState {
    /// A core's state; `now` starts the handshake budget.
    pub(crate) fn new(
        core: CoreId,
        cores: usize,
        endpoint: Endpoint,
        stats: Arc<CoreStats>,
        limits: CoreLimits,
        max_gso_segments: usize,
        now: Instant,
    ) -> Self {
        Self {
            core,
            cores,
            endpoint,
            conns: ConnTable::new(stats.clone()),
            stats,
            limits,
            max_gso_segments: max_gso_segments.max(1),
            next_uid: 0,
            bucket: HandshakeBucket::new(limits.handshakes_per_sec, now),
            accept_queue: VecDeque::new(),
            accept_waiters: Vec::new(),
            shutting_down: false,
            outbox: Outbox::default(),
            ended_paths: PathTotals::default(),
        }
    }

    /// Sets the `quic_*` counters: the path statistics of the live connections plus those of
    /// the ended ones, and the smallest path MTU of the live ones (called once a second;
    /// O(connections)).
    pub(crate) fn sample_paths(&self) -> PathTotals {
        let mut totals = self.ended_paths;
        let mut mtu_min: Option<u16> = None;
        for cs in self.conns.borrow().conns.values() {
            let path = cs.conn.stats().path;
            totals.add(&path);
            mtu_min = Some(mtu_min.map_or(path.current_mtu, |m| m.min(path.current_mtu)));
        }
        CoreStats::set(&self.stats.quic_black_holes, totals.black_holes);
        CoreStats::set(&self.stats.quic_mtu_min, mtu_min.map_or(0, u64::from));
        CoreStats::set(&self.stats.quic_packets_sent, totals.packets_sent);
        CoreStats::set(&self.stats.quic_packets_lost, totals.packets_lost);
        CoreStats::set(&self.stats.quic_bytes_lost, totals.bytes_lost);
        CoreStats::set(&self.stats.quic_congestion_events, totals.congestion_events);
        totals
    }

    /// This core's counters.
    pub(crate) fn stats(&self) -> &Arc<CoreStats> {
        &self.stats
    }

    /// Connections this core holds.
    pub(crate) fn conn_count(&self) -> usize {
        self.conns.borrow().conns.len()
    }

    /// Remembers the waker of the task that drives `ch` (woken when it has work).
    pub(crate) fn register_driver(&mut self, ch: ConnectionHandle, waker: &Waker) {
        if let Some(cs) = self.conns.borrow_mut().conns.get_mut(&ch) {
            cs.register_driver(waker);
        }
    }

    /// Shutdown has begun and every connection is gone.
    pub(crate) fn is_finished(&self) -> bool {
        self.shutting_down && self.conns.borrow().conns.is_empty()
    }

    /// Handles one datagram this core's socket received: forwards it to its owner core if its
    /// CID names another core (the safety net), else feeds it to this core's endpoint. A long
    /// header whose CID names a core this broker does not have is fed to this core's endpoint
    /// (`kept_bad_core`): it may be the Initial of a client whose DCID names a core it cannot
    /// have, and whichever core it reached owns that connection; a short header naming such a
    /// core belongs to no connection here and is dropped (`dropped_bad_core`).
    pub(crate) fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        if self.cores > 1 {
            match core_of_datagram(&d.data, CID_LEN) {
                None => {}
                Some(owner) if owner == self.core => {}
                Some(owner) if usize::from(owner.0) < self.cores => {
                    self.forward(owner, d);
                    return;
                }
                Some(_) if is_long_header(&d.data) => {
                    CoreStats::add(&self.stats.kept_bad_core, 1);
                }
                Some(_) => {
                    CoreStats::add(&self.stats.misrouted, 1);
                    CoreStats::add(&self.stats.dropped_bad_core, 1);
                    return;
                }
            }
        }
        self.handle_owned(now, d);
    }

    /// Handles a datagram another core received for one of our connections (never forwarded
    /// again).
    pub(crate) fn handle_forwarded(&mut self, now: Instant, d: Datagram) {
        CoreStats::add(&self.stats.forwarded_in, 1);
        self.handle_owned(now, d);
    }

    fn handle_owned(&mut self, now: Instant, d: Datagram) {
        let Datagram { data, remote, local_ip, ecn } = d;
        let mut buf = self.outbox.take_buf();
        match self.endpoint.handle(now, remote, local_ip, ecn, data, &mut buf) {
            Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                if let Some(cs) = self.conns.borrow_mut().conns.get_mut(&ch) {
                    cs.conn.handle_event(event);
                    cs.wake_driver();
                }
                self.outbox.recycle(buf);
            }
            Some(DatagramEvent::NewConnection(incoming)) => {
                self.handle_incoming(now, incoming, buf);
            }
            Some(DatagramEvent::Response(t)) => self.outbox.push(None, &t, buf),
            None => self.outbox.recycle(buf),
        }
    }

    fn forward(&mut self, owner: CoreId, d: Datagram) {
        debug_assert_ne!(owner, self.core, "a core forwards only datagrams of other cores");
        debug_assert!(usize::from(owner.0) < self.cores, "a core forwards only to a core");
        CoreStats::add(&self.stats.misrouted, 1);
        self.outbox.forwards.push_back((owner, d));
    }

    fn handle_incoming(&mut self, now: Instant, incoming: quinn_proto::Incoming, mut buf: Vec<u8>) {
        if self.shutting_down || self.conns.borrow().conns.len() >= self.limits.max_conns {
            CoreStats::add(&self.stats.refused_conn_limit, 1);
            let t = self.endpoint.refuse(incoming, &mut buf);
            self.outbox.push(None, &t, buf);
            return;
        }
        // Past the handshake rate, unvalidated clients get a stateless retry; a client that
        // already went through one (validated, or may not retry again) is accepted.
        if !incoming.remote_address_validated()
            && incoming.may_retry()
            && !self.bucket.try_take(now)
        {
            match self.endpoint.retry(incoming, &mut buf) {
                Ok(t) => {
                    CoreStats::add(&self.stats.retries, 1);
                    self.outbox.push(None, &t, buf);
                }
                Err(e) => {
                    self.endpoint.ignore(e.into_incoming());
                    self.outbox.recycle(buf);
                }
            }
            return;
        }
        match self.endpoint.accept(incoming, now, &mut buf, None) {
            Ok((ch, conn)) => {
                self.next_uid += 1;
                let mut table = self.conns.borrow_mut();
                table.conns.insert(ch, ConnState::new(conn, self.next_uid));
                debug_assert!(
                    table.conns.len() <= self.limits.max_conns,
                    "a core holds at most max_conns connections"
                );
                CoreStats::set(&self.stats.connections, table.conns.len() as u64);
                self.outbox.new_conns.push_back(ch);
                self.outbox.recycle(buf);
            }
            Err(e) => match e.response {
                Some(t) => self.outbox.push(None, &t, buf),
                None => self.outbox.recycle(buf),
            },
        }
    }

    /// One run of a connection's driver: handles its timer, queues its transmits and hands its
    /// events to the application.
    pub(crate) fn drive(&mut self, ch: ConnectionHandle, now: Instant) -> DriveOutcome {
        let conns = self.conns.clone();
        let mut table = conns.borrow_mut();
        let Some(cs) = table.conns.get_mut(&ch) else {
            return DriveOutcome::Gone;
        };
        handle_timers(cs, now);
        let mut keep_going = self.outbox.queue_transmits(ch, cs, now, self.max_gso_segments);
        let (drained, more) = self.handle_endpoint_events(ch, cs);
        keep_going |= more;
        keep_going |= self.handle_app_events(ch, cs, now);
        if drained || cs.conn.is_drained() {
            self.forget(&mut table, ch);
            return DriveOutcome::Gone;
        }
        DriveOutcome::Pending { keep_going }
    }

    /// When the connection's driver must run next: quinn-proto's timer or the retry of a send
    /// the socket refused, whichever is first (`None`: no timer, or the connection is gone).
    pub(crate) fn poll_timeout(&mut self, ch: ConnectionHandle) -> Option<Instant> {
        let mut table = self.conns.borrow_mut();
        let cs = table.conns.get_mut(&ch)?;
        match (cs.conn.poll_timeout(), cs.retry_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// CID issue and retirement, and whether the connection is drained (endpoint events);
    /// the second value says an event gave the connection more to do.
    fn handle_endpoint_events(&mut self, ch: ConnectionHandle, cs: &mut ConnState) -> (bool, bool) {
        let (mut drained, mut more) = (false, false);
        while let Some(ev) = cs.conn.poll_endpoint_events() {
            drained |= ev.is_drained();
            if let Some(conn_ev) = self.endpoint.handle_event(ch, ev) {
                cs.conn.handle_event(conn_ev);
                more = true;
            }
        }
        (drained, more)
    }

    /// Hands the connection's events to the application (accept queue, wakers); returns true
    /// when the connection has more to send at once.
    fn handle_app_events(
        &mut self,
        ch: ConnectionHandle,
        cs: &mut ConnState,
        now: Instant,
    ) -> bool {
        let mut more = false;
        while let Some(ev) = cs.conn.poll() {
            match ev {
                Event::HandshakeDataReady | Event::DatagramReceived | Event::DatagramsUnblocked => {
                }
                Event::Connected => {
                    // The peer's stream limits came with the handshake, which quinn-proto does
                    // not report as `Available`: streams opened before it (on a connection
                    // this core opened) may go now.
                    cs.waiters.wake_open();
                    more |= self.announce(ch, cs, now);
                }
                Event::ConnectionLost { reason } => {
                    if matches!(reason, ConnectionError::TimedOut) {
                        CoreStats::add(&self.stats.idle_timeouts, 1);
                    }
                    cs.fail(reason);
                }
                Event::Stream(ev) => cs.waiters.wake_stream(ev),
            }
        }
        more
    }

    /// A handshake completed: the connection goes to the accept queue, or is closed "busy"
    /// when the queue is full or the core is shutting down (then returns true: it has a close
    /// to send).
    fn announce(&mut self, ch: ConnectionHandle, cs: &mut ConnState, now: Instant) -> bool {
        CoreStats::add(&self.stats.handshakes, 1);
        if cs.announced {
            return false;
        }
        cs.announced = true;
        if self.shutting_down || self.accept_queue.len() >= ACCEPT_QUEUE_DEPTH {
            CoreStats::add(&self.stats.dropped_accept_full, 1);
            cs.conn.close(now, VarInt::from_u32(0), Bytes::from_static(b"busy"));
            return true;
        }
        let peer = cs.conn.remote_address();
        let handle =
            Connection::new(self.conns.clone(), self.core, ch, cs.uid, peer, cs.error.clone());
        self.accept_queue.push_back(handle);
        self.accept_waiters.drain(..).for_each(Waker::wake);
        false
    }

    /// Opens a connection from this core to `remote` (another broker). The Initial's
    /// destination CID is in the broker's layout and names `target`, so the peer's cores hand
    /// the handshake to its core `target` (`core_of_datagram` reads long headers too), and that
    /// core's CIDs, which name it, carry the rest: core i talks to core i with no cross-core
    /// hop once the handshake is done. This core's own CIDs name this core, so the peer's
    /// packets reach it. The handle is returned at once; streams open once the handshake is
    /// done, and a failed handshake fails them with the connection's error. The connection's
    /// driver task is started by [`CoreState::poll_new_conn`], like an accepted one's.
    pub(crate) fn connect(
        &mut self,
        now: Instant,
        mut config: quinn_proto::ClientConfig,
        remote: SocketAddr,
        server_name: &str,
        target: CoreId,
    ) -> Result<Connection, ConnectError> {
        if self.shutting_down {
            return Err(ConnectError::ShuttingDown);
        }
        if self.conns.borrow().conns.len() >= self.limits.max_conns {
            return Err(ConnectError::ConnLimit(self.limits.max_conns));
        }
        let generator =
            CoreCidGenerator::new(target).map_err(|e| ConnectError::Core(e.to_string()))?;
        let generator = std::sync::Mutex::new(generator);
        config.initial_dst_cid_provider(Arc::new(move || {
            generator.lock().unwrap_or_else(|p| p.into_inner()).generate_cid()
        }));
        let (ch, conn) = self.endpoint.connect(now, config, remote, server_name)?;
        self.next_uid += 1;
        let mut state = ConnState::new(conn, self.next_uid);
        state.announced = true;
        let handle = Connection::new(
            self.conns.clone(),
            self.core,
            ch,
            self.next_uid,
            remote,
            state.error.clone(),
        );
        let mut table = self.conns.borrow_mut();
        table.conns.insert(ch, state);
        CoreStats::set(&self.stats.connections, table.conns.len() as u64);
        CoreStats::add(&self.stats.connects, 1);
        self.outbox.new_conns.push_back(ch);
        Ok(handle)
    }

    /// Removes a drained connection and wakes whoever still waits on it.
    fn forget(&mut self, table: &mut ConnTable, ch: ConnectionHandle) {
        if let Some(mut cs) = table.conns.remove(&ch) {
            let stats = cs.conn.stats();
            self.ended_paths.add(&stats.path);
            let frames = stats.frame_rx;
            CoreStats::add(
                &self.stats.streams_blocked_rx,
                frames.streams_blocked_bidi + frames.streams_blocked_uni,
            );
            cs.error.borrow_mut().get_or_insert(ConnectionError::LocallyClosed);
            cs.waiters.wake_all();
            self.outbox.recycle_all(cs.blocked.drain(..));
        }
        CoreStats::set(&self.stats.connections, table.conns.len() as u64);
    }

    /// The next datagram(s) to send, in order.
    pub(crate) fn poll_transmit(&mut self) -> Option<OutTransmit> {
        self.outbox.transmits.pop_front()
    }

    /// Gives a sent transmit's buffer back for reuse.
    pub(crate) fn recycle(&mut self, t: OutTransmit) {
        self.outbox.recycle(t.contents);
    }

    /// The socket refused `t` (WouldBlock): a connection's transmit is kept, in order, and
    /// retried after [`SEND_RETRY_US`]; an endpoint response is dropped (the peer repeats it).
    pub(crate) fn handle_send_blocked(&mut self, t: OutTransmit, now: Instant) {
        let mut table = self.conns.borrow_mut();
        match t.conn.and_then(|ch| table.conns.get_mut(&ch)) {
            Some(cs) => {
                cs.blocked.push_back(t);
                debug_assert!(
                    cs.blocked.len() <= MAX_TRANSMITS_PER_DRIVE,
                    "a connection keeps at most one run's transmits"
                );
                cs.retry_at = Some(now + Duration::from_micros(SEND_RETRY_US));
            }
            None => self.outbox.recycle(t.contents),
        }
    }

    /// The next datagram to hand to another core, and that core.
    pub(crate) fn poll_forward(&mut self) -> Option<(CoreId, Datagram)> {
        self.outbox.forwards.pop_front()
    }

    /// The next connection whose driver task is to be started.
    pub(crate) fn poll_new_conn(&mut self) -> Option<ConnectionHandle> {
        self.outbox.new_conns.pop_front()
    }

    /// The next established connection for the application; `None` once shutdown began and
    /// the queue is empty.
    pub(crate) fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<Connection>> {
        if let Some(c) = self.accept_queue.pop_front() {
            return Poll::Ready(Some(c));
        }
        if self.shutting_down {
            return Poll::Ready(None);
        }
        self.accept_waiters.push(cx.waker().clone());
        Poll::Pending
    }

    /// Stops accepting and closes every connection (application code 0, reason "shutdown").
    /// Returns the connections the application never accepted: drop them outside any borrow.
    pub(crate) fn begin_shutdown(&mut self, now: Instant) -> VecDeque<Connection> {
        self.shutting_down = true;
        self.accept_waiters.drain(..).for_each(Waker::wake);
        for cs in self.conns.borrow_mut().conns.values_mut() {
            cs.conn.close(now, VarInt::from_u32(0), Bytes::from_static(b"shutdown"));
            cs.wake_driver();
        }
        std::mem::take(&mut self.accept_queue)
    }
}

/// Runs quinn-proto's timer if it passed and ends a send back-off that is over.
fn handle_timers(cs: &mut ConnState, now: Instant) {
    if cs.conn.poll_timeout().is_some_and(|t| t <= now) {
        cs.conn.handle_timeout(now);
    }
    if cs.retry_at.is_some_and(|t| t <= now) {
        cs.retry_at = None;
    }
}

/// What a core wants done: transmits to send, datagrams to forward, tasks to start; and the
/// buffers it reuses for transmits.
#[derive(Default)]
struct Outbox {
    transmits: VecDeque<OutTransmit>,
    forwards: VecDeque<(CoreId, Datagram)>,
    new_conns: VecDeque<ConnectionHandle>,
    free: Vec<Vec<u8>>,
}

impl Outbox {
    /// An empty buffer for quinn-proto to write a transmit into (it writes from offset 0).
    fn take_buf(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_default()
    }

    fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.free.len() < TRANSMIT_BUFFERS_POOLED_MAX {
            buf.clear();
            self.free.push(buf);
        }
    }

    fn recycle_all(&mut self, ts: impl Iterator<Item = OutTransmit>) {
        ts.for_each(|t| self.recycle(t.contents));
    }

    fn push(&mut self, conn: Option<ConnectionHandle>, t: &quinn_proto::Transmit, buf: Vec<u8>) {
        self.transmits.push_back(OutTransmit::new(conn, t, buf));
    }

    /// Queues a connection's transmits: the ones the socket refused first (once their back-off
    /// is over), then fresh ones, at most [`MAX_TRANSMITS_PER_DRIVE`]. Returns true when it
    /// stopped at that limit with more to send.
    fn queue_transmits(
        &mut self,
        ch: ConnectionHandle,
        cs: &mut ConnState,
        now: Instant,
        max_gso_segments: usize,
    ) -> bool {
        if cs.retry_at.is_some() {
            return false;
        }
        let mut queued = cs.blocked.len();
        self.transmits.extend(cs.blocked.drain(..));
        while queued < MAX_TRANSMITS_PER_DRIVE {
            let mut buf = self.take_buf();
            let segments = super::config::gso_segments_max(max_gso_segments, cs.conn.current_mtu());
            let Some(t) = cs.conn.poll_transmit(now, segments, &mut buf) else {
                self.recycle(buf);
                return false;
            };
            self.push(Some(ch), &t, buf);
            queued += 1;
        }
        true
    }
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

/// Why [`CoreState::connect`] could not start a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The core is shutting down.
    #[error("the core is shutting down")]
    ShuttingDown,
    /// The core holds `max_conns_per_core` connections already.
    #[error("the core holds its limit of {0} connections")]
    ConnLimit(usize),
    /// The target core cannot be named in a connection ID.
    #[error("target core: {0}")]
    Core(String),
    /// quinn-proto refused (bad address, server name or TLS configuration).
    #[error(transparent)]
    Quic(#[from] quinn_proto::ConnectError),
}
