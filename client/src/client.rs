//! The client: a pool of connections spread over the broker's cores, reconnect with backoff, and
//! the stream administration requests.
//!
//! Call order: [`Client::connect`], then any of the requests, [`Client::publisher`] and
//! [`Client::subscribe`], then [`Client::close`] (or drop).
//!
//! Pool: the client opens `connections` connections (default: the broker's `core_count` from
//! the first HelloOk, at most [`CONNECTIONS_MAX`]), each on its own endpoint. The broker assigns
//! a connection's owning core by the kernel's hash of the 4-tuple, so with `cover_cores` the
//! client replaces connections that landed on an already covered core with fresh ones, for at
//! most [`COVER_ATTEMPTS_PER_CONNECTION`] x `connections` extra handshakes; whatever is reached
//! then is reported by [`Client::cores_reached`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{
    Capabilities, CoreId, CreateStream, DescribeStream, Frame, FrameType, Limits, ListStreams,
    Retention, StreamName,
};

use crate::config::{ClientConfig, PublishSettings, CONNECTIONS_MAX};
use crate::conn::{unexpected, Conn, ConnParams};
use crate::error::ClientError;
use crate::publisher::Publisher;
use crate::subscriber::{SubscribeOptions, Subscriber};
use crate::tls;

/// Extra handshakes per connection spent on reaching uncovered cores.
pub const COVER_ATTEMPTS_PER_CONNECTION: usize = 4;
/// Marks a slot whose connection's core is not known.
const CORE_UNKNOWN: u32 = u32::MAX;

/// A connected client. Cheap to clone; all clones share the connections.
#[derive(Clone)]
pub struct Client {
    pub(crate) shared: Arc<Shared>,
}

/// A stream's settings, as the broker reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamDescription {
    /// `tenant/namespace/stream`.
    pub name: String,
    /// Shard count.
    pub shards: u32,
    /// Retention (`None` fields are unlimited).
    pub retention: Retention,
}

pub(crate) struct Shared {
    pub(crate) config: ClientConfig,
    params: ConnParams,
    pub(crate) slots: Vec<Slot>,
    first_hello: felix_proto::HelloOk,
    next_subscription_slot: AtomicUsize,
    /// Set by [`Client::close`]: no reconnect after it.
    closed: AtomicBool,
}

/// One position of the pool: the current connection and the gate that serialises reconnects.
pub(crate) struct Slot {
    current: RwLock<Option<Arc<Conn>>>,
    reconnect: tokio::sync::Mutex<()>,
    core: AtomicU32,
}

impl Client {
    /// Connects to the broker and opens the connection pool.
    pub async fn connect(config: ClientConfig) -> Result<Self, ClientError> {
        config.validate()?;
        let addr = resolve(&config.addr).await?;
        let trust = config.trust.as_ref().ok_or(crate::error::ConfigError::NoTrust)?;
        let tls = tls::client_config(trust, config.idle_timeout(), config.max_udp_payload)?;
        let params = ConnParams {
            addr,
            server_name: config.server_name.clone(),
            quic: tls.quic,
            rejection: tls.rejection,
            token: config.token.clone().map(Bytes::from),
            connect_timeout: config.connect_timeout(),
            ack_timeout: config.ack_timeout(),
        };
        let first = Conn::open(&params).await?;
        let first_hello = first.hello().clone();
        let core_count = usize::from(first_hello.core_count.max(1));
        let target = config.connections.unwrap_or(core_count).clamp(1, CONNECTIONS_MAX);
        let mut conns = vec![first];
        let mut opening = tokio::task::JoinSet::new();
        for _ in 1..target {
            let p = params.clone_for_task();
            opening.spawn(async move { Conn::open(&p).await });
        }
        while let Some(joined) = opening.join_next().await {
            match joined {
                Ok(Ok(c)) => conns.push(c),
                Ok(Err(e)) => return Err(close_all(&conns, e)),
                Err(e) => return Err(close_all(&conns, ClientError::Connect(e.to_string()))),
            }
        }
        if config.cover_cores {
            cover_cores(&params, &mut conns, core_count).await;
        }
        let slots = conns
            .into_iter()
            .map(|c| Slot {
                core: AtomicU32::new(u32::from(c.hello().core.0)),
                current: RwLock::new(Some(c)),
                reconnect: tokio::sync::Mutex::new(()),
            })
            .collect();
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                params,
                slots,
                first_hello,
                next_subscription_slot: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The configuration the client runs with.
    pub fn config(&self) -> &ClientConfig {
        &self.shared.config
    }

    /// The capabilities the broker advertised (first HelloOk), as far as this client uses them.
    pub fn capabilities(&self) -> Capabilities {
        self.shared.first_hello.capabilities.intersect(crate::conn::CLIENT_CAPABILITIES)
    }

    /// The broker's limits (first HelloOk).
    pub fn limits(&self) -> Limits {
        self.shared.first_hello.limits
    }

    /// The broker's core count (first HelloOk).
    pub fn core_count(&self) -> u16 {
        self.shared.first_hello.core_count
    }

    /// How many connections the pool holds.
    pub fn connection_count(&self) -> usize {
        self.shared.slots.len()
    }

    /// The distinct broker cores the pool's connections are owned by, sorted.
    pub fn cores_reached(&self) -> Vec<CoreId> {
        let mut cores: Vec<CoreId> = self
            .shared
            .slots
            .iter()
            .filter_map(|s| u16::try_from(s.core.load(Ordering::Relaxed)).ok())
            .map(CoreId)
            .collect();
        cores.sort();
        cores.dedup();
        cores
    }

    /// Creates `name` with `shards` shards (answers the existing settings if it exists alike).
    pub async fn create_stream(
        &self,
        name: &str,
        shards: u32,
        retention: Retention,
    ) -> Result<StreamDescription, ClientError> {
        check_stream_name(name)?;
        let answer = self
            .shared
            .request(0, false, |id| {
                Frame::CreateStream(CreateStream {
                    request_id: id,
                    stream: name.to_owned(),
                    shards,
                    retention,
                })
            })
            .await?;
        stream_info(answer)
    }

    /// Describes `name`.
    pub async fn describe_stream(&self, name: &str) -> Result<StreamDescription, ClientError> {
        check_stream_name(name)?;
        let answer = self
            .shared
            .request(0, true, |id| {
                Frame::DescribeStream(DescribeStream { request_id: id, stream: name.to_owned() })
            })
            .await?;
        stream_info(answer)
    }

    /// The names of the streams starting with `prefix` (empty: all).
    pub async fn list_streams(&self, prefix: &str) -> Result<Vec<String>, ClientError> {
        if prefix.len() > felix_proto::limits::MAX_STREAM_NAME_BYTES {
            return Err(ClientError::InvalidName(format!("prefix of {} bytes", prefix.len())));
        }
        let answer = self
            .shared
            .request(0, true, |id| {
                Frame::ListStreams(ListStreams { request_id: id, prefix: prefix.to_owned() })
            })
            .await?;
        match answer {
            Frame::StreamList(l) => Ok(l.streams),
            other => Err(unexpected(&other, FrameType::StreamList)),
        }
    }

    /// A publisher for `stream` with the configuration's publish settings.
    pub async fn publisher(&self, stream: &str) -> Result<Publisher, ClientError> {
        self.publisher_with(stream, self.shared.config.publish.clone()).await
    }

    /// A publisher for `stream` with `settings`.
    pub async fn publisher_with(
        &self,
        stream: &str,
        settings: PublishSettings,
    ) -> Result<Publisher, ClientError> {
        check_stream_name(stream)?;
        Publisher::start(self.clone(), stream.to_owned(), settings).await
    }

    /// Starts a subscription. Subscriptions are spread round-robin over the pool.
    pub async fn subscribe(&self, options: SubscribeOptions) -> Result<Subscriber, ClientError> {
        check_stream_name(&options.stream)?;
        if let Some(g) = &options.group {
            if g.is_empty() || g.len() > felix_proto::limits::MAX_GROUP_NAME_BYTES {
                return Err(ClientError::InvalidName(format!("group {g:?}")));
            }
        }
        if let Some(shards) = &options.shards {
            let max = felix_proto::limits::MAX_SUBSCRIBE_SHARDS;
            if shards.is_empty() || shards.len() > max {
                return Err(ClientError::InvalidArgument(format!(
                    "{} shards named; 1..={max} allowed (None reads all)",
                    shards.len()
                )));
            }
        }
        Subscriber::start(self.clone(), self.shared.next_slot(), options).await
    }

    /// Closes every connection. Operations in flight fail with `ConnectionLost`, later ones
    /// with `Closed` (no reconnect). Dropping every clone of the client, its publishers and
    /// subscribers closes the connections too.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        for slot in &self.shared.slots {
            if let Some(c) = slot.get_current() {
                c.close();
            }
        }
    }
}

impl Shared {
    /// The connection of slot `index`, reconnecting with backoff if it is closed.
    pub(crate) async fn conn(&self, index: usize) -> Result<Arc<Conn>, ClientError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(ClientError::Closed);
        }
        let slot = &self.slots[index % self.slots.len()];
        if let Some(c) = slot.get_current().filter(|c| !c.is_closed()) {
            return Ok(c);
        }
        let _gate = slot.reconnect.lock().await;
        if let Some(c) = slot.get_current().filter(|c| !c.is_closed()) {
            return Ok(c);
        }
        let c = reconnect(&self.params, &self.config).await?;
        slot.core.store(u32::from(c.hello().core.0), Ordering::Relaxed);
        *slot.current.write().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// The slot for the next subscription (round-robin).
    pub(crate) fn next_slot(&self) -> usize {
        self.next_subscription_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len()
    }

    /// The core of slot `index`'s connection, when known.
    pub(crate) fn slot_core(&self, index: usize) -> Option<u16> {
        let core = self.slots[index].core.load(Ordering::Relaxed);
        (core != CORE_UNKNOWN).then_some(core as u16)
    }

    /// Sends the frame `build` makes on slot `index`'s control lane and waits for the answer.
    /// `idempotent` requests are sent once more, on a fresh connection, if the first one was
    /// lost with its connection.
    async fn request(
        &self,
        index: usize,
        idempotent: bool,
        build: impl Fn(felix_proto::RequestId) -> Frame,
    ) -> Result<Frame, ClientError> {
        let conn = self.conn(index).await?;
        let id = conn.next_request_id();
        match conn.request(id, &build(id)).await {
            Err(e) if idempotent && e.is_connection_lost() => {
                let conn = self.conn(index).await?;
                let id = conn.next_request_id();
                conn.request(id, &build(id)).await
            }
            other => other,
        }
    }
}

impl Slot {
    fn get_current(&self) -> Option<Arc<Conn>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ConnParams {
    fn clone_for_task(&self) -> ConnParams {
        ConnParams {
            addr: self.addr,
            server_name: self.server_name.clone(),
            quic: self.quic.clone(),
            rejection: self.rejection.clone(),
            token: self.token.clone(),
            connect_timeout: self.connect_timeout,
            ack_timeout: self.ack_timeout,
        }
    }
}

/// Opens a connection, retrying with exponential backoff. Refusals that a retry cannot fix
/// (certificate, token, version) are returned at once.
async fn reconnect(p: &ConnParams, config: &ClientConfig) -> Result<Arc<Conn>, ClientError> {
    let attempts = config.reconnect_attempts_max.max(1);
    let mut delay = Duration::from_millis(config.reconnect_backoff_min_ms);
    let delay_max = Duration::from_millis(config.reconnect_backoff_max_ms);
    let mut last = ClientError::Connect("no attempt".into());
    for attempt in 1..=attempts {
        match Conn::open(p).await {
            Ok(c) => {
                tracing::info!(attempt, core = c.hello().core.0, "reconnected");
                return Ok(c);
            }
            Err(e @ (ClientError::CertificateRejected(_) | ClientError::Refused { .. })) => {
                return Err(e)
            }
            Err(e) => {
                tracing::warn!(attempt, error = %e, delay_ms = delay.as_millis() as u64, "reconnect failed");
                last = e;
            }
        }
        if attempt < attempts {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(delay_max);
        }
    }
    Err(last)
}

/// Replaces connections on duplicated cores with fresh ones until every core the pool can cover
/// is covered or the bounded attempts are spent.
async fn cover_cores(p: &ConnParams, conns: &mut [Arc<Conn>], core_count: usize) {
    let wanted = core_count.min(conns.len());
    let attempts_max = COVER_ATTEMPTS_PER_CONNECTION * conns.len();
    for _ in 0..attempts_max {
        let mut covered: Vec<u16> = conns.iter().map(|c| c.hello().core.0).collect();
        covered.sort_unstable();
        covered.dedup();
        if covered.len() >= wanted {
            return;
        }
        let Ok(fresh) = Conn::open(p).await else { return };
        let core = fresh.hello().core.0;
        if covered.contains(&core) {
            fresh.close();
            continue;
        }
        // Replace one connection whose core another connection also holds.
        let duplicate = (0..conns.len()).find(|&i| {
            let c = conns[i].hello().core.0;
            conns.iter().enumerate().any(|(j, o)| j != i && o.hello().core.0 == c)
        });
        match duplicate {
            Some(i) => {
                conns[i].close();
                conns[i] = fresh;
            }
            None => fresh.close(),
        }
    }
}

fn close_all(conns: &[Arc<Conn>], e: ClientError) -> ClientError {
    for c in conns {
        c.close();
    }
    e
}

async fn resolve(addr: &str) -> Result<SocketAddr, ClientError> {
    let err = |reason: String| ClientError::Resolve { addr: addr.to_owned(), reason };
    let mut addrs = tokio::net::lookup_host(addr).await.map_err(|e| err(e.to_string()))?;
    addrs.next().ok_or_else(|| err("no address".into()))
}

pub(crate) fn check_stream_name(name: &str) -> Result<(), ClientError> {
    StreamName::parse(name).map(|_| ()).map_err(|e| ClientError::InvalidName(e.to_string()))
}

fn stream_info(answer: Frame) -> Result<StreamDescription, ClientError> {
    match answer {
        Frame::StreamInfo(s) => {
            Ok(StreamDescription { name: s.stream, shards: s.shards, retention: s.retention })
        }
        other => Err(unexpected(&other, FrameType::StreamInfo)),
    }
}
