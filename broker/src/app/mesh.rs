//! The core mesh: bounded channels between every pair of cores, carrying owned requests and
//! their replies (the broker's `submit_to`).
//!
//! Channels are built on the main thread ([`MeshPlan::new`]) so that core `i`'s ends are known
//! by index; each core takes its own ends once at start ([`MeshPlan::take`]), which is the only
//! time the plan's lock is touched. On the hot path cores exchange owned messages only.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Mutex;

use felix_proto::{AckMode, CoreId, ErrorCode, Offset, ProducerTag, Record, ShardId, StartAt};
use felix_storage::AppendOutcome;

use super::error::WireError;
use super::tail::EncodedBatch;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};

/// Requests (or replies) queued from one core to another, per direction and per kind: the
/// application mesh. Not to be confused with the net layer's queue of forwarded datagrams
/// (`net::config::MESH_DATAGRAMS_QUEUED_MAX`).
pub const MESH_MESSAGES_QUEUED_MAX: usize = 1024;
/// Requests from other cores one core handles at once.
pub const MESH_REQUESTS_IN_FLIGHT_MAX: u64 = 4096;
/// Replies one mesh request gets: its reply channel holds exactly one.
const MESH_REPLIES_PER_REQUEST: usize = 1;

/// A batch for the core that owns its shard: what a session hands to
/// [`super::core_app::CoreApp::submit_local`], here or over the mesh.
#[derive(Debug)]
pub struct AppendBatch {
    /// Stream name.
    pub stream: String,
    /// Shard (owned by the receiver).
    pub shard: ShardId,
    /// Records.
    pub records: Vec<Record>,
    /// Broker time of receipt.
    pub timestamp_ms: u64,
    /// When to answer.
    pub ack: AckMode,
    /// The idempotent producer's tag, if the batch has one.
    pub producer: Option<ProducerTag>,
    /// The producer has no earlier batch unresolved (Publish flag `OLDEST_PENDING`).
    pub oldest_pending: bool,
}

/// Work one core asks of the core that owns a shard.
#[derive(Debug)]
pub enum CoreRequest {
    /// Append a batch to an owned shard.
    Append(AppendBatch),
    /// Read batches from `from`, waiting up to `wait_ms` for new data if none is there.
    Read {
        /// Stream name.
        stream: String,
        /// Shard.
        shard: ShardId,
        /// First offset wanted.
        from: Offset,
        /// Read size.
        max_bytes: usize,
        /// Tail wait.
        wait_ms: u64,
    },
    /// Resolve a start position (and a group's committed position) to an offset.
    Resolve {
        /// Stream name.
        stream: String,
        /// Shard.
        shard: ShardId,
        /// Start when the group has no position.
        start: StartAt,
        /// Consumer group.
        group: Option<String>,
    },
    /// Store a group's position durably.
    Commit {
        /// Stream name.
        stream: String,
        /// Group.
        group: String,
        /// Shard.
        shard: ShardId,
        /// Next offset to read.
        offset: Offset,
    },
    /// Change a stream on core `core` (sent to every core; the core is named by a shard it
    /// owns, `ShardId(core)`).
    Manage {
        /// Stream name.
        stream: String,
        /// The core, as the shard that routes to it.
        core: ShardId,
        /// What to do.
        op: StreamOp,
    },
}

/// A change to one stream on one core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamOp {
    /// The stream was deleted: close it here and delete this core's log of it.
    Drop,
    /// Its retention changed.
    SetRetention(felix_proto::Retention),
}

impl CoreRequest {
    /// The shard the request is for: only that shard's owner core handles it.
    pub fn shard(&self) -> ShardId {
        match self {
            Self::Append(AppendBatch { shard, .. })
            | Self::Read { shard, .. }
            | Self::Resolve { shard, .. }
            | Self::Commit { shard, .. }
            | Self::Manage { core: shard, .. } => *shard,
        }
    }
}

/// The answer to a [`CoreRequest`].
#[derive(Debug)]
pub enum CoreResponse {
    /// Answers Append.
    Appended(Result<AppendOutcome, WireError>),
    /// Answers Read.
    Batches(Result<Vec<EncodedBatch>, WireError>),
    /// Answers Resolve.
    Position(Result<Offset, WireError>),
    /// Answers Commit and Manage.
    Committed(Result<(), WireError>),
}

/// A message on the mesh.
#[derive(Debug)]
pub enum MeshMsg {
    /// A request from core `from`.
    Request {
        /// Correlation, chosen by the sender.
        id: u64,
        /// The sender.
        from: CoreId,
        /// The work.
        req: CoreRequest,
    },
    /// A reply to request `id`.
    Reply {
        /// Correlation.
        id: u64,
        /// The answer.
        resp: CoreResponse,
    },
}

type Row = (Vec<Option<SharedSender<MeshMsg>>>, Vec<(CoreId, SharedReceiver<MeshMsg>)>);

/// One core's ends of the mesh, before they are connected: requests and replies travel on
/// separate channels, so a core that stops taking requests (its request budget is spent) never
/// stops replies from reaching it, and two cores cannot wait on each other.
pub struct Ends {
    requests: Row,
    replies: Row,
}

/// Every channel of the mesh, before the cores take their ends.
pub struct MeshPlan {
    ends: Mutex<Vec<Option<Ends>>>,
}

fn plane(cores: usize) -> Vec<Row> {
    let mut senders: Vec<Vec<Option<SharedSender<MeshMsg>>>> =
        (0..cores).map(|_| (0..cores).map(|_| None).collect()).collect();
    let mut receivers: Vec<Vec<(CoreId, SharedReceiver<MeshMsg>)>> =
        (0..cores).map(|_| Vec::new()).collect();
    for (from, row) in senders.iter_mut().enumerate() {
        for (to, slot) in row.iter_mut().enumerate() {
            if from != to {
                let (tx, rx) = shared_channel::new_bounded(MESH_MESSAGES_QUEUED_MAX);
                *slot = Some(tx);
                receivers[to].push((CoreId(from as u16), rx));
            }
        }
    }
    senders.into_iter().zip(receivers).collect()
}

impl MeshPlan {
    /// Channels for `cores` cores.
    pub fn new(cores: usize) -> Self {
        let ends = plane(cores)
            .into_iter()
            .zip(plane(cores))
            .map(|(requests, replies)| Some(Ends { requests, replies }))
            .collect();
        Self { ends: Mutex::new(ends) }
    }

    /// Core `core`'s ends; `None` if taken already.
    pub fn take(&self, core: CoreId) -> Option<Ends> {
        let mut ends = self.ends.lock().ok()?;
        ends.get_mut(usize::from(core.0))?.take()
    }
}

/// One core's side of the mesh.
pub struct Mesh {
    requests: Vec<Option<ConnectedSender<MeshMsg>>>,
    replies: Vec<Option<ConnectedSender<MeshMsg>>>,
    next_id: Cell<u64>,
    pending: RefCell<HashMap<u64, LocalSender<CoreResponse>>>,
}

/// The receivers a core drains: requests from each other core, and replies.
pub type Receivers = Vec<(CoreId, ConnectedReceiver<MeshMsg>)>;

async fn connect_row(row: Row) -> (Vec<Option<ConnectedSender<MeshMsg>>>, Receivers) {
    let (txs, rxs) = row;
    // A sender's connect waits for its receiver's: connect receivers concurrently so no two
    // cores wait on each other.
    let rx_tasks: Vec<_> = rxs
        .into_iter()
        .map(|(from, rx)| glommio::spawn_local(async move { (from, rx.connect().await) }))
        .collect();
    let mut senders = Vec::with_capacity(txs.len());
    for tx in txs {
        senders.push(match tx {
            Some(tx) => Some(tx.connect().await),
            None => None,
        });
    }
    let mut receivers = Vec::with_capacity(rx_tasks.len());
    for task in rx_tasks {
        receivers.push(task.await);
    }
    (senders, receivers)
}

impl Mesh {
    /// Connects this core's ends; returns the mesh, the request receivers and the reply
    /// receivers to drain.
    pub async fn connect(ends: Ends) -> (Rc<Mesh>, Receivers, Receivers) {
        let (requests, request_rx) = connect_row(ends.requests).await;
        let (replies, reply_rx) = connect_row(ends.replies).await;
        let mesh =
            Rc::new(Mesh { requests, replies, next_id: Cell::new(1), pending: RefCell::default() });
        (mesh, request_rx, reply_rx)
    }

    /// Sends `req` to core `to` and waits for the reply.
    pub async fn call(
        &self,
        me: CoreId,
        to: CoreId,
        req: CoreRequest,
    ) -> Result<CoreResponse, WireError> {
        let rx = self.submit(me, to, req).await?;
        rx.recv()
            .await
            .ok_or_else(|| WireError::new(ErrorCode::ShuttingDown, format!("{to} did not answer")))
    }

    /// Queues `req` for core `to` and returns where its reply will arrive. Requests submitted
    /// one after another reach the other core in that order.
    pub async fn submit(
        &self,
        me: CoreId,
        to: CoreId,
        req: CoreRequest,
    ) -> Result<LocalReceiver<CoreResponse>, WireError> {
        let sender =
            self.requests.get(usize::from(to.0)).and_then(Option::as_ref).ok_or_else(|| {
                WireError::new(ErrorCode::Internal, format!("no mesh route to {to}"))
            })?;
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (tx, rx) = local_channel::new_bounded(MESH_REPLIES_PER_REQUEST);
        self.pending.borrow_mut().insert(id, tx);
        if sender.send(MeshMsg::Request { id, from: me, req }).await.is_err() {
            self.pending.borrow_mut().remove(&id);
            return Err(WireError::new(ErrorCode::ShuttingDown, format!("{to} is gone")));
        }
        Ok(rx)
    }

    /// Sends a reply to core `to`.
    pub async fn reply(&self, to: CoreId, id: u64, resp: CoreResponse) {
        if let Some(Some(sender)) = self.replies.get(usize::from(to.0)) {
            let _ = sender.send(MeshMsg::Reply { id, resp }).await;
        }
    }

    /// Completes the call waiting for reply `id`.
    pub fn complete(&self, id: u64, resp: CoreResponse) {
        if let Some(tx) = self.pending.borrow_mut().remove(&id) {
            let _ = tx.try_send(resp);
        }
    }
}
