//! Cluster routing, used when the first broker advertised `CLUSTER` (docs/cluster.md,
//! docs/protocol.md section "Cluster"): the placement of each stream (which broker owns which
//! shard, from `Metadata`), one connection pool per broker, and the loop that follows
//! `NotOwner` answers and retries `ShardUnavailable` within a deadline.
//!
//! Call order: [`Cluster::new`] with the seed broker's pool; then [`Cluster::cached`] (routing,
//! never waits) or [`Cluster::placement`] (fetches when absent), [`Cluster::pool_for`] for an
//! owner's pool, and [`Cluster::follow`] around any request that may be refused with
//! `NotOwner` or `ShardUnavailable`.
//!
//! Bounded: at most [`BROKER_POOLS_MAX`] pools, [`PLACEMENT_CACHE_STREAMS_MAX`] cached
//! placements (the oldest is dropped), [`NOT_OWNER_REDIRECTS_MAX`] redirects and
//! [`SHARD_UNAVAILABLE_DEADLINE_MS`] of retries per operation.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use felix_proto::{ErrorCode, Frame, FrameType, Metadata, ShardId, ShardOwner};

use crate::config::ClientConfig;
use crate::conn::{unexpected, Conn, ConnParams};
use crate::error::ClientError;
use crate::pool::{is_permanent, resolve, Pool};

/// The most brokers the client keeps a connection pool to.
pub const BROKER_POOLS_MAX: usize = 64;
/// The most streams whose placement is cached; the oldest entry is dropped beyond it.
pub const PLACEMENT_CACHE_STREAMS_MAX: usize = 1024;
/// A cached placement older than this is refreshed in the background on its next use, in
/// milliseconds (a refused request refreshes it at once).
pub const PLACEMENT_MAX_AGE_MS: u64 = 30_000;
/// The most `NotOwner` redirects one operation follows before it fails with
/// `ClientError::NotOwner`.
pub const NOT_OWNER_REDIRECTS_MAX: u32 = 4;
/// How long one operation retries a shard that is unavailable (its owner down or fenced)
/// before it fails with `ClientError::ShardUnavailable`, in milliseconds.
pub const SHARD_UNAVAILABLE_DEADLINE_MS: u64 = 2_000;
/// The pause between two tries of an unavailable shard, in milliseconds.
pub const SHARD_UNAVAILABLE_RETRY_MS: u64 = 200;
/// The shortest interval between two background fetches of one stream's placement, in
/// milliseconds (a stream the cluster does not know is not asked for on every record).
pub const PLACEMENT_REFRESH_MIN_MS: u64 = 250;
/// After a broker could not be reached, how long requests for it fail at once instead of
/// trying again, in milliseconds.
pub const POOL_RETRY_AFTER_MS: u64 = 1_000;

/// The cluster state of one client.
pub(crate) struct Cluster {
    config: ClientConfig,
    template: ConnParams,
    closed: Arc<AtomicBool>,
    home: Arc<Pool>,
    seeds: Vec<String>,
    state: Mutex<State>,
    /// Serialises the opening of pools (a broker's pool is opened once).
    open_gate: tokio::sync::Mutex<()>,
    /// Serialises placement fetches, so that many refused requests cause one fetch.
    refresh_gate: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Every broker's pool, the home broker's included.
    pools: HashMap<SocketAddr, Arc<Pool>>,
    /// Resolved `host:port` names.
    names: HashMap<String, SocketAddr>,
    /// Brokers that could not be reached, when, and why.
    failed: HashMap<SocketAddr, (Instant, ClientError)>,
    placements: HashMap<String, Arc<Placement>>,
    /// When a background fetch of each stream's placement last started.
    background: HashMap<String, Instant>,
}

impl State {
    /// Counts `addr` as unreachable from now, forgetting the brokers whose failure is older
    /// than [`POOL_RETRY_AFTER_MS`] (only the recent ones are ever consulted), so the map holds
    /// no more than the brokers that failed within that time.
    fn note_failed(&mut self, addr: SocketAddr, e: ClientError) {
        let keep = Duration::from_millis(POOL_RETRY_AFTER_MS);
        self.failed.retain(|_, (at, _)| at.elapsed() < keep);
        self.failed.insert(addr, (Instant::now(), e));
    }
}

/// Where each shard of a stream lives, as a broker answered `Metadata`.
#[derive(Debug)]
pub(crate) struct Placement {
    /// `owners[s]` owns shard `s`.
    pub(crate) owners: Vec<ShardOwner>,
    fetched: Instant,
    /// Set when a request proved the placement wrong or a broker was lost.
    stale: bool,
}

impl Placement {
    /// The shard count.
    pub(crate) fn shards(&self) -> u32 {
        self.owners.len() as u32
    }

    /// The owner of `shard`, if the shard exists.
    pub(crate) fn owner(&self, shard: ShardId) -> Option<&ShardOwner> {
        self.owners.get(shard.0 as usize)
    }

    /// The distinct addresses of live owners, in shard order.
    pub(crate) fn live_addresses(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for o in self.owners.iter().filter(|o| o.live) {
            if !out.contains(&o.address.as_str()) {
                out.push(&o.address);
            }
        }
        out
    }

    fn needs_refresh(&self) -> bool {
        self.stale || self.fetched.elapsed() >= Duration::from_millis(PLACEMENT_MAX_AGE_MS)
    }
}

impl Cluster {
    /// The cluster state of a client whose first broker is `home` (reached through a seed).
    pub(crate) fn new(
        config: ClientConfig,
        template: ConnParams,
        closed: Arc<AtomicBool>,
        home: Arc<Pool>,
    ) -> Self {
        let mut state = State::default();
        state.pools.insert(home.addr(), home.clone());
        state.names.insert(home.name().to_owned(), home.addr());
        Self {
            seeds: config.seeds(),
            config,
            template,
            closed,
            home,
            state: Mutex::new(state),
            open_gate: tokio::sync::Mutex::new(()),
            refresh_gate: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Single inserts and removes: a poisoned map is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pools, the home broker's first.
    pub(crate) fn pools(&self) -> Vec<Arc<Pool>> {
        let mut pools: Vec<Arc<Pool>> = self.lock().pools.values().cloned().collect();
        pools.sort_by_key(|p| (p.addr() != self.home.addr(), p.addr()));
        pools
    }

    /// The home broker's pool (the seed the client connected to).
    pub(crate) fn home(&self) -> &Arc<Pool> {
        &self.home
    }

    /// The cached placement of `stream`, without waiting; one that is stale or old is
    /// refreshed in the background meanwhile.
    pub(crate) fn cached(self: &Arc<Self>, stream: &str) -> Option<Arc<Placement>> {
        let p = self.lock().placements.get(stream).cloned();
        if p.as_ref().is_none_or(|p| p.needs_refresh()) {
            self.refresh_in_background(stream);
        }
        p
    }

    /// The shard count of the cached placement of `stream`, without refreshing it.
    pub(crate) fn cached_shards(&self, stream: &str) -> Option<u32> {
        self.lock().placements.get(stream).map(|p| p.shards())
    }

    /// The placement of `stream`: the cached one when fresh, else fetched from a broker.
    pub(crate) async fn placement(&self, stream: &str) -> Result<Arc<Placement>, ClientError> {
        if let Some(p) = self.lock().placements.get(stream).filter(|p| !p.needs_refresh()) {
            return Ok(p.clone());
        }
        self.refresh(stream, Instant::now()).await
    }

    /// Fetches the placement of `stream` unless another fetch completed after `after` (then
    /// its result is used: many refused requests cause one fetch).
    pub(crate) async fn refresh(
        &self,
        stream: &str,
        after: Instant,
    ) -> Result<Arc<Placement>, ClientError> {
        let _gate = self.refresh_gate.lock().await;
        if let Some(p) = self.lock().placements.get(stream).filter(|p| p.fetched > after) {
            return Ok(p.clone());
        }
        let owners = self.fetch(stream).await?;
        let placement = Arc::new(Placement { owners, fetched: Instant::now(), stale: false });
        let mut state = self.lock();
        if !state.placements.contains_key(stream)
            && state.placements.len() >= PLACEMENT_CACHE_STREAMS_MAX
        {
            let oldest =
                state.placements.iter().min_by_key(|(_, p)| p.fetched).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                state.placements.remove(&k);
            }
        }
        state.placements.insert(stream.to_owned(), placement.clone());
        Ok(placement)
    }

    fn refresh_in_background(self: &Arc<Self>, stream: &str) {
        // A fetch already running will do; another would only queue behind it.
        if self.refresh_gate.try_lock().is_err() {
            return;
        }
        {
            let mut state = self.lock();
            let min = Duration::from_millis(PLACEMENT_REFRESH_MIN_MS);
            if state.background.get(stream).is_some_and(|at| at.elapsed() < min) {
                return;
            }
            if state.background.len() >= PLACEMENT_CACHE_STREAMS_MAX {
                state.background.clear();
            }
            state.background.insert(stream.to_owned(), Instant::now());
        }
        let cluster = self.clone();
        let stream = stream.to_owned();
        tokio::spawn(async move {
            if let Err(e) = cluster.refresh(&stream, Instant::now()).await {
                tracing::debug!(stream, error = %e, "placement refresh failed");
            }
        });
    }

    /// Marks the placement of `stream` stale (a broker was lost): its next use refreshes it.
    pub(crate) fn invalidate(&self, stream: &str) {
        let mut state = self.lock();
        if let Some(p) = state.placements.get_mut(stream) {
            *p = Arc::new(Placement { owners: p.owners.clone(), fetched: p.fetched, stale: true });
        }
    }

    /// Takes in what a `NotOwner` answer said: `owner` owns `shard` of `stream`. The cached
    /// placement is corrected at once and marked stale, so that it is fetched again too.
    pub(crate) fn learn(&self, stream: &str, shard: ShardId, owner: &ShardOwner) {
        let mut state = self.lock();
        if let Some(p) = state.placements.get_mut(stream) {
            let mut owners = p.owners.clone();
            if let Some(o) = owners.get_mut(shard.0 as usize) {
                *o = owner.clone();
            }
            *p = Arc::new(Placement { owners, fetched: p.fetched, stale: true });
        }
    }

    /// Asks a broker where each shard of `stream` lives (see [`Cluster::anywhere`]). A
    /// broker's answer (`StreamNotFound`, `ShardUnavailable` when the stream is not placed
    /// yet) is returned as it is.
    ///
    /// A broker that answers `ShardUnavailable` may be one that lost touch with the cluster
    /// (its view may be stale: a broker refuses `Metadata` while it cannot confirm its lease),
    /// so the next broker is asked; the last such answer is returned when none knows better.
    async fn fetch(&self, stream: &str) -> Result<Vec<ShardOwner>, ClientError> {
        self.anywhere_with(true, ClientError::is_shard_unavailable, |conn| async move {
            metadata(&conn, stream).await
        })
        .await
    }

    /// Runs `request` on a connection to any broker that can be reached: an open connection
    /// of any pool first (the home broker's before the others), then one connection attempt
    /// per known broker, then the seeds, then the brokers the cached placements name. An unreachable broker is skipped; with `resend`, so
    /// is one whose connection was lost during the request (for requests that may be sent
    /// twice).
    pub(crate) async fn anywhere<T, F, Fut>(
        &self,
        resend: bool,
        request: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        self.anywhere_with(resend, |_| false, request).await
    }

    /// [`Cluster::anywhere`], also moving on to the next broker after an answer `skip` says
    /// another broker may answer better (the last such answer is returned if none does).
    pub(crate) async fn anywhere_with<T, F, Fut>(
        &self,
        resend: bool,
        skip: fn(&ClientError) -> bool,
        mut request: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut last = ClientError::ConnectionLost("no broker of the cluster answered".into());
        // Tries one connection (or the error of getting one): returns unless the broker
        // could not be reached.
        macro_rules! attempt {
            ($conn:expr) => {
                match $conn {
                    Ok(conn) => {
                        let peer = conn.peer();
                        match request(conn).await {
                            Err(e) if resend && is_unreachable(&e) => {
                                // Timed out or lost: not asked again for a moment.
                                self.mark_unreachable(peer, e.clone());
                                last = e
                            }
                            Err(e) if skip(&e) => last = e,
                            other => return other,
                        }
                    }
                    Err(e) if is_unreachable(&e) => last = e,
                    Err(e) => return Err(e),
                }
            };
        }
        // A broker that could not be reached a moment ago is not waited for again.
        let recently_failed = |addr: SocketAddr| -> Option<ClientError> {
            let state = self.lock();
            let (at, e) = state.failed.get(&addr)?;
            (at.elapsed() < Duration::from_millis(POOL_RETRY_AFTER_MS)).then(|| e.clone())
        };
        let pools = self.pools();
        for pool in &pools {
            let Some(conn) = pool.open_conn() else { continue };
            match recently_failed(pool.addr()) {
                Some(e) => last = e,
                None => attempt!(Ok::<_, ClientError>(conn)),
            }
        }
        for pool in &pools {
            if let Some(e) = recently_failed(pool.addr()) {
                last = e;
                continue;
            }
            let conn = pool.conn_once(0).await;
            if let Err(e) = &conn {
                if is_unreachable(e) {
                    self.mark_unreachable(pool.addr(), e.clone());
                }
            }
            attempt!(conn);
        }
        for seed in &self.seeds {
            let conn = match self.pool_for(seed).await {
                Ok(pool) => pool.conn_once(0).await,
                Err(e) => Err(e),
            };
            attempt!(conn);
        }
        // Then the brokers the placements named: a client whose seeds are all gone still
        // knows where the rest of the cluster is.
        for address in self.learned_addresses() {
            let conn = match self.pool_for(&address).await {
                Ok(pool) => pool.conn_once(0).await,
                Err(e) => Err(e),
            };
            attempt!(conn);
        }
        Err(last)
    }

    /// The brokers the cached placements name that have no pool and are not seeds, at most
    /// as many as pools may still be opened.
    fn learned_addresses(&self) -> Vec<String> {
        let state = self.lock();
        let room = BROKER_POOLS_MAX.saturating_sub(state.pools.len());
        let mut out: Vec<String> = Vec::new();
        for owner in state.placements.values().flat_map(|p| p.owners.iter()) {
            let address = &owner.address;
            let pooled = state.names.get(address).is_some_and(|a| state.pools.contains_key(a));
            if pooled || self.seeds.contains(address) || out.contains(address) {
                continue;
            }
            if out.len() == room {
                break;
            }
            out.push(address.clone());
        }
        out
    }

    /// Counts the broker at `addr` as unreachable for [`POOL_RETRY_AFTER_MS`] (a request to it
    /// timed out: it may be paused or cut off), so retries look elsewhere meanwhile.
    pub(crate) fn mark_unreachable(&self, addr: SocketAddr, e: ClientError) {
        self.lock().note_failed(addr, e);
    }

    /// The pool of the broker at `address` (`host:port`), opened on first use. A broker that
    /// could not be reached is not tried again for [`POOL_RETRY_AFTER_MS`].
    pub(crate) async fn pool_for(&self, address: &str) -> Result<Arc<Pool>, ClientError> {
        let known = self.lock().names.get(address).copied();
        let addr = match known {
            Some(a) => a,
            None => {
                let a = resolve(address).await?;
                let mut state = self.lock();
                if state.names.len() >= BROKER_POOLS_MAX * 2 {
                    state.names.clear();
                }
                state.names.insert(address.to_owned(), a);
                a
            }
        };
        if let Some(p) = self.cached_pool(addr)? {
            return Ok(p);
        }
        let _gate = self.open_gate.lock().await;
        if let Some(p) = self.cached_pool(addr)? {
            return Ok(p);
        }
        if self.lock().pools.len() >= BROKER_POOLS_MAX {
            return Err(ClientError::Protocol(format!(
                "the cluster names more than {BROKER_POOLS_MAX} brokers"
            )));
        }
        let params = ConnParams { addr, ..self.template.clone() };
        match Pool::open(address.to_owned(), params, &self.config, self.closed.clone()).await {
            Ok(pool) => {
                let mut state = self.lock();
                state.failed.remove(&addr);
                state.pools.insert(addr, pool.clone());
                tracing::info!(broker = address, connections = pool.len(), "connected to broker");
                Ok(pool)
            }
            Err(e) => {
                tracing::warn!(broker = address, error = %e, "cannot reach broker");
                self.lock().note_failed(addr, e.clone());
                Err(e)
            }
        }
    }

    fn cached_pool(&self, addr: SocketAddr) -> Result<Option<Arc<Pool>>, ClientError> {
        let state = self.lock();
        if let Some(p) = state.pools.get(&addr) {
            return Ok(Some(p.clone()));
        }
        match state.failed.get(&addr) {
            Some((at, e)) if at.elapsed() < Duration::from_millis(POOL_RETRY_AFTER_MS) => {
                Err(e.clone())
            }
            _ => Ok(None),
        }
    }

    /// Closes every pool.
    pub(crate) fn close(&self) {
        for pool in self.pools() {
            pool.close();
        }
    }

    /// Completes an operation whose first answer was `first`: a `NotOwner` answer sends it
    /// (through `attempt`) to the named owner, at most [`NOT_OWNER_REDIRECTS_MAX`] times; a
    /// `ShardUnavailable` answer, or an owner that cannot be reached, makes it wait
    /// [`SHARD_UNAVAILABLE_RETRY_MS`], refresh the placement and try the shard's owner again,
    /// until [`SHARD_UNAVAILABLE_DEADLINE_MS`] have passed. Any other answer is returned.
    ///
    /// `attempt` must be safe to repeat after these answers: the broker stored nothing (or,
    /// for an idempotent batch, a repeat is stored once). `patience_ms` replaces
    /// [`SHARD_UNAVAILABLE_DEADLINE_MS`] when given (an idempotent batch waits out a
    /// failover: its retry timeout).
    pub(crate) async fn follow<T, F, Fut>(
        &self,
        stream: &str,
        mut shard: Option<ShardId>,
        first: Result<T, ClientError>,
        patience_ms: Option<u64>,
        mut attempt: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut answer = first;
        let mut redirects = 0u32;
        let mut patience = Patience::new(patience_ms.unwrap_or(SHARD_UNAVAILABLE_DEADLINE_MS));
        loop {
            let target = match answer {
                Err(ClientError::NotOwner { stream: s, shard: refused, owner }) => {
                    redirects += 1;
                    self.learn(&s, refused, &owner);
                    if redirects > NOT_OWNER_REDIRECTS_MAX {
                        return Err(ClientError::NotOwner { stream: s, shard: refused, owner });
                    }
                    shard = Some(refused);
                    tracing::debug!(stream, shard = refused.0, owner = %owner.address, "NotOwner: resending to the owner");
                    owner.live.then_some(owner.address)
                }
                Err(e) if e.is_shard_unavailable() => None,
                other => return other,
            };
            let target = match target {
                Some(address) => address,
                None => {
                    patience.wait(stream, shard).await?;
                    match self.owner_address(stream, shard).await? {
                        Some(address) => address,
                        None => {
                            answer = Err(unavailable(stream, shard));
                            continue;
                        }
                    }
                }
            };
            answer = match self.conn_at(&target, shard).await {
                Ok(conn) => attempt(conn).await,
                Err(e) if is_permanent(&e) || matches!(e, ClientError::Closed) => return Err(e),
                Err(e) => {
                    tracing::debug!(broker = target, error = %e, "owner unreachable");
                    Err(unavailable(stream, shard))
                }
            };
        }
    }

    /// A connection to the broker at `address`, on the slot of `shard`'s core: one attempt.
    pub(crate) async fn conn_at(
        &self,
        address: &str,
        shard: Option<ShardId>,
    ) -> Result<Arc<Conn>, ClientError> {
        let pool = self.pool_for(address).await?;
        if let Some((at, e)) = self.lock().failed.get(&pool.addr()) {
            if at.elapsed() < Duration::from_millis(POOL_RETRY_AFTER_MS) {
                return Err(e.clone());
            }
        }
        let slot = shard.map_or_else(|| pool.next_slot(), |s| pool.slot_for_shard(s));
        let conn = pool.conn_once(slot).await;
        if let Err(e) = &conn {
            if is_unreachable(e) {
                self.lock().note_failed(pool.addr(), e.clone());
            }
        }
        conn
    }

    /// The address to try for `shard` after a fresh look at the placement: its owner when
    /// live, `None` when the shard is unavailable; without a shard, any live owner.
    async fn owner_address(
        &self,
        stream: &str,
        shard: Option<ShardId>,
    ) -> Result<Option<String>, ClientError> {
        let placement = match self.refresh(stream, Instant::now()).await {
            Ok(p) => p,
            Err(e) if e.is_shard_unavailable() => return Ok(None),
            Err(e) if is_unreachable(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(match shard {
            Some(s) => match placement.owner(s) {
                Some(o) => o.live.then(|| o.address.clone()),
                // A shard the placement does not have: let a broker answer.
                None => Some(self.home.name().to_owned()),
            },
            None => placement.live_addresses().first().map(|a| (*a).to_owned()),
        })
    }
}

/// Waits between tries of an unavailable shard, and says when to give up.
pub(crate) struct Patience {
    since: Option<Instant>,
    deadline: Duration,
}

impl Default for Patience {
    fn default() -> Self {
        Patience::new(SHARD_UNAVAILABLE_DEADLINE_MS)
    }
}

impl Patience {
    /// Gives up `deadline_ms` after the first wait.
    pub(crate) fn new(deadline_ms: u64) -> Self {
        Patience { since: None, deadline: Duration::from_millis(deadline_ms) }
    }

    /// Waits before the next try, or fails with `ShardUnavailable` once the deadline passed.
    pub(crate) async fn wait(
        &mut self,
        stream: &str,
        shard: Option<ShardId>,
    ) -> Result<(), ClientError> {
        let since = *self.since.get_or_insert_with(Instant::now);
        let deadline = self.deadline;
        let waited = since.elapsed();
        if waited >= deadline {
            return Err(ClientError::ShardUnavailable {
                stream: stream.to_owned(),
                shard,
                waited_ms: waited.as_millis() as u64,
            });
        }
        let pause = Duration::from_millis(SHARD_UNAVAILABLE_RETRY_MS).min(deadline - waited);
        tokio::time::sleep(pause).await;
        Ok(())
    }
}

/// The error that stands for "unavailable, try again" inside [`Cluster::follow`].
pub(crate) fn unavailable(stream: &str, shard: Option<ShardId>) -> ClientError {
    ClientError::ShardUnavailable { stream: stream.to_owned(), shard, waited_ms: 0 }
}

/// Whether `e` says the broker could not be reached (another broker may answer).
pub(crate) fn is_unreachable(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::ConnectionLost(_)
            | ClientError::Timeout { .. }
            | ClientError::Connect(_)
            | ClientError::Resolve { .. }
    )
}

/// Sends `Metadata` for `stream` on `conn`'s control lane.
async fn metadata(conn: &Conn, stream: &str) -> Result<Vec<ShardOwner>, ClientError> {
    let id = conn.next_request_id();
    let frame = Frame::Metadata(Metadata { request_id: id, stream: stream.to_owned() });
    match conn.request(id, &frame).await? {
        Frame::MetadataOk(m) if m.stream != stream => {
            Err(ClientError::Protocol(format!("MetadataOk for {:?}, asked {stream:?}", m.stream)))
        }
        Frame::MetadataOk(m) if m.owners.is_empty() => Err(ClientError::Broker {
            code: ErrorCode::ShardUnavailable,
            message: "no shard placed".into(),
        }),
        Frame::MetadataOk(m) => Ok(m.owners),
        other => Err(unexpected(&other, FrameType::MetadataOk)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_recent_failures_are_kept() {
        let mut state = State::default();
        let old = Instant::now() - Duration::from_millis(POOL_RETRY_AFTER_MS + 500);
        for port in 1..=100u16 {
            let addr = SocketAddr::from(([10, 0, 0, 1], port));
            state.failed.insert(addr, (old, ClientError::Connect("gone".into())));
        }
        let fresh = SocketAddr::from(([10, 0, 0, 2], 7400));
        state.note_failed(fresh, ClientError::Connect("down".into()));
        assert_eq!(state.failed.len(), 1);
        assert!(state.failed.contains_key(&fresh));
    }
}
