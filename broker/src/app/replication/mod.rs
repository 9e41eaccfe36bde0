//! The replication driver: runs `felix_replication`'s state machine for every shard of a
//! replicated stream that lives on this core, and wires it to QUIC, etcd and `felix-storage`
//! (docs/replication.md, "The broker driver").
//!
//! Shard `s` lives on core `s % cores` of each of its brokers, so core i talks only to core i
//! of its peers: each core keeps one outbound link per peer broker ([`peer`]) and receives its
//! peers' frames on the connections they opened ([`Host::handle_frame`]). Every
//! [`TICK_MS`] the host copies what the cluster agent knows into the state machines: the group
//! record of each shard (leader, epoch, in-sync set; `handle_controller`) and this broker's
//! lease (`handle_lease`), then ticks them. Nothing here blocks on etcd: proposals go to the
//! agent's thread and their outcome comes back in the view.

pub mod payload;
pub mod peer;
pub mod propose;
pub mod shard;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use felix_cluster::{AgentClient, ClusterView};
use felix_proto::{CoreId, ErrorCode, Frame, Offset, ProducerTag, Record, ShardId};
use felix_replication::{
    wire, AckMode, AppendError, IsrProposal, LeaseId, Message, NodeId, ReplicaConfig, Time,
};

pub use self::peer::verify_peers;
use self::peer::PeerLink;
use self::propose::OnePerShard;
use self::shard::ShardReplica;
use super::cluster::ClusterLink;
use super::core::CoreApp;
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
}

/// One core's replication driver.
pub struct Host {
    me: felix_cluster::NodeId,
    core: CoreId,
    cores: usize,
    base: Instant,
    ctx: crate::net::CoreContext,
    tls: quinn_proto::ClientConfig,
    server_name: String,
    min_insync: usize,
    producers: felix_replication::ProducerLimits,
    resident_bytes: u64,
    agent: AgentClient,
    link: Rc<ClusterLink>,
    /// The running replicas, by stream and shard (looked up by `&str`, with no allocation).
    shards: RefCell<HashMap<String, HashMap<u32, Rc<ShardReplica>>>>,
    opening: RefCell<HashSet<(String, u32)>>,
    /// Replicas that could not start, and when they may be tried again.
    retry_at: RefCell<HashMap<(String, u32), Time>>,
    /// Replicas stopped because their group's replicas changed under a log that holds
    /// batches: not opened again until the broker restarts (see [`Adoption::Refuse`]).
    refused: RefCell<HashSet<(String, u32)>>,
    /// The in-sync-set proposals on their way to the agent, one per shard at most.
    proposing: Rc<OnePerShard>,
    peers: RefCell<HashMap<felix_cluster::NodeId, Rc<PeerLink>>>,
    /// The second of the last status report (metrics, and a debug line per replica).
    last_report: std::cell::Cell<u64>,
    stats: Arc<AppStats>,
}

impl Host {
    /// The driver of core `ctx.core()`.
    pub fn new(
        ctx: crate::net::CoreContext,
        cores: usize,
        settings: &ReplicationSettings,
        agent: AgentClient,
        link: Rc<ClusterLink>,
        stats: Arc<AppStats>,
    ) -> Result<Rc<Host>, crate::net::tls::TlsError> {
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
        Ok(Rc::new(Host {
            me: agent.node().clone(),
            core: ctx.core(),
            cores,
            base: Instant::now(),
            ctx,
            tls,
            server_name: settings.server_name.clone(),
            min_insync: settings.min_insync,
            resident_bytes: settings.resident_bytes,
            producers: settings.producers,
            agent,
            link,
            shards: RefCell::default(),
            opening: RefCell::default(),
            retry_at: RefCell::default(),
            refused: RefCell::default(),
            proposing: Rc::default(),
            peers: RefCell::default(),
            last_report: std::cell::Cell::new(0),
            stats,
        }))
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

    /// The replica of `shard` of `stream` on this core, if the stream is replicated and the
    /// replica is running.
    pub fn replica(&self, stream: &str, shard: ShardId) -> Option<Rc<ShardReplica>> {
        self.shards.borrow().get(stream).and_then(|s| s.get(&shard.0)).cloned()
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
        let Some(replica) = self.replica(stream, shard) else {
            return Err(WireError::new(
                ErrorCode::ShardUnavailable,
                format!("{shard} of {stream}: its replica is starting on this broker"),
            ));
        };
        // `ack` is `Written` or `Durable` (`CoreApp::submit_local` made `None` a `Written`).
        let mode = match ack {
            felix_proto::AckMode::Durable => AckMode::Durable,
            _ => AckMode::Written,
        };
        let rx = replica.append(self, records, timestamp_ms, mode, producer);
        let (host, stream) = (self.clone(), stream.to_owned());
        Ok(async move {
            match rx.await {
                Ok(Ok(base)) => Ok(base),
                Ok(Err(e)) => Err(host.append_error(&stream, shard, &replica, e)),
                // The replica was dropped with the batch in its log.
                Err(_) => Err(WireError::new(
                    ErrorCode::OutcomeUnknown,
                    "the replica stopped before the batch committed: outcome unknown",
                )),
            }
        })
    }

    fn append_error(
        &self,
        stream: &str,
        shard: ShardId,
        replica: &ShardReplica,
        e: AppendError,
    ) -> WireError {
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
                replica.nodes.get(l.0 as usize).map(|n| format!(" (leader: {n})"))
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
        Some(self.replica(stream, shard).map_or(Offset(0), |r| r.visible_end()))
    }

    /// A frame from a peer's replica, for a shard of this core.
    pub fn handle_frame(self: &Rc<Self>, frame: felix_proto::Replicate) {
        let (stream, shard, from, message) = wire::from_frame(frame);
        if let Message::FetchReply { batches, .. } = &message {
            let bytes: usize = batches.iter().map(|b| b.payload.len()).sum();
            stats::add(&self.stats.counters.replication_bytes_received, bytes as u64);
        }
        let Some(replica) = self.replica(&stream, shard) else { return };
        let now = self.now();
        replica.with(self, |r| r.handle_message(now, from, message));
    }

    /// Sends `message` from replica `me` of `shard` to the broker `node`.
    pub fn send(
        self: &Rc<Self>,
        node: &felix_cluster::NodeId,
        stream: &str,
        shard: ShardId,
        me: NodeId,
        message: &Message,
    ) {
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

    /// Hands an in-sync-set proposal to the agent; its outcome comes back with the view. While
    /// the shard's previous proposal is still on its way (the agent's queue full, etcd away)
    /// this one is dropped and counted: the state machine resends it ([`OnePerShard`]).
    pub fn propose(&self, replica: &ShardReplica, p: IsrProposal) {
        let isr: Vec<felix_cluster::NodeId> =
            p.isr.iter().filter_map(|n| replica.nodes.get(n.0 as usize).cloned()).collect();
        let (agent, stream, shard) = (self.agent.clone(), replica.stream.clone(), replica.shard.0);
        let version = i64::try_from(p.expected_version).unwrap_or(i64::MAX);
        let sent = self.proposing.spawn(&replica.stream, shard, async move {
            if let Err(e) = agent.propose_isr(&stream, shard, version, p.epoch.0, isr).await {
                tracing::debug!(%stream, shard, error = %e, "in-sync set proposal refused");
            }
        });
        if !sent {
            stats::add(&self.stats.counters.replication_isr_proposals_dropped, 1);
            tracing::debug!(stream = %replica.stream, shard, "in-sync set proposal dropped: the previous one is on its way");
        }
    }

    /// Feeds the cluster view to the replicas and ticks them every [`TICK_MS`], until the core
    /// stops.
    pub async fn run(self: Rc<Self>, app: Weak<CoreApp>) {
        loop {
            glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
            let Some(app) = app.upgrade() else { return };
            let view = self.link.view();
            self.adopt(&app, &view);
            self.tick(&view);
        }
    }

    /// Starts a replica for every group of a placed stream with a replica on this core, and
    /// replaces one whose group's replicas changed ([`adoption`]).
    fn adopt(self: &Rc<Self>, app: &Rc<CoreApp>, view: &ClusterView) {
        for ((stream, shard), group) in &view.groups {
            if *shard as usize % self.cores != usize::from(self.core.0) {
                continue;
            }
            let key = (stream.clone(), *shard);
            let running = self.replica(stream, ShardId(*shard));
            let placed = view.placements.contains_key(stream);
            let opened = running.as_ref().map(|r| (r.nodes.as_slice(), r.replica().log().end()));
            let me = match adoption(placed, group, &self.me, opened) {
                Adoption::Keep | Adoption::Skip => continue,
                Adoption::Open(me) => me,
                decision @ (Adoption::Reopen | Adoption::Refuse) => {
                    if let Some(old) = running {
                        self.retire(key, old, &group.replicas, decision == Adoption::Reopen);
                    }
                    continue;
                }
            };
            if self.refused.borrow().contains(&key)
                || self.retry_at.borrow().get(&key).is_some_and(|at| self.now() < *at)
                || !self.opening.borrow_mut().insert(key.clone())
            {
                continue;
            }
            let replicas = group.replicas.len();
            let mut config = ReplicaConfig::for_replicas(replicas);
            config.producers = self.producers;
            if self.min_insync > 0 {
                config.min_insync = self.min_insync.min(replicas);
            }
            let (host, app, nodes) = (self.clone(), app.clone(), group.replicas.clone());
            glommio::spawn_local(async move {
                let opened = host.open_replica(&app, &key, nodes, me, config).await;
                host.opening.borrow_mut().remove(&key);
                if let Err(e) = opened {
                    tracing::warn!(stream = %key.0, shard = key.1, "cannot start the replica: {e}");
                    let at = host.now().plus_ms(REPLICA_RETRY_MS);
                    host.retry_at.borrow_mut().insert(key, at);
                }
            })
            .detach();
        }
    }

    /// Stops `old`, whose group's replicas are now `replicas`; with `reopen` (its log is
    /// empty) the next round opens the shard's replica again with them, once the old one's
    /// disk task has ended. Otherwise it stays stopped until the broker restarts.
    fn retire(
        self: &Rc<Self>,
        key: (String, u32),
        old: Rc<ShardReplica>,
        replicas: &[felix_cluster::NodeId],
        reopen: bool,
    ) {
        old.stop();
        if let Some(s) = self.shards.borrow_mut().get_mut(&key.0) {
            s.remove(&key.1);
        }
        let (stream, shard, was) = (&key.0, key.1, &old.nodes);
        if !reopen {
            tracing::error!(%stream, shard, ?was, now = ?replicas,
                "replica stopped: its group's replicas changed and its log holds batches of the \
                 old group, whose epochs a new group may repeat with another leader; not \
                 reopened until the broker restarts");
            self.refused.borrow_mut().insert(key);
            return;
        }
        tracing::warn!(%stream, shard, ?was, now = ?replicas,
            "the group's replicas changed: the replica (its log empty) is opened again");
        self.opening.borrow_mut().insert(key.clone());
        let host = self.clone();
        glommio::spawn_local(async move {
            old.stopped().await;
            host.opening.borrow_mut().remove(&key);
        })
        .detach();
    }

    async fn open_replica(
        self: &Rc<Self>,
        app: &Rc<CoreApp>,
        key: &(String, u32),
        nodes: Vec<felix_cluster::NodeId>,
        me: NodeId,
        config: ReplicaConfig,
    ) -> Result<(), String> {
        let entry = app.stream(&key.0, false).await.map_err(|e| e.message)?;
        let log = entry.log.clone().ok_or("no log on this core")?;
        let shard = ShardId(key.1);
        let (replica, disk_rx) =
            ShardReplica::open(entry, log, shard, nodes, me, config, self.resident_bytes).await?;
        replica.spawn_disk(self.clone(), disk_rx);
        self.shards.borrow_mut().entry(key.0.clone()).or_default().insert(key.1, replica);
        tracing::info!(stream = %key.0, shard = key.1, replica = me.0, "replica started");
        Ok(())
    }

    /// Publishes the replicas' state for the metrics page (once a second), with a debug line
    /// per replica.
    fn report(&self, shards: &[Rc<ShardReplica>], now: Time, valid_until: Option<Time>) {
        let mut statuses = Vec::with_capacity(shards.len());
        let mut totals = felix_replication::ReplicaStats::default();
        let (mut leading, mut lag_records, mut lag_bytes, mut resident) = (0, 0, 0, 0);
        let (mut producers_known, mut producers_expired, mut index_bytes) = (0, 0, 0);
        for r in shards {
            let replica = r.replica();
            let log = replica.log();
            let s = replica.stats();
            totals.batches_truncated += s.batches_truncated;
            totals.leaderships += s.leaderships;
            totals.isr_proposals += s.isr_proposals;
            totals.lease_refusals += s.lease_refusals;
            totals.batches_archived += s.batches_archived;
            totals.fetches_from_log += s.fetches_from_log;
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
                    let node =
                        r.nodes.get(f.node.0 as usize).map_or_else(String::new, |n| n.to_string());
                    let records = log.end().0.saturating_sub(f.durable_end.0);
                    (node, records, log.bytes_after(f.durable_end), f.in_sync)
                })
                .collect();
            for f in &followers {
                lag_records = lag_records.max(f.1);
                lag_bytes = lag_bytes.max(f.2);
            }
            tracing::debug!(
                stream = %r.stream,
                shard = r.shard.0,
                role = ?replica.role(),
                log_end = log.end().0,
                durable_end = replica.durable_end().0,
                committed = replica.committed().0,
                lease_left_ms = valid_until.map(|u| u.0 as i64 - now.0 as i64),
                ?followers,
                "replica"
            );
            statuses.push(ReplicaStatus {
                stream: r.stream.clone(),
                shard: r.shard.0,
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
        stats::set(&c.replication_lease_refusals, totals.lease_refusals);
        stats::set(&c.replication_batches_archived, totals.batches_archived);
        stats::set(&c.replication_fetches_from_log, totals.fetches_from_log);
        stats::set(&c.replication_resident_batches, resident);
        stats::set(&c.replication_producers, producers_known);
        stats::set(&c.replication_producers_expired, producers_expired);
        stats::set(&c.replication_index_bytes, index_bytes);
        stats::set(&c.replicas_leading, leading);
        stats::set(&c.replicas_following, shards.len() as u64 - leading);
        stats::set(&c.replication_lag_records, lag_records);
        stats::set(&c.replication_lag_bytes, lag_bytes);
        stats::set(&c.replication_peers_unreachable, self.peers_unreachable());
        if let Ok(mut slot) = self.stats.replicas.lock() {
            *slot = statuses;
        }
    }

    /// One round: each replica gets its newest group record, the lease, and a tick.
    fn tick(self: &Rc<Self>, view: &ClusterView) {
        let now = self.now();
        let lease = view.member_leases.get(&self.me).copied();
        let valid_until = view.lease_valid_until.map(|at| {
            let t = self.time_of(at);
            Time(t.0.saturating_sub(LEASE_DRIFT_MARGIN_MS))
        });
        let shards: Vec<Rc<ShardReplica>> =
            self.shards.borrow().values().flat_map(|s| s.values().cloned()).collect();
        if now.0 / 1000 != self.last_report.replace(now.0 / 1000) {
            self.report(&shards, now, valid_until);
        }
        let lease_gone = valid_until.is_none_or(|until| now >= until);
        for r in shards {
            if lease_gone {
                r.refuse_waiting();
            }
            let state = view.group(&r.stream, r.shard.0).and_then(|g| g.state().ok());
            r.with(self, |replica| {
                if let (Some(lease), Some(until)) = (lease, valid_until) {
                    replica.handle_lease(now, LeaseId(lease as u64), until);
                }
                if let Some(state) = state {
                    replica.handle_controller(now, state);
                }
                replica.handle_tick(now);
            });
        }
    }
}

/// What [`Host::adopt`] does with one group record of the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Adoption {
    /// Nothing: this broker is not a replica, or the stream is not placed yet (its groups
    /// may be a deposed controller's partial set, which the next controller overwrites with
    /// other replicas: docs/replication.md, "The controller on etcd").
    Skip,
    /// The running replica has this group's replicas: it goes on.
    Keep,
    /// Start the replica, with this replica number.
    Open(NodeId),
    /// The running replica was opened with other replicas (its numbers name other brokers)
    /// and its log is empty: stop it and open it again with these.
    Reopen,
    /// As `Reopen`, but its log holds batches: stop it and do not reopen it. Those batches'
    /// epochs come from another record of the group; a new record starts again at epoch 1,
    /// maybe with another leader, and log matching (one leader per epoch) would not hold.
    Refuse,
}

/// The decision for `group` on broker `me`: `placed` says whether the stream is placed;
/// `running`, the replicas the replica this core runs for the shard was opened with and where
/// its log ends, if it runs one.
fn adoption(
    placed: bool,
    group: &felix_cluster::ShardGroup,
    me: &felix_cluster::NodeId,
    running: Option<(&[felix_cluster::NodeId], Offset)>,
) -> Adoption {
    match (running, placed, group.number(me)) {
        (None, true, Some(n)) => Adoption::Open(n),
        (None, _, _) => Adoption::Skip,
        (Some((nodes, _)), _, _) if nodes == group.replicas.as_slice() => Adoption::Keep,
        (Some((_, Offset(0))), _, _) => Adoption::Reopen,
        (Some(_), _, _) => Adoption::Refuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_cluster::{NodeId as Node, ShardGroup};

    fn nodes(names: &[&str]) -> Vec<Node> {
        names.iter().map(|n| Node::new(n).unwrap()).collect()
    }

    /// A deposed controller's record [b1, b2, b3], then the next controller's [b2, b3, b4]
    /// with the placement (docs/replication.md, "The controller on etcd").
    #[test]
    fn replicas_start_only_for_placed_streams_and_follow_a_changed_group() {
        let b2 = Node::new("b2").unwrap();
        let deposed = ShardGroup::initial(nodes(&["b1", "b2", "b3"]), Some(7));
        let placed = ShardGroup::initial(nodes(&["b2", "b3", "b4"]), Some(8));
        assert_eq!(adoption(false, &deposed, &b2, None), Adoption::Skip, "unplaced: not started");
        assert_eq!(adoption(false, &placed, &b2, None), Adoption::Skip);
        assert_eq!(
            adoption(true, &placed, &b2, None),
            Adoption::Open(felix_replication::NodeId(0))
        );
        let b5 = Node::new("b5").unwrap();
        assert_eq!(adoption(true, &placed, &b5, None), Adoption::Skip, "not a replica");

        let opened = nodes(&["b2", "b3", "b4"]);
        let same = Some((opened.as_slice(), Offset(40)));
        assert_eq!(adoption(true, &placed, &b2, same), Adoption::Keep);
        // A replica opened from the deposed controller's record (as before this check).
        let old = nodes(&["b1", "b2", "b3"]);
        let empty = Some((old.as_slice(), Offset(0)));
        assert_eq!(adoption(true, &placed, &b2, empty), Adoption::Reopen);
        let written = Some((old.as_slice(), Offset(3)));
        assert_eq!(adoption(true, &placed, &b2, written), Adoption::Refuse);
        // Not a replica of the new group: stopped all the same (and not opened again).
        assert_eq!(adoption(true, &placed, &b5, empty), Adoption::Reopen);
        assert_eq!(adoption(true, &placed, &b5, None), Adoption::Skip);
    }
}
