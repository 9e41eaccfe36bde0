//! What the application sees of a QUIC connection: [`Connection`], [`SendStream`],
//! [`RecvStream`].
//!
//! Handles are `!Send`: they live on the core that owns the connection. Every operation borrows
//! the core's connection table for a moment, calls quinn-proto, and wakes the connection's
//! driver when something must be sent. Flow control is end to end: a read pulls at most what the
//! caller asked for (quinn-proto then extends the peer's credit), and a write that finds the
//! stream's or connection's send window full waits until the peer grants more, so a slow reader
//! pushes back on the sender and nothing buffers without a bound.
//!
//! This module also holds what the core and the handles share: [`ConnTable`], every
//! connection of one core as [`ConnState`] (the quinn-proto connection, the wakers of the
//! application's waiting operations, the driver's send state). The core
//! ([`super::core::CoreState`]) updates it from datagrams and timers; the handles read and
//! write streams through it. It imports nothing of the core or the driver.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::CoreId;
pub use quinn_proto::ConnectionError;
use quinn_proto::{ConnectionHandle, Dir, StreamEvent, StreamId, VarInt};

use super::stats::CoreStats;
use super::transmit::OutTransmit;

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

/// Every connection one core owns, shared by the core and the application's handles.
pub(crate) struct ConnTable {
    /// The connections by quinn-proto handle (handles are reused; [`ConnState::uid`] is not).
    pub(crate) conns: IdMap<ConnectionHandle, ConnState>,
    /// The core's counters (the handles count accepted streams).
    pub(crate) stats: Arc<CoreStats>,
}

/// Shared handle to a core's [`ConnTable`]. Borrows are short and never span an `.await`.
pub(crate) type ConnTableRef = Rc<RefCell<ConnTable>>;

impl ConnTable {
    /// An empty table counting into `stats`.
    pub(crate) fn new(stats: Arc<CoreStats>) -> ConnTableRef {
        Rc::new(RefCell::new(Self { conns: IdMap::default(), stats }))
    }
}

/// One connection as its core holds it.
pub(crate) struct ConnState {
    /// The quinn-proto state machine.
    pub(crate) conn: quinn_proto::Connection,
    /// Unique on this core for the server's lifetime (handles are reused by quinn-proto).
    pub(crate) uid: u64,
    /// Wakes the task that drives this connection (set by the driver).
    pub(crate) driver: Option<Waker>,
    /// The application's waiting operations.
    pub(crate) waiters: Waiters,
    /// Shared with the application's handles, so they see the error after the state is gone.
    pub(crate) error: Rc<RefCell<Option<ConnectionError>>>,
    /// Transmits the socket refused with WouldBlock, in order; sent before anything new.
    pub(crate) blocked: VecDeque<OutTransmit>,
    /// When the blocked transmits are tried again.
    pub(crate) retry_at: Option<Instant>,
    /// The connection was offered to the application (or refused for a full accept queue).
    /// A connection this core opened is its application's from the start: it is born
    /// announced and never enters the accept queue.
    pub(crate) announced: bool,
}

impl ConnState {
    /// A connection quinn-proto just accepted.
    pub(crate) fn new(conn: quinn_proto::Connection, uid: u64) -> Self {
        Self {
            conn,
            uid,
            driver: None,
            waiters: Waiters::default(),
            error: Rc::new(RefCell::new(None)),
            blocked: VecDeque::new(),
            retry_at: None,
            announced: false,
        }
    }

    /// Wakes the connection's driver task (it has something to send or a timer to move).
    pub(crate) fn wake_driver(&mut self) {
        if let Some(w) = &self.driver {
            w.wake_by_ref();
        }
    }

    /// Remembers the waker of the task that drives this connection.
    pub(crate) fn register_driver(&mut self, waker: &Waker) {
        if !self.driver.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.driver = Some(waker.clone());
        }
    }

    /// The connection is lost: records why and wakes everyone waiting.
    pub(crate) fn fail(&mut self, reason: ConnectionError) {
        *self.error.borrow_mut() = Some(reason);
        self.waiters.wake_all();
    }
}

/// Application-side wakers of one connection.
#[derive(Default)]
pub(crate) struct Waiters {
    /// Reads waiting for data, by stream.
    pub(crate) readers: IdMap<StreamId, Waker>,
    /// Writes waiting for credit, by stream.
    pub(crate) writers: IdMap<StreamId, Waker>,
    /// `accept_bi` / `accept_uni` waiting for the peer to open a stream (by [`dir_index`]).
    pub(crate) accept: [Vec<Waker>; 2],
    /// `open_bi` / `open_uni` waiting for the peer's stream limit (by [`dir_index`]).
    pub(crate) open: [Vec<Waker>; 2],
    /// `closed` waiting for the end.
    pub(crate) closed: Vec<Waker>,
}

impl Waiters {
    /// Wakes every waiting operation (the connection is gone).
    pub(crate) fn wake_all(&mut self) {
        self.readers.drain().for_each(|(_, w)| w.wake());
        self.writers.drain().for_each(|(_, w)| w.wake());
        for v in self.accept.iter_mut().chain(self.open.iter_mut()) {
            v.drain(..).for_each(Waker::wake);
        }
        self.closed.drain(..).for_each(Waker::wake);
    }

    /// Wakes the `open_bi` / `open_uni` calls waiting for stream credit.
    pub(crate) fn wake_open(&mut self) {
        self.open.iter_mut().for_each(|v| v.drain(..).for_each(Waker::wake));
    }

    /// Wakes the operations a stream event unblocks.
    pub(crate) fn wake_stream(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Opened { dir } => {
                self.accept[dir_index(dir)].drain(..).for_each(Waker::wake);
            }
            StreamEvent::Readable { id } => {
                if let Some(w) = self.readers.remove(&id) {
                    w.wake();
                }
            }
            StreamEvent::Writable { id }
            | StreamEvent::Finished { id }
            | StreamEvent::Stopped { id, .. } => {
                if let Some(w) = self.writers.remove(&id) {
                    w.wake();
                }
            }
            StreamEvent::Available { dir } => {
                self.open[dir_index(dir)].drain(..).for_each(Waker::wake);
            }
        }
    }
}

/// Index of a stream direction in [`Waiters::accept`] and [`Waiters::open`].
pub(crate) fn dir_index(dir: Dir) -> usize {
    match dir {
        Dir::Bi => 0,
        Dir::Uni => 1,
    }
}

/// An established connection, owned by one core.
#[derive(Clone)]
pub struct Connection {
    inner: Rc<ConnRef>,
}

struct ConnRef {
    table: ConnTableRef,
    core_id: CoreId,
    handle: ConnectionHandle,
    uid: u64,
    peer: SocketAddr,
    error: Rc<RefCell<Option<ConnectionError>>>,
}

impl ConnRef {
    /// Runs `f` on the connection's state if it still exists.
    fn with<R>(&self, f: impl FnOnce(&mut ConnState) -> R) -> Option<R> {
        let mut table = self.table.borrow_mut();
        match table.conns.get_mut(&self.handle) {
            Some(cs) if cs.uid == self.uid => Some(f(cs)),
            _ => None,
        }
    }

    /// Like [`ConnRef::with`], but does nothing when the core's state is borrowed already
    /// (drop paths may run inside a borrow).
    fn try_with(&self, f: impl FnOnce(&mut ConnState)) {
        let Ok(mut table) = self.table.try_borrow_mut() else { return };
        if let Some(cs) = table.conns.get_mut(&self.handle) {
            if cs.uid == self.uid {
                f(cs);
            }
        }
    }

    fn error(&self) -> ConnectionError {
        self.error.borrow().clone().unwrap_or(ConnectionError::LocallyClosed)
    }
}

impl Drop for ConnRef {
    /// Dropping the last handle (connection and streams) closes the connection, as quinn does.
    fn drop(&mut self) {
        let Ok(mut table) = self.table.try_borrow_mut() else {
            return;
        };
        if let Some(cs) = table.conns.get_mut(&self.handle) {
            if cs.uid == self.uid && !cs.conn.is_closed() {
                cs.conn.close(Instant::now(), VarInt::from_u32(0), Bytes::new());
                cs.wake_driver();
            }
        }
    }
}

impl Connection {
    pub(crate) fn new(
        table: ConnTableRef,
        core_id: CoreId,
        handle: ConnectionHandle,
        uid: u64,
        peer: SocketAddr,
        error: Rc<RefCell<Option<ConnectionError>>>,
    ) -> Self {
        Self { inner: Rc::new(ConnRef { table, core_id, handle, uid, peer, error }) }
    }

    /// The peer's current address (after a migration, the new one).
    pub fn peer(&self) -> SocketAddr {
        self.inner.with(|cs| cs.conn.remote_address()).unwrap_or(self.inner.peer)
    }

    /// The core that owns this connection.
    pub fn core(&self) -> CoreId {
        self.inner.core_id
    }

    /// Current smoothed round-trip time estimate.
    pub fn rtt(&self) -> Duration {
        self.inner.with(|cs| cs.conn.rtt()).unwrap_or_default()
    }

    /// The leaf of the client certificate chain the peer presented, on a connection accepted
    /// by this core. The server verifies any it presents against
    /// `NetConfig::peer_client_roots` and refuses the handshake when that fails, so one that
    /// is here was verified (a cluster's broker). `None` without one, and always on a
    /// connection this core opened (its peer identity is the server's certificate).
    pub fn peer_certificate(&self) -> Option<rustls::pki_types::CertificateDer<'static>> {
        self.inner
            .with(|cs| {
                if !cs.conn.side().is_server() {
                    return None;
                }
                let identity = cs.conn.crypto_session().peer_identity()?;
                let chain =
                    identity.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>().ok()?;
                chain.into_iter().next()
            })
            .flatten()
    }

    /// quinn-proto's statistics for this connection (packets, bytes, path).
    pub fn stats(&self) -> Option<quinn_proto::ConnectionStats> {
        self.inner.with(|cs| cs.conn.stats())
    }

    /// Waits for the peer to open a bidirectional stream.
    pub async fn accept_bi(&self) -> Result<(SendStream, RecvStream), ConnectionError> {
        let id = self.accept(Dir::Bi).await?;
        Ok((SendStream::new(self, id), RecvStream::new(self, id)))
    }

    /// Waits for the peer to open a unidirectional stream.
    pub async fn accept_uni(&self) -> Result<RecvStream, ConnectionError> {
        let id = self.accept(Dir::Uni).await?;
        Ok(RecvStream::new(self, id))
    }

    /// Opens a bidirectional stream, waiting while the peer's stream limit is reached.
    pub async fn open_bi(&self) -> Result<(SendStream, RecvStream), ConnectionError> {
        let id = self.open(Dir::Bi).await?;
        Ok((SendStream::new(self, id), RecvStream::new(self, id)))
    }

    /// Opens a unidirectional stream, waiting while the peer's stream limit is reached.
    pub async fn open_uni(&self) -> Result<SendStream, ConnectionError> {
        let id = self.open(Dir::Uni).await?;
        Ok(SendStream::new(self, id))
    }

    /// Closes the connection with an application error code and reason.
    pub fn close(&self, code: u32, reason: &[u8]) {
        self.inner.with(|cs| {
            cs.conn.close(Instant::now(), VarInt::from_u32(code), Bytes::copy_from_slice(reason));
            cs.wake_driver();
        });
    }

    /// Waits until the connection is closed (by either side or by a timeout) and says why.
    pub async fn closed(&self) -> ConnectionError {
        poll_fn(|cx| {
            if let Some(e) = self.inner.error.borrow().clone() {
                return Poll::Ready(e);
            }
            match self.inner.with(|cs| cs.waiters.closed.push(cx.waker().clone())) {
                Some(()) => Poll::Pending,
                None => Poll::Ready(self.inner.error()),
            }
        })
        .await
    }

    async fn accept(&self, dir: Dir) -> Result<StreamId, ConnectionError> {
        let table = self.inner.table.clone();
        poll_fn(|cx| {
            let r = self.inner.with(|cs| {
                if let Some(id) = cs.conn.streams().accept(dir) {
                    // Accepting may raise the peer's stream limit: let the driver send it.
                    cs.wake_driver();
                    return Poll::Ready(Ok(id));
                }
                if let Some(e) = cs.error.borrow().clone() {
                    return Poll::Ready(Err(e));
                }
                cs.waiters.accept[dir_index(dir)].push(cx.waker().clone());
                Poll::Pending
            });
            r.unwrap_or_else(|| Poll::Ready(Err(self.inner.error())))
        })
        .await
        .inspect(|_| {
            CoreStats::add(&table.borrow().stats.streams_accepted, 1);
        })
    }

    async fn open(&self, dir: Dir) -> Result<StreamId, ConnectionError> {
        poll_fn(|cx| {
            let r = self.inner.with(|cs| {
                if let Some(e) = cs.error.borrow().clone() {
                    return Poll::Ready(Err(e));
                }
                if let Some(id) = cs.conn.streams().open(dir) {
                    return Poll::Ready(Ok(id));
                }
                cs.waiters.open[dir_index(dir)].push(cx.waker().clone());
                Poll::Pending
            });
            r.unwrap_or_else(|| Poll::Ready(Err(self.inner.error())))
        })
        .await
    }
}

/// The sending half of a stream.
pub struct SendStream {
    conn: Rc<ConnRef>,
    id: StreamId,
    finished: bool,
}

impl SendStream {
    fn new(conn: &Connection, id: StreamId) -> Self {
        Self { conn: conn.inner.clone(), id, finished: false }
    }

    /// One write attempt `op` on the stream: ready with what it took, or pending (the task is
    /// woken when the stream can take more) while the stream's or connection's flow-control
    /// window, or the connection's send buffer, is full.
    fn poll_write<T>(
        &self,
        cx: &mut std::task::Context<'_>,
        op: impl FnOnce(&mut quinn_proto::SendStream<'_>) -> Result<T, quinn_proto::WriteError>,
    ) -> Poll<Result<T, WriteError>> {
        let id = self.id;
        let r = self.conn.with(|cs| match op(&mut cs.conn.send_stream(id)) {
            Ok(n) => {
                cs.wake_driver();
                Poll::Ready(Ok(n))
            }
            Err(quinn_proto::WriteError::Blocked) => {
                if let Some(e) = cs.error.borrow().clone() {
                    return Poll::Ready(Err(WriteError::ConnectionLost(e)));
                }
                cs.waiters.writers.insert(id, cx.waker().clone());
                Poll::Pending
            }
            Err(quinn_proto::WriteError::Stopped(code)) => {
                Poll::Ready(Err(WriteError::Stopped(code.into_inner())))
            }
            Err(quinn_proto::WriteError::ClosedStream) => {
                Poll::Ready(Err(match cs.error.borrow().clone() {
                    Some(e) => WriteError::ConnectionLost(e),
                    None => WriteError::ClosedStream,
                }))
            }
        });
        r.unwrap_or_else(|| Poll::Ready(Err(WriteError::ConnectionLost(self.conn.error()))))
    }

    /// Writes some of `data` (copied into quinn's send buffer), waiting while the stream
    /// cannot take more (see [`SendStream::poll_write`]). Returns how many bytes were taken.
    pub async fn write(&mut self, data: &[u8]) -> Result<usize, WriteError> {
        poll_fn(|cx| self.poll_write(cx, |s| s.write(data))).await
    }

    /// Writes all of `data` (see [`SendStream::write`]).
    pub async fn write_all(&mut self, mut data: &[u8]) -> Result<(), WriteError> {
        while !data.is_empty() {
            let n = self.write(data).await?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Writes all of `chunks` without copying them: quinn keeps each `Bytes` (sharing it with
    /// whoever else holds it, e.g. the other subscribers of a tail batch) until its packets
    /// are built. A chunk taken in part is advanced past what was taken; on return every
    /// chunk is empty.
    pub async fn write_all_chunks(&mut self, chunks: &mut [Bytes]) -> Result<(), WriteError> {
        let mut at = 0;
        loop {
            while chunks.get(at).is_some_and(Bytes::is_empty) {
                at += 1;
            }
            if at == chunks.len() {
                return Ok(());
            }
            let rest = &mut chunks[at..];
            let written = poll_fn(|cx| self.poll_write(cx, |s| s.write_chunks(rest))).await?;
            at += written.chunks;
        }
    }

    /// Marks the end of the stream; data already written is still delivered.
    pub fn finish(&mut self) -> Result<(), WriteError> {
        self.finished = true;
        let id = self.id;
        let r = self.conn.with(|cs| {
            let r = cs.conn.send_stream(id).finish();
            cs.wake_driver();
            r
        });
        match r {
            Some(Ok(())) => Ok(()),
            Some(Err(quinn_proto::FinishError::Stopped(code))) => {
                Err(WriteError::Stopped(code.into_inner()))
            }
            Some(Err(quinn_proto::FinishError::ClosedStream)) => Err(WriteError::ClosedStream),
            None => Err(WriteError::ConnectionLost(self.conn.error())),
        }
    }

    /// Waits until the peer no longer wants the stream: it sent STOP_SENDING (its code is
    /// returned), or the stream or the connection is gone (`None`). A task that also writes
    /// the stream may wait on this between writes: both wait in the stream's writer slot.
    pub async fn stopped(&self) -> Option<u64> {
        poll_fn(|cx| self.poll_stopped(cx)).await
    }

    fn poll_stopped(&self, cx: &mut std::task::Context<'_>) -> Poll<Option<u64>> {
        let id = self.id;
        let r = self.conn.with(|cs| match cs.conn.send_stream(id).stopped() {
            Ok(Some(code)) => Poll::Ready(Some(code.into_inner())),
            Ok(None) if cs.error.borrow().is_none() => {
                // Woken by `StreamEvent::Stopped` (or by the connection's end).
                cs.waiters.writers.insert(id, cx.waker().clone());
                Poll::Pending
            }
            Ok(None) | Err(_) => Poll::Ready(None),
        });
        r.unwrap_or(Poll::Ready(None))
    }

    /// Abandons the stream with an application error code.
    pub fn reset(&mut self, code: u32) {
        self.finished = true;
        let id = self.id;
        self.conn.with(|cs| {
            let _ = cs.conn.send_stream(id).reset(VarInt::from_u32(code));
            cs.wake_driver();
        });
    }
}

impl Drop for SendStream {
    /// A dropped, unfinished stream is finished, or reset with the peer's code when the peer
    /// stopped it, so that quinn-proto frees it (as quinn does).
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let id = self.id;
        self.conn.try_with(|cs| {
            let mut stream = cs.conn.send_stream(id);
            if let Err(quinn_proto::FinishError::Stopped(code)) = stream.finish() {
                let _ = stream.reset(code);
            }
            cs.wake_driver();
        });
    }
}

/// The receiving half of a stream.
pub struct RecvStream {
    conn: Rc<ConnRef>,
    id: StreamId,
    /// No more reads reach quinn-proto (end seen, reset, stopped or failed).
    done: bool,
    /// The end of the stream was seen together with the last data; the next read says so.
    eof: bool,
}

impl RecvStream {
    fn new(conn: &Connection, id: StreamId) -> Self {
        Self { conn: conn.inner.clone(), id, done: false, eof: false }
    }

    /// Reads into `buf`, waiting for data. `Ok(None)` at the end of the stream.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<Option<usize>, ReadError> {
        let max = buf.len();
        let mut n = 0;
        let r = self
            .read_chunks(max, |chunk| {
                buf[n..n + chunk.len()].copy_from_slice(&chunk);
                n += chunk.len();
            })
            .await;
        r.map(|got| got.then_some(n))
    }

    /// Hands every chunk that has arrived, up to `max` bytes in all, to `sink` without
    /// copying, waiting until there is at least one: one call for what one `read_chunk` per
    /// chunk would take (quinn's read state is opened and its flow control settled once).
    /// `Ok(true)` if data came, `Ok(false)` at the end of the stream.
    pub async fn read_chunks(
        &mut self,
        max: usize,
        mut sink: impl FnMut(Bytes),
    ) -> Result<bool, ReadError> {
        self.read_with(max, usize::MAX, &mut sink).await
    }

    /// Reads one chunk of at most `max` bytes without copying. `Ok(None)` at the end.
    pub async fn read_chunk(&mut self, max: usize) -> Result<Option<Bytes>, ReadError> {
        let mut out = None;
        let r = self
            .poll_read_one(max, |chunk| {
                out = Some(chunk);
            })
            .await;
        r.map(|got| if got { out } else { None })
    }

    /// Reads to the end of the stream, failing past `limit` bytes.
    pub async fn read_to_end(&mut self, limit: usize) -> Result<Vec<u8>, ReadError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.read_chunk(usize::MAX).await? {
            if out.len() + chunk.len() > limit {
                return Err(ReadError::TooLong(limit));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// Asks the peer to stop sending, with an application error code.
    pub fn stop(&mut self, code: u32) {
        self.done = true;
        let id = self.id;
        self.conn.with(|cs| {
            let _ = cs.conn.recv_stream(id).stop(VarInt::from_u32(code));
            cs.wake_driver();
        });
    }

    async fn poll_read_one(
        &mut self,
        max: usize,
        mut sink: impl FnMut(Bytes),
    ) -> Result<bool, ReadError> {
        self.read_with(max, 1, &mut sink).await
    }

    async fn read_with(
        &mut self,
        max: usize,
        max_chunks: usize,
        sink: &mut impl FnMut(Bytes),
    ) -> Result<bool, ReadError> {
        if self.eof {
            return Ok(false);
        }
        if max == 0 {
            return Ok(true);
        }
        let id = self.id;
        let conn = self.conn.clone();
        let r = poll_fn(|cx| {
            let r = conn.with(|cs| read_some(cs, id, max, max_chunks, sink, cx.waker()));
            r.unwrap_or_else(|| Poll::Ready(Err(ReadError::ConnectionLost(conn.error()))))
        })
        .await;
        match r {
            Ok(ReadOutcome::Data { eof }) => {
                if eof {
                    self.eof = true;
                    self.done = true;
                }
                Ok(true)
            }
            Ok(ReadOutcome::End) => {
                self.eof = true;
                self.done = true;
                Ok(false)
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }
}

enum ReadOutcome {
    /// Some data; `eof` when the end of the stream came right after it.
    Data { eof: bool },
    /// The end of the stream, no data.
    End,
}

fn read_some(
    cs: &mut ConnState,
    id: StreamId,
    max: usize,
    max_chunks: usize,
    sink: &mut impl FnMut(Bytes),
    waker: &Waker,
) -> Poll<Result<ReadOutcome, ReadError>> {
    let mut stream = cs.conn.recv_stream(id);
    let mut chunks = match stream.read(true) {
        Ok(c) => c,
        Err(_) => {
            return Poll::Ready(Err(match cs.error.borrow().clone() {
                Some(e) => ReadError::ConnectionLost(e),
                None => ReadError::ClosedStream,
            }))
        }
    };
    let mut got = 0usize;
    let mut count = 0usize;
    let outcome = loop {
        if got >= max || count >= max_chunks {
            break None;
        }
        match chunks.next(max - got) {
            Ok(Some(chunk)) => {
                got += chunk.bytes.len();
                count += 1;
                sink(chunk.bytes);
            }
            Ok(None) => break Some(Ok(ReadOutcome::End)),
            Err(quinn_proto::ReadError::Blocked) => break None,
            Err(quinn_proto::ReadError::Reset(code)) => {
                break Some(Err(ReadError::Reset(code.into_inner())))
            }
        }
    };
    if chunks.finalize().should_transmit() {
        cs.wake_driver();
    }
    if count > 0 {
        let eof = matches!(outcome, Some(Ok(ReadOutcome::End)));
        return Poll::Ready(Ok(ReadOutcome::Data { eof }));
    }
    match outcome {
        Some(r) => Poll::Ready(r),
        None => {
            if let Some(e) = cs.error.borrow().clone() {
                return Poll::Ready(Err(ReadError::ConnectionLost(e)));
            }
            cs.waiters.readers.insert(id, waker.clone());
            Poll::Pending
        }
    }
}

impl Drop for RecvStream {
    /// A dropped stream that was not read to the end asks the peer to stop (as quinn does).
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let id = self.id;
        self.conn.try_with(|cs| {
            let _ = cs.conn.recv_stream(id).stop(VarInt::from_u32(0));
            cs.wake_driver();
        });
    }
}

/// A write on a stream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// The peer asked us to stop sending (STOP_SENDING) with this application code.
    #[error("stopped by peer: code {0}")]
    Stopped(u64),
    /// The stream was already finished or reset.
    #[error("stream closed")]
    ClosedStream,
    /// The connection is gone.
    #[error("connection lost: {0}")]
    ConnectionLost(ConnectionError),
}

/// A read on a stream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// The peer abandoned the stream (RESET_STREAM) with this application code.
    #[error("reset by peer: code {0}")]
    Reset(u64),
    /// The stream was already read to the end or stopped.
    #[error("stream closed")]
    ClosedStream,
    /// The connection is gone.
    #[error("connection lost: {0}")]
    ConnectionLost(ConnectionError),
    /// `read_to_end` found more than its limit.
    #[error("stream longer than {0} bytes")]
    TooLong(usize),
}
