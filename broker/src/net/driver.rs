//! The glommio shell around a core's sans-IO state ([`CoreState`]): it reads the clock, the
//! socket and the core mesh, feeds the state, and drains its outbox (`sendmsg`, mesh queues,
//! `spawn_local`). Everything else is decided in [`super::core`].
//!
//! Tasks on a core (all `spawn_local`, nothing `Send`):
//! - the receive task ([`recv_loop`]): awaits readability (glommio `peek_from` on a dup of the
//!   socket), drains the socket with quinn-udp (`recvmmsg` + GRO) until WouldBlock, feeds every
//!   datagram to the core, then yields so the connection drivers it woke run before the next
//!   receive;
//! - one mesh task per peer core ([`mesh_loop`]): datagrams other cores received for our CIDs;
//! - one driver task per connection ([`drive_connection`]): runs [`CoreState::drive`] when woken
//!   or when the connection's timer fires, and sends what it queued.
//!
//! The state is one [`CoreState`] in a `RefCell` of the core's [`CoreShell`]; every borrow is
//! short and never held across an `.await`, and no task is spawned while it is held.

use std::cell::{RefCell, RefMut};
use std::future::{poll_fn, Future};
use std::io::{self, IoSliceMut};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use glommio::channels::shared_channel::{ConnectedReceiver, ConnectedSender};
use glommio::timer::Timer;
use quinn_proto::{ConnectionHandle, EcnCodepoint};
use quinn_udp::{RecvMeta, UdpSocketState, BATCH_SIZE};
use socket2::Socket;

use super::core::{CoreState, Datagram, DriveOutcome};
use super::recv::RecvSlabs;
use super::stats::CoreStats;
use super::transmit::OutTransmit;

/// Most `recvmmsg` calls per readiness wake-up before the receive task yields.
const MAX_RECV_CALLS_PER_WAKE: usize = 8;
/// How long the socket stays quiet before the receive task trims its retired slabs.
const IDLE_TRIM_MS: u64 = 100;
/// How long the receive task backs off after the socket reported an error.
const SOCKET_ERROR_BACKOFF_MS: u64 = 1;
/// How often shutdown looks whether every connection has drained.
const SHUTDOWN_DRAIN_POLL_MS: u64 = 5;

/// The socket as the send and receive paths see it.
pub(crate) struct SocketIo {
    pub(crate) socket: Socket,
    pub(crate) state: UdpSocketState,
}

/// One core: its sans-IO state and the I/O it needs (the socket, the mesh senders).
pub(crate) struct CoreShell {
    state: RefCell<CoreState>,
    io: SocketIo,
    /// `mesh[i]`: the queue to core `i` (`None` for this core).
    mesh: Vec<Option<ConnectedSender<Datagram>>>,
    stats: Arc<CoreStats>,
}

/// Shared handle to a core.
pub(crate) type CoreRef = Rc<CoreShell>;

impl CoreShell {
    /// Wraps a core's state with its socket and mesh senders.
    pub(crate) fn new(
        state: CoreState,
        io: SocketIo,
        mesh: Vec<Option<ConnectedSender<Datagram>>>,
    ) -> CoreRef {
        let stats = state.stats().clone();
        Rc::new(Self { state: RefCell::new(state), io, mesh, stats })
    }

    /// Borrows the core's state (never across an `.await`).
    pub(crate) fn state(&self) -> RefMut<'_, CoreState> {
        self.state.borrow_mut()
    }

    /// Sends the transmits the state queued and hands its forwards to their cores. After the
    /// first WouldBlock the socket is full: every transmit left goes back to the state.
    fn flush(&self, st: &mut CoreState, now: Instant) {
        let mut full = false;
        while let Some(t) = st.poll_transmit() {
            if !full && send_udp(&self.io, &self.stats, &t).is_ok() {
                st.recycle(t);
            } else {
                full = true;
                st.handle_send_blocked(t, now);
            }
        }
        while let Some((owner, d)) = st.poll_forward() {
            let Some(Some(tx)) = self.mesh.get(usize::from(owner.0)) else {
                CoreStats::add(&self.stats.dropped_bad_core, 1);
                continue;
            };
            match tx.try_send(d) {
                Ok(()) => CoreStats::add(&self.stats.forwarded_out, 1),
                Err(_) => CoreStats::add(&self.stats.dropped_mesh_full, 1),
            }
        }
    }

    /// Starts the driver task of every connection the state accepted. glommio polls a task
    /// once inside `spawn_local`, so the state must not be borrowed here.
    fn start_tasks(self: &Rc<Self>) {
        loop {
            let next = self.state.borrow_mut().poll_new_conn();
            let Some(ch) = next else { return };
            glommio::spawn_local(drive_connection(self.clone(), ch)).detach();
        }
    }

    /// Opens a connection to another broker's core `target` and starts its driver task.
    pub(crate) fn connect(
        self: &Rc<Self>,
        config: quinn_proto::ClientConfig,
        remote: std::net::SocketAddr,
        server_name: &str,
        target: felix_proto::CoreId,
    ) -> Result<super::conn::Connection, super::core::ConnectError> {
        let conn =
            self.state.borrow_mut().connect(Instant::now(), config, remote, server_name, target)?;
        self.start_tasks();
        Ok(conn)
    }

    /// One run of a connection's driver: drive, send, and when to run next.
    fn drive(&self, ch: ConnectionHandle, waker: &Waker) -> (DriveOutcome, Option<Instant>) {
        let now = Instant::now();
        let mut st = self.state.borrow_mut();
        st.register_driver(ch, waker);
        let outcome = st.drive(ch, now);
        self.flush(&mut st, now);
        (outcome, st.poll_timeout(ch))
    }

    /// One `recvmmsg`: feeds every datagram to the state and sends what it answered. Returns
    /// false when the socket is empty (or failed).
    fn recv_batch(self: &Rc<Self>, bufs: &mut RecvBuffers) -> bool {
        let mut iovs: [IoSliceMut<'_>; BATCH_SIZE] = bufs.slabs.iovs();
        let n = match self.io.state.recv((&self.io.socket).into(), &mut iovs, &mut bufs.metas) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(_) => {
                CoreStats::add(&self.stats.socket_errors, 1);
                return false;
            }
        };
        CoreStats::add(&self.stats.recv_calls, 1);
        let now = Instant::now();
        {
            let mut st = self.state.borrow_mut();
            for (slot, meta) in bufs.metas.iter().enumerate().take(n) {
                let mut data = bufs.slabs.take(slot, meta.len);
                let stride = meta.stride.max(1);
                let ecn = meta.ecn.and_then(|e| EcnCodepoint::from_bits(e as u8));
                while !data.is_empty() {
                    let seg = data.split_to(stride.min(data.len()));
                    CoreStats::add(&self.stats.datagrams_in, 1);
                    let d = Datagram { data: seg, remote: meta.addr, local_ip: meta.dst_ip, ecn };
                    st.handle_datagram(now, d);
                }
            }
            self.flush(&mut st, now);
        }
        self.start_tasks();
        true
    }
}

/// Sends one transmit (a GSO batch when it has a segment size); `Err` only for WouldBlock.
fn send_udp(io: &SocketIo, stats: &CoreStats, t: &OutTransmit) -> io::Result<()> {
    let tx = t.as_udp();
    match io.state.send((&io.socket).into(), &tx) {
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
    let mut timer = ConnTimer::default();
    poll_fn(|cx| loop {
        let (outcome, deadline) = core.drive(ch, cx.waker());
        match outcome {
            DriveOutcome::Gone => return Poll::Ready(()),
            DriveOutcome::Pending { keep_going: true } => {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            DriveOutcome::Pending { keep_going: false } => {
                if deadline.is_some_and(|d| timer.poll_at(d, cx).is_ready()) {
                    continue;
                }
                return Poll::Pending;
            }
        }
    })
    .await
}

/// A connection's glommio timer.
#[derive(Default)]
struct ConnTimer {
    /// When the armed timer fires, and the timer.
    armed: Option<(Instant, Timer)>,
}

impl ConnTimer {
    /// Polls a timer due at `deadline`. The armed timer is only moved earlier, never later: a
    /// timer that fires before the connection's real deadline costs one empty driver run,
    /// while resetting it on every ACK (each moves the loss-detection deadline) costs a reactor
    /// update per packet.
    fn poll_at(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let now = Instant::now();
        match &mut self.armed {
            Some((at, t)) => {
                if deadline < *at || *at <= now {
                    *at = deadline;
                    t.reset(deadline.saturating_duration_since(now));
                }
                Pin::new(t).poll(cx).map(drop)
            }
            None => {
                let mut t = Timer::new(deadline.saturating_duration_since(now));
                let ready = Pin::new(&mut t).poll(cx).map(drop);
                self.armed = Some((deadline, t));
                ready
            }
        }
    }
}

/// The receive task's buffers: a slab per message of a `recvmmsg` batch.
struct RecvBuffers {
    slabs: RecvSlabs,
    metas: [RecvMeta; BATCH_SIZE],
}

/// The receive task: waits for readability, drains the socket in batches, feeds the core.
pub(crate) async fn recv_loop(core: CoreRef, ready: glommio::net::UdpSocket) {
    let mut bufs =
        RecvBuffers { slabs: RecvSlabs::new(BATCH_SIZE), metas: [RecvMeta::default(); BATCH_SIZE] };
    let mut probe = [0u8; 1];
    loop {
        if core.state().is_finished() {
            return;
        }
        // Idle for a while: give back the retired slabs nothing holds any more.
        let peek = async { Some(ready.peek_from(&mut probe).await) };
        let idle = async {
            glommio::timer::sleep(Duration::from_millis(IDLE_TRIM_MS)).await;
            None
        };
        let Some(peeked) = futures_lite::future::or(peek, idle).await else {
            bufs.slabs.trim();
            continue;
        };
        if peeked.is_err() {
            CoreStats::add(&core.stats.socket_errors, 1);
            glommio::timer::sleep(Duration::from_millis(SOCKET_ERROR_BACKOFF_MS)).await;
            continue;
        }
        for _ in 0..MAX_RECV_CALLS_PER_WAKE {
            if !core.recv_batch(&mut bufs) {
                break;
            }
        }
        // Let the connection drivers woken above run (and send their ACKs) before the next
        // receive; glommio's `peek_from` may complete without yielding under load.
        futures_lite::future::yield_now().await;
    }
}

/// Receives datagrams another core forwarded to this one.
pub(crate) async fn mesh_loop(core: CoreRef, rx: ConnectedReceiver<Datagram>) {
    while let Some(d) = rx.recv().await {
        let now = Instant::now();
        {
            let mut st = core.state.borrow_mut();
            st.handle_forwarded(now, d);
            core.flush(&mut st, now);
        }
        core.start_tasks();
    }
}

/// Closes every connection (application code 0, reason "shutdown") and waits, bounded, until
/// they are drained.
pub(crate) async fn shutdown(core: &CoreRef, grace: Duration) {
    let queued = core.state().begin_shutdown(Instant::now());
    // Dropping a handle borrows the connection table: not while the state is borrowed.
    drop(queued);
    let start = Instant::now();
    while core.state().conn_count() > 0 && start.elapsed() < grace {
        glommio::timer::sleep(Duration::from_millis(SHUTDOWN_DRAIN_POLL_MS)).await;
    }
}
