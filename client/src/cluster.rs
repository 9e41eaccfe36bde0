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
//!
//! A broker that could not be reached, or did not answer in time, is penalized for a moment
//! ([`ADDRESS_PENALTY_MIN_MS`], doubling per failure in a row up to [`ADDRESS_PENALTY_MAX_MS`]):
//! requests that any broker can answer try it after every other one, and requests for its
//! shards fail over at once instead of waiting for it. A dead broker often keeps its
//! connections open in the client's view (nothing closes them until the idle timeout), so
//! requests any broker can answer are raced over the brokers ([`crate::race`]) rather than
//! sent to one and waited for.

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
use crate::race::first_decisive;

/// The most brokers the client keeps a connection pool to.
pub const BROKER_POOLS_MAX: usize = 64;
/// The most streams whose placement is cached; the oldest entry is dropped beyond it.
pub const PLACEMENT_CACHE_STREAMS_MAX: usize = 1024;
/// A cached placement older than this is refreshed in the background on its next use, in
/// milliseconds (a refused request refreshes it at once).
pub const PLACEMENT_MAX_AGE_MS: u64 = 30_000;
/// The most `NotOwner` redirects one operation follows in a row; past it, brokers disagree
/// about the owner (a leadership being handed on reaches one broker's view before another's),
/// and the operation pauses ([`SHARD_UNAVAILABLE_RETRY_MS`]) before following again, until
/// its patience runs out: then it fails with `ClientError::NotOwner`.
pub const NOT_OWNER_REDIRECTS_MAX: u32 = 4;
/// How long one operation retries a shard that is unavailable (its owner down or fenced)
/// before it fails with `ClientError::ShardUnavailable`, in milliseconds.
pub const SHARD_UNAVAILABLE_DEADLINE_MS: u64 = 2_000;
/// The pause between two tries of an unavailable shard, in milliseconds.
pub const SHARD_UNAVAILABLE_RETRY_MS: u64 = 200;
/// The shortest interval between two background fetches of one stream's placement, in
/// milliseconds (a stream the cluster does not know is not asked for on every record).
pub const PLACEMENT_REFRESH_MIN_MS: u64 = 250;
/// After a broker could not be reached (or did not answer in time), how long it is penalized:
/// requests for it fail at once (its shards' batches fail over to their next owner) and it is
/// asked after every other broker, in milliseconds. Doubled for each failure in a row, up to
/// [`ADDRESS_PENALTY_MAX_MS`]; a broker that answers is forgiven.
pub const ADDRESS_PENALTY_MIN_MS: u64 = 250;
/// The longest penalty of a broker that keeps failing, in milliseconds.
pub const ADDRESS_PENALTY_MAX_MS: u64 = 2_000;
/// How long a request that any broker can answer waits on the brokers asked so far before it
/// asks the next one as well, in milliseconds (a broker that failed is left at once).
pub const ANSWER_STAGGER_MS: u64 = 50;
/// The pause before a batch refused with `OutOfOrderSequence` is sent again, in milliseconds:
/// an earlier batch of its producer is on its way (batches that fail over together reach the
/// next leader in any order).
pub const OUT_OF_ORDER_RETRY_MS: u64 = 20;
/// How long an idempotent batch waits for its broker's answer before the client starts looking
/// whether its shard has left that broker, in milliseconds (see [`OWNER_CHECK_INTERVAL_MS`]).
pub const ANSWER_SUSPECT_MS: u64 = 500;
/// How long [`Cluster::conn_at`] waits for a connection attempt before it answers that the
/// broker is not reachable yet (the attempt goes on), in milliseconds: a live broker's
/// handshake takes a few; a dead one's the whole per-attempt connect timeout.
pub const CONNECT_WAIT_MS: u64 = 100;
/// How long the broker of a batch awaited past [`ANSWER_SUSPECT_MS`] has to answer a probe
/// (`Metadata` on the same connection) before its connection counts as dead and is closed, in
/// milliseconds. A broker restarted on its address, or killed, leaves its old connections open
/// in the client's view until the idle timeout (its new process does not know them).
pub const PROBE_TIMEOUT_MS: u64 = 1_000;
/// How often a placement is fetched again, at most, to see whether the shard of a batch
/// waiting for its ack has a new owner, in milliseconds (many batches share a fetch).
pub const OWNER_CHECK_INTERVAL_MS: u64 = 200;

/// The cluster state of one client.
pub(crate) struct Cluster {
    config: ClientConfig,
    template: ConnParams,
    closed: Arc<AtomicBool>,
    home: Arc<Pool>,
    seeds: Vec<String>,
    /// Shared with the reconnects [`Cluster::conn_at`] leaves running in the background.
    state: Arc<Mutex<State>>,
    /// Serialises placement fetches, so that many refused requests cause one fetch.
    refresh_gate: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Every broker's pool, the home broker's included.
    pools: HashMap<SocketAddr, Arc<Pool>>,
    /// Resolved `host:port` names.
    names: HashMap<String, SocketAddr>,
    /// Brokers that could not be reached or did not answer: their penalties.
    failed: HashMap<SocketAddr, Penalty>,
    placements: HashMap<String, Arc<Placement>>,
    /// When a background fetch of each stream's placement last started.
    background: HashMap<String, Instant>,
    /// The gate of each broker whose pool is being opened (a broker's pool is opened once).
    opening: HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>,
}

/// A broker's penalty: until when it counts as failed, after how many failures in a row, and
/// the last error.
struct Penalty {
    until: Instant,
    failures: u32,
    error: ClientError,
}

impl State {
    /// Penalizes `addr` from now (see [`ADDRESS_PENALTY_MIN_MS`]). Penalties that ended more
    /// than [`ADDRESS_PENALTY_MAX_MS`] ago are forgotten (a later failure starts over), so the
    /// map holds only the brokers that failed within about that time.
    fn note_failed(&mut self, addr: SocketAddr, e: ClientError) {
        let now = Instant::now();
        let forget = Duration::from_millis(ADDRESS_PENALTY_MAX_MS);
        self.failed.retain(|_, p| p.until + forget > now);
        let failures = self.failed.get(&addr).map_or(1, |p| p.failures.saturating_add(1));
        let doublings = failures.saturating_sub(1).min(16);
        let ms = (ADDRESS_PENALTY_MIN_MS << doublings).min(ADDRESS_PENALTY_MAX_MS);
        let until = now + Duration::from_millis(ms);
        self.failed.insert(addr, Penalty { until, failures, error: e });
    }

    /// The error `addr` failed with, while its penalty lasts.
    fn penalty(&self, addr: SocketAddr) -> Option<ClientError> {
        self.failed.get(&addr).filter(|p| p.until > Instant::now()).map(|p| p.error.clone())
    }

    /// When `addr`'s penalty ends, while it lasts.
    fn penalized_until(&self, addr: SocketAddr) -> Option<Instant> {
        self.failed.get(&addr).map(|p| p.until).filter(|u| *u > Instant::now())
    }
}

/// A broker a request that any broker can answer may be sent to.
enum Candidate {
    /// A pool with an open connection.
    Open(Arc<Pool>, Arc<Conn>),
    /// A pool to reconnect (one attempt).
    Pool(Arc<Pool>),
    /// A seed or a broker a placement named, with no pool yet.
    Address(String),
}

/// What asking one candidate came to.
enum Asked<T> {
    /// No connection could be had.
    NoConn(ClientError),
    /// The request's answer.
    Answer(Result<T, ClientError>),
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
            state: Arc::new(Mutex::new(state)),
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
        self.refresh_from(stream, after, None).await
    }

    /// [`Cluster::refresh`], asking the broker at `avoid` only after every other one (it is
    /// the broker whose ownership is in doubt: its own view may lag the others').
    async fn refresh_from(
        &self,
        stream: &str,
        after: Instant,
        avoid: Option<SocketAddr>,
    ) -> Result<Arc<Placement>, ClientError> {
        let _gate = self.refresh_gate.lock().await;
        if let Some(p) = self.lock().placements.get(stream).filter(|p| p.fetched > after) {
            return Ok(p.clone());
        }
        let owners = self.fetch(stream, avoid).await?;
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

    /// Drops what is cached of `stream` (deleted or created by this client): its next use
    /// fetches it.
    pub(crate) fn forget(&self, stream: &str) {
        self.lock().placements.remove(stream);
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
    async fn fetch(
        &self,
        stream: &str,
        avoid: Option<SocketAddr>,
    ) -> Result<Vec<ShardOwner>, ClientError> {
        let skip = ClientError::is_shard_unavailable;
        self.ask_any(true, skip, avoid, |conn| async move { metadata(&conn, stream).await }).await
    }

    /// Runs `request` on a connection to any broker that can be reached. The brokers are
    /// asked in this order: those with an open connection (the home broker first), the other
    /// pools (one connection attempt each), the seeds, the brokers the cached placements name;
    /// a penalized broker after all of them. An unreachable broker is skipped.
    ///
    /// With `resend` (a request that may be sent twice: `Metadata`, descriptions), the brokers
    /// are raced: the next one is asked as soon as the ones asked so far failed, or
    /// [`ANSWER_STAGGER_MS`] after the last was asked, and the first answer wins; a broker
    /// whose connection was lost under the request, or that did not answer in time, is
    /// skipped (and penalized). Without it, one after another, and a lost request's error is
    /// returned (its outcome is unknown).
    pub(crate) async fn anywhere<T, F, Fut>(
        &self,
        resend: bool,
        request: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Arc<Conn>) -> Fut,
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
        request: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        self.ask_any(resend, skip, None, request).await
    }

    /// [`Cluster::anywhere_with`], asking the broker at `avoid` after every other one that is
    /// not penalized.
    async fn ask_any<T, F, Fut>(
        &self,
        resend: bool,
        skip: fn(&ClientError) -> bool,
        avoid: Option<SocketAddr>,
        request: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let none = || ClientError::ConnectionLost("no broker of the cluster answered".into());
        let request = &request;
        let ask = |candidate: Candidate| async move {
            let (pool, conn) = match candidate {
                Candidate::Open(pool, conn) => (Some(pool), Ok(conn)),
                Candidate::Pool(pool) => {
                    let conn = self.pool_conn(&pool, 0).await;
                    (Some(pool), conn)
                }
                Candidate::Address(address) => match self.pool_for(&address).await {
                    Ok(pool) => {
                        let conn = self.pool_conn(&pool, 0).await;
                        (Some(pool), conn)
                    }
                    Err(e) => (None, Err(e)),
                },
            };
            let conn = match conn {
                Ok(conn) => conn,
                Err(e) => return Asked::NoConn(e),
            };
            let peer = conn.peer();
            let mut answer = request(conn).await;
            // A connection found closed under a request that may be resent: once more on a
            // fresh one to the same broker.
            if let (true, Err(ClientError::ConnectionLost(_)), Some(pool)) = (resend, &answer, pool)
            {
                if let Ok(conn) = self.pool_conn(&pool, 0).await {
                    answer = request(conn).await;
                }
            }
            match &answer {
                Err(e) if is_unreachable(e) => {
                    if resend {
                        self.mark_unreachable(peer, e.clone());
                    }
                }
                _ => self.forgive(peer),
            }
            Asked::Answer(answer)
        };
        let candidates = self.candidates(avoid);
        if resend {
            let decisive = |asked: &Asked<T>| match asked {
                Asked::NoConn(e) => is_permanent(e) || matches!(e, ClientError::Closed),
                Asked::Answer(Err(e)) => !(is_unreachable(e) || skip(e)),
                Asked::Answer(Ok(_)) => true,
            };
            let attempts = candidates.into_iter().map(ask).collect();
            let stagger = Duration::from_millis(ANSWER_STAGGER_MS);
            return match first_decisive(attempts, stagger, decisive).await {
                Ok(Asked::Answer(answer)) => answer,
                Ok(Asked::NoConn(e)) => Err(e),
                Err(Some(Asked::Answer(answer))) => answer,
                Err(Some(Asked::NoConn(e))) => Err(e),
                Err(None) => Err(none()),
            };
        }
        let mut last = none();
        for candidate in candidates {
            match ask(candidate).await {
                Asked::NoConn(e) if is_unreachable(&e) => last = e,
                Asked::NoConn(e) => return Err(e),
                Asked::Answer(Err(e)) if skip(&e) => last = e,
                Asked::Answer(answer) => return answer,
            }
        }
        Err(last)
    }

    /// Every broker a request may be sent to, in the order of [`Cluster::anywhere`]; `avoid`
    /// after the others that are not penalized.
    fn candidates(&self, avoid: Option<SocketAddr>) -> Vec<Candidate> {
        let pools = self.pools();
        let learned = self.learned_addresses();
        let state = self.lock();
        // (penalized until, kind, candidate): stable-sorted, so pools keep the home first.
        let mut list: Vec<(Option<Instant>, u8, Candidate)> = Vec::new();
        // The avoided broker's kinds sort after every other kind.
        let avoided =
            |addr: Option<SocketAddr>| if addr.is_some() && addr == avoid { 10 } else { 0 };
        for pool in pools {
            let until = state.penalized_until(pool.addr());
            let later = avoided(Some(pool.addr()));
            match pool.open_conn() {
                Some(conn) => list.push((until, later, Candidate::Open(pool, conn))),
                None => list.push((until, later + 1, Candidate::Pool(pool))),
            }
        }
        let pooled =
            |address: &str| state.names.get(address).is_some_and(|a| state.pools.contains_key(a));
        let until_of =
            |address: &str| state.names.get(address).and_then(|a| state.penalized_until(*a));
        let later = |address: &str| avoided(state.names.get(address).copied());
        for seed in self.seeds.iter().filter(|s| !pooled(s)) {
            list.push((until_of(seed), later(seed) + 2, Candidate::Address(seed.clone())));
        }
        for address in learned {
            let kind = later(&address) + 3;
            list.push((until_of(&address), kind, Candidate::Address(address)));
        }
        list.sort_by_key(|(until, kind, _)| (until.is_some(), *until, *kind));
        list.into_iter().map(|(_, _, c)| c).collect()
    }

    /// Slot `index`'s connection of `pool` (one attempt), penalizing the broker when it
    /// cannot be reached and forgiving it when it can.
    pub(crate) async fn pool_conn(
        &self,
        pool: &Pool,
        index: usize,
    ) -> Result<Arc<Conn>, ClientError> {
        let conn = pool.conn_once(index).await;
        match &conn {
            Err(e) if is_unreachable(e) => self.mark_unreachable(pool.addr(), e.clone()),
            Err(_) => {}
            Ok(_) => self.forgive(pool.addr()),
        }
        conn
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

    /// Penalizes the broker at `addr` (see [`ADDRESS_PENALTY_MIN_MS`]): it could not be
    /// reached, or a request to it timed out (it may be dead, paused or cut off), so retries
    /// look elsewhere meanwhile.
    pub(crate) fn mark_unreachable(&self, addr: SocketAddr, e: ClientError) {
        let mut state = self.lock();
        if state.penalty(addr).is_none() {
            tracing::debug!(broker = %addr, error = %e, "broker penalized");
        }
        state.note_failed(addr, e);
    }

    /// Forgets the penalty of the broker at `addr`: it answered.
    pub(crate) fn forgive(&self, addr: SocketAddr) {
        self.lock().failed.remove(&addr);
    }

    /// The error the broker at `addr` failed with, while it is penalized.
    pub(crate) fn penalty(&self, addr: SocketAddr) -> Option<ClientError> {
        self.lock().penalty(addr)
    }

    /// The broker address `address` (`host:port`) resolved to, when known.
    pub(crate) fn resolved(&self, address: &str) -> Option<SocketAddr> {
        let known = self.lock().names.get(address).copied();
        known.or_else(|| address.parse().ok())
    }

    /// The pool of the broker at `address` (`host:port`), opened on first use (its
    /// connections with the per-attempt connect timeout). A penalized broker fails at once.
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
        // One opening per broker at a time; brokers are opened side by side (a dead one must
        // not hold the others).
        let gate = {
            let mut state = self.lock();
            if state.opening.len() >= BROKER_POOLS_MAX * 2 {
                state.opening.retain(|_, g| Arc::strong_count(g) > 1);
            }
            state.opening.entry(addr).or_default().clone()
        };
        let _gate = gate.lock().await;
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
                state.opening.remove(&addr);
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
        match state.penalty(addr) {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Closes every pool.
    pub(crate) fn close(&self) {
        for pool in self.pools() {
            pool.close();
        }
    }

    /// Completes an operation whose first answer was `first`: a `NotOwner` answer sends it
    /// (through `attempt`) to the named owner, [`NOT_OWNER_REDIRECTS_MAX`] times in a row,
    /// then after a pause again, until the patience below runs out; a
    /// `ShardUnavailable` answer, or an owner that cannot be reached, makes it wait
    /// [`SHARD_UNAVAILABLE_RETRY_MS`], refresh the placement and try the shard's owner again,
    /// until [`SHARD_UNAVAILABLE_DEADLINE_MS`] have passed; `OutOfOrderSequence` sends it
    /// again to the same broker after [`OUT_OF_ORDER_RETRY_MS`]. Any other answer is returned.
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
        /// Where the next try goes.
        enum Next {
            To(String),
            /// Wait, then the owner of a fresh placement.
            Wait,
            /// The owner of a fresh placement, now.
            Lookup,
        }
        let mut answer = first;
        let mut redirects = 0u32;
        let mut patience = Patience::new(patience_ms.unwrap_or(SHARD_UNAVAILABLE_DEADLINE_MS));
        // The broker tried last: an out-of-order batch goes there again.
        let mut last: Option<String> = None;
        loop {
            let next = match answer {
                Err(ClientError::NotOwner { stream: s, shard: refused, owner }) => {
                    redirects += 1;
                    self.learn(&s, refused, &owner);
                    if redirects > NOT_OWNER_REDIRECTS_MAX {
                        // The brokers disagree about the owner, as while a leadership is
                        // handed on (each names the other until both views have the record):
                        // pause, then follow again, within the operation's patience.
                        if patience.wait(stream, Some(refused)).await.is_err() {
                            return Err(ClientError::NotOwner { stream: s, shard: refused, owner });
                        }
                        redirects = 0;
                    }
                    shard = Some(refused);
                    tracing::debug!(stream, shard = refused.0, owner = %owner.address, "NotOwner: resending to the owner");
                    if owner.live {
                        Next::To(owner.address)
                    } else {
                        Next::Wait
                    }
                }
                Err(ClientError::Broker { code: ErrorCode::OutOfOrderSequence, .. }) => {
                    patience.wait_for(stream, shard, OUT_OF_ORDER_RETRY_MS).await?;
                    last.take().map_or(Next::Lookup, Next::To)
                }
                Err(e) if e.is_shard_unavailable() => Next::Wait,
                other => return other,
            };
            let target = match next {
                Next::To(address) => address,
                Next::Wait | Next::Lookup => {
                    if matches!(next, Next::Wait) {
                        patience.wait(stream, shard).await?;
                    }
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
            last = Some(target);
        }
    }

    /// A connection to the broker at `address`, on the slot of `shard`'s core; a penalized
    /// broker fails at once. A slot to reconnect gets one attempt (with the per-attempt connect
    /// timeout) in a task of its own, waited for at most [`CONNECT_WAIT_MS`]: a retry loop
    /// calling this every 200 ms is never held by an attempt to a dead broker, and looks at the
    /// placement again meanwhile. While an attempt runs, others fail at once (one per slot).
    pub(crate) async fn conn_at(
        &self,
        address: &str,
        shard: Option<ShardId>,
    ) -> Result<Arc<Conn>, ClientError> {
        let pool = self.pool_for(address).await?;
        let addr = pool.addr();
        if let Some(e) = self.penalty(addr) {
            return Err(e);
        }
        let slot = shard.map_or_else(|| pool.next_slot(), |s| pool.slot_for_shard(s));
        if let Some(conn) = pool.open_slot(slot) {
            return Ok(conn);
        }
        let connecting = || ClientError::Connect(format!("connecting to {addr}"));
        if pool.reconnecting(slot) {
            return Err(connecting());
        }
        let state = self.state.clone();
        let attempt = tokio::spawn(async move {
            let conn = pool.conn_once(slot).await;
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            match &conn {
                Err(e) if is_unreachable(e) => state.note_failed(addr, e.clone()),
                Err(_) => {}
                Ok(_) => drop(state.failed.remove(&addr)),
            }
            conn
        });
        match tokio::time::timeout(Duration::from_millis(CONNECT_WAIT_MS), attempt).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => Err(ClientError::Connect(e.to_string())),
            Err(_) => Err(connecting()),
        }
    }

    /// Whether `shard` of `stream` has left the broker at `peer`: a placement fetched at most
    /// [`OWNER_CHECK_INTERVAL_MS`] ago (by any broker that answers first) names another owner,
    /// or says its owner is down. `false` when no placement can be had. For a batch whose ack
    /// does not come: its broker may be dead with its connection still open in the client's
    /// view, and the shard's next leader takes the batch instead.
    pub(crate) async fn owner_moved(&self, stream: &str, shard: ShardId, peer: SocketAddr) -> bool {
        let interval = Duration::from_millis(OWNER_CHECK_INTERVAL_MS);
        let after = Instant::now().checked_sub(interval).unwrap_or_else(Instant::now);
        let Ok(placement) = self.refresh_from(stream, after, Some(peer)).await else {
            return false;
        };
        match placement.owner(shard) {
            Some(o) if !o.live => true,
            Some(o) => self.resolved(&o.address).is_some_and(|a| a != peer),
            None => false,
        }
    }

    /// Whether the cached placement of `stream` shows `shard` owned by another broker than
    /// the one at `here`, or its owner down (`false` without a placement).
    pub(crate) fn owner_elsewhere(&self, stream: &str, shard: ShardId, here: SocketAddr) -> bool {
        let owner = {
            let state = self.lock();
            match state.placements.get(stream).and_then(|p| p.owner(shard)) {
                Some(o) => o.clone(),
                None => return false,
            }
        };
        !owner.live || self.resolved(&owner.address).is_some_and(|a| a != here)
    }

    /// The live owner of `shard` in the cached placement of `stream`, unless it is penalized.
    pub(crate) fn live_owner(&self, stream: &str, shard: ShardId) -> Option<String> {
        let state = self.lock();
        let owner = state.placements.get(stream)?.owner(shard)?.clone();
        let penalized =
            state.names.get(&owner.address).is_some_and(|a| state.penalty(*a).is_some());
        (owner.live && !penalized).then_some(owner.address)
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
        self.wait_for(stream, shard, SHARD_UNAVAILABLE_RETRY_MS).await
    }

    /// [`Patience::wait`] with a pause of `pause_ms`.
    pub(crate) async fn wait_for(
        &mut self,
        stream: &str,
        shard: Option<ShardId>,
        pause_ms: u64,
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
        let pause = Duration::from_millis(pause_ms).min(deadline - waited);
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
            | ClientError::PortUnreachable { .. }
            | ClientError::Resolve { .. }
    )
}

/// Whether the broker on `conn` answers at all: a `Metadata` request for `stream` on the same
/// connection, answered (with anything) within [`PROBE_TIMEOUT_MS`]; an answer to a probe
/// within the last [`OWNER_CHECK_INTERVAL_MS`] counts, and one probe at a time is sent per
/// connection (the others wait for its result). A connection that does not answer is closed,
/// so that everything waiting on it fails over and the next request reconnects.
pub(crate) async fn conn_answers(conn: &Conn, stream: &str) -> bool {
    let mut probed = conn.probed.lock().await;
    let fresh = Duration::from_millis(OWNER_CHECK_INTERVAL_MS);
    if probed.is_some_and(|at| at.elapsed() < fresh) {
        return true;
    }
    if conn.is_closed() {
        return false;
    }
    let limit = Duration::from_millis(PROBE_TIMEOUT_MS);
    match tokio::time::timeout(limit, metadata(conn, stream)).await {
        Ok(Err(e)) if is_unreachable(&e) => {}
        Ok(_) => {
            *probed = Some(Instant::now());
            return true;
        }
        Err(_) => {}
    }
    tracing::debug!(broker = %conn.peer(), "no answer to a probe: closing the connection");
    conn.close();
    false
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
        let old = Instant::now() - Duration::from_millis(ADDRESS_PENALTY_MAX_MS + 500);
        for port in 1..=100u16 {
            let addr = SocketAddr::from(([10, 0, 0, 1], port));
            let error = ClientError::Connect("gone".into());
            state.failed.insert(addr, Penalty { until: old, failures: 3, error });
        }
        let fresh = SocketAddr::from(([10, 0, 0, 2], 7400));
        state.note_failed(fresh, ClientError::Connect("down".into()));
        assert_eq!(state.failed.len(), 1);
        assert!(state.failed.contains_key(&fresh));
    }

    #[test]
    fn a_penalty_doubles_per_failure_in_a_row_up_to_its_maximum() {
        let mut state = State::default();
        let addr = SocketAddr::from(([10, 0, 0, 3], 7400));
        let mut lengths = Vec::new();
        for _ in 0..6 {
            let before = Instant::now();
            state.note_failed(addr, ClientError::Connect("down".into()));
            let until = state.penalized_until(addr).expect("penalized");
            lengths.push((until - before).as_millis() as u64);
        }
        let want = [250, 500, 1000, 2000, 2000, 2000];
        for (got, want) in lengths.iter().zip(want) {
            assert!((want..want + 50).contains(got), "{lengths:?}");
        }
        assert!(state.penalty(addr).is_some());
        let other = SocketAddr::from(([10, 0, 0, 4], 7400));
        assert!(state.penalty(other).is_none());
    }
}
