//! The cluster agent: one per broker, on a control thread of its own with a current-thread
//! tokio runtime. It holds the broker's membership lease, campaigns for the controller role,
//! places the shards of new streams while it is the controller (with a replica-group record per
//! shard of a replicated stream, [`crate::groups`]), runs an election for every group it is an
//! in-sync replica of whose leader's lease is gone, proposes its in-sync-set changes
//! ([`AgentClient::propose_isr`]), and keeps a [`ClusterView`] up to date from one etcd watch
//! over the cluster's keys.
//!
//! Call order: [`Agent::start`] returns an [`AgentHandle`]; [`AgentHandle::views`] gives a
//! latest-value channel of views (bounded: one slot, newest wins) that data cores poll on a
//! timer, never blocking; [`AgentHandle::create_stream`] defines a stream and waits for its
//! placement; [`AgentHandle::stop`] resigns, revokes the lease and joins the thread.
//!
//! Failure behaviour: if etcd cannot be reached, the agent retries every
//! [`RETRY_INTERVAL_MS`]; the view keeps its last placements but its `lease_valid_until`
//! runs out, so the broker stops acknowledging writes once its lease may have expired. A lost
//! lease starts a new session (new lease, member key, campaign). A connection that stops
//! answering without failing (a hung etcd member, dropped packets) is given up when a
//! keep-alive goes unanswered for half the TTL or the lease's validity passes
//! ([`crate::agent_state::AgentState`], sans-IO, which the simulator drives too), and by HTTP/2 pings ([`HTTP2_PING_INTERVAL_MS`]) on every
//! connection; every other etcd call has a timeout. A session publishes the view of a new
//! lease only once it has loaded the cluster's keys for it. A key that does not parse is
//! logged and skipped ([`ClusterView::keys_skipped`]), never the end of a session.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaderKey,
    LeaseKeepAliveResponse, PutOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::{mpsc, oneshot, watch};

use crate::agent_state::{AgentState, SessionEnd};
use crate::error::ClusterError;
use crate::groups::{self, ShardGroup};
use crate::keys;
use crate::keyspace::{apply_or_skip, Candidates};
use crate::placement::{self, PlacementError, StreamPlacement};
use crate::throttle::WarnEvery;
use crate::view::{ClusterView, Member, StreamDef, StreamRecord};
use crate::NodeId;

/// How long the agent waits before it retries etcd after an error.
pub const RETRY_INTERVAL_MS: u64 = 500;
/// Timeout of one etcd connection attempt.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Timeout of one etcd request (and of opening a keep-alive or watch stream).
pub const REQUEST_TIMEOUT_MS: u64 = 3_000;
/// Interval of the HTTP/2 pings on an etcd connection with calls open and nothing received
/// (a frozen connection fails its calls when a ping goes unanswered). Above etcd's default
/// `--grpc-keepalive-min-time` (5 s): etcd closes connections that ping more often.
pub const HTTP2_PING_INTERVAL_MS: u64 = 6_000;
/// How long an HTTP/2 ping may go unanswered before its connection is closed.
pub const HTTP2_PING_TIMEOUT_MS: u64 = 3_000;
/// Default membership lease TTL.
pub const LEASE_TTL_S_DEFAULT: u32 = 5;
/// Replica-group records written per etcd transaction when a replicated stream is placed
/// (etcd's default `--max-txn-ops` is 128).
pub const GROUP_PUTS_PER_TXN: usize = 64;
/// Shortest lease TTL accepted (etcd's own minimum is larger than a keep-alive round trip).
pub const LEASE_TTL_S_MIN: u32 = 2;
/// Requests queued to the agent before callers wait.
pub const COMMANDS_QUEUED_MAX: usize = 64;
/// How long [`AgentHandle::create_stream`] waits for the controller's placement.
pub const PLACEMENT_WAIT_MS: u64 = 10_000;
/// Lease TTLs after an agent's start during which a CreateStream with more replicas than live
/// brokers waits for more to join instead of being refused at once.
pub const FEW_BROKERS_GRACE_TTLS: u32 = 2;
/// How often the controller repeats its warning about one stream it cannot place.
pub const PLACEMENT_WARN_INTERVAL_MS: u64 = 60_000;

/// What the agent needs to join a cluster.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// etcd endpoints (`http://host:port`).
    pub endpoints: Vec<String>,
    /// The cluster's name: the key prefix `/felix/<cluster>/`.
    pub cluster: String,
    /// This broker.
    pub member: Member,
    /// Membership lease TTL in seconds.
    pub lease_ttl_s: u32,
}

impl AgentConfig {
    fn validate(&self) -> Result<(), ClusterError> {
        let bad = |why: &str| Err(ClusterError::InvalidConfig(why.to_owned()));
        if self.endpoints.is_empty() {
            return bad("at least one etcd endpoint");
        }
        if self.lease_ttl_s < LEASE_TTL_S_MIN {
            return bad("lease TTL below LEASE_TTL_S_MIN");
        }
        if self.cluster.is_empty() || self.cluster.contains('/') {
            return bad("the cluster name is non-empty, without '/'");
        }
        Ok(())
    }
}

/// Starts agents.
pub struct Agent;

impl Agent {
    /// Starts the agent of `config.member` on its own thread. It connects in the background:
    /// the first views may have no lease yet.
    pub fn start(config: AgentConfig) -> Result<AgentHandle, ClusterError> {
        config.validate()?;
        let node = config.member.node.clone();
        let (view_tx, views) = watch::channel(Arc::new(ClusterView::default()));
        let (commands, rx) = mpsc::channel(COMMANDS_QUEUED_MAX);
        let (stop_tx, stop_rx) = watch::channel(Stop::Run);
        let thread = std::thread::Builder::new()
            .name("felix-cluster".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime starts");
                rt.block_on(run(config, view_tx, rx, stop_rx));
            })
            .map_err(|e| ClusterError::InvalidConfig(format!("cannot start a thread: {e}")))?;
        Ok(AgentHandle { node, commands, views, stop: stop_tx, thread: Some(thread) })
    }
}

/// The broker's side of its agent.
pub struct AgentHandle {
    node: NodeId,
    commands: mpsc::Sender<Command>,
    views: watch::Receiver<Arc<ClusterView>>,
    stop: watch::Sender<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a data core holds of the agent: the views and the command queue. Its futures need no
/// runtime (tokio's channels), so a glommio core awaits them directly.
#[derive(Clone, Debug)]
pub struct AgentClient {
    node: NodeId,
    commands: mpsc::Sender<Command>,
    views: watch::Receiver<Arc<ClusterView>>,
}

impl AgentClient {
    /// This broker's node id.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// A receiver of the newest view.
    pub fn views(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.views.clone()
    }

    /// Sends the agent's thread the command `make` builds around a reply channel, and waits
    /// for the answer (`Stopped` once the agent has ended).
    async fn ask<R>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<R, ClusterError>>) -> Command,
    ) -> Result<R, ClusterError> {
        let (reply, rx) = oneshot::channel();
        self.commands.send(make(reply)).await.map_err(|_| ClusterError::Stopped)?;
        rx.await.map_err(|_| ClusterError::Stopped)?
    }

    /// See [`AgentHandle::create_stream`].
    pub async fn create_stream(
        &self,
        name: &str,
        def: StreamDef,
    ) -> Result<(StreamDef, StreamPlacement), ClusterError> {
        self.create_replicated_stream(name, def, 1).await
    }

    /// [`AgentHandle::create_stream`] with `replicas` (1..=[`placement::REPLICAS_MAX`])
    /// replicas per shard on distinct brokers; with more than one, the controller creates each
    /// shard's replica-group record with the placement, its first replica leading epoch 1.
    pub async fn create_replicated_stream(
        &self,
        name: &str,
        def: StreamDef,
        replicas: u8,
    ) -> Result<(StreamDef, StreamPlacement), ClusterError> {
        if replicas == 0 || replicas > placement::REPLICAS_MAX {
            return Err(PlacementError::BadReplicas(replicas).into());
        }
        self.ask(|reply| Command::CreateStream { name: name.to_owned(), def, replicas, reply })
            .await
    }

    /// Deletes `name` cluster-wide: its definition, placement and replica groups go in one
    /// etcd transaction that writes its tombstone ([`crate::Tombstone`]); every broker then
    /// deletes its copy. Returns the definition it had.
    pub async fn delete_stream(&self, name: &str) -> Result<StreamDef, ClusterError> {
        self.ask(|reply| Command::DeleteStream { name: name.to_owned(), reply }).await
    }

    /// Replaces `name`'s definition by `def` (shard count unchanged), a compare-and-swap on
    /// the definition's key; brokers apply it from their views. Returns `def`.
    pub async fn alter_stream(
        &self,
        name: &str,
        def: StreamDef,
    ) -> Result<StreamDef, ClusterError> {
        self.ask(|reply| Command::AlterStream { name: name.to_owned(), def, reply }).await
    }

    /// As the leader of `epoch` of the group of `shard` of `stream`, hands the next epoch to
    /// `target`, an in-sync replica ([`groups::transfer_leadership`]; leader balance), based on
    /// version `expected_version` and the in-sync set `isr` as read. Returns the new record.
    pub async fn transfer_leadership(
        &self,
        stream: &str,
        shard: u32,
        expected_version: i64,
        epoch: u64,
        isr: Vec<NodeId>,
        target: NodeId,
    ) -> Result<ShardGroup, ClusterError> {
        self.ask(|reply| Command::TransferLeadership {
            stream: stream.to_owned(),
            shard,
            expected_version,
            epoch,
            isr,
            target,
            reply,
        })
        .await
    }

    /// See [`AgentHandle::mark_peers_verified`].
    pub async fn mark_peers_verified(&self) -> Result<(), ClusterError> {
        self.ask(|reply| Command::MarkPeersVerified { reply }).await
    }

    /// As the leader of `epoch` of the group of `shard` of `stream`, changes its in-sync set
    /// to `isr` (which must contain this broker), based on the group's version
    /// `expected_version` (`ShardGroup::version` as read in a view). A compare-and-swap in
    /// etcd ([`groups::propose_isr`]), on this agent's current lease: refused with
    /// `Cas(StaleVersion)`, `Cas(NotLeader)`, `Cas(InvalidIsr)` or `Fenced` (this broker's
    /// lease is not the one it was elected on, or expired). Returns the new record.
    pub async fn propose_isr(
        &self,
        stream: &str,
        shard: u32,
        expected_version: i64,
        epoch: u64,
        isr: Vec<NodeId>,
    ) -> Result<ShardGroup, ClusterError> {
        self.ask(|reply| Command::ProposeIsr {
            stream: stream.to_owned(),
            shard,
            expected_version,
            epoch,
            isr,
            reply,
        })
        .await
    }
}

/// What the agent's thread is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Keep going.
    Run,
    /// Resign, revoke the lease, end.
    Leave,
    /// End at once, leaving the lease to expire: what a crash leaves behind (tests).
    Halt,
}

/// The answer to a CreateStream: the definition in force and its placement.
type CreateReply = oneshot::Sender<Result<(StreamDef, StreamPlacement), ClusterError>>;

#[derive(Debug)]
enum Command {
    CreateStream {
        name: String,
        def: StreamDef,
        replicas: u8,
        reply: CreateReply,
    },
    ProposeIsr {
        stream: String,
        shard: u32,
        expected_version: i64,
        epoch: u64,
        isr: Vec<NodeId>,
        reply: oneshot::Sender<Result<ShardGroup, ClusterError>>,
    },
    MarkPeersVerified {
        reply: oneshot::Sender<Result<(), ClusterError>>,
    },
    TransferLeadership {
        stream: String,
        shard: u32,
        expected_version: i64,
        epoch: u64,
        isr: Vec<NodeId>,
        target: NodeId,
        reply: oneshot::Sender<Result<ShardGroup, ClusterError>>,
    },
    DeleteStream {
        name: String,
        reply: oneshot::Sender<Result<StreamDef, ClusterError>>,
    },
    AlterStream {
        name: String,
        def: StreamDef,
        reply: oneshot::Sender<Result<StreamDef, ClusterError>>,
    },
}

impl AgentHandle {
    /// This broker's node id.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// A receiver of the newest view (one slot; an unread view is replaced by a newer one).
    pub fn views(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.views.clone()
    }

    /// The newest view.
    pub fn view(&self) -> Arc<ClusterView> {
        self.views.borrow().clone()
    }

    /// A cloneable, `Send` client of this agent, for the broker's data cores.
    pub fn client(&self) -> AgentClient {
        AgentClient {
            node: self.node.clone(),
            commands: self.commands.clone(),
            views: self.views.clone(),
        }
    }

    /// Defines `name` cluster-wide unless it exists, and waits until the controller placed
    /// it. Returns the definition in force (an existing one wins) and its placement.
    pub async fn create_stream(
        &self,
        name: &str,
        def: StreamDef,
    ) -> Result<(StreamDef, StreamPlacement), ClusterError> {
        self.client().create_stream(name, def).await
    }

    /// See [`AgentClient::create_replicated_stream`].
    pub async fn create_replicated_stream(
        &self,
        name: &str,
        def: StreamDef,
        replicas: u8,
    ) -> Result<(StreamDef, StreamPlacement), ClusterError> {
        self.client().create_replicated_stream(name, def, replicas).await
    }

    /// Records in this broker's member key that its replication links reach every other live
    /// broker (`Member::peers_verified`), so that the controller may place replicas on it; kept
    /// for the rest of the agent's life, across sessions.
    pub async fn mark_peers_verified(&self) -> Result<(), ClusterError> {
        self.client().mark_peers_verified().await
    }

    /// See [`AgentClient::propose_isr`].
    pub async fn propose_isr(
        &self,
        stream: &str,
        shard: u32,
        expected_version: i64,
        epoch: u64,
        isr: Vec<NodeId>,
    ) -> Result<ShardGroup, ClusterError> {
        self.client().propose_isr(stream, shard, expected_version, epoch, isr).await
    }

    /// Stops the agent: resigns the controller role, revokes the lease (so the others see
    /// this broker leave at once) and joins its thread.
    pub fn stop(mut self) {
        self.shutdown(Stop::Leave);
    }

    /// Stops the agent without resigning or revoking its lease, as a crash would: the others
    /// see this broker leave only when its lease expires. For failure tests.
    pub fn halt(mut self) {
        self.shutdown(Stop::Halt);
    }

    fn shutdown(&mut self, how: Stop) {
        let _ = self.stop.send(how);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.shutdown(Stop::Leave);
    }
}

/// One agent's state across sessions.
struct State {
    config: AgentConfig,
    view: ClusterView,
    candidates: Candidates,
    view_tx: watch::Sender<Arc<ClusterView>>,
    /// The lease of the current (or last) session.
    lease: Option<i64>,
    /// CreateStream requests waiting for a placement.
    waiting: Vec<(String, Instant, CreateReply)>,
    /// When each stream that could not be placed was last warned about.
    placement_warnings: WarnEvery,
    /// CreateStream requests with more replicas than live brokers, held back briefly.
    deferred: Vec<Deferred>,
    /// When this agent started.
    started: Instant,
}

async fn run(
    config: AgentConfig,
    view_tx: watch::Sender<Arc<ClusterView>>,
    mut commands: mpsc::Receiver<Command>,
    mut stop: watch::Receiver<Stop>,
) {
    let mut st = State {
        config,
        view: ClusterView::default(),
        candidates: BTreeMap::new(),
        view_tx,
        lease: None,
        waiting: Vec::new(),
        placement_warnings: WarnEvery::new(Duration::from_millis(PLACEMENT_WARN_INTERVAL_MS)),
        deferred: Vec::new(),
        started: Instant::now(),
    };
    while *stop.borrow() == Stop::Run {
        match session(&mut st, &mut commands, &mut stop).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "cluster agent: etcd session ended; retrying");
                // The lease stays valid until `lease_valid_until` (the last answered keep-alive
                // plus the TTL): the broker goes on acking its own shards until then, and the
                // next session resumes the lease if etcd still holds it.
                st.view.controller = None;
                st.publish();
                // A connection given up for its silence is replaced at once, in time to
                // renew the lease if etcd answers on a new one; errors etcd answered with
                // are retried after a pause.
                let pause =
                    if matches!(e, ClusterError::Unresponsive) { 0 } else { RETRY_INTERVAL_MS };
                let retry = tokio::time::sleep(Duration::from_millis(pause));
                tokio::select! {
                    _ = retry => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }
    for (_, _, reply) in st.waiting.drain(..) {
        let _ = reply.send(Err(ClusterError::Stopped));
    }
}

/// One etcd session: a lease, the member key, a campaign, and the watch. Returns `Ok` when
/// asked to stop, an error when the session is lost.
async fn session(
    st: &mut State,
    commands: &mut mpsc::Receiver<Command>,
    stop: &mut watch::Receiver<Stop>,
) -> Result<(), ClusterError> {
    let options = connect_options().with_timeout(Duration::from_millis(REQUEST_TIMEOUT_MS));
    let mut client = Client::connect(&st.config.endpoints, Some(options)).await?;
    let ttl = st.config.lease_ttl_s;
    // The lease's validity stays out of the view until the view is loaded for this lease: the
    // view in hand may be a lost lease's (it names this broker leader of epochs elected on
    // that lease), and published with a new lease's validity it would let the broker act for
    // them again.
    let (lease, valid_until) = match resume_lease(st, &mut client).await? {
        Some(held) => held,
        None => {
            let granted_at = Instant::now();
            let lease = client.lease_grant(i64::from(ttl), None).await?.id();
            register(st, &mut client, lease).await?;
            st.lease = Some(lease);
            (lease, granted_at + Duration::from_secs(u64::from(ttl)))
        }
    };
    let mut keep = AgentState::new(Duration::from_secs(u64::from(ttl)));
    keep.session_started(valid_until);
    // Opening the stream sends the first keep-alive.
    keep.keepalive_sent(Instant::now()).map_err(session_end)?;
    let (mut keeper, mut keep_stream) = within(client.lease_keep_alive(lease)).await?;
    let mut keep_tick = tokio::time::interval(Duration::from_millis(u64::from(ttl) * 1000 / 3));

    let (elected_tx, mut elected_rx) = oneshot::channel::<Result<LeaderKey, ClusterError>>();
    // The campaign blocks until this broker is elected, which may be never: it gets a
    // connection without the per-request timeout (with it, every broker but the controller
    // lost its session each REQUEST_TIMEOUT_MS). Its HTTP/2 pings fail it on a frozen
    // connection (it may reach another etcd member than the session's); the session's other
    // paths notice an etcd that went away; the campaign is aborted with the session.
    let mut campaign_client =
        Client::connect(&st.config.endpoints, Some(connect_options())).await?;
    let name = keys::controller(&st.config.cluster);
    let node = st.config.member.node.to_string();
    let campaign = tokio::spawn(async move {
        let r = campaign_client.campaign(name, node, lease).await;
        let r = r.map_err(ClusterError::from).and_then(|resp| {
            resp.leader().cloned().ok_or(ClusterError::InvalidConfig("no leader key".into()))
        });
        let _ = elected_tx.send(r);
    });
    let _campaign = AbortOnDrop(campaign);
    let mut leader: Option<LeaderKey> = None;

    let (view, candidates) = load(&st.config.cluster, &mut client).await?;
    keep.view_loaded();
    st.view = ClusterView { lease_valid_until: keep.lease_valid_until(), ..view };
    st.candidates = candidates;
    let root = keys::root(&st.config.cluster);
    let watch_opts = WatchOptions::new().with_prefix().with_start_revision(st.view.revision + 1);
    let mut events = within(client.watch(root, Some(watch_opts))).await?;
    st.publish();
    let mut placement_tick = tokio::time::interval(Duration::from_millis(RETRY_INTERVAL_MS));

    loop {
        tokio::select! {
            _ = stop.changed() => {
                if *stop.borrow() == Stop::Halt {
                    return Ok(());
                }
                if let Some(l) = leader.take() {
                    let _ = client
                        .resign(Some(etcd_client::ResignOptions::new().with_leader(l)))
                        .await;
                }
                let _ = client.lease_revoke(lease).await;
                st.lease = None;
                st.view.lease_valid_until = None;
                st.publish();
                return Ok(());
            }
            _ = tokio::time::sleep_until(keep.deadline().unwrap_or_else(Instant::now).into()) => {
                // An answer may wait in the stream while the loop was busy elsewhere: only a
                // deadline with none waiting ends the session.
                match tokio::time::timeout(Duration::ZERO, keep_stream.message()).await {
                    Ok(msg) => handle_keep_answer(st, &mut keep, msg?)?,
                    Err(_) => return Err(ClusterError::Unresponsive),
                }
            }
            _ = keep_tick.tick() => {
                keep.keepalive_sent(Instant::now()).map_err(session_end)?;
                within(keeper.keep_alive()).await?;
            }
            msg = keep_stream.message() => handle_keep_answer(st, &mut keep, msg?)?,
            r = &mut elected_rx, if leader.is_none() => {
                let key = r.map_err(|_| ClusterError::Stopped)??;
                tracing::info!(node = %st.config.member.node, "cluster agent: elected controller");
                leader = Some(key);
                place_new_streams(st, &mut client, leader.as_ref()).await?;
                st.publish();
            }
            resp = events.message() => {
                let Some(resp) = resp? else {
                    return Err(ClusterError::InvalidConfig("watch closed".into()));
                };
                if resp.canceled() {
                    return Err(ClusterError::InvalidConfig("watch canceled".into()));
                }
                let before: BTreeSet<NodeId> = st.view.members.keys().cloned().collect();
                for e in resp.events() {
                    if let Some(kv) = e.kv() {
                        let deleted = e.event_type() == EventType::Delete;
                        let cluster = &st.config.cluster;
                        apply_or_skip(cluster, &mut st.view, &mut st.candidates, kv, deleted);
                    }
                }
                let (joined, left) = membership_changes(&before, &st.view.members);
                for node in joined {
                    tracing::info!(%node, "cluster member joined");
                }
                for node in left {
                    tracing::info!(%node, "cluster member left (its lease ended or it stopped)");
                }
                if let Some(h) = resp.header() {
                    st.view.revision = h.revision();
                }
                st.publish();
                run_elections(st, &mut client).await?;
                place_new_streams(st, &mut client, leader.as_ref()).await?;
                st.answer_waiting();
            }
            cmd = commands.recv() => {
                let Some(cmd) = cmd else { return Ok(()) };
                match cmd {
                    Command::CreateStream { name, def, replicas, reply } => {
                        // More replicas than live brokers: held back, nothing written, and
                        // refused once the start-up grace is over ([`State::few_brokers_until`]).
                        let until = st.few_brokers_until();
                        st.deferred.push(Deferred { name, def, replicas, until, reply });
                        define_deferred(st, &mut client).await?;
                        st.answer_waiting();
                    }
                    Command::ProposeIsr { stream, shard, expected_version, epoch, isr, reply } => {
                        let (base, at) = (expected_version, (stream, shard));
                        let r = propose_isr(st, &mut client, &at.0, at.1, base, epoch, &isr).await;
                        if let Ok(g) = &r {
                            st.view.groups.insert(at, g.clone());
                            st.publish();
                        }
                        let _ = reply.send(r);
                    }
                    Command::TransferLeadership {
                        stream,
                        shard,
                        expected_version,
                        epoch,
                        isr,
                        target,
                        reply,
                    } => {
                        let r = match st.lease {
                            None => Err(ClusterError::Fenced),
                            Some(lease) => {
                                groups::transfer_leadership(
                                    &mut client,
                                    &st.config.cluster,
                                    &stream,
                                    shard,
                                    &st.config.member.node,
                                    lease,
                                    expected_version,
                                    epoch,
                                    &isr,
                                    &target,
                                )
                                .await
                            }
                        };
                        if let Ok(g) = &r {
                            tracing::info!(%stream, shard, %target, epoch = g.epoch, "leadership handed to the preferred replica");
                            st.view.groups.insert((stream, shard), g.clone());
                            st.publish();
                        }
                        let _ = reply.send(r);
                    }
                    Command::DeleteStream { name, reply } => {
                        let _ = reply.send(delete_stream(st, &mut client, &name).await);
                    }
                    Command::AlterStream { name, def, reply } => {
                        let _ = reply.send(alter_stream(st, &mut client, &name, def).await);
                    }
                    Command::MarkPeersVerified { reply } => {
                        st.config.member.peers_verified = true;
                        let r = match st.lease {
                            Some(lease) => put_member(st, &mut client, lease).await,
                            None => Ok(()),
                        };
                        let _ = reply.send(r);
                    }
                }
            }
            _ = placement_tick.tick() => {
                run_elections(st, &mut client).await?;
                define_deferred(st, &mut client).await?;
                place_new_streams(st, &mut client, leader.as_ref()).await?;
                st.answer_waiting();
            }
        }
    }
}

/// Credits a keep-alive answer to the oldest unanswered keep-alive and publishes the lease's
/// new validity; an answer without a TTL (or the stream's end) means the lease is gone.
fn handle_keep_answer(
    st: &mut State,
    keep: &mut AgentState<Instant>,
    answer: Option<LeaseKeepAliveResponse>,
) -> Result<(), ClusterError> {
    let ttl = answer.map(|r| Duration::from_secs(r.ttl().max(0) as u64));
    if let Some(until) = keep.keepalive_answered(ttl).map_err(session_end)? {
        st.view.lease_valid_until = Some(until);
        st.publish();
    }
    Ok(())
}

/// The members that joined and left between `before` and `after` (each said once, as the
/// watch reports it).
fn membership_changes<V>(
    before: &BTreeSet<NodeId>,
    after: &BTreeMap<NodeId, V>,
) -> (Vec<NodeId>, Vec<NodeId>) {
    let joined = after.keys().filter(|n| !before.contains(*n)).cloned().collect();
    let left = before.iter().filter(|n| !after.contains_key(*n)).cloned().collect();
    (joined, left)
}

/// The error that ends a session the agent's state gave up.
fn session_end(end: SessionEnd) -> ClusterError {
    match end {
        SessionEnd::Unresponsive => ClusterError::Unresponsive,
        SessionEnd::LeaseLost => ClusterError::InvalidConfig("membership lease lost".into()),
    }
}

/// The previous session's lease, if etcd still holds it with this broker's member key on it
/// (etcd was away for less than a TTL, or renewed its leases when it came back).
/// Returns it with the time it is known to hold until.
async fn resume_lease(
    st: &mut State,
    client: &mut Client,
) -> Result<Option<(i64, Instant)>, ClusterError> {
    let Some(lease) = st.lease.take() else { return Ok(None) };
    let asked_at = Instant::now();
    let left = client.lease_time_to_live(lease, None).await?.ttl();
    // -1: gone. 0: less than a second left (etcd truncates), still worth a keep-alive: if it
    // arrives too late, its answer says the lease is gone and the next session starts anew.
    if left < 0 {
        return Ok(None);
    }
    let key = keys::member(&st.config.cluster, st.config.member.node.as_str());
    let held = client.get(key, None).await?.kvs().first().is_some_and(|kv| kv.lease() == lease);
    if !held {
        let _ = client.lease_revoke(lease).await;
        return Ok(None);
    }
    st.lease = Some(lease);
    Ok(Some((lease, asked_at + Duration::from_secs(left as u64))))
}

/// Writes this broker's member key again on `lease` (it holds the key), with what
/// `st.config.member` says now.
async fn put_member(st: &State, client: &mut Client, lease: i64) -> Result<(), ClusterError> {
    let key = keys::member(&st.config.cluster, st.config.member.node.as_str());
    let value = serde_json::to_vec(&st.config.member).expect("a member serializes");
    client.put(key, value, Some(PutOptions::new().with_lease(lease))).await?;
    Ok(())
}

/// Writes this broker's member key on `lease`, unless another live broker holds the node id.
/// A key left by this node's previous run (a lease not yet expired after a crash) is waited
/// out for up to one TTL.
async fn register(st: &State, client: &mut Client, lease: i64) -> Result<(), ClusterError> {
    let key = keys::member(&st.config.cluster, st.config.member.node.as_str());
    let value = serde_json::to_vec(&st.config.member).expect("a member serializes");
    let deadline = Instant::now() + Duration::from_secs(u64::from(st.config.lease_ttl_s) + 1);
    loop {
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        if client.txn(txn).await?.succeeded() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ClusterError::NodeIdTaken(st.config.member.node.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(RETRY_INTERVAL_MS)).await;
    }
}

/// Loads every key of the cluster into a fresh view (without a lease validity) and its
/// controller candidates; the view's revision is the one it reflects.
async fn load(
    cluster: &str,
    client: &mut Client,
) -> Result<(ClusterView, Candidates), ClusterError> {
    let resp = client.get(keys::root(cluster), Some(GetOptions::new().with_prefix())).await?;
    let mut view = ClusterView::default();
    let mut candidates = Candidates::new();
    for kv in resp.kvs() {
        apply_or_skip(cluster, &mut view, &mut candidates, kv, false);
    }
    view.revision = resp.header().map_or(0, |h| h.revision());
    Ok((view, candidates))
}

/// A CreateStream held back until enough brokers are live to hold its replicas.
#[derive(Debug)]
struct Deferred {
    name: String,
    def: StreamDef,
    replicas: u8,
    /// Refused with `TooFewBrokers` if still too few by then.
    until: Instant,
    reply: CreateReply,
}

/// Defines each held-back stream whose replicas the live brokers can hold now (or that exists
/// already: the first definition wins), and refuses those still short past their time, with
/// nothing written: a definition that can never be placed would stay for ever.
async fn define_deferred(st: &mut State, client: &mut Client) -> Result<(), ClusterError> {
    let now = Instant::now();
    let live = st.view.members.len();
    for d in std::mem::take(&mut st.deferred) {
        let fits = usize::from(d.replicas) <= live || st.view.streams.contains_key(&d.name);
        if fits {
            match define_stream(st, client, &d.name, d.def, d.replicas).await {
                Ok(()) => st.waiting.push((d.name, now, d.reply)),
                Err(e) => {
                    let _ = d.reply.send(Err(e));
                }
            }
        } else if now >= d.until {
            let e = PlacementError::TooFewBrokers { replicas: d.replicas, live };
            let _ = d.reply.send(Err(e.into()));
        } else {
            st.deferred.push(d);
        }
    }
    Ok(())
}

/// Defines `name` with `replicas` replicas per shard unless it exists (the first definition
/// wins).
async fn define_stream(
    st: &State,
    client: &mut Client,
    name: &str,
    def: StreamDef,
    replicas: u8,
) -> Result<(), ClusterError> {
    let key = keys::stream(&st.config.cluster, name);
    let value =
        serde_json::to_vec(&StreamRecord { def, replicas }).expect("a definition serializes");
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.as_str(), value, None)]);
    client.txn(txn).await?;
    Ok(())
}

/// Deletes `name`'s definition, placement and groups and writes its tombstone, in one
/// transaction conditional on the definition being the one read (its create and mod
/// revisions). Returns the definition deleted.
async fn delete_stream(
    st: &mut State,
    client: &mut Client,
    name: &str,
) -> Result<StreamDef, ClusterError> {
    let cluster = st.config.cluster.clone();
    let key = keys::stream(&cluster, name);
    let (record, create_rev, mod_rev) = read_stream(client, &key, name).await?;
    let tombstone = serde_json::to_vec(&crate::Tombstone { incarnation: create_rev })
        .expect("a tombstone serializes");
    let txn = Txn::new()
        .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, mod_rev)])
        .and_then([
            TxnOp::delete(key.as_str(), None),
            TxnOp::delete(keys::placement(&cluster, name), None),
            TxnOp::delete(
                keys::groups_of(&cluster, name),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ),
            TxnOp::put(keys::tombstone(&cluster, name), tombstone, None),
        ]);
    if !client.txn(txn).await?.succeeded() {
        return Err(ClusterError::StreamChanged(name.to_owned()));
    }
    tracing::info!(stream = %name, incarnation = create_rev, "stream deleted");
    // In this broker's view at once (the watch brings the same): its cores must not adopt
    // the stream again from a view older than the delete.
    let view = &mut st.view;
    view.streams.remove(name);
    view.placements.remove(name);
    view.replication.remove(name);
    view.incarnations.remove(name);
    view.groups.retain(|(stream, _), _| stream != name);
    view.deleted.insert(name.to_owned(), crate::Tombstone { incarnation: create_rev });
    st.publish();
    Ok(record.def)
}

/// Writes `def` as `name`'s definition (replicas as they are), conditional on the definition
/// being the one read.
async fn alter_stream(
    st: &mut State,
    client: &mut Client,
    name: &str,
    def: StreamDef,
) -> Result<StreamDef, ClusterError> {
    let key = keys::stream(&st.config.cluster, name);
    let (record, _, mod_rev) = read_stream(client, &key, name).await?;
    if def.shards != record.def.shards {
        return Err(ClusterError::InvalidConfig("a stream's shard count cannot change".into()));
    }
    let value = serde_json::to_vec(&StreamRecord { def, replicas: record.replicas })
        .expect("a definition serializes");
    let txn = Txn::new()
        .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, mod_rev)])
        .and_then([TxnOp::put(key.as_str(), value, None)]);
    if !client.txn(txn).await?.succeeded() {
        return Err(ClusterError::StreamChanged(name.to_owned()));
    }
    tracing::info!(stream = %name, ?def, "stream altered");
    st.view.streams.insert(name.to_owned(), def);
    st.publish();
    Ok(def)
}

/// `name`'s definition record as etcd has it now, with its key's create and mod revisions.
async fn read_stream(
    client: &mut Client,
    key: &str,
    name: &str,
) -> Result<(StreamRecord, i64, i64), ClusterError> {
    let resp = client.get(key, None).await?;
    let Some(kv) = resp.kvs().first() else { return Err(ClusterError::NoStream(name.to_owned())) };
    let record: StreamRecord = serde_json::from_slice(kv.value())
        .map_err(|e| ClusterError::Corrupt { key: key.to_owned(), why: e.to_string() })?;
    Ok((record, kv.create_revision(), kv.mod_revision()))
}

/// While this broker is the controller: places every defined stream that has no placement.
/// Each write is conditional on this broker still holding the election key (fencing: a
/// deposed controller's write fails) and on the placement still being absent. A replicated
/// stream's group records are written first, on the same conditions, each shard's first
/// replica elected for epoch 1 on the lease its member key is on.
async fn place_new_streams(
    st: &mut State,
    client: &mut Client,
    leader: Option<&LeaderKey>,
) -> Result<(), ClusterError> {
    let Some(leader) = leader else { return Ok(()) };
    let unplaced: Vec<(String, StreamDef)> = st
        .view
        .streams
        .iter()
        .filter(|(name, _)| !st.view.placements.contains_key(*name))
        .map(|(n, d)| (n.clone(), *d))
        .collect();
    for (name, def) in unplaced {
        let replicas = st.view.replication.get(&name).copied().unwrap_or(1);
        // Replicas only on brokers whose peer links are verified: a shard led by a broker its
        // followers cannot connect to (or accept) would never commit.
        let live: BTreeSet<NodeId> = st
            .view
            .members
            .iter()
            .filter(|(_, m)| replicas == 1 || m.peers_verified)
            .map(|(n, _)| n.clone())
            .collect();
        let load = placement::load(st.view.placements.values());
        let leaders = placement::leaders(st.view.placements.values());
        let p = match placement::assign_replicas(def.shards, replicas, &live, &load, &leaders) {
            Ok(p) => p,
            Err(e) => {
                if st.placement_warnings.should_warn(&name, Instant::now()) {
                    let unverified: Vec<&str> = st
                        .view
                        .members
                        .values()
                        .filter(|m| !m.peers_verified)
                        .map(|m| m.node.as_str())
                        .collect();
                    tracing::warn!(
                        stream = %name,
                        error = %e,
                        ?unverified,
                        "cannot place stream yet (brokers whose replication links to every other \
                         broker are not verified get no replicas: see their logs)"
                    );
                }
                continue;
            }
        };
        let key = keys::placement(&st.config.cluster, &name);
        let def_key = keys::stream(&st.config.cluster, &name);
        let incarnation = st.view.incarnations.get(&name).copied().unwrap_or(0);
        let leader_key = String::from_utf8_lossy(leader.key()).into_owned();
        // ... and on the definition being the incarnation seen: a stream deleted meanwhile
        // gets no placement or groups (the delete's transaction removed them).
        let held = || {
            vec![
                Compare::create_revision(leader_key.as_str(), CompareOp::Equal, leader.rev()),
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Compare::create_revision(def_key.as_str(), CompareOp::Equal, incarnation),
            ]
        };
        // The groups first, in transactions of GROUP_PUTS_PER_TXN (etcd caps the operations
        // of one); each only while this broker is the controller and the stream unplaced.
        // Nothing serves or elects an unplaced stream's groups, so a deposed controller's
        // partial set is simply overwritten by the next one's.
        let mut all_groups = true;
        for (chunk, sets) in p.replicas.chunks(GROUP_PUTS_PER_TXN).enumerate() {
            let ops: Vec<TxnOp> = sets
                .iter()
                .enumerate()
                .map(|(i, set)| {
                    let shard = (chunk * GROUP_PUTS_PER_TXN + i) as u32;
                    // The first replica leads epoch 1 on the lease its member key is on now;
                    // if that lease is gone by then, the agents elect another at once.
                    let lease = st.view.member_leases.get(&set[0]).copied();
                    let group = ShardGroup::initial(set.clone(), lease);
                    TxnOp::put(keys::group(&st.config.cluster, &name, shard), group.to_json(), None)
                })
                .collect();
            if !client.txn(Txn::new().when(held()).and_then(ops)).await?.succeeded() {
                all_groups = false;
                break;
            }
        }
        if !all_groups {
            continue;
        }
        let put = TxnOp::put(key.as_str(), serde_json::to_vec(&p).expect("serializes"), None);
        let txn = Txn::new().when(held()).and_then([put]);
        if client.txn(txn).await?.succeeded() {
            tracing::info!(stream = %name, owners = ?p.owners, "placed stream");
            // The watch brings it too; record it now so the next stream sees this load.
            st.view.placements.insert(name, p);
        }
    }
    Ok(())
}

/// Runs an election for every group of a placed stream this broker is an in-sync replica of
/// whose leader's lease is gone (or that has no leader): it proposes itself
/// ([`groups::elect`]); of racing candidates the transaction lets exactly one win. Only while
/// this broker's own lease holds.
async fn run_elections(st: &mut State, client: &mut Client) -> Result<(), ClusterError> {
    let Some(lease) = st.lease else { return Ok(()) };
    let me = st.config.member.node.clone();
    if !st.view.lease_holds(Instant::now()) || st.view.member_leases.get(&me) != Some(&lease) {
        return Ok(());
    }
    let live: BTreeSet<NodeId> = st.view.members.keys().cloned().collect();
    let due: Vec<((String, u32), ShardGroup)> = st
        .view
        .groups
        .iter()
        .filter(|((stream, _), g)| {
            st.view.placements.contains_key(stream)
                && g.isr.contains(&me)
                && !g.leader_alive(&st.view.member_leases)
        })
        .map(|(at, g)| (at.clone(), g.clone()))
        .collect();
    let mut changed = false;
    for ((stream, shard), g) in due {
        let cluster = st.config.cluster.clone();
        match groups::elect(client, &cluster, &stream, shard, &g, &me, lease, &live).await {
            Ok(next) => {
                tracing::info!(%stream, shard, epoch = next.epoch, "elected shard leader");
                st.view.groups.insert((stream, shard), next);
                changed = true;
            }
            Err(ClusterError::Etcd(e)) => return Err(e.into()),
            Err(e) => tracing::debug!(%stream, shard, error = %e, "election not won"),
        }
    }
    if changed {
        st.publish();
    }
    Ok(())
}

/// [`groups::propose_isr`] as this broker, on its current lease.
async fn propose_isr(
    st: &State,
    client: &mut Client,
    stream: &str,
    shard: u32,
    expected_version: i64,
    epoch: u64,
    isr: &[NodeId],
) -> Result<ShardGroup, ClusterError> {
    let Some(lease) = st.lease else { return Err(ClusterError::Fenced) };
    let me = &st.config.member.node;
    let cluster = &st.config.cluster;
    groups::propose_isr(client, cluster, stream, shard, me, lease, expected_version, epoch, isr)
        .await
}

/// Options of every etcd connection: a connect timeout, and HTTP/2 pings while calls are open
/// so that a connection that stops answering fails its calls.
fn connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .with_keep_alive(
            Duration::from_millis(HTTP2_PING_INTERVAL_MS),
            Duration::from_millis(HTTP2_PING_TIMEOUT_MS),
        )
        // No pings on an idle connection: etcd counts those against the client too.
        .with_keep_alive_while_idle(false)
}

/// `call` with [`REQUEST_TIMEOUT_MS`]: for the calls the connection's request timeout does
/// not cover (opening a stream, sending on one).
async fn within<T>(
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(Duration::from_millis(REQUEST_TIMEOUT_MS), call).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(ClusterError::TimedOut(REQUEST_TIMEOUT_MS)),
    }
}

impl State {
    fn publish(&self) {
        self.view_tx.send_replace(Arc::new(self.view.clone()));
    }

    /// Answers the CreateStream requests whose stream is placed (or that waited too long).
    /// Until when a CreateStream with more replicas than live brokers waits for more to
    /// join: while the cluster may still be starting (this agent started less than
    /// [`FEW_BROKERS_GRACE_TTLS`] lease TTLs ago, so the other brokers' member keys may not be
    /// in its view yet) until that grace is over; later it is refused at once.
    fn few_brokers_until(&self) -> Instant {
        let ttl = Duration::from_secs(u64::from(self.config.lease_ttl_s));
        (self.started + ttl * FEW_BROKERS_GRACE_TTLS).max(Instant::now())
    }

    fn answer_waiting(&mut self) {
        let wait = Duration::from_millis(PLACEMENT_WAIT_MS);
        let view = &self.view;
        let mut still = Vec::new();
        for (name, since, reply) in self.waiting.drain(..) {
            match (view.streams.get(&name), view.placements.get(&name)) {
                (Some(d), Some(p)) => {
                    let _ = reply.send(Ok((*d, p.clone())));
                }
                _ if since.elapsed() >= wait => {
                    let _ = reply.send(Err(ClusterError::TimedOut(PLACEMENT_WAIT_MS)));
                }
                _ => still.push((name, since, reply)),
            }
        }
        self.waiting = still;
    }
}

/// Aborts a spawned task when dropped (a session's campaign ends with the session).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_and_leaves_are_the_members_that_appeared_and_went() {
        let n = |s: &str| NodeId::new(s).unwrap();
        let before: BTreeSet<NodeId> = [n("b1"), n("b2"), n("b3")].into_iter().collect();
        let after: BTreeMap<NodeId, ()> = [(n("b1"), ()), (n("b3"), ()), (n("b4"), ())].into();
        assert_eq!(membership_changes(&before, &after), (vec![n("b4")], vec![n("b2")]));
        let same: BTreeMap<NodeId, ()> = before.iter().map(|m| (m.clone(), ())).collect();
        assert_eq!(membership_changes(&before, &same), (vec![], vec![]));
    }
}
