//! One core's broker state: its stream logs, the stream registry, consumer positions, and the
//! handling of requests for the shards it owns (from its own connections or from the mesh).
//!
//! Shard `s` of every stream is owned by core `s % cores`. Everything here lives on one core
//! (`Rc`, `RefCell`); other cores reach it only through [`super::mesh`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_proto::{CoreId, ErrorCode, Offset, Retention, ShardId, StartAt, StreamName};
use felix_storage::{CoreStore, RetentionConfig, StorageError, StreamLog};
use glommio::sync::Semaphore;

use super::disk::DiskFloor;
pub use super::error::{meta_error, storage_error, DISK_FULL_MESSAGE};
use super::error::{CoreOpenError, WireError};
use super::frames::LogFrames;
use super::mesh::{CoreRequest, CoreResponse, Mesh, StreamOp};
use super::meta::{self, StreamMeta, TenantQuota};
use super::offsets::GroupPositions;
use super::publish::PublishPath;
use super::stats::{self, AppStats};
use super::tail::{EncodedBatch, TailRead};
use super::tasks::CoreTasks;

/// A stream definition as the cluster keeps it.
fn cluster_def(shards: u32, retention: Retention) -> felix_cluster::StreamDef {
    felix_cluster::StreamDef {
        shards,
        retention_bytes: retention.bytes_max.unwrap_or(0),
        retention_ms: retention.age_max_ms.unwrap_or(0),
    }
}

/// The retention of a cluster definition.
fn retention_of(def: felix_cluster::StreamDef) -> Retention {
    Retention {
        bytes_max: (def.retention_bytes != 0).then_some(def.retention_bytes),
        age_max_ms: (def.retention_ms != 0).then_some(def.retention_ms),
    }
}

pub use super::offsets::OFFSETS_LOG;
/// Bytes one read of a log asks for when the broker scans it itself (a timestamp lookup).
pub const SCAN_READ_BYTES_MAX: usize = 1 << 20;
/// How often a core of a cluster's broker looks for deleted and altered streams.
pub const RECONCILE_MS: u64 = 500;
/// How long a tail read that found nothing in the log waits before it looks again.
pub const LOG_POLL_MS: u64 = 1;

/// Settings every core shares (copied into each core at start).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Data directory.
    pub data_dir: PathBuf,
    /// Cores running.
    pub cores: usize,
    /// Create streams on first use.
    pub auto_create: bool,
    /// Streams per tenant: the quota and the counts, shared by every core.
    pub quota: Arc<TenantQuota>,
    /// Free-space floor of the data directory's file system.
    pub min_free_bytes: crate::config::MinFreeBytes,
    /// Shards of auto-created streams.
    pub default_shards: u32,
    /// Default retention.
    pub retention: Retention,
    /// Limits advertised to clients.
    pub limits: felix_proto::Limits,
    /// Publish bytes in flight per connection.
    pub inflight_bytes_per_conn: usize,
    /// Publish bytes in flight per core.
    pub inflight_bytes_per_core: usize,
    /// How long a subscriber may block before it is disconnected.
    pub slow_consumer: Duration,
    /// Consumer-group positions one core keeps at most (`--max-group-positions-per-core`).
    pub max_group_positions: usize,
    /// The segment size of the offsets log (`--segment-bytes`): snapshots of the positions
    /// are written once about this much was committed since the last (`offsets`).
    pub offsets_segment_bytes: u64,
    /// Token verification; `None` when authentication is off. Immutable after start.
    pub auth: Option<Arc<super::auth::Authenticator>>,
    /// The cluster agent; `None` for a single-node broker.
    pub cluster: Option<felix_cluster::AgentClient>,
    /// Replication factor of the streams this broker creates in a cluster (`None`: 3, or the
    /// live brokers when fewer).
    pub default_replicas: Option<u8>,
    /// Replication between brokers (in a cluster).
    pub replication: Option<super::replication::ReplicationSettings>,
}

/// A stream known to this core.
pub struct StreamEntry {
    /// Its definition.
    pub meta: StreamMeta,
    /// The log of the shards this core owns (none if it owns no shard of the stream).
    pub log: Option<StreamLog>,
    /// The in-memory tails of the shards this core owns.
    pub tails: super::tail::StreamTails,
    unkeyed_next: Cell<u32>,
    /// In a cluster: the incarnation of the cluster's definition this copy was made from
    /// (`None`: not recorded, or a single broker).
    incarnation: Option<i64>,
    /// The retention in force (an AlterStream changes it after the entry was opened).
    retention: Cell<Retention>,
    /// Bytes and records appended to each shard this core owns, since it opened.
    appended: RefCell<HashMap<ShardId, (u64, u64)>>,
}

impl StreamEntry {
    /// Counts an append of `records` records, `bytes` payload bytes, to `shard`.
    pub fn count_append(&self, shard: ShardId, bytes: u64, records: u64) {
        let mut appended = self.appended.borrow_mut();
        let (b, r) = appended.entry(shard).or_default();
        *b += bytes;
        *r += records;
    }

    /// Bytes and records appended to `shard` since the entry opened.
    pub fn appended(&self, shard: ShardId) -> (u64, u64) {
        self.appended.borrow().get(&shard).copied().unwrap_or_default()
    }

    /// Its definition as it is now (retention included).
    pub fn current_meta(&self) -> StreamMeta {
        StreamMeta { retention: self.retention.get(), ..self.meta.clone() }
    }
}

/// One core's broker state: its streams ([`StreamRegistry`]), its publish path's budget and
/// latencies ([`PublishPath`]), consumer positions, the mesh to other cores, the cluster link
/// and the replication shell. Fields are private; the other modules use the accessors.
pub struct CoreApp {
    core: CoreId,
    settings: Settings,
    store: CoreStore,
    /// The free-space floor, refreshed in the background.
    disk: Rc<DiskFloor>,
    mesh: Rc<Mesh>,
    /// Statistics, read by the admin thread.
    stats: Arc<AppStats>,
    publish: PublishPath,
    streams: StreamRegistry,
    positions: Rc<GroupPositions>,
    /// Set when shutdown starts: new publishes are refused.
    stopping: Cell<bool>,
    /// The cluster view of this core; `None` for a single-node broker.
    cluster: Option<Rc<super::cluster::ClusterLink>>,
    /// The replication shell of this core (in a cluster), set once the core is open.
    replication: std::cell::OnceCell<Rc<super::replication::ReplicationShell>>,
    /// The tasks that hold this state, ended when the core stops.
    tasks: CoreTasks,
}

/// The streams open on one core, by name; opened one at a time.
pub struct StreamRegistry {
    streams: RefCell<HashMap<String, Rc<StreamEntry>>>,
    opening: Semaphore,
}

impl StreamRegistry {
    fn new() -> Self {
        StreamRegistry { streams: RefCell::default(), opening: Semaphore::new(1) }
    }

    /// The stream `name`, if it is open on this core.
    pub fn get(&self, name: &str) -> Option<Rc<StreamEntry>> {
        self.streams.borrow().get(name).cloned()
    }

    /// Whether `name` is open on this core.
    pub fn contains(&self, name: &str) -> bool {
        self.streams.borrow().contains_key(name)
    }

    /// Every open stream.
    pub fn all(&self) -> Vec<Rc<StreamEntry>> {
        self.streams.borrow().values().cloned().collect()
    }

    fn insert(&self, entry: Rc<StreamEntry>) {
        self.streams.borrow_mut().insert(entry.meta.name.as_str().to_owned(), entry);
    }

    fn remove(&self, name: &str) -> Option<Rc<StreamEntry>> {
        self.streams.borrow_mut().remove(name)
    }
}

impl CoreApp {
    /// Opens the core's storage, recovers every stream it owns shards of, and loads consumer
    /// positions.
    pub async fn open(
        core: CoreId,
        settings: Settings,
        store: CoreStore,
        mesh: Rc<Mesh>,
        stats: Arc<AppStats>,
    ) -> Result<Rc<CoreApp>, CoreOpenError> {
        let (offsets_log, _) = store
            .open_stream(OFFSETS_LOG, &[ShardId(0)], Some(RetentionConfig::default()))
            .await
            .map_err(|source| CoreOpenError::Offsets { core, source })?;
        let positions = GroupPositions::load(
            core,
            offsets_log,
            settings.max_group_positions,
            settings.offsets_segment_bytes,
        )
        .await
        .map(Rc::new)
        .map_err(|source| CoreOpenError::Offsets { core, source })?;
        let disk =
            DiskFloor::open(&settings.data_dir, settings.min_free_bytes).map(Rc::new).map_err(
                |source| CoreOpenError::FreeSpace { core, dir: settings.data_dir.clone(), source },
            )?;
        let tasks = CoreTasks::new();
        DiskFloor::spawn_watch(&disk, &tasks);
        let cluster = settings.cluster.clone().map(super::cluster::ClusterLink::new);
        let app = Rc::new(CoreApp {
            cluster,
            core,
            disk,
            publish: PublishPath::new(settings.inflight_bytes_per_core),
            settings,
            store,
            mesh,
            stats,
            streams: StreamRegistry::new(),
            positions,
            stopping: Cell::new(false),
            replication: std::cell::OnceCell::new(),
            tasks,
        });
        if let Some(link) = app.cluster.clone() {
            let weak = Rc::downgrade(&app);
            let stop = move || weak.upgrade().is_none_or(|a| a.stopping.get());
            glommio::spawn_local(link.follow(stop)).detach();
            glommio::spawn_local(app.clone().reconcile()).detach();
        }
        let metas = meta::load_all(&app.settings.data_dir).map_err(CoreOpenError::Definitions)?;
        for m in metas {
            // The full error (file and position of a corrupt log) is for the operator.
            let name = m.name.as_str().to_owned();
            app.open_entry(m).await.map_err(|source| CoreOpenError::Stream {
                core,
                name,
                source,
            })?;
        }
        Ok(app)
    }

    /// The core that owns `shard`.
    pub fn owner(&self, shard: ShardId) -> CoreId {
        CoreId((shard.0 as usize % self.settings.cores) as u16)
    }

    /// Every open stream entry.
    pub fn entries(&self) -> Vec<Rc<StreamEntry>> {
        self.streams.all()
    }

    /// The stream `name`, loading its definition from disk, or creating it when allowed.
    pub async fn stream(&self, name: &str, create: bool) -> Result<Rc<StreamEntry>, WireError> {
        if let Some(e) = self.streams.get(name) {
            // A copy of a deleted stream serves nothing, not even before the reconciler
            // removed it (nor to a replica of a new stream of that name).
            if self.cluster.as_ref().is_some_and(|l| l.is_deleted_copy(name, e.incarnation)) {
                return Err(WireError::new(
                    ErrorCode::StreamNotFound,
                    format!("{name} was deleted; its copy here is being removed"),
                ));
            }
            return Ok(e);
        }
        let parsed = parse_client_stream(name)?;
        let found = meta::load(&self.settings.data_dir, &parsed).map_err(|e| meta_error(&e))?;
        if let (Some(_), Some(link)) = (&found, &self.cluster) {
            // A copy of a deleted stream is not opened (the reconciler removes it); the
            // cluster's new stream of that name, if any, is adopted once it has.
            let local =
                meta::incarnation(&self.settings.data_dir, &parsed).map_err(|e| meta_error(&e))?;
            if link.is_deleted_copy(name, local) {
                return Err(WireError::new(
                    ErrorCode::StreamNotFound,
                    format!("{name} was deleted; its copy here is being removed"),
                ));
            }
        }
        let m = match (found, &self.cluster) {
            (Some(m), _) => m,
            (None, Some(link)) => {
                // In a cluster the definition is the cluster's: adopt it, or create it there.
                let def = match link.definition(name) {
                    Some(def) => def,
                    None if create && self.settings.auto_create => {
                        let replicas = self.default_replicas();
                        check_replicas(replicas, true)?;
                        let wanted =
                            cluster_def(self.settings.default_shards, self.settings.retention);
                        link.define(name, wanted, replicas).await?
                    }
                    None => {
                        return Err(WireError::new(
                            ErrorCode::StreamNotFound,
                            format!("no stream {name}"),
                        ))
                    }
                };
                self.check_adopted_shards(name, def.shards)?;
                let m =
                    StreamMeta { name: parsed, shards: def.shards, retention: retention_of(def) };
                self.define(&m, link.incarnation(name))?.0
            }
            (None, None) if create && self.settings.auto_create => {
                let m = StreamMeta {
                    name: parsed,
                    shards: self.settings.default_shards,
                    retention: self.settings.retention,
                };
                self.define(&m, None)?.0
            }
            (None, None) => {
                return Err(WireError::new(ErrorCode::StreamNotFound, format!("no stream {name}")))
            }
        };
        self.register(m).await
    }

    /// A definition from the cluster (written by another broker, maybe one with more cores)
    /// is checked before this broker keeps a copy: a shard count its logs cannot open would
    /// otherwise be written to its data directory and stop its next start.
    fn check_adopted_shards(&self, name: &str, shards: u32) -> Result<(), WireError> {
        let max = max_shards(self.settings.cores);
        if shards == 0 || shards > max {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "stream {name} has {shards} shards in the cluster; this broker ({} cores) \
                     holds 1..={max}",
                    self.settings.cores
                ),
            ));
        }
        Ok(())
    }

    /// Creates a stream explicitly, in a cluster with `replicas` replicas per shard (default
    /// `--default-replicas`). Creating an existing stream with the same settings succeeds.
    pub async fn create_stream(
        &self,
        m: StreamMeta,
        asked_replicas: Option<u8>,
    ) -> Result<StreamMeta, WireError> {
        parse_client_stream(m.name.as_str())?;
        let max = max_shards(self.settings.cores);
        if m.shards == 0 || m.shards > max {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("shards must be 1..={max} on a broker with {} cores", self.settings.cores),
            ));
        }
        let replicas = asked_replicas.unwrap_or_else(|| self.default_replicas());
        check_replicas(replicas, self.cluster.is_some())?;
        let found = match meta::load(&self.settings.data_dir, &m.name) {
            Ok(Some(found)) => found,
            Ok(None) => match &self.cluster {
                None => self.define(&m, None)?.0,
                Some(link) => {
                    // The cluster's definition wins; this broker keeps a copy to open its logs.
                    let wanted = cluster_def(m.shards, m.retention);
                    let def = link.define(m.name.as_str(), wanted, replicas).await?;
                    self.check_adopted_shards(m.name.as_str(), def.shards)?;
                    let local = StreamMeta {
                        name: m.name.clone(),
                        shards: def.shards,
                        retention: retention_of(def),
                    };
                    self.define(&local, link.incarnation(m.name.as_str()))?.0
                }
            },
            Err(e) => return Err(meta_error(&e)),
        };
        if found != m {
            return Err(WireError::new(
                ErrorCode::StreamExists,
                format!("{} exists with {} shards", found.name, found.shards),
            ));
        }
        let existing = self.cluster.as_ref().map_or(1, |l| l.replicas_of(m.name.as_str()));
        if asked_replicas.is_some_and(|n| n != existing) {
            return Err(WireError::new(
                ErrorCode::StreamExists,
                format!("{} exists with {existing} replicas", found.name),
            ));
        }
        self.register(found.clone()).await?;
        Ok(found)
    }

    /// The replication factor of a stream created without one: `--default-replicas`, else 3
    /// in a cluster (or the live brokers when fewer), 1 on a single node.
    fn default_replicas(&self) -> u8 {
        match (&self.cluster, self.settings.default_replicas) {
            (None, _) => 1,
            (Some(_), Some(n)) => n,
            (Some(link), None) => link.live_members().clamp(1, 3) as u8,
        }
    }

    /// Writes a new stream's definition, unless it exists: refused below the free-space floor
    /// (`StorageFull`) and past the tenant's stream quota (`LimitReached`).
    fn define(
        &self,
        m: &StreamMeta,
        incarnation: Option<i64>,
    ) -> Result<(StreamMeta, bool), WireError> {
        // A fresh look: creating is rare, and a stream costs disk (one block per core at least).
        self.disk.refresh();
        self.disk.check()?;
        let data_dir = &self.settings.data_dir;
        self.settings.quota.create(data_dir, m, incarnation).map_err(|e| meta_error(&e))
    }

    /// Deletes stream `name`: in a cluster its definition, placement and groups in etcd
    /// first (every other broker then deletes its copy, [`CoreApp::reconcile`]); then its
    /// definition here and its log on every core. Returns the definition it had.
    pub async fn delete_stream(self: &Rc<Self>, name: &str) -> Result<StreamMeta, WireError> {
        let parsed = parse_client_stream(name)?;
        let data_dir = &self.settings.data_dir;
        let local = meta::load(data_dir, &parsed).map_err(|e| meta_error(&e))?;
        let gone = match &self.cluster {
            Some(link) => {
                let def = link.delete(name).await?;
                StreamMeta {
                    name: parsed.clone(),
                    shards: def.shards,
                    retention: retention_of(def),
                }
            }
            None => local.ok_or_else(|| {
                WireError::new(ErrorCode::StreamNotFound, format!("no stream {name}"))
            })?,
        };
        self.delete_local_copy(&parsed).await?;
        tracing::info!(stream = %name, "stream deleted");
        Ok(gone)
    }

    /// Changes stream `name`'s settings: its retention (in a cluster, in etcd first; every
    /// broker applies it from its view; a replicated stream's leaders apply it). A replication
    /// factor other than the stream's is refused. Returns the settings in force.
    pub async fn alter_stream(
        self: &Rc<Self>,
        name: &str,
        changes: felix_proto::StreamChanges,
    ) -> Result<StreamMeta, WireError> {
        let entry = self.stream(name, false).await?;
        let current = entry.current_meta();
        let replicas = self.cluster.as_ref().map_or(1, |l| l.replicas_of(name));
        if let Some(n) = changes.replicas.filter(|n| *n != replicas) {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{name} has {replicas} replicas; changing it to {n} needs replica moves, \
                     which are not supported yet"
                ),
            ));
        }
        let retention = changes.apply(current.retention);
        check_replicas(replicas, self.cluster.is_some())?;
        let altered = StreamMeta { retention, ..current };
        if let Some(link) = &self.cluster {
            link.alter(name, cluster_def(altered.shards, retention)).await?;
        }
        meta::replace(&self.settings.data_dir, &altered).map_err(|e| meta_error(&e))?;
        self.on_every_core(name, StreamOp::SetRetention(retention)).await?;
        tracing::info!(stream = %name, ?retention, "stream altered");
        Ok(altered)
    }

    /// Runs `op` on `stream` on every core of this broker.
    async fn on_every_core(self: &Rc<Self>, stream: &str, op: StreamOp) -> Result<(), WireError> {
        for core in 0..self.settings.cores {
            let shard = ShardId(core as u32);
            let req = CoreRequest::Manage { stream: stream.to_owned(), core: shard, op };
            match self.on_owner(shard, req).await? {
                CoreResponse::Committed(r) => r?,
                other => {
                    return Err(WireError::new(
                        ErrorCode::Internal,
                        format!("unexpected answer from core {core}: {other:?}"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// `op` on this core's copy of `stream`.
    async fn manage_local(&self, stream: &str, op: StreamOp) -> Result<(), WireError> {
        match op {
            StreamOp::Drop => {
                // No open of the stream on this core runs meanwhile.
                let _guard = self.streams.opening.acquire_permit(1).await.map_err(|_| {
                    WireError::new(ErrorCode::Internal, "the stream registry is closed")
                })?;
                let entry = self.streams.remove(stream);
                if let Some(shell) = self.replication.get() {
                    shell.stream_deleted(stream);
                }
                drop(entry);
                self.store.delete_stream(stream).await.map_err(|e| storage_error(&e))?;
                Ok(())
            }
            StreamOp::SetRetention(retention) => {
                if let Some(e) = self.streams.get(stream) {
                    e.retention.set(retention);
                    let log = e.log.as_ref().filter(|_| !self.is_replicated(stream));
                    if let Some(log) = log {
                        log.set_retention(RetentionConfig {
                            bytes_max: retention.bytes_max,
                            age_ms_max: retention.age_max_ms,
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// In a cluster, every [`RECONCILE_MS`]: core 0 deletes this broker's copies of streams a
    /// tombstone covers ([`CoreApp::delete_covered_copies`]), and every core applies a
    /// retention altered on another broker to its logs (core 0 also to the local definition).
    pub async fn reconcile(self: Rc<Self>) {
        let Some(link) = self.cluster.clone() else { return };
        let mut handled = std::collections::HashSet::new();
        while !self.stopping.get() {
            glommio::timer::sleep(Duration::from_millis(RECONCILE_MS)).await;
            if self.core.0 == 0 {
                self.delete_covered_copies(&link, &mut handled).await;
            }
            for entry in self.streams.all() {
                let name = entry.meta.name.as_str();
                if link.is_deleted_copy(name, entry.incarnation) {
                    continue;
                }
                let Some(def) = link.view().streams.get(name).copied() else { continue };
                let retention = retention_of(def);
                if entry.retention.get() != retention {
                    if self.core.0 == 0 {
                        let m = StreamMeta { retention, ..entry.meta.clone() };
                        if let Err(e) = meta::replace(&self.settings.data_dir, &m) {
                            tracing::warn!(stream = %name, error = %e, "recording a retention");
                        }
                    }
                    let _ = self.manage_local(name, StreamOp::SetRetention(retention)).await;
                    tracing::info!(stream = %name, ?retention, "retention altered in the cluster");
                }
            }
        }
    }

    /// Deletes this broker's copy of every stream a tombstone of the view covers (each
    /// tombstone looked at once, or again after a failure).
    async fn delete_covered_copies(
        self: &Rc<Self>,
        link: &super::cluster::ClusterLink,
        handled: &mut std::collections::HashSet<(String, i64)>,
    ) {
        let tombstones: Vec<(String, i64)> =
            link.view().deleted.iter().map(|(n, t)| (n.clone(), t.incarnation)).collect();
        for (name, incarnation) in tombstones {
            if handled.contains(&(name.clone(), incarnation)) {
                continue;
            }
            let Ok(parsed) = StreamName::parse(&name) else {
                handled.insert((name, incarnation));
                continue;
            };
            let data_dir = &self.settings.data_dir;
            let local = match meta::load(data_dir, &parsed) {
                Ok(Some(_)) => meta::incarnation(data_dir, &parsed),
                Ok(None) => {
                    handled.insert((name, incarnation));
                    continue;
                }
                Err(e) => Err(e),
            };
            let covered = match local {
                Ok(local) => link.is_deleted_copy(&name, local),
                Err(e) => {
                    tracing::warn!(stream = %name, error = %e, "reading a deleted stream's copy");
                    continue;
                }
            };
            if !covered {
                handled.insert((name, incarnation));
                continue;
            }
            match self.delete_local_copy(&parsed).await {
                Ok(()) => {
                    tracing::info!(stream = %name, "deleted this broker's copy of a stream deleted in the cluster");
                    handled.insert((name, incarnation));
                }
                Err(e) => tracing::warn!(stream = %name, error = %e.message,
                    "deleting a stream deleted in the cluster; trying again"),
            }
        }
    }

    /// Deletes this broker's copy of `name`: its definition is set aside first (nothing opens
    /// the stream again), then every core's log, then the definition
    /// ([`meta::begin_delete`], [`meta::finish_delete`]).
    async fn delete_local_copy(self: &Rc<Self>, name: &StreamName) -> Result<(), WireError> {
        let data_dir = &self.settings.data_dir;
        self.settings.quota.begin_delete(data_dir, name).map_err(|e| meta_error(&e))?;
        // On a failure the definition stays set aside until the next start finishes the
        // delete, and the name stays taken.
        self.on_every_core(name.as_str(), StreamOp::Drop).await?;
        self.settings.quota.finish_delete(data_dir, name).map_err(|e| meta_error(&e))
    }

    async fn register(&self, m: StreamMeta) -> Result<Rc<StreamEntry>, WireError> {
        self.open_entry(m).await.map_err(|e| storage_error(&e))
    }

    /// Opens the logs of a defined stream on this core (the full storage error, for start-up).
    async fn open_entry(&self, m: StreamMeta) -> Result<Rc<StreamEntry>, StorageError> {
        // The semaphore is never closed.
        let _guard =
            self.streams.opening.acquire_permit(1).await.map_err(|_| StorageError::Closed)?;
        if let Some(e) = self.streams.get(m.name.as_str()) {
            return Ok(e.clone());
        }
        let owned: Vec<ShardId> =
            (0..m.shards).map(ShardId).filter(|s| self.owner(*s) == self.core).collect();
        let log = if owned.is_empty() {
            None
        } else {
            // A replicated stream's retention is its leaders' (the replication shell deletes
            // below the log starts they decide): storage deletes nothing on its own.
            let retention = match self.is_replicated(m.name.as_str()) {
                true => RetentionConfig::default(),
                false => RetentionConfig {
                    bytes_max: m.retention.bytes_max,
                    age_ms_max: m.retention.age_max_ms,
                },
            };
            let (log, report) =
                self.store.open_stream(m.name.as_str(), &owned, Some(retention)).await?;
            if report.torn_bytes_dropped > 0 {
                stats::add(
                    &self.stats.counters.storage_torn_bytes_dropped,
                    report.torn_bytes_dropped,
                );
            }
            Some(log)
        };
        let incarnation = match &self.cluster {
            // Read a moment ago with the definition; a failure now reads as "not recorded".
            Some(_) => meta::incarnation(&self.settings.data_dir, &m.name).unwrap_or_else(|e| {
                tracing::warn!(stream = %m.name, error = %e, "reading the stream's incarnation");
                None
            }),
            None => None,
        };
        let entry = Rc::new(StreamEntry {
            retention: Cell::new(m.retention),
            meta: m,
            log,
            tails: Default::default(),
            unkeyed_next: Cell::new(0),
            incarnation,
            appended: RefCell::default(),
        });
        self.streams.insert(entry.clone());
        Ok(entry)
    }

    /// Whether `stream` is replicated (more than one replica in this broker's cluster).
    fn is_replicated(&self, stream: &str) -> bool {
        self.cluster.as_ref().is_some_and(|l| l.replicas_of(stream) > 1)
    }

    /// The shard an unkeyed batch goes to in a cluster: one of `owned` (the shards this
    /// broker owns), preferring this core's, round-robin; `None` when it owns none.
    pub fn unkeyed_shard_among(&self, entry: &StreamEntry, owned: &[ShardId]) -> Option<ShardId> {
        let mine: Vec<ShardId> =
            owned.iter().copied().filter(|s| self.owner(*s) == self.core).collect();
        let pick = if mine.is_empty() { owned } else { &mine[..] };
        if pick.is_empty() {
            return None;
        }
        let k = entry.unkeyed_next.get();
        entry.unkeyed_next.set(k.wrapping_add(1));
        Some(pick[k as usize % pick.len()])
    }

    /// The shard an unkeyed batch goes to: one this core owns, round-robin, so unkeyed
    /// publishes never cross cores; when the core owns none, a fixed shard elsewhere.
    pub fn unkeyed_shard(&self, entry: &StreamEntry) -> ShardId {
        let n = self.settings.cores as u32;
        let mine: u32 =
            (0..entry.meta.shards).filter(|s| s % n == u32::from(self.core.0)).count() as u32;
        if mine == 0 {
            return ShardId(u32::from(self.core.0) % entry.meta.shards);
        }
        let k = entry.unkeyed_next.get();
        entry.unkeyed_next.set(k.wrapping_add(1));
        ShardId(u32::from(self.core.0) + (k % mine) * n)
    }

    /// Handles a request for a shard this core owns.
    pub async fn handle_request(self: &Rc<Self>, req: CoreRequest) -> CoreResponse {
        debug_assert_eq!(self.owner(req.shard()), self.core, "a shard is handled by its owner");
        match req {
            CoreRequest::Append(batch) => {
                CoreResponse::Appended(async { self.submit_forwarded(batch).await?.await }.await)
            }
            CoreRequest::Read { stream, shard, from, max_bytes, wait_ms } => CoreResponse::Batches(
                self.read_local(&stream, shard, from, max_bytes, wait_ms).await,
            ),
            CoreRequest::Resolve { stream, shard, start, group } => {
                CoreResponse::Position(self.resolve_local(&stream, shard, start, group).await)
            }
            CoreRequest::Commit { stream, group, shard, offset } => {
                CoreResponse::Committed(self.commit_local(&stream, &group, shard, offset).await)
            }
            CoreRequest::Manage { stream, op, .. } => {
                CoreResponse::Committed(self.manage_local(&stream, op).await)
            }
        }
    }

    /// Runs `req` on the owner of `shard`: here, or over the mesh.
    pub async fn on_owner(
        self: &Rc<Self>,
        shard: ShardId,
        req: CoreRequest,
    ) -> Result<CoreResponse, WireError> {
        let owner = self.owner(shard);
        if owner == self.core {
            Ok(self.handle_request(req).await)
        } else {
            self.mesh.call(self.core, owner, req).await
        }
    }

    async fn owned_log(&self, stream: &str, shard: ShardId) -> Result<StreamLog, WireError> {
        let entry = self.stream(stream, false).await?;
        if shard.0 >= entry.meta.shards {
            return Err(WireError::new(
                ErrorCode::InvalidShard,
                format!("{stream} has no {shard}"),
            ));
        }
        entry.log.clone().ok_or_else(|| {
            WireError::new(ErrorCode::Internal, format!("{shard} is not on this core"))
        })
    }

    async fn read_local(
        &self,
        stream: &str,
        shard: ShardId,
        from: Offset,
        max_bytes: usize,
        wait_ms: u64,
    ) -> Result<Vec<EncodedBatch>, WireError> {
        let log = self.owned_log(stream, shard).await?;
        let entry = self.stream(stream, false).await?;
        let deadline = std::time::Instant::now() + Duration::from_millis(wait_ms);
        loop {
            let next = self.visible_next(&log, stream, shard)?;
            match self.read_tail(&entry, shard, from, max_bytes, next) {
                TailRead::Batches(b) => return Ok(b),
                TailRead::Miss => {
                    // Encoded straight from the read buffer: one copy per payload byte.
                    let mut frames = LogFrames::new(shard, from);
                    log.read_with(shard, from, max_bytes, |view| {
                        // Only what is committed, on a replicated shard.
                        if view.base_offset() < next {
                            frames.push(&view);
                        }
                    })
                    .await
                    .map_err(|e| storage_error(&e))?;
                    let read = frames.batches();
                    let batches = frames.finish();
                    if !batches.is_empty() {
                        stats::add(&self.stats.counters.log_batches, read);
                        return Ok(batches);
                    }
                    if std::time::Instant::now() >= deadline {
                        return Ok(Vec::new());
                    }
                    glommio::timer::sleep(Duration::from_millis(LOG_POLL_MS)).await;
                }
                TailRead::Crowded => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(Vec::new());
                    }
                    glommio::timer::sleep(
                        left.min(Duration::from_millis(super::tail::CROWDED_RETRY_MS)),
                    )
                    .await;
                }
                TailRead::AtTail(rx) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(Vec::new());
                    }
                    let _ = glommio::timer::timeout(left, async {
                        rx.await;
                        Ok(())
                    })
                    .await;
                    if std::time::Instant::now() >= deadline {
                        // One last look, then give up until the reader asks again.
                        let next = self.visible_next(&log, stream, shard)?;
                        return Ok(
                            match entry.tails.with(shard, |t| t.read(from, max_bytes, next)) {
                                TailRead::Batches(b) => b,
                                _ => Vec::new(),
                            },
                        );
                    }
                }
            }
        }
    }

    /// The shard's next offset as readers see it: on a replicated shard, its commit point.
    fn visible_next(
        &self,
        log: &StreamLog,
        stream: &str,
        shard: ShardId,
    ) -> Result<Offset, WireError> {
        let next = log.next_offset(shard).map_err(|e| storage_error(&e))?;
        let visible = self.replication.get().and_then(|h| h.visible_end(stream, shard));
        Ok(visible.map_or(next, |v| v.min(next)))
    }

    fn read_tail(
        &self,
        entry: &StreamEntry,
        shard: ShardId,
        from: Offset,
        max_bytes: usize,
        next: Offset,
    ) -> TailRead {
        entry.tails.with(shard, |t| {
            let before = t.encodes;
            let r = t.read(from, max_bytes, next);
            if let TailRead::Batches(b) = &r {
                debug_assert!(
                    b.first().is_none_or(|b| b.base_offset == from),
                    "a tail read starts at the offset asked for"
                );
            }
            stats::add(&self.stats.counters.tail_encodes, t.encodes - before);
            if let TailRead::Batches(b) = &r {
                stats::add(&self.stats.counters.tail_batches, b.len() as u64);
            }
            r
        })
    }

    async fn resolve_local(
        &self,
        stream: &str,
        shard: ShardId,
        start: StartAt,
        group: Option<String>,
    ) -> Result<Offset, WireError> {
        let log = self.owned_log(stream, shard).await?;
        let first = log.start_offset(shard).map_err(|e| storage_error(&e))?;
        // Positions are checked against what the log holds (a subscriber may come back at an
        // offset a new leader has not yet seen committed); `Latest` is what readers may see.
        let next = log.next_offset(shard).map_err(|e| storage_error(&e))?;
        let visible = self.visible_next(&log, stream, shard)?;
        if let Some(g) = group {
            if let Some(o) = self.positions.get(stream, &g, shard) {
                return Ok(Offset(o.max(first.0).min(next.0)));
            }
        }
        Ok(match start {
            StartAt::Earliest => first,
            StartAt::Latest => visible,
            StartAt::Offset(o) if o < first || o > next => {
                return Err(WireError::new(
                    ErrorCode::OffsetOutOfRange,
                    format!("{shard} holds offsets {}..{}", first.0, next.0),
                ))
            }
            StartAt::Offset(o) => o,
            StartAt::Timestamp(t) => self.offset_at_time(&log, shard, first, next, t).await?,
        })
    }

    /// The first offset stored at or after `t`, by scanning batch timestamps from the start.
    async fn offset_at_time(
        &self,
        log: &StreamLog,
        shard: ShardId,
        first: Offset,
        next: Offset,
        t: u64,
    ) -> Result<Offset, WireError> {
        let mut at = first;
        while at < next {
            let batches =
                log.read(shard, at, SCAN_READ_BYTES_MAX).await.map_err(|e| storage_error(&e))?;
            let Some(last) = batches.last() else { break };
            for b in &batches {
                if b.last_timestamp_ms >= t {
                    return Ok(b.base_offset.max(at));
                }
            }
            let end = Offset(last.base_offset.0 + last.records.len() as u64);
            debug_assert!(end > at, "a scan's position advances");
            at = end;
        }
        Ok(next)
    }

    async fn commit_local(
        &self,
        stream: &str,
        group: &str,
        shard: ShardId,
        offset: Offset,
    ) -> Result<(), WireError> {
        self.owned_log(stream, shard).await?;
        self.positions.commit(stream, group, shard, offset).await?;
        stats::add(&self.stats.counters.commits, 1);
        Ok(())
    }

    /// Flushes every log (shutdown).
    pub async fn flush_all(&self) {
        for e in self.entries() {
            if let Some(log) = &e.log {
                if let Err(err) = log.flush().await {
                    tracing::warn!(core = self.core.0, stream = %e.meta.name, error = %err, "flush at shutdown failed");
                }
            }
        }
        self.positions.flush().await;
    }

    /// Lets every tail on this core go of the records no subscriber read in time
    /// ([`super::tail::TAIL_RAW_AGE_MS`]).
    pub fn release_tails(&self, now: Instant) {
        for e in self.entries() {
            e.tails.release_raw(now);
        }
    }

    /// Copies storage statistics and histograms into the shared slots.
    pub fn publish_stats(&self) {
        let c = &self.stats.counters;
        let mut flushes = 0;
        let mut overlapped = 0;
        let mut written = 0;
        let mut zeroed = 0;
        let (mut producers, mut expired, mut evicted) = (0, 0, 0);
        let mut flush_h = stats::new_histogram();
        let mut write_h = stats::new_histogram();
        let mut fan_in = stats::new_histogram();
        for e in self.entries() {
            if let Some(log) = &e.log {
                let s = log.stats();
                flushes += s.flushes;
                overlapped += s.flushes_overlapped;
                written += s.bytes_written;
                zeroed += s.zero_fill_bytes;
                expired += s.producers_expired;
                evicted += s.producers_evicted;
                producers += log.producers_known();
                let _ = flush_h.add(&s.flush_latency_us);
                let _ = write_h.add(&s.write_latency_us);
                let _ = fan_in.add(&s.fan_in);
            }
        }
        stats::set(&c.storage_flushes, flushes);
        stats::set(&c.storage_flushes_overlapped, overlapped);
        stats::set(&c.storage_bytes_written, written);
        stats::set(&c.storage_zero_fill_bytes, zeroed);
        stats::set(&c.storage_producers, producers);
        stats::set(&c.storage_producers_expired, expired);
        stats::set(&c.storage_producers_evicted, evicted);
        let cache = self.store.read_cache_stats();
        stats::set(&c.storage_read_cache_hits, cache.hits);
        stats::set(&c.storage_read_cache_misses, cache.misses);
        stats::set(&c.storage_read_cache_waits, cache.waits);
        stats::set(&c.storage_read_cache_evictions, cache.evictions);
        stats::set(&c.storage_read_cache_bytes, cache.bytes);
        stats::set(&c.storage_below_floor, u64::from(self.disk.is_low()));
        self.publish_stream_series();
        stats::publish_histogram(&self.stats.flush_latency_us, &flush_h);
        stats::publish_histogram(&self.stats.write_latency_us, &write_h);
        stats::publish_histogram(&self.stats.fan_in, &fan_in);
        self.publish.publish_histograms(&self.stats);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // Release: a reader that sees this time sees the histograms copied before it.
        self.stats.histograms_published_unix_ms.store(now, std::sync::atomic::Ordering::Release);
    }
}

impl CoreApp {
    /// Copies the per-shard series (bytes and records in, end offset) of the shards this core
    /// owns (in a cluster: those this broker owns or leads) into the shared slot, at most
    /// [`stats::SHARD_SERIES_MAX_PER_CORE`].
    fn publish_stream_series(&self) {
        let committed: HashMap<(String, u32), (bool, u64)> = match self.stats.replicas.lock() {
            Ok(r) => {
                r.iter().map(|r| ((r.stream.clone(), r.shard), (r.leader, r.committed))).collect()
            }
            Err(_) => HashMap::new(),
        };
        let mut series = Vec::new();
        let mut dropped = 0u64;
        let mut entries = self.entries();
        entries.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
        for e in entries {
            let Some(log) = &e.log else { continue };
            let name = e.meta.name.as_str();
            let shards: Vec<ShardId> = match &self.cluster {
                Some(link) => link.owned(name, e.meta.shards),
                None => (0..e.meta.shards).map(ShardId).collect(),
            };
            for shard in shards.into_iter().filter(|s| self.owner(*s) == self.core) {
                let end = match committed.get(&(name.to_owned(), shard.0)) {
                    Some((true, committed)) => *committed,
                    Some((false, _)) => continue,
                    None => log.next_offset(shard).map_or(0, |o| o.0),
                };
                if series.len() >= stats::SHARD_SERIES_MAX_PER_CORE {
                    dropped += 1;
                    continue;
                }
                let (bytes_in, records_in) = e.appended(shard);
                series.push(stats::ShardSeries {
                    stream: name.to_owned(),
                    shard: shard.0,
                    bytes_in,
                    records_in,
                    end_offset: end,
                });
            }
        }
        stats::set(&self.stats.counters.stream_series_dropped, dropped);
        if let Ok(mut slot) = self.stats.streams.lock() {
            *slot = series;
        }
    }
}

/// A replication factor a stream may be created with: 1..=`REPLICAS_MAX`, above 1 only in a
/// cluster.
fn check_replicas(replicas: u8, cluster: bool) -> Result<(), WireError> {
    let most = felix_cluster::placement::REPLICAS_MAX;
    let bad = |why: String| Err(WireError::new(ErrorCode::InvalidArgument, why));
    if replicas == 0 || replicas > most {
        return bad(format!("replicas must be 1..={most}"));
    }
    if replicas > 1 && !cluster {
        return bad("replicas above 1 need a cluster (felix serve --cluster-etcd)".into());
    }
    Ok(())
}

/// The tenant of the broker's own streams; clients may not name it.
pub const RESERVED_TENANT: &str = "felix-internal";

/// The replication shell's narrow view of the core: a stream's log and tails.
impl super::replication::ShardStore for CoreApp {
    fn open_shard_log<'a>(&'a self, stream: &'a str) -> super::replication::OpenShardLog<'a> {
        Box::pin(async move {
            let entry = self.stream(stream, false).await.map_err(|e| e.message)?;
            let log = entry.log.clone().ok_or("no log on this core")?;
            Ok((log, entry as Rc<dyn super::replication::TailFeed>))
        })
    }
}

impl super::replication::TailFeed for StreamEntry {
    fn feed(
        &self,
        shard: ShardId,
        base: Offset,
        timestamp_ms: u64,
        records: Vec<felix_proto::Record>,
    ) {
        self.tails
            .with(shard, |t| t.handle_append(Instant::now(), shard, base, timestamp_ms, records));
    }
}

/// Read access for the other modules of `app` (the fields stay private).
impl CoreApp {
    /// This core.
    pub fn core(&self) -> CoreId {
        self.core
    }

    /// Shared settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The core's storage.
    pub fn store(&self) -> &CoreStore {
        &self.store
    }

    /// The mesh to other cores.
    pub fn mesh(&self) -> &Rc<Mesh> {
        &self.mesh
    }

    /// Statistics, read by the admin thread.
    pub fn stats(&self) -> &Arc<AppStats> {
        &self.stats
    }

    /// The publish path's budget and latencies.
    pub fn publish_path(&self) -> &PublishPath {
        &self.publish
    }

    /// The streams open on this core.
    pub fn streams(&self) -> &StreamRegistry {
        &self.streams
    }

    /// The free-space floor.
    pub fn disk(&self) -> &DiskFloor {
        &self.disk
    }

    /// Whether shutdown has started (new publishes are refused).
    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Starts shutdown: new publishes are refused from now on.
    pub fn begin_stopping(&self) {
        self.stopping.set(true);
    }

    /// The cluster view of this core; `None` for a single-node broker.
    pub fn cluster(&self) -> Option<&Rc<super::cluster::ClusterLink>> {
        self.cluster.as_ref()
    }

    /// The replication shell of this core, once set (in a cluster).
    pub fn replication(&self) -> Option<&Rc<super::replication::ReplicationShell>> {
        self.replication.get()
    }

    /// Sets the replication shell (once, when the core opens in a cluster).
    pub fn set_replication(&self, shell: Rc<super::replication::ReplicationShell>) {
        let _ = self.replication.set(shell);
    }

    /// The tasks that hold this state, ended when the core stops.
    pub fn tasks(&self) -> &CoreTasks {
        &self.tasks
    }
}

/// The most shards a stream may have on a broker with `cores` cores: one log holds at most
/// `SHARDS_PER_LOG_MAX` shards of a stream per core.
pub fn max_shards(cores: usize) -> u32 {
    let per_log = felix_storage::format::SHARDS_PER_LOG_MAX.saturating_mul(cores);
    felix_proto::limits::MAX_SHARDS_PER_STREAM.min(u32::try_from(per_log).unwrap_or(u32::MAX))
}

/// A stream name a client may use.
fn parse_client_stream(name: &str) -> Result<StreamName, WireError> {
    let parsed = StreamName::parse(name)
        .map_err(|e| WireError::new(ErrorCode::InvalidStreamName, e.to_string()))?;
    if parsed.tenant() == RESERVED_TENANT {
        return Err(WireError::new(
            ErrorCode::InvalidStreamName,
            format!("tenant {RESERVED_TENANT} is reserved for the broker"),
        ));
    }
    Ok(parsed)
}
