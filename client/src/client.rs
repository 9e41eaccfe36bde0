//! The client: one connection pool to the broker (or, in a cluster, one per broker),
//! reconnect with backoff, and the stream administration requests.
//!
//! Call order: [`Client::connect`], then any of the requests, [`Client::publisher`] and
//! [`Client::subscribe`], then [`Client::close`] (or drop).
//!
//! `connect` tries the seed addresses of `addr` (in order, each a moment after the one before
//! unless that one failed sooner: [`SEED_STAGGER_MS`]) and keeps the first broker that
//! answers as the home broker, whose pool (`crate::pool`) carries the administration requests.
//! When that broker advertises `CLUSTER`, the client routes by placement (`crate::cluster`):
//! each keyed batch, subscription part and commit goes to its shard's owner, through a pool
//! per broker opened on first use.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{
    Capabilities, CoreId, CreateStream, DescribeStream, Frame, FrameType, Limits, ListStreams,
    Retention, ShardOwner, StreamName,
};

use crate::cluster::Cluster;
use crate::config::{ClientConfig, PublishSettings};
use crate::conn::{unexpected, Conn, ConnParams};
use crate::error::ClientError;
use crate::pool::{is_permanent, resolve, Pool};
use crate::publisher::Publisher;
use crate::race::first_decisive;
use crate::subscriber::{SubscribeOptions, Subscriber};
use crate::tls;

pub use crate::pool::COVER_ATTEMPTS_PER_CONNECTION;

/// With several seeds, how long `connect` waits on the seeds tried so far before it tries the
/// next one as well, in milliseconds (RFC 8305's connection attempt delay): a live first seed
/// still wins, a dead one costs this much.
pub const SEED_STAGGER_MS: u64 = 250;

/// A connected client. Cheap to clone; all clones share the connections.
#[derive(Clone)]
pub struct Client {
    pub(crate) shared: Arc<Shared>,
}

/// QUIC's path statistics of a client's connections, summed ([`Client::quic_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicStats {
    /// Packets sent.
    pub packets_sent: u64,
    /// Packets QUIC's loss detection declared lost.
    pub packets_lost: u64,
    /// Bytes of the lost packets.
    pub bytes_lost: u64,
    /// Congestion events (a loss or an ECN mark that made a connection slow down).
    pub congestion_events: u64,
    /// Times path MTU discovery took losses for a black hole and fell back to 1200 bytes.
    pub black_holes: u64,
    /// The smallest current path MTU (UDP payload bytes) of the connections; 0 with none.
    pub mtu_min: u16,
    /// STREAM_DATA_BLOCKED and DATA_BLOCKED frames sent: how often a connection had data to
    /// send that the broker's flow control did not yet allow (the broker had not read enough
    /// of a stream, or of the connection, to open more window).
    pub flow_control_blocked: u64,
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
    /// The pool of the broker the client connected to first.
    pub(crate) home: Arc<Pool>,
    /// Set when the home broker advertised `CLUSTER`.
    pub(crate) cluster: Option<Arc<Cluster>>,
    /// Set by [`Client::close`]: no reconnect after it (shared by every pool).
    closed: Arc<AtomicBool>,
}

impl Client {
    /// Connects to the first seed broker of `addr` that answers and opens its connection
    /// pool. When that broker is in a cluster (it advertised `CLUSTER`), the pools of the
    /// other brokers are opened when first needed.
    pub async fn connect(config: ClientConfig) -> Result<Self, ClientError> {
        config.validate()?;
        let trust = config.trust.as_ref().ok_or(crate::error::ConfigError::NoTrust)?;
        let tls = tls::client_config(
            trust,
            config.idle_timeout(),
            config.max_udp_payload,
            config.send_in_write_order,
        )?;
        let mut template = ConnParams {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            server_name: config.server_name.clone(),
            quic: tls.quic,
            rejection: tls.rejection,
            token: config.token.clone().map(Bytes::from),
            connect_timeout: config.connect_timeout(),
            ack_timeout: config.ack_timeout(),
            max_udp_payload: config.max_udp_payload,
        };
        let closed = Arc::new(AtomicBool::new(false));
        let attempt = config.connect_attempt_timeout();
        let (name, mut params, first) = connect_seed(&template, &config.seeds(), attempt).await?;
        let in_cluster = first.hello().capabilities.contains(Capabilities::CLUSTER);
        if in_cluster {
            // Other brokers can answer: a connection attempt to one of them is short.
            template.connect_timeout = attempt;
        }
        params.connect_timeout = template.connect_timeout;
        let home = Pool::with_first(name, params, first, &config, closed.clone()).await?;
        let cluster = in_cluster.then(|| {
            Arc::new(Cluster::new(config.clone(), template, closed.clone(), home.clone()))
        });
        Ok(Self { shared: Arc::new(Shared { config, home, cluster, closed }) })
    }

    /// The configuration the client runs with.
    pub fn config(&self) -> &ClientConfig {
        &self.shared.config
    }

    /// The capabilities the broker advertised (first HelloOk), as far as this client uses them.
    pub fn capabilities(&self) -> Capabilities {
        self.shared.home.hello().capabilities.intersect(crate::conn::CLIENT_CAPABILITIES)
    }

    /// The broker's limits (first HelloOk).
    pub fn limits(&self) -> Limits {
        self.shared.home.hello().limits
    }

    /// The broker's core count (first HelloOk).
    pub fn core_count(&self) -> u16 {
        self.shared.home.hello().core_count
    }

    /// How many connections the pool of the home broker (the first seed that answered) holds.
    pub fn connection_count(&self) -> usize {
        self.shared.home.len()
    }

    /// QUIC's statistics of the home broker's connections, summed: packets sent, packets
    /// declared lost (datagrams the network or the broker's socket dropped; QUIC sends their
    /// data again and slows down), their bytes, congestion events, and the times a connection
    /// was held back by the broker's flow control. A connection that was replaced (reconnect)
    /// leaves the sum with it.
    pub fn quic_stats(&self) -> QuicStats {
        let mut s = QuicStats::default();
        for conn in self.shared.home.current_conns() {
            let stats = conn.stats();
            let path = stats.path;
            s.flow_control_blocked +=
                stats.frame_tx.stream_data_blocked + stats.frame_tx.data_blocked;
            s.packets_sent += path.sent_packets;
            s.packets_lost += path.lost_packets;
            s.bytes_lost += path.lost_bytes;
            s.congestion_events += path.congestion_events;
            s.black_holes += path.black_holes_detected;
            s.mtu_min = match s.mtu_min {
                0 => path.current_mtu,
                m => m.min(path.current_mtu),
            };
        }
        s
    }

    /// The distinct cores of the home broker that the pool's connections are owned by, sorted.
    pub fn cores_reached(&self) -> Vec<CoreId> {
        let pool = &self.shared.home;
        let mut cores: Vec<CoreId> =
            (0..pool.len()).filter_map(|i| pool.slot_core(i)).map(CoreId).collect();
        cores.sort();
        cores.dedup();
        cores
    }

    /// Whether the broker is part of a cluster (it advertised `CLUSTER`): requests are then
    /// routed to each shard's owner.
    pub fn is_cluster(&self) -> bool {
        self.shared.cluster.is_some()
    }

    /// The brokers the client holds a connection pool to, as `host:port`: the home broker
    /// first, then those of a cluster opened so far.
    pub fn brokers(&self) -> Vec<String> {
        match &self.shared.cluster {
            Some(c) => c.pools().iter().map(|p| p.name().to_owned()).collect(),
            None => vec![self.shared.home.name().to_owned()],
        }
    }

    /// In a cluster: where each shard of `stream` lives (`owners[s]` owns shard `s`), fetched
    /// from a broker now. `Unsupported` from a single-node broker.
    pub async fn placement(&self, stream: &str) -> Result<Vec<ShardOwner>, ClientError> {
        check_stream_name(stream)?;
        let Some(cluster) = &self.shared.cluster else {
            return Err(ClientError::Unsupported("cluster metadata"));
        };
        let p = cluster.refresh(stream, std::time::Instant::now()).await?;
        Ok(p.owners.clone())
    }

    /// Creates `name` with `shards` shards (answers the existing settings if it exists alike).
    pub async fn create_stream(
        &self,
        name: &str,
        shards: u32,
        retention: Retention,
    ) -> Result<StreamDescription, ClientError> {
        self.create_stream_with(name, shards, retention, None).await
    }

    /// [`Client::create_stream`] with a replication factor (1..=5): in a cluster, each shard is
    /// kept on `replicas` brokers (docs/replication.md); `None` leaves it to the broker
    /// (`--default-replicas`). A single-node broker takes only `Some(1)`; more is
    /// `Unsupported`.
    pub async fn create_stream_with(
        &self,
        name: &str,
        shards: u32,
        retention: Retention,
        replicas: Option<u8>,
    ) -> Result<StreamDescription, ClientError> {
        check_stream_name(name)?;
        let replicas = match replicas {
            Some(n) if !self.capabilities().contains(Capabilities::CLUSTER) => {
                if n != 1 {
                    return Err(ClientError::Unsupported("replicated streams (a cluster only)"));
                }
                None
            }
            other => other,
        };
        let answer = self
            .shared
            .request(0, false, |id| {
                Frame::CreateStream(CreateStream {
                    request_id: id,
                    stream: name.to_owned(),
                    shards,
                    retention,
                    replicas,
                })
            })
            .await?;
        if let Some(c) = &self.shared.cluster {
            // What was cached of the name may be of a deleted stream.
            c.forget(name);
        }
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

    /// Deletes `name` and its records (on every broker of a cluster). Returns the settings it
    /// had. Its subscriptions end with [`felix_proto::ErrorCode::StreamNotFound`].
    pub async fn delete_stream(&self, name: &str) -> Result<StreamDescription, ClientError> {
        check_stream_name(name)?;
        // Not sent again after a lost connection: a second delete of a deleted stream would
        // answer StreamNotFound for a delete that happened.
        let answer = self
            .shared
            .request(0, false, |id| {
                Frame::DeleteStream(DescribeStream { request_id: id, stream: name.to_owned() })
            })
            .await;
        // A stream of that name made later may have other shards and owners.
        if let Some(c) = &self.shared.cluster {
            c.forget(name);
        }
        stream_info(answer?)
    }

    /// Changes `name`'s settings (what `changes` leaves `None` stays). Returns the settings in
    /// force.
    pub async fn alter_stream(
        &self,
        name: &str,
        changes: felix_proto::StreamChanges,
    ) -> Result<StreamDescription, ClientError> {
        check_stream_name(name)?;
        let answer = self
            .shared
            .request(0, true, |id| {
                Frame::AlterStream(felix_proto::AlterStream {
                    request_id: id,
                    stream: name.to_owned(),
                    changes,
                })
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
        Subscriber::start(self.clone(), options).await
    }

    /// Closes every connection. Operations in flight fail with `ConnectionLost`, later ones
    /// with `Closed` (no reconnect). Dropping every clone of the client, its publishers and
    /// subscribers closes the connections too.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.home.close();
        if let Some(c) = &self.shared.cluster {
            c.close();
        }
    }
}

impl Shared {
    /// The connection of the home pool's slot `index`, reconnecting with backoff if closed.
    pub(crate) async fn conn(&self, index: usize) -> Result<Arc<Conn>, ClientError> {
        self.home.conn(index).await
    }

    /// Sends the frame `build` makes on a control lane and waits for the answer: of the home
    /// pool's slot `index`, or in a cluster of any broker that can be reached (home first).
    /// `idempotent` requests are sent once more, on a fresh connection (or another broker),
    /// if the first one was lost with its connection.
    async fn request(
        &self,
        index: usize,
        idempotent: bool,
        build: impl Fn(felix_proto::RequestId) -> Frame,
    ) -> Result<Frame, ClientError> {
        let build = &build;
        if let Some(cluster) = &self.cluster {
            if self.closed.load(Ordering::Relaxed) {
                return Err(ClientError::Closed);
            }
            return cluster
                .anywhere(idempotent, |conn| async move {
                    let id = conn.next_request_id();
                    conn.request(id, &build(id)).await
                })
                .await;
        }
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

/// Opens the first connection to the first seed that answers. One seed: one attempt within
/// the connect timeout (`template.connect_timeout`). Several: rounds of attempts within the
/// connect timeout, each attempt bounded by `attempt` and the seeds raced in order
/// ([`SEED_STAGGER_MS`]), so a dead seed costs a moment, not a connect timeout. A refusal no
/// retry can fix (certificate, token, version) is returned at once; otherwise the last error.
async fn connect_seed(
    template: &ConnParams,
    seeds: &[String],
    attempt: Duration,
) -> Result<(String, ConnParams, Arc<Conn>), ClientError> {
    let open = |seed: &String, limit: Duration| {
        let seed = seed.clone();
        async move {
            let addr = resolve(&seed).await?;
            let params = ConnParams { addr, connect_timeout: limit, ..template.clone() };
            let conn = Conn::open(&params).await;
            if let Err(e) = &conn {
                tracing::warn!(seed, error = %e, "seed broker unreachable");
            }
            Ok::<_, ClientError>((seed, params, conn?))
        }
    };
    let mut last = ClientError::Connect("no seed address".into());
    if let [seed] = seeds {
        return open(seed, template.connect_timeout).await;
    }
    let deadline = tokio::time::Instant::now() + template.connect_timeout;
    let stagger = Duration::from_millis(SEED_STAGGER_MS);
    // Each round gives its attempts twice as long as the last: a broker that answers, but
    // slower than one attempt allows (a loaded host), is still reached before the deadline
    // instead of being given up on, and started again, every round.
    let mut limit = attempt;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() || seeds.is_empty() {
            return Err(last);
        }
        let attempts = seeds.iter().map(|s| open(s, limit.min(left))).collect();
        limit = (limit * 2).min(template.connect_timeout);
        let refusals = std::sync::atomic::AtomicUsize::new(0);
        let decisive = |r: &Result<_, ClientError>| {
            let refused = matches!(r, Err(ClientError::PortUnreachable { .. }));
            refusals.fetch_add(usize::from(refused), std::sync::atomic::Ordering::Relaxed);
            r.as_ref().err().is_none_or(is_permanent)
        };
        let outcome = tokio::time::timeout(left, first_decisive(attempts, stagger, decisive));
        match outcome.await {
            Ok(Ok(done)) => return done,
            // Every seed's port refused (nothing listens on any): no point in another round.
            Ok(Err(Some(Err(e))))
                if refusals.load(std::sync::atomic::Ordering::Relaxed) == seeds.len() =>
            {
                return Err(e)
            }
            Ok(Err(Some(Err(e)))) => last = e,
            Ok(Err(_)) => {}
            Err(_) => {
                let after_ms = template.connect_timeout.as_millis() as u64;
                return Err(ClientError::Timeout { what: "connect", after_ms });
            }
        }
        tokio::time::sleep(stagger.min(left)).await;
    }
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

/// `Client::connect` may be spawned (the CLI runs its commands as tasks): its future is `Send`,
/// checked at compile time.
#[allow(dead_code)]
fn connect_is_send(config: ClientConfig) -> impl Send {
    Client::connect(config)
}
