//! One client connection on its owning core: Hello, then requests on any bidirectional stream.
//!
//! Per bidirectional stream, one reader decodes frames in order and one responder writes the
//! answers in the same order (a bounded queue of pending answers between them). A publish is
//! queued in storage, or on the owning core's mesh channel, before the next frame is read, so
//! the batches of one stream keep their order per shard. Reading stops while the connection's
//! or the core's in-flight byte budget is spent, and QUIC flow control pushes back on the
//! client.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use felix_proto::{
    Capabilities, ErrorCode, Frame, FrameDecoder, FrameError, FrameType, HelloOk, RequestId,
    ShardId, StreamInfo, StreamList, PROTOCOL_VERSION,
};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::sync::Semaphore;

use super::auth::{Action, Grant};
use super::cluster::Refused;
use super::core_app::CoreApp;
use super::error::WireError;
use super::mesh::{CoreRequest, CoreResponse};
use super::meta::{self, StreamMeta};
use super::stats;
use super::subscribe;
use super::tasks::now_ms;
use crate::net::{Connection, RecvStream, SendStream};

/// Answers queued per stream before the reader stops reading.
pub const RESPONSES_IN_FLIGHT_MAX: usize = 1024;
/// The most bytes one read from a stream takes.
pub(super) const READ_CHUNK_BYTES: usize = 256 << 10;
/// Capabilities this broker advertises.
/// Capabilities a single-node broker advertises: everything but `CLUSTER`.
pub const BROKER_CAPABILITIES: Capabilities =
    Capabilities(Capabilities::ALL.0 & !Capabilities::CLUSTER.0);
/// QUIC application error code used when the broker closes a connection at shutdown.
pub const CLOSE_SHUTTING_DOWN: u32 = ErrorCode::ShuttingDown as u32;

/// A request's answer, once it is ready (none for an unacked publish).
pub(super) type Answer = Pin<Box<dyn Future<Output = Option<Frame>>>>;

/// State of one connection.
pub struct Session {
    /// The core.
    pub app: Rc<CoreApp>,
    /// The connection.
    pub conn: Connection,
    hello: Cell<bool>,
    /// What the client advertised in Hello.
    client_capabilities: Cell<Capabilities>,
    /// The peer is another broker of the cluster, sending replication frames.
    peer: Cell<bool>,
    grant: std::cell::RefCell<Option<Grant>>,
    /// Publish bytes in flight on this connection.
    pub(super) budget: Rc<Semaphore>,
    /// Set once the connection is gone.
    pub closed: Cell<bool>,
    /// Subscriptions running on this connection.
    pub active_subscriptions: Cell<usize>,
    next_subscription: Cell<u64>,
}

/// Serves `conn` until it closes.
pub async fn serve_connection(app: Rc<CoreApp>, conn: Connection) {
    let c = &app.stats().counters;
    stats::add(&c.connections_accepted, 1);
    stats::add(&c.connections_open, 1);
    let session = Rc::new(Session {
        budget: Rc::new(Semaphore::new(app.settings().inflight_bytes_per_conn as u64)),
        app: app.clone(),
        conn: conn.clone(),
        hello: Cell::new(false),
        client_capabilities: Cell::new(Capabilities::NONE),
        peer: Cell::new(false),
        grant: std::cell::RefCell::new(None),
        closed: Cell::new(false),
        active_subscriptions: Cell::new(0),
        next_subscription: Cell::new(1),
    });
    while let Ok((send, recv)) = conn.accept_bi().await {
        glommio::spawn_local(serve_stream(session.clone(), send, recv)).detach();
    }
    session.closed.set(true);
    c.connections_open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
}

async fn serve_stream(session: Rc<Session>, mut send: SendStream, mut recv: RecvStream) {
    let (tx, rx) = local_channel::new_bounded::<Answer>(RESPONSES_IN_FLIGHT_MAX);
    let responder = glommio::spawn_local(async move {
        let mut buf = BytesMut::new();
        while let Some(answer) = rx.recv().await {
            if let Some(frame) = answer.await {
                buf.clear();
                frame.encode(&mut buf);
                if send.write_all(&buf).await.is_err() {
                    break;
                }
            }
        }
        let _ = send.finish();
    });
    // A broker of a cluster accepts the flags CLUSTER allows (CreateStream's REPLICAS).
    let accepted = broker_capabilities(&session.app);
    let mut decoder = FrameDecoder::new(session.app.settings().limits, accepted);
    // When the first read of the frame now being decoded happened (`None` between frames).
    let mut frame_began: Option<Instant> = None;
    'read: loop {
        // Every chunk that is there, up to what the frame being decoded still needs.
        let wanted = decoder.wanted_bytes().clamp(1, READ_CHUNK_BYTES);
        match recv.read_chunks(wanted, |chunk| decoder.handle_chunk(chunk)).await {
            Ok(true) => {}
            Ok(false) => {
                if let Some(e) = decoder.handle_end() {
                    let _ = tx.send(reject(&session, &e)).await;
                }
                break;
            }
            Err(_) => break,
        }
        // The clock is read at most twice per frame, not once per chunk (a 256 KiB batch
        // arrives in about 180): when a frame's first bytes arrive and when a frame completes.
        let mut read_at = None;
        if frame_began.is_none() {
            frame_began = Some(*read_at.insert(Instant::now()));
        }
        let mut began = frame_began;
        while let Some(result) = decoder.poll_frame() {
            let now = *read_at.get_or_insert_with(Instant::now);
            if matches!(result, Ok(Frame::Publish(_))) {
                let span = now.duration_since(began.unwrap_or(now));
                record_receive_span(&session.app, span);
            }
            // Bytes left after this frame belong to the next one, which began in this read.
            began = Some(now);
            let answer = match result {
                Ok(frame) => {
                    let answer = session.dispatch(frame).await;
                    if session.peer.get() {
                        // Another broker's replication stream: its own entry from here on.
                        if tx.send(answer).await.is_err() {
                            break 'read;
                        }
                        if let Some(host) = session.app.replication().cloned() {
                            decoder.set_accepted(Capabilities(
                                accepted.0 | Capabilities::REPLICATION.0,
                            ));
                            super::replication::inbound::serve(host, decoder, &mut recv, &tx).await;
                        }
                        break 'read;
                    }
                    answer
                }
                Err(e) => {
                    let fatal = e.fatal;
                    let answer = reject(&session, &e);
                    if tx.send(answer).await.is_err() || fatal {
                        recv.stop(ErrorCode::Malformed as u32);
                        break 'read;
                    }
                    continue;
                }
            };
            if tx.send(answer).await.is_err() {
                break 'read;
            }
        }
        frame_began = began.filter(|_| decoder.buffered_bytes() > 0);
    }
    drop(tx);
    responder.await;
}

/// Records how long a Publish frame's bytes took to arrive, from the first read of them to
/// the last (`felix_publish_receive_span_us`).
fn record_receive_span(app: &CoreApp, span: std::time::Duration) {
    let us = u64::try_from(span.as_micros()).unwrap_or(u64::MAX);
    app.publish_path().record_receive_span(us);
}

fn reject(session: &Session, e: &FrameError) -> Answer {
    stats::add(&session.app.stats().counters.rejected_frames, 1);
    // A Publish whose request id could be read asked for an ack.
    let acked_publish = e.frame_type == Some(FrameType::Publish) && e.request_id.is_some();
    let answer = WireError::new(e.code(), e.to_string())
        .into_answer(e.request_id.unwrap_or_default(), acked_publish);
    ready(Some(answer))
}

pub(super) fn ready(frame: Option<Frame>) -> Answer {
    Box::pin(async move { frame })
}

/// The answer refusing request `request_id`, of any type but an acked Publish.
fn error_frame(request_id: RequestId, e: WireError) -> Option<Frame> {
    Some(e.into_answer(request_id, false))
}

/// The request id an answer to `frame` carries: the one its body starts with, of any type
/// (a client sending a broker-only frame is answered with that frame's id too), else 0.
fn request_id_of(frame: &Frame) -> RequestId {
    frame.request_id().unwrap_or_default()
}

/// Whether refusals of `frame` are PublishError: an acked Publish, whatever its request id.
fn answers_with_publish_error(frame: &Frame) -> bool {
    matches!(frame, Frame::Publish(p) if p.ack.is_some())
}

impl Session {
    /// Answer one frame: Hello first, then each request after its grant is checked.
    async fn dispatch(self: &Rc<Self>, frame: Frame) -> Answer {
        if !self.hello.get() {
            return self.handle_first_frame(frame);
        }
        if let Some(refusal) = self.check_grant(&frame) {
            return refusal;
        }
        match frame {
            Frame::Publish(p) => super::publish::publish(self, p).await,
            Frame::Subscribe(s) => self.handle_subscribe(s),
            Frame::CreateStream(c) => self.handle_create_stream(c).await,
            Frame::DescribeStream(d) => match self.app.stream(&d.stream, false).await {
                Ok(entry) => ready(Some(stream_info(d.request_id, &entry.current_meta()))),
                Err(e) => ready(error_frame(d.request_id, e)),
            },
            Frame::DeleteStream(d) => match self.app.delete_stream(&d.stream).await {
                Ok(m) => ready(Some(stream_info(d.request_id, &m))),
                Err(e) => ready(error_frame(d.request_id, e)),
            },
            Frame::AlterStream(a) => match self.app.alter_stream(&a.stream, a.changes).await {
                Ok(m) => ready(Some(stream_info(a.request_id, &m))),
                Err(e) => ready(error_frame(a.request_id, e)),
            },
            Frame::ListStreams(l) => self.handle_list_streams(l),
            Frame::CommitOffset(c) => self.handle_commit_offset(c),
            Frame::Metadata(m) => self.handle_metadata(m),
            Frame::Ping(n) => ready(Some(Frame::Pong(n))),
            Frame::Pong(_) => ready(None),
            Frame::Hello(_) => {
                stats::add(&self.app.stats().counters.rejected_frames, 1);
                ready(error_frame(
                    RequestId(0),
                    WireError::new(ErrorCode::InvalidArgument, "Hello was already received"),
                ))
            }
            other => {
                stats::add(&self.app.stats().counters.rejected_frames, 1);
                let e = WireError::new(
                    ErrorCode::InvalidArgument,
                    format!("{:?} is not sent by clients", other.frame_type()),
                );
                ready(error_frame(request_id_of(&other), e))
            }
        }
    }

    /// Before Hello: only a Hello of this protocol version is answered with HelloOk.
    fn handle_first_frame(self: &Rc<Self>, frame: Frame) -> Answer {
        let app = &self.app;
        match frame {
            Frame::Hello(h) if h.version != PROTOCOL_VERSION => {
                stats::add(&app.stats().counters.rejected_frames, 1);
                let e = WireError::new(
                    ErrorCode::UnsupportedVersion,
                    format!("protocol version {} is not supported; this broker speaks {PROTOCOL_VERSION}", h.version),
                );
                ready(error_frame(RequestId(0), e))
            }
            Frame::Hello(h) => self.handle_hello(h),
            other => {
                stats::add(&app.stats().counters.rejected_frames, 1);
                let e = WireError::new(ErrorCode::Unauthenticated, "Hello must come first");
                let answer =
                    e.into_answer(request_id_of(&other), answers_with_publish_error(&other));
                ready(Some(answer))
            }
        }
    }

    /// Hello of this protocol version: verify the token when the broker requires one, then
    /// answer HelloOk.
    fn handle_hello(self: &Rc<Self>, h: felix_proto::Hello) -> Answer {
        let app = &self.app;
        if h.capabilities.contains(Capabilities::REPLICATION) {
            return self.handle_peer_hello();
        }
        if let Some(auth) = &app.settings().auth {
            let verified = match &h.token {
                None => {
                    Err(WireError::new(ErrorCode::Unauthenticated, "this broker requires a token"))
                }
                Some(t) => auth.verify(t),
            };
            match verified {
                Ok(grant) => {
                    // At `exp` the connection is closed with TokenExpired (14).
                    let conn = self.conn.clone();
                    let expiry = super::auth::close_at_expiry(conn, grant.exp);
                    glommio::spawn_local(expiry).detach();
                    *self.grant.borrow_mut() = Some(grant);
                }
                Err(e) => {
                    stats::add(&app.stats().counters.rejected_frames, 1);
                    return ready(error_frame(RequestId(0), e));
                }
            }
        }
        self.hello.set(true);
        self.client_capabilities.set(h.capabilities);
        ready(Some(Frame::HelloOk(HelloOk {
            version: PROTOCOL_VERSION,
            capabilities: broker_capabilities(app),
            limits: app.settings().limits,
            core: app.core(),
            core_count: app.settings().cores as u16,
        })))
    }

    /// Hello from another broker of the cluster (capability `REPLICATION`): from then on this
    /// stream carries only its `Replicate` frames. Refused by a broker outside a cluster.
    fn handle_peer_hello(self: &Rc<Self>) -> Answer {
        let app = &self.app;
        if app.replication().is_none() {
            stats::add(&app.stats().counters.rejected_frames, 1);
            let e = WireError::new(
                ErrorCode::InvalidArgument,
                "REPLICATION is spoken only between brokers of a cluster",
            );
            return ready(error_frame(RequestId(0), e));
        }
        // Only another broker: its connection presented a client certificate, which the
        // handshake verified against `--peer-ca` (mutual TLS, `crate::net::tls`), issued for
        // the name the brokers' certificates carry (`--peer-server-name`).
        let certified = match (self.conn.peer_certificate(), app.replication()) {
            (None, _) => Err("this connection presented none".to_owned()),
            (Some(cert), Some(host)) => {
                crate::net::tls::certificate_names(&cert, host.server_name())
            }
            (Some(_), None) => Err("no replication on this core".to_owned()),
        };
        if let Err(why) = certified {
            stats::add(&app.stats().counters.rejected_frames, 1);
            let e = WireError::new(
                ErrorCode::Unauthenticated,
                format!("REPLICATION needs a client certificate that --peer-ca verifies, for --peer-server-name: {why}"),
            );
            return ready(error_frame(RequestId(0), e));
        }
        self.hello.set(true);
        self.peer.set(true);
        ready(Some(Frame::HelloOk(HelloOk {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities(broker_capabilities(app).0 | Capabilities::REPLICATION.0),
            limits: app.settings().limits,
            core: app.core(),
            core_count: app.settings().cores as u16,
        })))
    }

    /// The refusal of `frame` when the connection's grant does not allow it, else `None`.
    fn check_grant(&self, frame: &Frame) -> Option<Answer> {
        let (action, stream) = needs(frame)?;
        let e = self.authorize(action, stream).err()?;
        stats::add(&self.app.stats().counters.rejected_frames, 1);
        let answer = e.into_answer(request_id_of(frame), answers_with_publish_error(frame));
        Some(ready(Some(answer)))
    }

    fn handle_subscribe(self: &Rc<Self>, s: felix_proto::Subscribe) -> Answer {
        if let Err(r) = self.check_subscribe(&s) {
            return ready(self.refused(s.request_id, &s.stream, r, false));
        }
        let session = self.clone();
        let id = s.request_id;
        // Resolving start positions may take mesh round trips; answer in order.
        Box::pin(async move {
            match subscribe::start(session, s).await {
                Ok(ok) => Some(Frame::SubscribeOk(ok)),
                Err(e) => error_frame(id, e),
            }
        })
    }

    async fn handle_create_stream(&self, c: felix_proto::CreateStream) -> Answer {
        let name = match felix_proto::StreamName::parse(&c.stream) {
            Ok(n) => n,
            Err(e) => {
                return ready(error_frame(
                    c.request_id,
                    WireError::new(ErrorCode::InvalidStreamName, e.to_string()),
                ))
            }
        };
        let m = StreamMeta { name, shards: c.shards, retention: c.retention };
        match self.app.create_stream(m, c.replicas).await {
            Ok(m) => ready(Some(stream_info(c.request_id, &m))),
            Err(e) => ready(error_frame(c.request_id, e)),
        }
    }

    /// The streams whose names start with the prefix and that the grant may read: from the
    /// cluster view in a cluster, else from the layout files in the data directory.
    fn handle_list_streams(&self, l: felix_proto::ListStreams) -> Answer {
        let app = &self.app;
        let streams = match &app.cluster() {
            Some(link) => link
                .stream_names()
                .into_iter()
                .filter(|n| n.starts_with(&l.prefix))
                .filter(|n| {
                    felix_proto::StreamName::parse(n)
                        .is_ok_and(|name| self.authorize_name(Action::Read, &name).is_ok())
                })
                .take(felix_proto::limits::MAX_LISTED_STREAMS)
                .collect(),
            None => match meta::load_all(&app.settings().data_dir) {
                Ok(all) => all
                    .into_iter()
                    .filter(|m| self.authorize_name(Action::Read, &m.name).is_ok())
                    .map(|m| m.name.as_str().to_owned())
                    .filter(|n| n.starts_with(&l.prefix))
                    .take(felix_proto::limits::MAX_LISTED_STREAMS)
                    .collect(),
                Err(e) => return ready(error_frame(l.request_id, super::core_app::meta_error(&e))),
            },
        };
        ready(Some(Frame::StreamList(StreamList { request_id: l.request_id, streams })))
    }

    /// Store a consumer group's position on the shard's owner core (once the stream and
    /// shard are known to exist).
    fn handle_commit_offset(self: &Rc<Self>, c: felix_proto::CommitOffset) -> Answer {
        if c.group.is_empty() || c.group.chars().any(char::is_control) {
            let e = WireError::new(
                ErrorCode::InvalidArgument,
                "group names are non-empty, without control characters",
            );
            return ready(error_frame(c.request_id, e));
        }
        if let Some(Err(r)) = self.app.cluster().as_ref().map(|l| l.check(&c.stream, c.shard, true))
        {
            return ready(self.refused(c.request_id, &c.stream, r, false));
        }
        let app = self.app.clone();
        Box::pin(async move {
            let req = CoreRequest::Commit {
                stream: c.stream.clone(),
                group: c.group,
                shard: c.shard,
                offset: c.offset,
            };
            match app.stream(&c.stream, false).await {
                Ok(e) if c.shard.0 < e.meta.shards => {}
                Ok(_) => {
                    return error_frame(
                        c.request_id,
                        WireError::new(ErrorCode::InvalidShard, format!("no {}", c.shard)),
                    )
                }
                Err(e) => return error_frame(c.request_id, e),
            }
            match app.on_owner(c.shard, req).await {
                Ok(CoreResponse::Committed(Ok(()))) => Some(Frame::CommitOk(c.request_id)),
                Ok(CoreResponse::Committed(Err(e))) | Err(e) => error_frame(c.request_id, e),
                Ok(_) => error_frame(
                    c.request_id,
                    WireError::new(ErrorCode::Internal, "unexpected reply"),
                ),
            }
        })
    }

    fn handle_metadata(&self, m: felix_proto::Metadata) -> Answer {
        let cluster = self
            .app
            .cluster()
            .filter(|_| self.client_capabilities.get().contains(Capabilities::CLUSTER));
        ready(match cluster {
            Some(link) => match link.metadata(m.request_id, &m.stream) {
                Ok(ok) => Some(Frame::MetadataOk(ok)),
                Err(e) => error_frame(m.request_id, e),
            },
            None => error_frame(
                m.request_id,
                WireError::new(
                    ErrorCode::InvalidArgument,
                    "Metadata needs capability CLUSTER on both sides (a broker in a cluster)",
                ),
            ),
        })
    }

    /// The answer to a request refused by the cluster: a `NotOwner` frame for a client that
    /// advertised CLUSTER, else `PublishError` (acked publishes) or `Error` with the code.
    pub(super) fn refused(
        &self,
        request_id: RequestId,
        stream: &str,
        r: Refused,
        publish: bool,
    ) -> Option<Frame> {
        let counters = &self.app.stats().counters;
        if let Refused::NotOwner { shard, owner } = &r {
            stats::add(&counters.cluster_not_owner, 1);
            if self.client_capabilities.get().contains(Capabilities::CLUSTER) {
                return Some(Frame::NotOwner(felix_proto::NotOwner {
                    request_id,
                    stream: stream.to_owned(),
                    shard: *shard,
                    owner: owner.clone(),
                }));
            }
        }
        Some(r.into_wire(stream).into_answer(request_id, publish))
    }

    /// In a cluster: whether every shard a Subscribe names (all of the stream's when it
    /// names none) is this broker's.
    fn check_subscribe(&self, s: &felix_proto::Subscribe) -> Result<(), Refused> {
        let Some(link) = &self.app.cluster() else { return Ok(()) };
        let all: Vec<ShardId>;
        let shards = match &s.shards {
            Some(list) => list,
            None => {
                let n = link.definition(&s.stream).map_or(0, |d| d.shards);
                all = (0..n).map(ShardId).collect();
                &all
            }
        };
        shards.iter().try_for_each(|shard| link.check(&s.stream, *shard, false))
    }

    /// Whether the client advertised every capability of `caps` in its Hello.
    pub fn client_has(&self, caps: Capabilities) -> bool {
        self.client_capabilities.get().contains(caps)
    }

    /// Whether this connection may do `action` on `stream`.
    pub fn may(&self, action: Action, stream: &str) -> bool {
        self.authorize(action, stream).is_ok()
    }

    /// Whether this connection's token allows `action` on `stream` (always, without auth).
    fn authorize(&self, action: Action, stream: &str) -> Result<(), WireError> {
        if self.app.settings().auth.is_none() {
            return Ok(());
        }
        let name = felix_proto::StreamName::parse(stream)
            .map_err(|e| WireError::new(ErrorCode::InvalidStreamName, e.to_string()))?;
        self.authorize_name(action, &name)
    }

    fn authorize_name(
        &self,
        action: Action,
        name: &felix_proto::StreamName,
    ) -> Result<(), WireError> {
        if self.app.settings().auth.is_none() {
            return Ok(());
        }
        match &*self.grant.borrow() {
            Some(g) => g.check(action, name, now_ms() / 1000),
            None => Err(WireError::new(ErrorCode::Unauthenticated, "no token")),
        }
    }

    /// A fresh subscription id on this connection.
    pub fn next_subscription_id(&self) -> u64 {
        let id = self.next_subscription.get();
        self.next_subscription.set(id + 1);
        id
    }
}

/// The permission a request needs, and the stream it names.
fn needs(frame: &Frame) -> Option<(Action, &str)> {
    match frame {
        Frame::Publish(p) => Some((Action::Publish, &p.stream)),
        Frame::CreateStream(c) => Some((Action::Publish, &c.stream)),
        Frame::DeleteStream(d) => Some((Action::Publish, &d.stream)),
        Frame::AlterStream(a) => Some((Action::Publish, &a.stream)),
        Frame::DescribeStream(d) => Some((Action::Read, &d.stream)),
        Frame::Subscribe(s) => Some((Action::Subscribe, &s.stream)),
        Frame::CommitOffset(c) => Some((Action::Subscribe, &c.stream)),
        Frame::Metadata(m) => Some((Action::Read, &m.stream)),
        _ => None,
    }
}

/// What this broker advertises: everything when it runs in a cluster, else all but CLUSTER.
fn broker_capabilities(app: &CoreApp) -> Capabilities {
    match app.cluster() {
        Some(_) => Capabilities::ALL,
        None => BROKER_CAPABILITIES,
    }
}

fn stream_info(request_id: RequestId, m: &StreamMeta) -> Frame {
    Frame::StreamInfo(StreamInfo {
        request_id,
        stream: m.name.as_str().to_owned(),
        shards: m.shards,
        retention: m.retention,
    })
}

/// Keeps the `LocalSender` type in this module's vocabulary for subscribe's writer queue.
pub type FrameSender = LocalSender<Bytes>;
