//! One broker's connection pool: connections spread over the broker's cores, each slot
//! reconnecting on its own with backoff.
//!
//! Call order: [`Pool::open`] (or [`Pool::with_first`] when the first connection is already
//! open), then [`Pool::conn`] for a slot's connection (reconnecting if it closed), and
//! [`Pool::close`]. A single-node client has one pool; a cluster client one per broker
//! (`crate::cluster`).
//!
//! The pool opens `connections` connections (default: the broker's `core_count` from its first
//! HelloOk, at most [`CONNECTIONS_MAX`]), each on its own endpoint. The first lands where the
//! kernel's hash of its 4-tuple puts it; with `cover_cores` each of the others asks for the
//! next core in turn (its Initial's destination connection ID names the core, and the broker
//! hands the handshake to it), and a slot that reconnects asks for the core it had. A broker
//! that places connections by the hash alone is covered by replacing connections that landed
//! on an already covered core with fresh ones, each asking for a core still missing, for at
//! most [`COVER_ATTEMPTS_PER_CONNECTION`] x `connections` extra handshakes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use felix_proto::{CoreId, HelloOk, ShardId};

use crate::config::{ClientConfig, CONNECTIONS_MAX};
use crate::conn::{Conn, ConnParams};
use crate::error::ClientError;

/// Extra handshakes per connection spent on reaching uncovered cores.
pub const COVER_ATTEMPTS_PER_CONNECTION: usize = 4;
/// Marks a slot whose connection's core is not known.
const CORE_UNKNOWN: u32 = u32::MAX;

/// Within one reconnect attempt, how long after a refused port (nothing listens: a broker
/// restarting) the connection is tried again.
pub const REFUSED_RETRY_MS: u64 = 100;

/// The connections to one broker.
pub(crate) struct Pool {
    /// The address as configured or as the cluster advertised it (`host:port`).
    name: String,
    params: ConnParams,
    slots: Vec<Slot>,
    hello: HelloOk,
    next_subscription_slot: AtomicUsize,
    reconnect: ReconnectPolicy,
    /// The client's closed flag, shared by every pool: no reconnect after it is set.
    closed: Arc<AtomicBool>,
}

/// One position of the pool: the current connection and the gate that serialises reconnects.
struct Slot {
    current: RwLock<Option<Arc<Conn>>>,
    reconnect: tokio::sync::Mutex<()>,
    core: AtomicU32,
}

/// The reconnect settings of the configuration.
#[derive(Clone, Copy)]
struct ReconnectPolicy {
    attempts_max: u32,
    backoff_min: Duration,
    backoff_max: Duration,
}

impl Pool {
    /// Opens a pool to `params.addr`: the first connection, then the others.
    pub(crate) async fn open(
        name: String,
        params: ConnParams,
        config: &ClientConfig,
        closed: Arc<AtomicBool>,
    ) -> Result<Arc<Self>, ClientError> {
        let first = Conn::open(&params).await?;
        Self::with_first(name, params, first, config, closed).await
    }

    /// Completes a pool whose first connection is `first`.
    pub(crate) async fn with_first(
        name: String,
        params: ConnParams,
        first: Arc<Conn>,
        config: &ClientConfig,
        closed: Arc<AtomicBool>,
    ) -> Result<Arc<Self>, ClientError> {
        let hello = first.hello().clone();
        let core_count = usize::from(hello.core_count.max(1));
        let target = config.connections.unwrap_or(core_count).clamp(1, CONNECTIONS_MAX);
        let first_core = usize::from(first.hello().core.0);
        let mut conns = vec![first];
        let mut opening = tokio::task::JoinSet::new();
        for k in 1..target {
            let p = params.clone();
            // The cores after the first one's, in turn.
            let core = config.cover_cores.then(|| core_id((first_core + k) % core_count));
            opening.spawn(async move { Conn::open_on(&p, core).await });
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
        Ok(Arc::new(Self {
            name,
            params,
            slots,
            hello,
            next_subscription_slot: AtomicUsize::new(0),
            reconnect: ReconnectPolicy {
                attempts_max: config.reconnect_attempts_max.max(1),
                backoff_min: Duration::from_millis(config.reconnect_backoff_min_ms),
                backoff_max: Duration::from_millis(config.reconnect_backoff_max_ms),
            },
            closed,
        }))
    }

    /// The address this pool was opened for, as named (`host:port`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The resolved address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.params.addr
    }

    /// The broker's first HelloOk.
    pub(crate) fn hello(&self) -> &HelloOk {
        &self.hello
    }

    /// How many connections the pool holds.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The connection of slot `index`, reconnecting with backoff if it is closed.
    pub(crate) async fn conn(&self, index: usize) -> Result<Arc<Conn>, ClientError> {
        self.conn_with(index, self.reconnect.attempts_max).await
    }

    /// Like [`Pool::conn`] with a single connection attempt: for a broker that may be gone,
    /// when another broker can answer instead.
    pub(crate) async fn conn_once(&self, index: usize) -> Result<Arc<Conn>, ClientError> {
        self.conn_with(index, 1).await
    }

    async fn conn_with(&self, index: usize, attempts: u32) -> Result<Arc<Conn>, ClientError> {
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
        let policy = ReconnectPolicy { attempts_max: attempts, ..self.reconnect };
        let core = self.slot_core(index % self.slots.len()).map(CoreId);
        let c = reconnect(&self.params, core, policy).await?;
        slot.core.store(u32::from(c.hello().core.0), Ordering::Relaxed);
        *slot.current.write().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Slot `index`'s connection when it is open, without reconnecting.
    pub(crate) fn open_slot(&self, index: usize) -> Option<Arc<Conn>> {
        let slot = &self.slots[index % self.slots.len()];
        slot.get_current().filter(|c| !c.is_closed())
    }

    /// Whether slot `index` is reconnecting now.
    pub(crate) fn reconnecting(&self, index: usize) -> bool {
        self.slots[index % self.slots.len()].reconnect.try_lock().is_err()
    }

    /// The connections the pool holds now (none for a slot not connected yet).
    pub(crate) fn current_conns(&self) -> Vec<Arc<Conn>> {
        self.slots.iter().filter_map(Slot::get_current).collect()
    }

    /// Some open connection of the pool, without reconnecting.
    pub(crate) fn open_conn(&self) -> Option<Arc<Conn>> {
        self.slots.iter().filter_map(Slot::get_current).find(|c| !c.is_closed())
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

    /// The slot whose connection is owned by the core of `shard` (`s % core_count`) when the
    /// pool has one, else one chosen by the shard number.
    pub(crate) fn slot_for_shard(&self, shard: ShardId) -> usize {
        let core = shard.0 % u32::from(self.hello.core_count.max(1));
        (0..self.slots.len())
            .find(|&i| self.slot_core(i).is_some_and(|c| u32::from(c) == core))
            .unwrap_or(shard.0 as usize % self.slots.len())
    }

    /// Closes every connection of the pool.
    pub(crate) fn close(&self) {
        for slot in &self.slots {
            if let Some(c) = slot.get_current() {
                c.close();
            }
        }
    }
}

impl Slot {
    fn get_current(&self) -> Option<Arc<Conn>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Opens a connection (asking for `core`, see [`Conn::open_on`]), retrying with exponential
/// backoff. Refusals that a retry cannot fix (certificate, token, version) are returned at once.
async fn reconnect(
    p: &ConnParams,
    core: Option<CoreId>,
    policy: ReconnectPolicy,
) -> Result<Arc<Conn>, ClientError> {
    let mut delay = policy.backoff_min;
    let mut last = ClientError::Connect("no attempt".into());
    for attempt in 1..=policy.attempts_max {
        // The core asked for on the first attempt only: one that is gone (a broker restarted
        // with fewer cores) or full must not hold the slot's every retry.
        match open_attempt(p, core.filter(|_| attempt == 1)).await {
            Ok(c) => {
                tracing::info!(attempt, core = c.hello().core.0, addr = %p.addr, "reconnected");
                return Ok(c);
            }
            Err(e) if is_permanent(&e) => return Err(e),
            Err(e) => {
                tracing::warn!(attempt, addr = %p.addr, error = %e, delay_ms = delay.as_millis() as u64, "reconnect failed");
                last = e;
            }
        }
        if attempt < policy.attempts_max {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(policy.backoff_max);
        }
    }
    Err(last)
}

/// One reconnect attempt: [`Conn::open_on`] within the connect timeout. A refused port fails
/// an open at once, so within the attempt it is tried again every [`REFUSED_RETRY_MS`]: an
/// attempt lasts as long as one the handshake's own retransmissions carried, and a broker that
/// comes back during it is reached as soon.
async fn open_attempt(p: &ConnParams, core: Option<CoreId>) -> Result<Arc<Conn>, ClientError> {
    let deadline = tokio::time::Instant::now() + p.connect_timeout;
    let retry = Duration::from_millis(REFUSED_RETRY_MS);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let params = ConnParams { connect_timeout: left, ..p.clone() };
        match Conn::open_on(&params, core).await {
            Err(ClientError::PortUnreachable { .. }) if left > retry => {
                tokio::time::sleep(retry).await;
            }
            other => return other,
        }
    }
}

/// Whether a connect error is one no retry can fix (certificate, token, version).
pub(crate) fn is_permanent(e: &ClientError) -> bool {
    matches!(e, ClientError::CertificateRejected(_) | ClientError::Refused { .. })
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
        let missing = (0..core_count).find(|c| !covered.contains(&(*c as u16)));
        let Ok(fresh) = Conn::open_on(p, missing.map(core_id)).await else { return };
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

/// Core `index` (below the broker's `core_count`, a `u16`).
fn core_id(index: usize) -> CoreId {
    CoreId(u16::try_from(index).unwrap_or(u16::MAX))
}

fn close_all(conns: &[Arc<Conn>], e: ClientError) -> ClientError {
    for c in conns {
        c.close();
    }
    e
}

/// Resolves `addr` (`host:port`) to its first socket address.
pub(crate) async fn resolve(addr: &str) -> Result<SocketAddr, ClientError> {
    let err = |reason: String| ClientError::Resolve { addr: addr.to_owned(), reason };
    let mut addrs = tokio::net::lookup_host(addr).await.map_err(|e| err(e.to_string()))?;
    addrs.next().ok_or_else(|| err("no address".into()))
}
