//! The broker application: what each core runs on top of the QUIC endpoint, and the process
//! around the cores (start-up checks, admin thread, signals, shutdown).
//!
//! - `auth`: bearer tokens (JWT) and what they allow.
//! - `cluster`: each core's copy of the cluster view, ownership checks and fencing.
//! - `core`: one core's state and the handling of its own shards.
//! - `error`: what a client hears when a request is refused, and why start-up failed.
//! - `mesh`: requests between cores (forwarded publishes, remote reads, commits).
//! - `session`: one client connection: Hello, requests, publish and acks.
//! - `subscribe`: subscriptions and their per-shard pumps.
//! - `tail`: the in-memory live tail of each owned shard, encoded once for all subscribers.
//! - `meta`: stream definitions, the per-tenant stream quota, and the data directory's layout
//!   file.
//! - `disk`: the free-space floor (`--min-free-bytes`).
//! - `replication`: the replication driver (in a cluster): each replicated shard's state
//!   machine, its disk operations, and the links to the peer brokers.
//! - `stats`: per-core counters and histograms.

pub mod auth;
pub mod cluster;
pub mod core_app;
pub mod disk;
pub mod error;
pub mod frames;
pub mod mesh;
pub mod meta;
pub mod offsets;
pub mod publish;
pub mod replication;
pub mod session;
pub mod stats;
pub mod subscribe;
pub mod tail;
pub mod tasks;

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use felix_proto::{Limits, Retention};
use felix_storage::{CoreStore, RetentionConfig, StorageConfig, BATCH_BYTES_LIMIT};
use glommio::sync::Semaphore;

use self::core_app::{CoreApp, Settings};
use self::error::{CoreOpenError, StartError};
use self::mesh::{Mesh, MeshMsg, MeshPlan, MESH_REQUESTS_IN_FLIGHT_MAX};
use self::stats::AppStats;
use crate::config::ServeArgs;
use crate::net::{NetConfig, Server, TlsSource};

/// How long shutdown waits for in-flight appends to finish and logs to flush.
pub const DRAIN_TIMEOUT_MS: u64 = 10_000;
/// How long start-up waits for a just-released port before calling it taken.
pub const PORT_RELEASE_WAIT_MS: u64 = 3_000;
/// How long start-up waits for the cluster agent's first lease before serving anyway (requests
/// for this broker's shards get ShardUnavailable until it has one).
pub const CLUSTER_JOIN_WAIT_MS: u64 = 10_000;
/// How often retention runs.
pub const RETENTION_INTERVAL_MS: u64 = 10_000;
/// How long start-up waits for every core to open its storage and recover its logs (a large
/// data directory takes a while) before it gives up.
pub const CORE_START_TIMEOUT_MS: u64 = 600_000;
/// How often a core looks for the main thread's shutdown request.
pub const SHUTDOWN_POLL_MS: u64 = 20;
/// How often a stopping core looks again at its in-flight appends and at the flush request.
pub const DRAIN_POLL_MS: u64 = 5;
/// How often start-up looks whether the cluster agent holds its first lease.
pub const CLUSTER_JOIN_POLL_MS: u64 = 50;
/// How often start-up tries again to bind a port that is still held.
pub const PORT_RELEASE_POLL_MS: u64 = 100;

/// A running broker.
pub struct Broker {
    handle: crate::net::ServerHandle,
    stop: Arc<ShutdownFlags>,
    drained: mpsc::Receiver<()>,
    cores: usize,
    /// Per-core statistics.
    pub stats: Arc<Vec<Arc<AppStats>>>,
    /// Net counters refreshed by [`Broker::refresh`].
    pub net: crate::net::NetSnapshot,
    /// Whether the broker is serving (for `/health`).
    pub ready: Arc<AtomicBool>,
    /// The cluster agent (`--cluster-etcd`), stopped last at shutdown.
    agent: Option<felix_cluster::AgentHandle>,
    /// The cluster's name (`--cluster-name`).
    cluster_name: String,
    /// The data directory's lock, held until the broker is dropped (after its cores stopped).
    _lock: crate::sys::lock::DataDirLock,
}

impl Broker {
    /// Starts every core. Returns once each core has recovered its logs.
    ///
    /// In order: the start-up checks, the cluster agent (with `--cluster-etcd`), the cores'
    /// settings, storage and network configurations, then the server, whose cores each open
    /// their storage and report back ([`CoreLauncher`]).
    pub fn start(args: &ServeArgs) -> Result<Broker, StartError> {
        let lock = check_startup(args)?;
        let agent = start_agent(args)?;
        let settings = core_settings(args, &agent)?;
        let storage = storage_config(args, &settings)?;
        let net = net_config(args);
        let cores = args.cores;
        let stats: Arc<Vec<Arc<AppStats>>> =
            Arc::new((0..cores).map(|_| Arc::new(AppStats::default())).collect());
        let stop = Arc::new(ShutdownFlags::default());
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), CoreOpenError>>();
        let (drained_tx, drained_rx) = mpsc::channel::<()>();
        let launcher = CoreLauncher {
            plan: Arc::new(MeshPlan::new(cores)),
            settings,
            storage,
            stats: stats.clone(),
            stop: stop.clone(),
            ready: Mutex::new(ready_tx),
            drained: Mutex::new(drained_tx),
        };
        let handle = Server::start(net, move |ctx| launcher.launch(ctx))
            .map_err(|e| StartError::from_server(e, args.listen))?;
        let handle = wait_for_cores(handle, &ready_rx, cores)?;
        let broker = Broker {
            handle,
            stop,
            drained: drained_rx,
            cores,
            stats,
            net: Arc::new(Mutex::new(Vec::new())),
            ready: Arc::new(AtomicBool::new(true)),
            agent,
            cluster_name: args.cluster_name.clone(),
            _lock: lock,
        };
        broker.refresh();
        Ok(broker)
    }

    /// The UDP address the broker listens on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.handle.local_addr()
    }

    /// The steering mode in effect.
    pub fn steering(&self) -> impl std::fmt::Debug {
        self.handle.steering()
    }

    /// Copies the cores' network counters for the admin thread.
    pub fn refresh(&self) {
        let snap: Vec<Vec<(&'static str, u64)>> =
            self.handle.stats().iter().map(|s| s.fields()).collect();
        if let Ok(mut n) = self.net.lock() {
            *n = snap;
        }
    }

    /// Stops accepting publishes on every core, waits until no append is in flight anywhere
    /// (forwarded ones included), flushes every log, then closes every connection and stops the
    /// cores. Returns false if a core did not drain or flush in time.
    pub fn shutdown(self) -> bool {
        self.ready.store(false, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_millis(DRAIN_TIMEOUT_MS);
        let mut clean = true;
        // Phase 1: every core refuses new publishes and waits for its in-flight appends.
        self.stop.refuse.store(true, Ordering::Relaxed);
        clean &= self.wait_cores(deadline, "drain");
        // Phase 2: nothing can arrive any more; every core flushes.
        self.stop.flush.store(true, Ordering::Relaxed);
        clean &= self.wait_cores(deadline, "flush");
        self.handle.shutdown();
        // Last: leave the cluster (resign, revoke the lease) once nothing is served any more.
        if let Some(agent) = self.agent {
            agent.stop();
        }
        clean
    }

    /// What `/ready` checks: the serving flag, the cores' reports and, in a cluster, the
    /// lease and the peers ([`crate::ready`]).
    pub fn readiness(&self) -> crate::ready::Readiness {
        let views = self.agent.as_ref().map(felix_cluster::AgentHandle::views);
        crate::ready::Readiness::new(self.ready.clone(), self.stats.clone(), views)
            .named(&self.cluster_name)
    }

    /// The cluster agent's newest view, for a broker in a cluster.
    pub fn cluster_view(&self) -> Option<Arc<felix_cluster::ClusterView>> {
        self.agent.as_ref().map(felix_cluster::AgentHandle::view)
    }

    fn wait_cores(&self, deadline: Instant, phase: &str) -> bool {
        for _ in 0..self.cores {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.drained.recv_timeout(left).is_err() {
                let timeout = Duration::from_millis(DRAIN_TIMEOUT_MS);
                eprintln!("felix: shutdown: a core did not {phase} within {timeout:?}");
                return false;
            }
        }
        true
    }
}

/// What each core needs to start, shared by the server's core threads.
struct CoreLauncher {
    plan: Arc<MeshPlan>,
    settings: Settings,
    storage: StorageConfig,
    stats: Arc<Vec<Arc<AppStats>>>,
    stop: Arc<ShutdownFlags>,
    /// Each core reports here once its storage is open (or why it is not).
    ready: Mutex<mpsc::Sender<Result<(), CoreOpenError>>>,
    /// Each core reports here at each shutdown phase it finishes.
    drained: Mutex<mpsc::Sender<()>>,
}

impl CoreLauncher {
    /// The future core `ctx` runs: open the core, report, then serve its connections.
    fn launch(&self, ctx: crate::net::CoreContext) -> impl std::future::Future<Output = ()> {
        let core = ctx.core();
        let ends = self.plan.take(core);
        let settings = self.settings.clone();
        let storage = self.storage.clone();
        let stats = self.stats[usize::from(core.0)].clone();
        let stop = self.stop.clone();
        let ready = self.ready.lock().map(|t| t.clone()).ok();
        let drained = self.drained.lock().map(|t| t.clone()).ok();
        async move {
            let (Some(ends), Some(ready), Some(drained)) = (ends, ready, drained) else {
                eprintln!("felix: {core}: mesh or channels already taken");
                return;
            };
            tracing::debug!(core = core.0, "opening core");
            let started = open_core(&ctx, ends, settings, storage, stats).await;
            let app = match started {
                Ok(app) => {
                    let _ = ready.send(Ok(()));
                    app
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            // Once the server stops accepting (it has closed every connection), or when this
            // future is dropped, the core's tasks end, and with them its state and open logs.
            let _stop = app.tasks().stop_on_drop();
            app.tasks().spawn(watch_stop(app.clone(), stop, drained));
            while let Some(conn) = ctx.accept().await {
                app.tasks().spawn(session::serve_connection(app.clone(), conn));
            }
        }
    }
}

/// The checks made before anything starts: the data directory (and its lock, which the
/// caller holds for the broker's life), the port, io_uring, the layout file, and
/// `--default-shards`.
fn check_startup(args: &ServeArgs) -> Result<crate::sys::lock::DataDirLock, StartError> {
    check_data_dir(&args.data_dir)?;
    let lock = crate::sys::lock::DataDirLock::acquire(&args.data_dir)
        .map_err(StartError::DataDirLocked)?;
    check_port_free(args.listen)?;
    check_io_uring()?;
    meta::check_layout(&args.data_dir, args.cores).map_err(StartError::Layout)?;
    finish_interrupted_deletes(&args.data_dir, args.cores).map_err(StartError::Layout)?;
    let max = core_app::max_shards(args.cores);
    if args.default_shards > max {
        return Err(StartError::DefaultShards {
            shards: args.default_shards,
            max,
            cores: args.cores,
        });
    }
    Ok(lock)
}

/// Finishes the stream deletes a stop interrupted ([`meta::begin_delete`]): each core's log
/// directory of the stream, then its set-aside definition, go.
fn finish_interrupted_deletes(
    data_dir: &std::path::Path,
    cores: usize,
) -> Result<(), meta::MetaError> {
    for m in meta::interrupted_deletes(data_dir)? {
        let dir_name = felix_storage::stream_dir_name(m.name.as_str()).map_err(|e| {
            meta::MetaError::Corrupt { path: data_dir.join("streams"), why: e.to_string() }
        })?;
        for core in 0..cores {
            let dir = data_dir.join(format!("core-{core}")).join(&dir_name);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(meta::MetaError::Io { path: dir, source }),
            }
        }
        meta::finish_delete(data_dir, &m.name)?;
        eprintln!("felix: finished deleting stream {} (a stop interrupted its delete)", m.name);
    }
    Ok(())
}

/// What every core is told: limits, budgets, retention, tokens, the cluster agent.
fn core_settings(
    args: &ServeArgs,
    agent: &Option<felix_cluster::AgentHandle>,
) -> Result<Settings, StartError> {
    let limits = Limits {
        max_frame_bytes: (BATCH_BYTES_LIMIT as u32)
            .min(felix_proto::limits::MAX_FRAME_BYTES_DEFAULT),
        max_batch_records: felix_proto::limits::MAX_BATCH_RECORDS_DEFAULT,
        max_key_bytes: felix_proto::limits::MAX_KEY_BYTES_DEFAULT,
    };
    Ok(Settings {
        cluster: agent.as_ref().map(felix_cluster::AgentHandle::client),
        default_replicas: args.default_replicas,
        replication: agent.as_ref().map(|_| replication::ReplicationSettings {
            peer_ca: peer_ca(args),
            identity: tls_source(args),
            server_name: args.peer_server_name.clone(),
            min_insync: args.min_insync,
            resident_bytes: args.replica_resident_bytes,
            producers: felix_replication::ProducerLimits {
                expiry_ms: args.producer_expiry.0,
                max: args.max_producers_per_shard,
            },
            leader_balance: args.leader_balance,
        }),
        data_dir: args.data_dir.clone(),
        cores: args.cores,
        auto_create: args.auto_create,
        quota: Arc::new(meta::TenantQuota::new(args.max_streams_per_tenant)),
        min_free_bytes: args.min_free_bytes,
        default_shards: args.default_shards,
        retention: Retention {
            bytes_max: (args.retention_bytes != 0).then_some(args.retention_bytes),
            age_max_ms: (args.retention_ms != 0).then_some(args.retention_ms),
        },
        limits,
        inflight_bytes_per_conn: args.inflight_bytes_per_conn.max(1),
        inflight_bytes_per_core: args.inflight_bytes_per_core.max(1),
        slow_consumer: Duration::from_secs(args.slow_consumer_secs.max(1)),
        max_group_positions: args.max_group_positions_per_core,
        offsets_segment_bytes: args.segment_bytes,
        auth: match args.auth_keys.is_empty() {
            true => None,
            false => Some(Arc::new(
                auth::Authenticator::load(&args.auth_keys).map_err(StartError::AuthKeys)?,
            )),
        },
    })
}

/// The storage configuration every core opens its store with, validated.
fn storage_config(args: &ServeArgs, settings: &Settings) -> Result<StorageConfig, StartError> {
    let mut storage = StorageConfig::new(&args.data_dir);
    storage.segment_bytes_max = args.segment_bytes;
    storage.read_cache_bytes = args.read_cache_bytes;
    storage.producer_expiry_ms = args.producer_expiry.0;
    storage.producers_per_shard_max = args.max_producers_per_shard;
    storage.write_sync = args.write_sync;
    storage.preallocate = args.preallocate;
    storage.batch_bytes_max = BATCH_BYTES_LIMIT;
    storage.batch_records_max = settings.limits.max_batch_records as usize;
    storage.repair = args.repair;
    storage.retention = RetentionConfig {
        bytes_max: settings.retention.bytes_max,
        age_ms_max: settings.retention.age_max_ms,
    };
    storage.validate().map_err(StartError::Storage)?;
    Ok(storage)
}

/// The broker's certificate and key: `--cert`/`--key`, else the development certificate.
fn tls_source(args: &ServeArgs) -> TlsSource {
    match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => TlsSource::Pem { cert: cert.clone(), key: key.clone() },
        _ => TlsSource::Dev { data_dir: args.data_dir.clone() },
    }
}

/// The certificates the other brokers of a cluster are verified against: `--peer-ca`, else
/// this broker's own certificate.
fn peer_ca(args: &ServeArgs) -> std::path::PathBuf {
    args.peer_ca
        .clone()
        .or_else(|| args.cert.clone())
        .unwrap_or_else(|| args.data_dir.join(crate::net::tls::DEV_CERT_FILE))
}

/// The QUIC endpoint's configuration: certificate, CPUs, steering and limits; in a cluster,
/// the roots the other brokers' client certificates are verified against.
fn net_config(args: &ServeArgs) -> NetConfig {
    let mut net = NetConfig::new(args.listen, args.cores, tls_source(args));
    if !args.cluster_etcd.is_empty() {
        net.peer_client_roots = Some(peer_ca(args));
    }
    net.cpus = if args.no_pin {
        Vec::new()
    } else if args.cpus.0.is_empty() {
        (0..args.cores).collect()
    } else {
        args.cpus.0.clone()
    };
    net.steering = args.steering;
    net.max_udp_payload = args.max_udp_payload;
    net.idle_timeout = Duration::from_millis(args.idle_timeout_ms);
    net.max_conns_per_core = args.max_conns_per_core;
    net.max_streams_per_conn = args.max_streams_per_conn;
    net.handshakes_per_sec_per_core = args.handshakes_per_sec_per_core;
    net
}

/// Waits (at most [`CORE_START_TIMEOUT_MS`] in all) until every core has reported that its
/// storage is open; shuts the server down if one failed or did not report.
fn wait_for_cores(
    handle: crate::net::ServerHandle,
    ready: &mpsc::Receiver<Result<(), CoreOpenError>>,
    cores: usize,
) -> Result<crate::net::ServerHandle, StartError> {
    let deadline = Instant::now() + Duration::from_millis(CORE_START_TIMEOUT_MS);
    for _ in 0..cores {
        let left = deadline.saturating_duration_since(Instant::now());
        match ready.recv_timeout(left) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                handle.shutdown();
                return Err(e.into());
            }
            Err(_) => {
                handle.shutdown();
                return Err(StartError::CoreTimeout);
            }
        }
    }
    Ok(handle)
}

/// The two phases of shutdown, set by the main thread and read by each core.
#[derive(Default)]
pub struct ShutdownFlags {
    refuse: AtomicBool,
    flush: AtomicBool,
}

async fn open_core(
    ctx: &crate::net::CoreContext,
    ends: mesh::Ends,
    settings: Settings,
    storage: StorageConfig,
    stats: Arc<AppStats>,
) -> Result<Rc<CoreApp>, CoreOpenError> {
    let core = ctx.core();
    let (mesh, request_rx, reply_rx) = Mesh::connect(ends).await;
    tracing::debug!(core = core.0, "mesh connected");
    let store = CoreStore::open(storage, core)
        .await
        .map_err(|source| CoreOpenError::Storage { core, source })?;
    let replication = settings.replication.clone();
    let app = CoreApp::open(core, settings, store.clone(), mesh.clone(), stats).await?;
    if let (Some(r), Some(agent), Some(link)) =
        (replication, app.settings().cluster.clone(), app.cluster().cloned())
    {
        let stats = app.stats().clone();
        let host = replication::ReplicationShell::new(
            ctx.clone(),
            app.settings().cores,
            &r,
            agent,
            link,
            stats,
        )
        .map_err(|source| CoreOpenError::PeerTls { core, source })?;
        app.set_replication(host.clone());
        let store: Rc<dyn replication::ShardStore> = app.clone();
        app.tasks().spawn(host.clone().run(Rc::downgrade(&store)));
        if core.0 == 0 {
            app.tasks().spawn(replication::verify_peers(host));
        }
    }
    // Replies only complete local waiters: their loops never block.
    for (_, rx) in reply_rx {
        let app = app.clone();
        app.tasks().clone().spawn(async move {
            while let Some(msg) = rx.recv().await {
                if let MeshMsg::Reply { id, resp } = msg {
                    app.mesh().complete(id, resp);
                }
            }
        });
    }
    // Requests: at most MESH_REQUESTS_IN_FLIGHT_MAX at once; past it this core stops taking
    // them and the senders wait on the bounded channels (replies still flow).
    let limit = Rc::new(Semaphore::new(MESH_REQUESTS_IN_FLIGHT_MAX));
    for (_, rx) in request_rx {
        let app = app.clone();
        let limit = limit.clone();
        app.tasks().clone().spawn(async move {
            while let Some(msg) = rx.recv().await {
                let MeshMsg::Request { id, from, req } = msg else { continue };
                let Ok(permit) = limit.acquire_static_permit(1).await else { return };
                let work: Pin<Box<dyn Future<Output = mesh::CoreResponse>>> = match req {
                    mesh::CoreRequest::Append(batch) => {
                        stats::add(&app.stats().counters.forwarded_in, 1);
                        // Queued here, in arrival order: a sender's appends are stored in the
                        // order it sent them.
                        let queued = app.submit_forwarded(batch).await;
                        Box::pin(async move {
                            mesh::CoreResponse::Appended(async { queued?.await }.await)
                        })
                    }
                    other => {
                        let worker = app.clone();
                        Box::pin(async move { worker.handle_request(other).await })
                    }
                };
                let app = app.clone();
                app.tasks().clone().spawn(async move {
                    let resp = work.await;
                    drop(permit);
                    app.mesh().reply(from, id, resp).await;
                });
            }
        });
    }
    if let Err(source) = store.start_retention(Duration::from_millis(RETENTION_INTERVAL_MS)) {
        app.tasks().stop();
        return Err(CoreOpenError::Retention { core, source });
    }
    let sweeper = Rc::downgrade(&app);
    app.tasks().spawn(async move {
        loop {
            glommio::timer::sleep(Duration::from_millis(tail::TAIL_SWEEP_MS)).await;
            let Some(app) = sweeper.upgrade() else { return };
            app.release_tails(Instant::now());
        }
    });
    let publisher = app.clone();
    app.tasks().spawn(async move {
        loop {
            glommio::timer::sleep(Duration::from_millis(stats::HISTOGRAM_PUBLISH_INTERVAL_MS))
                .await;
            publisher.publish_stats();
        }
    });
    Ok(app)
}

async fn watch_stop(app: Rc<CoreApp>, stop: Arc<ShutdownFlags>, drained: mpsc::Sender<()>) {
    while !stop.refuse.load(Ordering::Relaxed) {
        glommio::timer::sleep(Duration::from_millis(SHUTDOWN_POLL_MS)).await;
    }
    app.begin_stopping();
    while app.stats().counters.inflight_bytes.load(Ordering::Relaxed) > 0 {
        glommio::timer::sleep(Duration::from_millis(DRAIN_POLL_MS)).await;
    }
    let _ = drained.send(());
    while !stop.flush.load(Ordering::Relaxed) {
        glommio::timer::sleep(Duration::from_millis(DRAIN_POLL_MS)).await;
    }
    app.flush_all().await;
    app.publish_stats();
    let _ = drained.send(());
}

/// Starts the cluster agent with `--cluster-etcd`, and waits (at most [`CLUSTER_JOIN_WAIT_MS`])
/// for its first lease.
fn start_agent(args: &ServeArgs) -> Result<Option<felix_cluster::AgentHandle>, StartError> {
    if args.cluster_etcd.is_empty() {
        return Ok(None);
    }
    let (Some(node), Some(advertise)) = (&args.node_id, &args.advertise) else {
        return Err(StartError::ClusterArgs);
    };
    let node = felix_cluster::NodeId::new(node).map_err(StartError::Cluster)?;
    let metrics = args.metrics_addr().ok().flatten().map(|a| a.to_string());
    let member = felix_cluster::Member {
        node,
        advertise: advertise.clone(),
        cores: args.cores as u16,
        metrics,
        // Verified once this broker's replication links reach every other live broker (the
        // replication host's check on core 0).
        peers_verified: false,
    };
    let agent = felix_cluster::Agent::start(felix_cluster::AgentConfig {
        endpoints: args.cluster_etcd.clone(),
        cluster: args.cluster_name.clone(),
        member,
        lease_ttl_s: args.lease_ttl_s,
    })
    .map_err(StartError::Cluster)?;
    let wait = Duration::from_millis(CLUSTER_JOIN_WAIT_MS);
    let deadline = Instant::now() + wait;
    while !agent.view().lease_holds(Instant::now()) {
        if Instant::now() >= deadline {
            eprintln!(
                "felix: warning: no cluster lease from etcd {:?} after {wait:?}; \
                 serving, but this broker's shards are unavailable until it has one",
                args.cluster_etcd
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(CLUSTER_JOIN_POLL_MS));
    }
    Ok(Some(agent))
}

fn check_data_dir(dir: &std::path::Path) -> Result<(), StartError> {
    std::fs::create_dir_all(dir)
        .map_err(|source| StartError::DataDirCreate { path: dir.to_owned(), source })?;
    let probe = dir.join(".felix-write-probe");
    std::fs::write(&probe, b"ok")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|source| StartError::DataDirNotWritable { path: dir.to_owned(), source })
}

/// SO_REUSEPORT would let a second broker silently join the first one's socket group and
/// split its traffic; a plain bind first tells that the port is taken.
fn check_port_free(addr: std::net::SocketAddr) -> Result<(), StartError> {
    if addr.port() == 0 {
        return Ok(());
    }
    // A broker killed a moment ago can hold the port until the kernel finishes tearing down
    // its io_uring instances: retry briefly before calling the port taken.
    let deadline = Instant::now() + Duration::from_millis(PORT_RELEASE_WAIT_MS);
    loop {
        match std::net::UdpSocket::bind(addr) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(PORT_RELEASE_POLL_MS));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(StartError::PortBound { addr })
            }
            Err(source) => return Err(StartError::Bind { addr, source }),
        }
    }
}

fn check_io_uring() -> Result<(), StartError> {
    const KNOB: &str = "/proc/sys/kernel/io_uring_disabled";
    /// The knob's value that refuses io_uring to every process (1 allows a group, 0 all).
    const DISABLED_FOR_ALL: &str = "2";
    match std::fs::read_to_string(KNOB).map(|s| s.trim().to_owned()) {
        Ok(v) if v == DISABLED_FOR_ALL => Err(StartError::IoUringDisabled { knob: KNOB }),
        _ => Ok(()),
    }
}
