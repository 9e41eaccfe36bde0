//! The replication driver's glommio shell: runs `felix_replication`'s [`Driver`] (the
//! decisions, sans-IO) for the replicated shards that live on this core, and carries out what
//! it asks: peer links over QUIC, disk operations and reads through `felix-storage`, answers
//! to the waiting appends, the subscribers' tail, proposals to the cluster agent
//! (docs/replication.md, "The broker driver").
//!
//! Shard `s` lives on core `s % cores` of each of its brokers, so core i talks only to core i
//! of its peers: each core keeps one outbound link per peer broker ([`peer`]) and receives its
//! peers' frames on the connections they opened ([`ReplicationShell::handle_frame`]). Every
//! [`TICK_MS`] the host hands the driver what the cluster agent knows (the group record of
//! each shard, this broker's lease; [`Driver::handle_view`]). Nothing here blocks on etcd:
//! proposals go to the agent's thread and their outcome comes back in the view.

pub mod inbound;
pub mod payload;
pub mod peer;
pub mod shard;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use felix_cluster::{AgentClient, ClusterView};
use felix_proto::{CoreId, ErrorCode, Frame, Offset, ProducerTag, Record, ShardId};
use felix_replication::driver::Limits;
use felix_replication::{
    wire, AckMode, Action, AppendError, AppendId, AppendRequest, Driver, GroupView, LeaseId,
    Message, ProducerId, ProducerSeq, ReplicaConfig, ReplicaNumber, Retention, Seq, ShardKey,
    StopReason, Submitted, Time,
};
use felix_storage::StreamLog;

pub use self::peer::verify_peers;
use self::peer::PeerLink;
use self::shard::ShardShell;
use super::cluster::ClusterLink;
use super::error::WireError;
use super::stats::{self, AppStats, ReplicaStatus};

/// How often the host feeds the cluster view to the replicas and ticks them.
pub const TICK_MS: u64 = 10;
/// Taken off the lease's validity before the replicas see it: clocks of brokers and etcd may
/// drift apart a little over one TTL.
pub const LEASE_DRIFT_MARGIN_MS: u64 = 100;
/// Disk operations queued per replicated shard; the state machine bounds what it emits (its
/// waiting acks and the follower's unwritten bytes), so reaching this stops the replica.
pub const DISK_OPS_MAX: usize = 16_384;
/// How long after a replica failed to start it is tried again.
pub const REPLICA_RETRY_MS: u64 = 5_000;
/// Bytes per storage read when a replica recovers its log at start.
pub const RECOVERY_READ_BYTES: usize = 1 << 20;

/// Replication settings every core shares.
#[derive(Clone, Debug)]
pub struct ReplicationSettings {
    /// The certificates (PEM) other brokers' certificates are verified against.
    pub peer_ca: std::path::PathBuf,
    /// This broker's certificate and key: presented as its client certificate when it
    /// connects to another broker (mutual TLS; `crate::net::tls`).
    pub identity: crate::net::TlsSource,
    /// The name their certificates must carry.
    pub server_name: String,
    /// In-sync replicas a durable append needs (0: a majority of the replicas).
    pub min_insync: usize,
    /// Payload bytes of the newest committed batches each replica keeps in memory (for
    /// fetches and the subscribers' tail); older batches are archived and read back from
    /// storage when a fetch needs them (`--replica-resident-bytes`).
    pub resident_bytes: u64,
    /// How long and how many idempotent producers each replicated shard remembers
    /// (`--producer-expiry`, `--max-producers-per-shard`).
    pub producers: felix_replication::ProducerLimits,
    /// Leader balance (`--leader-balance`): leaderships go back to the preferred replicas.
    pub leader_balance: bool,
}

/// What the shell needs of its core, and nothing more: a replicated stream's stored log on
/// this core, and the subscribers' tail its committed batches feed. The core's `CoreApp`
/// provides it.
pub trait ShardStore {
    /// Opens `stream` on this core (it must exist): its log, and its tails.
    fn open_shard_log<'a>(&'a self, stream: &'a str) -> OpenShardLog<'a>;
}

/// What [`ShardStore::open_shard_log`] resolves to.
pub type OpenShardLog<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(StreamLog, Rc<dyn TailFeed>), String>> + 'a>,
>;

/// The subscribers' tail of a stream's shards on this core.
pub trait TailFeed {
    /// Hands the tail of `shard` a committed batch of `records` at `base`.
    fn feed(&self, shard: ShardId, base: Offset, timestamp_ms: u64, records: Vec<Record>);
}

/// The I/O side of each running replica, by stream and shard.
type Shells = HashMap<Rc<str>, HashMap<u32, Rc<ShardShell>>>;

/// One core's replication driver: the sans-IO [`Driver`] and what carries out its actions.
pub struct ReplicationShell {
    me: felix_cluster::NodeId,
    core: CoreId,
    cores: usize,
    base: Instant,
    ctx: crate::net::CoreContext,
    tls: quinn_proto::ClientConfig,
    server_name: String,
    resident_bytes: u64,
    producers: felix_replication::ProducerLimits,
    agent: AgentClient,
    link: Rc<ClusterLink>,
    driver: RefCell<Driver<felix_cluster::NodeId>>,
    /// The I/O side of each running replica, by stream and shard (looked up by `&str`).
    shells: RefCell<Shells>,
    /// The core's streams (to open a replica's log and feed its tail); set by [`ReplicationShell::run`].
    store: RefCell<Option<Weak<dyn ShardStore>>>,
    peers: RefCell<HashMap<felix_cluster::NodeId, Rc<PeerLink>>>,
    /// The second of the last status report (metrics, and a debug line per replica).
    last_report: std::cell::Cell<u64>,
    /// A retention pass's deletions are running (`retention_pass`).
    deleting: Rc<std::cell::Cell<bool>>,
    stats: Arc<AppStats>,
}

impl ReplicationShell {
    /// The driver of core `ctx.core()`.
    pub fn new(
        ctx: crate::net::CoreContext,
        cores: usize,
        settings: &ReplicationSettings,
        agent: AgentClient,
        link: Rc<ClusterLink>,
        stats: Arc<AppStats>,
    ) -> Result<Rc<ReplicationShell>, crate::net::tls::TlsError> {
        // Loaded again here (the network layer checked its own copy at start): checked again,
        // so the certificate presented is one the peers accept, even if the files changed.
        let identity = crate::net::tls::ServerIdentity::load(&settings.identity)?;
        crate::net::tls::check_peer_identity(&identity, &settings.peer_ca)?;
        if let Some(leaf) = identity.certs.first() {
            crate::net::tls::certificate_names(leaf, &settings.server_name)
                .map_err(crate::net::tls::TlsError::PeerIdentity)?;
        }
        let mut tls = crate::net::tls::quic_client_config(&settings.peer_ca, Some(&identity))?;
        tls.transport_config(Arc::new(peer::transport()));
        let defaults = ReplicaConfig::default();
        let config = ReplicaConfig {
            producers: settings.producers,
            preferred_leader_after_ms: defaults
                .preferred_leader_after_ms
                .filter(|_| settings.leader_balance),
            ..defaults
        };
        let limits = Limits {
            resident_bytes: settings.resident_bytes,
            retry_open_ms: REPLICA_RETRY_MS,
            min_insync: settings.min_insync,
        };
        Ok(Rc::new(ReplicationShell {
            me: agent.node().clone(),
            core: ctx.core(),
            cores,
            base: Instant::now(),
            ctx,
            tls,
            server_name: settings.server_name.clone(),
            resident_bytes: settings.resident_bytes,
            producers: settings.producers,
            driver: RefCell::new(Driver::new(agent.node().clone(), config, limits)),
            agent,
            link,
            shells: RefCell::default(),
            store: RefCell::default(),
            peers: RefCell::default(),
            last_report: std::cell::Cell::new(0),
            deleting: Rc::default(),
            stats,
        }))
    }

    /// The broker's counters.
    pub fn stats(&self) -> &AppStats {
        &self.stats
    }

    /// The name every broker's certificate carries (`--peer-server-name`).
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// The state machines' clock: milliseconds since this host started.
    pub fn now(&self) -> Time {
        Time(self.base.elapsed().as_millis() as u64)
    }

    fn time_of(&self, at: Instant) -> Time {
        Time(at.saturating_duration_since(self.base).as_millis() as u64)
    }

    fn shell(&self, stream: &str, shard: u32) -> Option<Rc<ShardShell>> {
        self.shells.borrow().get(stream).and_then(|s| s.get(&shard)).cloned()
    }

    /// Whether `stream` is replicated (defined with more than one replica).
    pub fn is_replicated(&self, stream: &str) -> bool {
        self.link.view().replication.get(stream).is_some_and(|n| *n > 1)
    }

    /// Queues a client's batch on a replicated shard this broker leads (batches submitted one
    /// after another are replicated in that order); the future resolves to its base offset
    /// once `ack` (`Written` or `Durable`) is met.
    pub fn submit(
        self: &Rc<Self>,
        stream: &str,
        shard: ShardId,
        records: &[Record],
        timestamp_ms: u64,
        ack: felix_proto::AckMode,
        producer: Option<(ProducerTag, bool)>,
    ) -> Result<impl std::future::Future<Output = Result<Offset, WireError>> + 'static, WireError>
    {
        let unavailable = || {
            WireError::new(
                ErrorCode::ShardUnavailable,
                format!("{shard} of {stream}: its replica is starting on this broker"),
            )
        };
        let Some(shell) = self.shell(stream, shard.0) else { return Err(unavailable()) };
        // `ack` is `Written` or `Durable` (`CoreApp::submit_local` made `None` a `Written`).
        let mode = match ack {
            felix_proto::AckMode::Durable => AckMode::Durable,
            _ => AckMode::Written,
        };
        let oldest_pending = producer.is_some_and(|(_, oldest)| oldest);
        let producer = producer
            .map(|(t, _)| ProducerSeq { producer: ProducerId(t.producer.0), seq: Seq(t.seq) });
        let request = AppendRequest {
            request: AppendId(0), // the driver's own
            producer,
            records: records.len() as u32,
            oldest_pending,
            time_ms: timestamp_ms,
            payload: payload::encode(timestamp_ms, records),
            mode,
        };
        let now = self.now();
        let submitted = self.driver.borrow_mut().handle_append(now, stream, shard.0, request);
        let Submitted::Pending(id) = submitted else {
            return Err(WireError::new(
                ErrorCode::ShardUnavailable,
                format!("{shard} of {stream}: its replica stopped on this broker"),
            ));
        };
        let rx = shell.wait(id, producer);
        self.run_actions();
        let (host, stream) = (self.clone(), stream.to_owned());
        Ok(async move {
            match rx.await {
                Ok(Ok(base)) => Ok(base),
                Ok(Err(e)) => Err(host.append_error(&stream, shard, e)),
                // The replica was dropped with the batch in its log.
                Err(_) => Err(WireError::new(
                    ErrorCode::OutcomeUnknown,
                    "the replica stopped before the batch committed: outcome unknown",
                )),
            }
        })
    }

    fn append_error(&self, stream: &str, shard: ShardId, e: AppendError) -> WireError {
        let code = match e {
            AppendError::Busy => ErrorCode::Overloaded,
            AppendError::InvalidBatch(_) | AppendError::SequenceMismatch { .. } => {
                ErrorCode::InvalidArgument
            }
            AppendError::OutOfOrderSequence => ErrorCode::OutOfOrderSequence,
            AppendError::SequenceTooOld => ErrorCode::SequenceTooOld,
            AppendError::NotLeader { .. }
            | AppendError::LeaseExpired
            | AppendError::NotEnoughReplicas { .. } => ErrorCode::ShardUnavailable,
            AppendError::OutcomeUnknown { .. } => ErrorCode::OutcomeUnknown,
        };
        let leader = match e {
            AppendError::NotLeader { leader: Some(l) }
            | AppendError::OutcomeUnknown { leader: Some(l) } => {
                let driver = self.driver.borrow();
                let nodes = driver.shard(stream, shard.0).map(|s| s.nodes().to_vec());
                nodes.and_then(|n| n.get(l.0 as usize).map(|n| format!(" (leader: {n})")))
            }
            _ => None,
        };
        WireError::new(code, format!("{shard} of {stream}: {e}{}", leader.unwrap_or_default()))
    }

    /// Subscribers may read `shard` of `stream` below this offset (its commit point), when
    /// the shard is replicated.
    pub fn visible_end(&self, stream: &str, shard: ShardId) -> Option<Offset> {
        if !self.is_replicated(stream) {
            return None;
        }
        let driver = self.driver.borrow();
        Some(driver.shard(stream, shard.0).map_or(Offset(0), |r| r.visible_end()))
    }

    /// A frame from a peer's replica, for a shard of this core.
    pub fn handle_frame(self: &Rc<Self>, frame: felix_proto::Replicate) {
        let (stream, shard, from, message) = wire::from_frame(frame);
        if let Message::FetchReply { batches, .. } = &message {
            let bytes: usize = batches.iter().map(|b| b.payload.len()).sum();
            stats::add(&self.stats.counters.replication_bytes_received, bytes as u64);
        }
        let now = self.now();
        self.driver.borrow_mut().handle_message(now, &stream, shard.0, from, message);
        self.run_actions();
    }

    /// A disk operation of `key` completed.
    fn disk_done(self: &Rc<Self>, key: &ShardKey, id: felix_replication::DiskOpId) {
        let now = self.now();
        self.driver.borrow_mut().handle_disk_done(now, key, id);
        self.run_actions();
    }

    /// The replica of `key` stops: a storage operation failed, or its disk queue is full.
    fn fail(self: &Rc<Self>, key: &ShardKey, why: String) {
        self.driver.borrow_mut().fail(key, why);
        self.run_actions();
    }

    /// Carries out everything the driver asks for.
    fn run_actions(self: &Rc<Self>) {
        loop {
            let action = self.driver.borrow_mut().poll();
            let Some(action) = action else { return };
            self.act(action);
        }
    }

    fn act(self: &Rc<Self>, action: Action<felix_cluster::NodeId>) {
        match action {
            Action::Send { key, to, from, message } => {
                self.send(&to, &key.stream, ShardId(key.shard), from, &message)
            }
            Action::SendReadingPayloads { key, to, from, message } => {
                let Some(shell) = self.shell(&key.stream, key.shard) else { return };
                let (host, log) = (self.clone(), shell.log().clone());
                glommio::spawn_local(async move {
                    let shard = ShardId(key.shard);
                    if let Some(message) = shard::fill_from_storage(&log, shard, message).await {
                        host.send(&to, &key.stream, shard, from, &message);
                    }
                })
                .detach();
            }
            Action::SendFromLog {
                key,
                to,
                from,
                epoch,
                start,
                upto,
                committed,
                log_start,
                bytes_max,
            } => {
                let Some(shell) = self.shell(&key.stream, key.shard) else { return };
                let (host, log) = (self.clone(), shell.log().clone());
                let read = shard::ArchivedRead {
                    epoch,
                    from: start,
                    upto,
                    committed,
                    log_start,
                    bytes_max,
                };
                glommio::spawn_local(async move {
                    let shard = ShardId(key.shard);
                    if let Some(message) = shard::read_archived(&log, shard, read).await {
                        host.send(&to, &key.stream, shard, from, &message);
                    }
                })
                .detach();
            }
            Action::Disk { key, op } => {
                if let felix_replication::DiskOp::Truncate { to, .. } = &op {
                    tracing::info!(stream = %key.stream, shard = key.shard, to = to.0, "replica truncates its log");
                }
                let queued = self.shell(&key.stream, key.shard).is_some_and(|s| s.queue_disk(op));
                if !queued {
                    self.driver.borrow_mut().fail(&key, "the disk queue is full".to_owned());
                }
            }
            Action::Ack { key, request, base, .. } => {
                if let Some(shell) = self.shell(&key.stream, key.shard) {
                    shell.answer(request, Ok(base));
                }
            }
            Action::Reject { key, request, error } => {
                if let Some(shell) = self.shell(&key.stream, key.shard) {
                    shell.answer(request, Err(error));
                }
            }
            Action::Propose { key, expected_version, epoch, isr, transfer_to } => {
                self.propose(key, expected_version, epoch, isr, transfer_to)
            }
            Action::Tail { key, batches } => {
                if let Some(shell) = self.shell(&key.stream, key.shard) {
                    shell.feed_tail(&batches);
                }
            }
            Action::Checkpoint { key, bytes } => {
                if let Some(shell) = self.shell(&key.stream, key.shard) {
                    shell.save_checkpoint(bytes);
                }
            }
            Action::RoleChanged { key, role, log_end, committed } => {
                tracing::info!(
                    stream = %key.stream,
                    shard = key.shard,
                    ?role,
                    log_end = log_end.0,
                    committed = committed.0,
                    "replica role changed"
                );
            }
            Action::Open { key, me, nodes } => self.open(key, me, nodes),
            Action::Stop { key, reason } => self.stop(key, reason),
        }
    }

    /// Sends `message` from replica `me` of `shard` to the broker `node`.
    pub fn send(
        self: &Rc<Self>,
        node: &felix_cluster::NodeId,
        stream: &str,
        shard: ShardId,
        me: ReplicaNumber,
        message: &Message,
    ) {
        if matches!(message, Message::EpochAnswer { .. } | Message::EpochQuery { .. }) {
            tracing::debug!(%stream, shard = shard.0, %node, ?message, "replica sends");
        }
        let link = self.peers.borrow().get(node).cloned();
        let link = link.unwrap_or_else(|| {
            let l = PeerLink::open(self, node.clone());
            self.peers.borrow_mut().insert(node.clone(), l.clone());
            l
        });
        let mut buf = BytesMut::new();
        Frame::Replicate(wire::to_frame(stream, shard, me, message)).encode(&mut buf);
        if !link.send(buf.freeze()) {
            stats::add(&self.stats.counters.replication_frames_dropped, 1);
            return;
        }
        if let Message::FetchReply { batches, .. } = message {
            let bytes: usize = batches.iter().map(|b| b.payload.len()).sum();
            stats::add(&self.stats.counters.replication_bytes_sent, bytes as u64);
        }
    }

    /// Live members of the cluster whose link from this core failed its last connect.
    fn peers_unreachable(&self) -> u64 {
        let view = self.link.view();
        let peers = self.peers.borrow();
        let down = peers.iter().filter(|(node, link)| {
            link.state() == peer::LinkState::Down && view.members.contains_key(*node)
        });
        down.count() as u64
    }

    /// Where `node` listens, as the cluster view says.
    pub fn address_of(&self, node: &felix_cluster::NodeId) -> Option<String> {
        self.link.view().members.get(node).map(|m| m.advertise.clone())
    }

    /// Hands an in-sync-set proposal to the agent (the driver hands over one per shard at a
    /// time); its outcome comes back with the view.
    fn propose(
        self: &Rc<Self>,
        key: ShardKey,
        expected_version: u64,
        epoch: felix_replication::Epoch,
        isr: Vec<felix_cluster::NodeId>,
        transfer_to: Option<felix_cluster::NodeId>,
    ) {
        let (host, agent) = (self.clone(), self.agent.clone());
        let version = i64::try_from(expected_version).unwrap_or(i64::MAX);
        glommio::spawn_local(async move {
            let (stream, shard) = (&key.stream, key.shard);
            let proposed = match transfer_to {
                None => agent.propose_isr(stream, shard, version, epoch.0, isr).await,
                Some(to) => {
                    agent.transfer_leadership(stream, shard, version, epoch.0, isr, to).await
                }
            };
            if let Err(e) = proposed {
                tracing::debug!(%stream, shard, error = %e, "in-sync set proposal refused");
            }
            host.driver.borrow_mut().proposal_done(&key);
        })
        .detach();
    }

    /// Starts the replica of `key`: recovers its log from storage, then hands it to the driver.
    fn open(self: &Rc<Self>, key: ShardKey, me: ReplicaNumber, nodes: Vec<felix_cluster::NodeId>) {
        let Some(store) = self.store.borrow().as_ref().and_then(Weak::upgrade) else { return };
        let host = self.clone();
        glommio::spawn_local(async move {
            match host.open_replica(&*store, &key).await {
                Ok((shell, log)) => {
                    host.shells
                        .borrow_mut()
                        .entry(key.stream.clone())
                        .or_default()
                        .insert(key.shard, shell);
                    let now = host.now();
                    tracing::info!(stream = %key.stream, shard = key.shard, replica = me.0, "replica started");
                    host.driver.borrow_mut().opened(now, key, me, nodes, log);
                }
                Err(e) => {
                    tracing::warn!(stream = %key.stream, shard = key.shard, "cannot start the replica: {e}");
                    let now = host.now();
                    host.driver.borrow_mut().open_failed(now, key);
                }
            }
            host.run_actions();
        })
        .detach();
    }

    async fn open_replica(
        self: &Rc<Self>,
        store: &dyn ShardStore,
        key: &ShardKey,
    ) -> Result<(Rc<ShardShell>, felix_replication::ReplicaLog), String> {
        let (log, tail) = store.open_shard_log(&key.stream).await?;
        let shard = ShardId(key.shard);
        let recovered = shard::recover(&log, shard, self.resident_bytes, self.producers).await?;
        let shell = ShardShell::open(self, key.clone(), tail, log);
        Ok((shell, recovered))
    }

    /// The replica of `key` stopped: its waiting appends were answered; its disk task ends
    /// once the operations already queued are done.
    fn stop(self: &Rc<Self>, key: ShardKey, reason: StopReason) {
        let shell = {
            let mut shells = self.shells.borrow_mut();
            shells.get_mut(&key.stream).and_then(|s| s.remove(&key.shard))
        };
        let (stream, shard) = (&key.stream, key.shard);
        match &reason {
            StopReason::Failed(why) => {
                tracing::error!(%stream, shard, "replica stopped: {why}");
            }
            StopReason::Refused => {
                tracing::error!(%stream, shard,
                    "replica stopped: its group's replicas changed and its log holds batches of \
                     the old group, whose epochs a new group may repeat with another leader; not \
                     reopened until the broker restarts");
            }
            StopReason::Reopen => {
                tracing::warn!(%stream, shard,
                    "the group's replicas changed: the replica (its log empty) is opened again");
            }
            StopReason::Deleted => {
                tracing::debug!(%stream, shard, "replica stopped: stream deleted")
            }
        }
        let Some(shell) = shell else {
            if reason == StopReason::Reopen {
                self.driver.borrow_mut().stopped(&key);
            }
            return;
        };
        shell.stop();
        if reason == StopReason::Reopen {
            let host = self.clone();
            glommio::spawn_local(async move {
                shell.stopped().await;
                host.driver.borrow_mut().stopped(&key);
            })
            .detach();
        }
    }

    /// `stream` was deleted: its replicas on this core stop (before the core deletes its log).
    pub fn stream_deleted(self: &Rc<Self>, stream: &str) {
        self.driver.borrow_mut().handle_deleted(stream);
        self.run_actions();
    }

    /// Feeds the cluster view to the driver every [`TICK_MS`], until the core stops.
    pub async fn run(self: Rc<Self>, store: Weak<dyn ShardStore>) {
        *self.store.borrow_mut() = Some(store.clone());
        let app = store;
        loop {
            glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
            if app.strong_count() == 0 {
                return;
            }
            let view = self.link.view();
            self.tick(&view);
        }
    }

    /// One round: the driver gets the lease, every group record of this core, and a tick.
    fn tick(self: &Rc<Self>, view: &ClusterView) {
        let now = self.now();
        let lease = view.member_leases.get(&self.me).copied();
        let valid_until = view.lease_valid_until.map(|at| {
            let t = self.time_of(at);
            Time(t.0.saturating_sub(LEASE_DRIFT_MARGIN_MS))
        });
        if now.0 / 1000 != self.last_report.replace(now.0 / 1000) {
            self.report(now, valid_until);
            self.retention_pass(view);
        }
        let lease = lease.zip(valid_until).map(|(l, until)| (LeaseId(l as u64), until));
        let mine: Vec<(ShardKey, &felix_cluster::ShardGroup)> = view
            .groups
            .iter()
            .filter(|((_, shard), _)| *shard as usize % self.cores == usize::from(self.core.0))
            .map(|((stream, shard), group)| (ShardKey::new(stream, *shard), group))
            .collect();
        let groups = mine.iter().map(|(key, group)| GroupView {
            key,
            placed: view.placements.contains_key(&*key.stream),
            replicas: &group.replicas,
            state: group.state().ok(),
        });
        self.driver.borrow_mut().handle_view(now, lease, groups);
        self.run_actions();
    }

    /// Retention of the replicated streams (once a second): the leaders of this core's shards
    /// start their logs where their streams' retention says (and every replica holds the log
    /// from there on: `Replica::apply_retention`), followers take their leaders' starts, and
    /// each stream's log on this core deletes the segments that lie wholly below its shards'
    /// starts. A shard without a replica running here keeps what it has (its segments stay),
    /// unless it holds nothing.
    fn retention_pass(self: &Rc<Self>, view: &ClusterView) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let retention_of = |stream: &str| {
            view.streams.get(stream).map_or(Retention::default(), |d| Retention {
                bytes_max: (d.retention_bytes != 0).then_some(d.retention_bytes),
                age_ms_max: (d.retention_ms != 0).then_some(d.retention_ms),
            })
        };
        self.driver.borrow_mut().apply_retention(now_ms, retention_of);
        self.run_actions();
        if self.deleting.get() {
            return; // the previous pass still deletes; the next one catches up
        }
        let mut work = Vec::new();
        {
            let driver = self.driver.borrow();
            let shells = self.shells.borrow();
            for (stream, shards) in shells.iter() {
                let Some(def) = view.streams.get(&**stream) else { continue };
                if retention_of(stream) == Retention::default() {
                    continue;
                }
                let Some(log) = shards.values().next().map(|s| s.log().clone()) else { continue };
                let mut keep = Vec::new();
                for shard in
                    (0..def.shards).filter(|s| *s as usize % self.cores == usize::from(self.core.0))
                {
                    match driver.shard(stream, shard).filter(|_| shards.contains_key(&shard)) {
                        Some(r) => keep.push((ShardId(shard), r.replica().log_start())),
                        None if log.next_offset(ShardId(shard)).is_ok_and(|o| o == Offset(0)) => {
                            keep.push((ShardId(shard), Offset(0)))
                        }
                        None => {}
                    }
                }
                tracing::debug!(%stream, ?keep, "replicated retention: the shards' log starts");
                if keep.iter().any(|(_, start)| *start > Offset(0)) {
                    work.push((stream.clone(), log, keep));
                }
            }
        }
        if work.is_empty() {
            return;
        }
        self.deleting.set(true);
        let (busy, stats) = (self.deleting.clone(), self.stats.clone());
        glommio::spawn_local(async move {
            for (stream, log, keep) in work {
                match log.delete_below(&keep).await {
                    Ok(done) if done.segments_deleted > 0 => {
                        stats::add(&stats.counters.replication_retention_bytes_deleted, done.bytes_deleted);
                        tracing::debug!(%stream, segments = done.segments_deleted, "replicated retention deleted segments");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(%stream, error = %e, "replicated retention"),
                }
            }
            busy.set(false);
        })
        .detach();
    }

    /// Publishes the replicas' state for the metrics page (once a second), with a debug line
    /// per replica.
    fn report(&self, now: Time, valid_until: Option<Time>) {
        let driver = self.driver.borrow();
        let mut statuses = Vec::new();
        let mut totals = felix_replication::ReplicaStats::default();
        let (mut leading, mut lag_records, mut lag_bytes, mut resident) = (0, 0, 0, 0);
        let (mut producers_known, mut producers_expired, mut index_bytes) = (0, 0, 0);
        let mut running = 0u64;
        for r in driver.shards() {
            running += 1;
            let replica = r.replica();
            let log = replica.log();
            totals = totals + replica.stats();
            resident += log.batches().len() as u64;
            producers_known += log.producers_known() as u64;
            producers_expired += log.producers_forgotten().0;
            index_bytes += log.index_bytes();
            let (leader, epoch) = match replica.role() {
                felix_replication::RoleView::Leader { epoch } => (true, epoch.0),
                felix_replication::RoleView::Follower { epoch, .. } => (false, epoch.0),
                felix_replication::RoleView::Idle => (false, 0),
            };
            leading += u64::from(leader);
            let followers: Vec<(String, u64, u64, bool)> = replica
                .followers()
                .into_iter()
                .map(|f| {
                    let node = r
                        .nodes()
                        .get(f.node.0 as usize)
                        .map_or_else(String::new, |n| n.to_string());
                    let records = log.end().0.saturating_sub(f.durable_end.0);
                    (node, records, log.bytes_after(f.durable_end), f.in_sync)
                })
                .collect();
            for f in &followers {
                lag_records = lag_records.max(f.1);
                lag_bytes = lag_bytes.max(f.2);
            }
            let key = r.key();
            tracing::debug!(
                stream = %key.stream,
                shard = key.shard,
                role = ?replica.role(),
                log_start = log.start().0,
                log_end = log.end().0,
                durable_end = replica.durable_end().0,
                committed = replica.committed().0,
                lease_left_ms = valid_until.map(|u| u.0 as i64 - now.0 as i64),
                ?followers,
                "replica"
            );
            statuses.push(ReplicaStatus {
                stream: key.stream.to_string(),
                shard: key.shard,
                leader,
                epoch,
                log_end: log.end().0,
                committed: replica.committed().0,
                followers,
            });
        }
        let c = &self.stats.counters;
        stats::set(&c.replication_truncated_batches, totals.batches_truncated);
        stats::set(&c.replication_leaderships, totals.leaderships);
        stats::set(&c.replication_isr_proposals, totals.isr_proposals);
        stats::set(&c.replication_isr_proposals_dropped, driver.stats().proposals_dropped);
        stats::set(&c.replication_lease_refusals, totals.lease_refusals);
        stats::set(&c.replication_batches_archived, totals.batches_archived);
        stats::set(&c.replication_fetches_from_log, totals.fetches_from_log);
        stats::set(&c.replication_resident_batches, resident);
        stats::set(&c.replication_producers, producers_known);
        stats::set(&c.replication_producers_expired, producers_expired);
        stats::set(&c.replication_index_bytes, index_bytes);
        stats::set(&c.replicas_leading, leading);
        stats::set(&c.replicas_following, running - leading);
        stats::set(&c.replication_lag_records, lag_records);
        stats::set(&c.replication_lag_bytes, lag_bytes);
        stats::set(&c.replication_peers_unreachable, self.peers_unreachable());
        drop(driver);
        if let Ok(mut slot) = self.stats.replicas.lock() {
            *slot = statuses;
        }
    }
}
