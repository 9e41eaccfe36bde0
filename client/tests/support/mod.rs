//! A scripted test broker: quinn (tokio) speaking felix-proto, everything in memory.
//!
//! It advertises configurable capabilities and limits, assigns each connection a core from a
//! configurable sequence, records every flag bit it receives (and every use of a capability it
//! did not advertise), stores published records, pushes them to subscriptions and keeps
//! consumer-group commits. It is not the real broker: it exists to test the client's logic.
//!
//! A broker that advertises `CLUSTER` acts as a member of a cluster (`cluster.rs`): it answers
//! `Metadata` from a placement table shared by every member, refuses shards it does not own with
//! `NotOwner` and shards whose owner is down with `ShardUnavailable`. Without a table it is a
//! cluster of one that owns everything.
#![allow(dead_code)]

pub mod cluster;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use cluster::ClusterRole;
use felix_client::{CertFingerprint, ClientConfig, Trust};
use felix_proto::{
    encode_event_batch, shard_for_key, AckMode, Capabilities, CoreId, ErrorBody, ErrorCode,
    EventBatch, Frame, FrameDecoder, HelloOk, Limits, Offset, PublishAck, Record, RequestId,
    ShardId, StartAt, StreamInfo, StreamList, StreamName, SubscribeOk, SubscriptionId,
    PROTOCOL_VERSION,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::sync::watch;

/// How the test broker behaves.
#[derive(Clone, Debug)]
pub struct BrokerOptions {
    /// Capabilities advertised in HelloOk.
    pub capabilities: Capabilities,
    /// Limits advertised in HelloOk (and enforced on received frames).
    pub limits: Limits,
    /// core_count advertised in HelloOk.
    pub core_count: u16,
    /// The cores handed to successive connections (cycled).
    pub core_sequence: Vec<u16>,
    /// Store publishes but never answer them (ack timeouts).
    pub swallow_acks: bool,
    /// The token a Hello must carry, if any.
    pub token: Option<String>,
    /// This broker's place in a mock cluster (used when `capabilities` has `CLUSTER`).
    pub cluster: Option<ClusterRole>,
    /// The QUIC stream receive window it gives clients (quinn's default when `None`).
    pub stream_receive_window: Option<u32>,
    /// How long it waits before acking each publish (a slow disk), reading nothing more on
    /// that stream meanwhile.
    pub ack_delay: Option<Duration>,
    /// How long it waits before answering a Hello (a loaded host).
    pub hello_delay: Option<Duration>,
}

/// What a single-node broker advertises: everything but `CLUSTER`.
pub const SINGLE_NODE: Capabilities = Capabilities(Capabilities::ALL.0 & !Capabilities::CLUSTER.0);

impl Default for BrokerOptions {
    fn default() -> Self {
        Self {
            capabilities: SINGLE_NODE,
            limits: Limits::default(),
            core_count: 2,
            core_sequence: vec![0, 1],
            swallow_acks: false,
            token: None,
            cluster: None,
            stream_receive_window: None,
            ack_delay: None,
            hello_delay: None,
        }
    }
}

/// A stored record.
#[derive(Clone, Debug)]
pub struct Stored {
    pub timestamp_ms: u64,
    pub key: Option<Bytes>,
    pub value: Bytes,
}

/// A stream's data.
#[derive(Clone, Debug, Default)]
pub struct StreamData {
    pub shards: Vec<Vec<Stored>>,
    pub retention: felix_proto::Retention,
}

/// What the broker observed; shared across restarts.
#[derive(Default)]
pub struct Observed {
    pub streams: BTreeMap<String, StreamData>,
    pub commits: HashMap<(String, String, u32), u64>,
    /// OR of every flag bit received, over all frames.
    pub flags_seen: u16,
    /// Every frame that used a flag or capability the broker did not advertise.
    pub violations: Vec<String>,
    /// Hellos received (handshakes completed).
    pub hellos: usize,
    /// Tokens received in Hello.
    pub tokens: Vec<Option<Bytes>>,
    /// The client address of each Hello's connection.
    pub hello_from: Vec<SocketAddr>,
    /// Publish frames received.
    pub publishes: usize,
    /// Records received per publish frame, in order.
    pub batch_sizes: Vec<usize>,
    /// Ack mode of each acked publish frame.
    pub ack_modes: Vec<AckMode>,
    /// The key of each publish frame and the core of the connection it arrived on.
    pub publish_cores: Vec<(Option<Bytes>, u16)>,
    /// Metadata requests answered.
    pub metadata_requests: usize,
    /// NotOwner answers sent (publish, subscribe, commit).
    pub not_owner_sent: usize,
    /// ShardUnavailable answers sent.
    pub unavailable_sent: usize,
    /// Unacked publishes dropped because the shard is not owned here.
    pub dropped_not_owner: usize,
    /// The shard list of each accepted Subscribe (`None`: all).
    pub subscribes: Vec<Option<Vec<ShardId>>>,
}

/// Shared state: observations plus a change counter that wakes subscriptions.
pub struct State {
    pub observed: Mutex<Observed>,
    changed: watch::Sender<u64>,
    /// Set to a code to reset every subscription stream with it.
    reset_subscriptions: watch::Sender<Option<u32>>,
    next_subscription: AtomicU64,
    next_core: AtomicUsize,
    /// Set: the broker answers nothing more, while QUIC keeps its connections alive (a broker
    /// cut off from its cluster that clients still reach, or hung).
    pub frozen: AtomicBool,
    /// Set: the broker refuses every publish with `ShuttingDown` (a graceful stop under way).
    pub stopping: AtomicBool,
}

impl Default for State {
    fn default() -> Self {
        Self {
            observed: Mutex::default(),
            changed: watch::channel(0).0,
            reset_subscriptions: watch::channel(None).0,
            next_subscription: AtomicU64::new(1),
            next_core: AtomicUsize::new(0),
            frozen: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }
}

impl State {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Observed> {
        self.observed.lock().unwrap()
    }

    /// Resets every subscription stream with `code` (as the broker does for a slow consumer).
    pub fn reset_subscriptions(&self, code: ErrorCode) {
        self.reset_subscriptions.send_replace(Some(u32::from(code.as_u16())));
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }
}

/// A running test broker.
pub struct TestBroker {
    pub addr: SocketAddr,
    pub cert: CertificateDer<'static>,
    pub cert_pem: String,
    key: Arc<Vec<u8>>,
    pub state: Arc<State>,
    pub options: BrokerOptions,
    endpoint: quinn::Endpoint,
    task: tokio::task::JoinHandle<()>,
}

impl TestBroker {
    /// Starts on an ephemeral loopback port with a fresh self-signed certificate for localhost.
    pub async fn start(options: BrokerOptions) -> Self {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = Arc::new(cert.key_pair.serialize_der());
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        Self::start_with(
            addr,
            cert.cert.der().clone(),
            cert.cert.pem(),
            key,
            Arc::default(),
            options,
        )
        .await
    }

    async fn start_with(
        addr: SocketAddr,
        cert: CertificateDer<'static>,
        cert_pem: String,
        key: Arc<Vec<u8>>,
        state: Arc<State>,
        options: BrokerOptions,
    ) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.as_ref().clone())),
            )
            .unwrap();
        tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        if let Some(window) = options.stream_receive_window {
            let mut transport = quinn::TransportConfig::default();
            transport.stream_receive_window(quinn::VarInt::from_u32(window));
            server.transport_config(Arc::new(transport));
        }
        // A restart may find the port still held for a moment.
        let mut tries = 0;
        let endpoint = loop {
            match quinn::Endpoint::server(server.clone(), addr) {
                Ok(e) => break e,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("test broker cannot bind {addr}: {e}"),
            }
        };
        let addr = endpoint.local_addr().unwrap();
        let task =
            tokio::spawn(accept_loop(endpoint.clone(), addr, state.clone(), options.clone()));
        Self { addr, cert, cert_pem, key, state, options, endpoint, task }
    }

    /// The certificate's SHA-256 fingerprint.
    pub fn fingerprint(&self) -> CertFingerprint {
        CertFingerprint::of_der(self.cert.as_ref())
    }

    /// A client configuration that pins this broker's certificate.
    pub fn client_config(&self) -> ClientConfig {
        let mut c =
            ClientConfig::new(self.addr.to_string(), Trust::Fingerprint(self.fingerprint()));
        c.connect_timeout_ms = 5_000;
        c.ack_timeout_ms = 5_000;
        c
    }

    /// Creates a stream directly in the broker's state.
    pub fn create_stream(&self, name: &str, shards: u32) {
        let data = StreamData { shards: vec![Vec::new(); shards as usize], ..Default::default() };
        self.state.lock().streams.insert(name.to_owned(), data);
    }

    /// Stops: closes every connection and releases the port.
    pub async fn stop(self) -> StoppedBroker {
        self.endpoint.close(0u32.into(), b"test broker stopping");
        self.task.abort();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
        let addr = self.addr;
        drop(self.endpoint);
        StoppedBroker {
            addr,
            cert: self.cert,
            cert_pem: self.cert_pem,
            key: self.key,
            state: self.state,
            options: self.options,
        }
    }

    /// Asserts that no frame used a flag bit or capability the broker did not advertise.
    pub fn assert_no_unadvertised_bits(&self) {
        let o = self.state.lock();
        let caps = self.options.capabilities;
        let allowed =
            felix_proto::FrameType::ALL.iter().fold(0, |a, t| a | caps.allowed_flags(*t).0);
        assert_eq!(o.flags_seen & !allowed, 0, "flag bits received: {:#06x}", o.flags_seen);
        assert!(o.violations.is_empty(), "violations: {:?}", o.violations);
    }
}

/// A stopped broker that can be started again on the same address, certificate and state.
pub struct StoppedBroker {
    pub addr: SocketAddr,
    cert: CertificateDer<'static>,
    cert_pem: String,
    key: Arc<Vec<u8>>,
    pub state: Arc<State>,
    options: BrokerOptions,
}

impl StoppedBroker {
    pub async fn restart(self) -> TestBroker {
        TestBroker::start_with(
            self.addr,
            self.cert,
            self.cert_pem,
            self.key,
            self.state,
            self.options,
        )
        .await
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    state: Arc<State>,
    options: BrokerOptions,
) {
    while let Some(incoming) = endpoint.accept().await {
        let state = state.clone();
        let options = options.clone();
        tokio::spawn(async move {
            if let Ok(conn) = incoming.await {
                serve_connection(conn, addr, state, options).await;
            }
        });
    }
}

struct ConnCtx {
    conn: quinn::Connection,
    /// The broker's own address.
    addr: SocketAddr,
    state: Arc<State>,
    options: Arc<BrokerOptions>,
    core: Mutex<Option<u16>>,
    /// What the client advertised in Hello.
    client_caps: Mutex<Capabilities>,
}

async fn serve_connection(
    conn: quinn::Connection,
    addr: SocketAddr,
    state: Arc<State>,
    options: BrokerOptions,
) {
    let ctx = Arc::new(ConnCtx {
        conn,
        addr,
        state,
        options: Arc::new(options),
        core: Mutex::new(None),
        client_caps: Mutex::new(Capabilities::NONE),
    });
    while let Ok((send, recv)) = ctx.conn.accept_bi().await {
        tokio::spawn(serve_stream(ctx.clone(), send, recv));
    }
}

async fn serve_stream(ctx: Arc<ConnCtx>, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    let mut decoder = FrameDecoder::new(ctx.options.limits, ctx.options.capabilities);
    loop {
        while let Some(item) = decoder.poll_frame() {
            let answers = match item {
                Ok(frame) => {
                    ctx.state.lock().flags_seen |= frame.flags().0;
                    let acked_publish = matches!(&frame, Frame::Publish(p) if p.ack.is_some());
                    let answers = handle_frame(&ctx, frame).await;
                    if let (Some(d), true) = (ctx.options.ack_delay, acked_publish) {
                        tokio::time::sleep(d).await;
                    }
                    answers
                }
                Err(e) => {
                    if let felix_proto::DecodeError::FlagNotAdvertised { flags, .. } = e.error {
                        let mut o = ctx.state.lock();
                        o.flags_seen |= flags;
                        o.violations.push(format!("unadvertised flags {flags:#06x}"));
                    }
                    let body = ErrorBody {
                        request_id: e.request_id.unwrap_or_default(),
                        code: e.code(),
                        message: e.to_string(),
                    };
                    if e.fatal {
                        let _ = send.write_all(&Frame::Error(body).to_bytes()).await;
                        return;
                    }
                    vec![Frame::Error(body)]
                }
            };
            if ctx.state.frozen.load(Ordering::Relaxed) {
                continue;
            }
            for a in answers {
                if send.write_all(&a.to_bytes()).await.is_err() {
                    return;
                }
            }
        }
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(chunk)) => decoder.handle_chunk(chunk.bytes),
            _ => return,
        }
    }
}

fn error(request_id: RequestId, code: ErrorCode, message: &str) -> Frame {
    Frame::Error(ErrorBody { request_id, code, message: message.to_owned() })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn handle_frame(ctx: &Arc<ConnCtx>, frame: Frame) -> Vec<Frame> {
    let caps = ctx.options.capabilities;
    let core = *ctx.core.lock().unwrap();
    let Some(core) = core else {
        return match frame {
            Frame::Hello(h) => {
                {
                    let mut o = ctx.state.lock();
                    o.hellos += 1;
                    o.tokens.push(h.token.clone());
                    o.hello_from.push(ctx.conn.remote_address());
                }
                if h.version != PROTOCOL_VERSION {
                    return vec![error(RequestId(0), ErrorCode::UnsupportedVersion, "version")];
                }
                if let Some(t) = &ctx.options.token {
                    if h.token.as_deref() != Some(t.as_bytes()) {
                        return vec![error(RequestId(0), ErrorCode::InvalidToken, "bad token")];
                    }
                }
                *ctx.client_caps.lock().unwrap() = h.capabilities;
                if let Some(d) = ctx.options.hello_delay {
                    tokio::time::sleep(d).await;
                }
                let seq = &ctx.options.core_sequence;
                let n = ctx.state.next_core.fetch_add(1, Ordering::Relaxed);
                let core = seq[n % seq.len()];
                *ctx.core.lock().unwrap() = Some(core);
                vec![Frame::HelloOk(HelloOk {
                    version: PROTOCOL_VERSION,
                    capabilities: caps,
                    limits: ctx.options.limits,
                    core: CoreId(core),
                    core_count: ctx.options.core_count,
                })]
            }
            _ => vec![error(RequestId(0), ErrorCode::Unauthenticated, "no Hello yet")],
        };
    };
    match frame {
        Frame::CreateStream(c) => {
            if StreamName::parse(&c.stream).is_err() {
                return vec![error(c.request_id, ErrorCode::InvalidStreamName, "bad name")];
            }
            if c.shards == 0 || c.shards > 4096 {
                return vec![error(c.request_id, ErrorCode::InvalidArgument, "shards")];
            }
            let mut o = ctx.state.lock();
            let entry = o.streams.entry(c.stream.clone()).or_insert_with(|| StreamData {
                shards: vec![Vec::new(); c.shards as usize],
                retention: c.retention,
            });
            if entry.shards.len() != c.shards as usize {
                return vec![error(c.request_id, ErrorCode::StreamExists, "other settings")];
            }
            vec![Frame::StreamInfo(StreamInfo {
                request_id: c.request_id,
                stream: c.stream,
                shards: c.shards,
                retention: entry.retention,
            })]
        }
        Frame::DescribeStream(d) => match ctx.state.lock().streams.get(&d.stream) {
            Some(s) => vec![Frame::StreamInfo(StreamInfo {
                request_id: d.request_id,
                stream: d.stream,
                shards: s.shards.len() as u32,
                retention: s.retention,
            })],
            None => vec![error(d.request_id, ErrorCode::StreamNotFound, "no such stream")],
        },
        Frame::ListStreams(l) => {
            let o = ctx.state.lock();
            let streams = o.streams.keys().filter(|k| k.starts_with(&l.prefix)).cloned().collect();
            vec![Frame::StreamList(StreamList { request_id: l.request_id, streams })]
        }
        Frame::Publish(p) => {
            let request_id = p.ack.map(|a| a.request_id).unwrap_or_default();
            let mut o = ctx.state.lock();
            o.publishes += 1;
            o.batch_sizes.push(p.records.len());
            o.publish_cores.push((p.key.clone(), core));
            if let Some(a) = p.ack {
                o.ack_modes.push(a.mode);
            }
            let Some(stream) = o.streams.get_mut(&p.stream) else {
                return vec![if p.ack.is_some() {
                    Frame::PublishError(ErrorBody {
                        request_id,
                        code: ErrorCode::StreamNotFound,
                        message: "no such stream".into(),
                    })
                } else {
                    error(RequestId(0), ErrorCode::StreamNotFound, "no such stream")
                }];
            };
            let n = stream.shards.len() as u32;
            drop(o);
            if ctx.state.stopping.load(Ordering::Relaxed) {
                let request_id = p.ack.map(|a| a.request_id).unwrap_or_default();
                let code = ErrorCode::ShuttingDown;
                let body = ErrorBody { request_id, code, message: "stopping".into() };
                return vec![Frame::PublishError(body)];
            }
            let shard = match cluster::check_publish(ctx, &p, n, core) {
                Ok(shard) => shard,
                Err(answers) => return answers,
            };
            let mut o = ctx.state.lock();
            let Some(stream) = o.streams.get_mut(&p.stream) else { return vec![] };
            let log = &mut stream.shards[shard.0 as usize];
            let base = log.len() as u64;
            let ts = now_ms();
            for v in &p.records {
                log.push(Stored { timestamp_ms: ts, key: p.key.clone(), value: v.to_bytes() });
            }
            drop(o);
            ctx.state.bump();
            match p.ack {
                Some(a) if !ctx.options.swallow_acks => vec![Frame::PublishAck(PublishAck {
                    request_id: a.request_id,
                    shard,
                    base_offset: Offset(base),
                    count: p.records.len() as u32,
                })],
                _ => vec![],
            }
        }
        Frame::Subscribe(s) => {
            if s.group.is_some() && !caps.contains(Capabilities::CONSUMER_GROUPS) {
                ctx.state.lock().violations.push("Subscribe with a group".into());
                return vec![error(s.request_id, ErrorCode::InvalidArgument, "no groups")];
            }
            if let Err(answers) = cluster::check_subscribe(ctx, &s) {
                return answers;
            }
            let o = ctx.state.lock();
            let Some(stream) = o.streams.get(&s.stream) else {
                return vec![error(s.request_id, ErrorCode::StreamNotFound, "no such stream")];
            };
            let n = stream.shards.len() as u32;
            let shards: Vec<ShardId> =
                s.shards.clone().unwrap_or_else(|| (0..n).map(ShardId).collect());
            if shards.iter().any(|sh| sh.0 >= n) {
                return vec![error(s.request_id, ErrorCode::InvalidShard, "no such shard")];
            }
            let mut positions = BTreeMap::new();
            drop(o);
            ctx.state.lock().subscribes.push(s.shards.clone());
            // A resume's positions (flag POSITIONS) replace the start and the group's commits.
            let asked: BTreeMap<ShardId, u64> = match (&s.shards, &s.positions) {
                (Some(list), Some(at)) => {
                    list.iter().copied().zip(at.iter().map(|o| o.0)).collect()
                }
                _ => BTreeMap::new(),
            };
            let o = ctx.state.lock();
            let Some(stream) = o.streams.get(&s.stream) else { return vec![] };
            for sh in &shards {
                let log = &stream.shards[sh.0 as usize];
                if let Some(at) = asked.get(sh) {
                    positions.insert(*sh, (*at).min(log.len() as u64));
                    continue;
                }
                let committed = s
                    .group
                    .as_ref()
                    .and_then(|g| o.commits.get(&(s.stream.clone(), g.clone(), sh.0)).copied());
                let pos = committed.unwrap_or(match s.start {
                    StartAt::Earliest => 0,
                    StartAt::Latest => log.len() as u64,
                    StartAt::Offset(off) => off.0,
                    StartAt::Timestamp(t) => {
                        log.iter().position(|r| r.timestamp_ms >= t).unwrap_or(log.len()) as u64
                    }
                });
                positions.insert(*sh, pos);
            }
            drop(o);
            // Where each shard starts, to a client that asked for positions in its Hello.
            let tell = caps.contains(Capabilities::SUBSCRIBE_POSITIONS)
                && ctx.client_caps.lock().unwrap().contains(Capabilities::SUBSCRIBE_POSITIONS);
            let starts = tell.then(|| shards.iter().map(|sh| Offset(positions[sh])).collect());
            let id = SubscriptionId(ctx.state.next_subscription.fetch_add(1, Ordering::Relaxed));
            tokio::spawn(push_subscription(ctx.clone(), id, s.stream.clone(), positions));
            vec![Frame::SubscribeOk(SubscribeOk {
                request_id: s.request_id,
                subscription_id: id,
                shards,
                positions: starts,
            })]
        }
        Frame::CommitOffset(c) => {
            if !caps.contains(Capabilities::CONSUMER_GROUPS) {
                ctx.state.lock().violations.push("CommitOffset".into());
                return vec![error(c.request_id, ErrorCode::InvalidArgument, "no groups")];
            }
            if let Err(answers) = cluster::check_commit(ctx, &c) {
                return answers;
            }
            ctx.state.lock().commits.insert((c.stream, c.group, c.shard.0), c.offset.0);
            vec![Frame::CommitOk(c.request_id)]
        }
        Frame::Metadata(m) => cluster::metadata(ctx, m),
        Frame::Ping(n) => vec![Frame::Pong(n)],
        Frame::Hello(_) => vec![error(RequestId(0), ErrorCode::InvalidArgument, "second Hello")],
        other => vec![error(RequestId(0), ErrorCode::InvalidArgument, &format!("{other:?}"))],
    }
}

async fn push_subscription(
    ctx: Arc<ConnCtx>,
    id: SubscriptionId,
    stream: String,
    mut positions: BTreeMap<ShardId, u64>,
) {
    let Ok(mut send) = ctx.conn.open_uni().await else { return };
    if send.write_all(&Frame::SubscriptionStart(id).to_bytes()).await.is_err() {
        return;
    }
    let mut changed = ctx.state.changed.subscribe();
    let mut reset = ctx.state.reset_subscriptions.subscribe();
    let batch_max = ctx.options.limits.max_batch_records as usize;
    loop {
        let mut out = BytesMut::new();
        {
            let o = ctx.state.lock();
            let Some(data) = o.streams.get(&stream) else { return };
            for (shard, pos) in positions.iter_mut() {
                let log = &data.shards[shard.0 as usize];
                while (*pos as usize) < log.len() {
                    let from = *pos as usize;
                    let to = log.len().min(from + batch_max);
                    let slice = &log[from..to];
                    let batch = EventBatch {
                        shard: *shard,
                        base_offset: Offset(*pos),
                        timestamp_ms: slice[0].timestamp_ms,
                        records: slice
                            .iter()
                            .map(|r| Record { key: r.key.clone(), value: r.value.clone().into() })
                            .collect(),
                    };
                    encode_event_batch(&batch, &mut out);
                    *pos = to as u64;
                }
            }
        }
        if !out.is_empty() && send.write_all(&out).await.is_err() {
            return;
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = ctx.conn.closed() => return,
            _ = reset.changed() => {
                if let Some(code) = *reset.borrow() {
                    let _ = send.reset(code.into());
                    return;
                }
            }
        }
    }
}

/// Waits (bounded) until `cond` holds on the broker's observations; panics when it never does.
pub async fn wait_until(state: &State, what: &str, cond: impl Fn(&Observed) -> bool) {
    for _ in 0..400 {
        if cond(&state.lock()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}

impl TestBroker {
    /// A raw connection that has sent Hello and read HelloOk: lets a test write any bytes, to
    /// check that the harness itself notices what it must notice.
    pub async fn raw_session(&self) -> (quinn::Endpoint, quinn::SendStream, quinn::RecvStream) {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let conn = endpoint
            .connect_with(quinn::ClientConfig::new(Arc::new(crypto)), self.addr, "localhost")
            .unwrap()
            .await
            .unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let hello = Frame::Hello(felix_proto::Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::ALL,
            token: None,
        });
        send.write_all(&hello.to_bytes()).await.unwrap();
        let mut head = [0u8; felix_proto::HEADER_LEN];
        recv.read_exact(&mut head).await.unwrap();
        let mut body = vec![0u8; u32::from_be_bytes([head[6], head[7], head[8], head[9]]) as usize];
        recv.read_exact(&mut body).await.unwrap();
        assert_eq!(head[3], 0x02, "HelloOk");
        (endpoint, send, recv)
    }
}
