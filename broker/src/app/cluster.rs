//! The broker's side of the cluster (`--cluster-etcd`): each core's copy of the cluster view,
//! shard ownership checks, fencing, and the answers that only a cluster gives (Metadata,
//! NotOwner).
//!
//! The etcd agent (`felix-cluster`) runs on its own thread. Each core copies the agent's
//! newest view into a core-local cell every [`VIEW_POLL_MS`]; requests read only that cell, so
//! no request ever waits on etcd or touches another thread's state.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_cluster::{AgentClient, ClusterError, ClusterView, Route, StreamDef};
use felix_proto::{ErrorCode, MetadataOk, RequestId, ShardId, ShardOwner};

use super::error::WireError;

/// How often a core copies the agent's newest view.
pub const VIEW_POLL_MS: u64 = 20;

/// Why a request for a shard is not served here.
#[derive(Clone, Debug)]
pub enum Refused {
    /// A plain refusal.
    Wire(WireError),
    /// Another broker owns the shard.
    NotOwner {
        /// The shard.
        shard: ShardId,
        /// Its owner.
        owner: ShardOwner,
    },
}

impl From<WireError> for Refused {
    fn from(e: WireError) -> Self {
        Refused::Wire(e)
    }
}

impl Refused {
    /// The refusal as a plain error (for clients that did not advertise CLUSTER).
    pub fn into_wire(self, stream: &str) -> WireError {
        match self {
            Refused::Wire(e) => e,
            Refused::NotOwner { shard, owner } => WireError::new(
                ErrorCode::NotOwner,
                format!("{shard} of {stream} is owned by {} at {}", owner.node, owner.address),
            ),
        }
    }
}

/// One core's link to the cluster agent.
pub struct ClusterLink {
    agent: AgentClient,
    views: RefCell<tokio::sync::watch::Receiver<Arc<ClusterView>>>,
    view: RefCell<Arc<ClusterView>>,
}

impl ClusterLink {
    /// A link that follows `agent`'s views (call [`ClusterLink::follow`] in a task).
    pub fn new(agent: AgentClient) -> Rc<Self> {
        let views = agent.views();
        let view = views.borrow().clone();
        Rc::new(Self { agent, views: RefCell::new(views), view: RefCell::new(view) })
    }

    /// Takes the agent's newest view now if it changed (a core-local copy of an `Arc`).
    fn refresh(&self) {
        let mut views = self.views.borrow_mut();
        if views.has_changed().unwrap_or(false) {
            let v = views.borrow_and_update().clone();
            *self.view.borrow_mut() = v;
        }
    }

    /// Copies the agent's newest view into this core every [`VIEW_POLL_MS`], until `stop`.
    pub async fn follow(self: Rc<Self>, stop: impl Fn() -> bool) {
        while !stop() {
            glommio::timer::sleep(Duration::from_millis(VIEW_POLL_MS)).await;
            self.refresh();
        }
    }

    /// The newest view this core has.
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.borrow().clone()
    }

    /// Whether this broker may serve `shard` of `stream`; `write` also asks whether it may
    /// acknowledge writes (its membership lease holds: fencing).
    pub fn check(&self, stream: &str, shard: ShardId, write: bool) -> Result<(), Refused> {
        // A stream this core does not know placed yet may be newer than its copy of the view
        // (created a moment ago): look at the agent's newest first.
        if matches!(self.view.borrow().route(stream, shard.0), Route::Unplaced | Route::Unknown) {
            self.refresh();
        }
        let view = self.view.borrow();
        match view.route(stream, shard.0) {
            Route::Owner(m) if m.node == *self.agent.node() => {
                if write && !view.lease_holds(Instant::now()) {
                    return Err(unavailable(
                        "this broker cannot confirm its cluster membership; it acknowledges no \
                         writes until it can",
                    ));
                }
                Ok(())
            }
            Route::Owner(m) => Err(Refused::NotOwner {
                shard,
                owner: ShardOwner {
                    node: m.node.to_string(),
                    address: m.advertise.clone(),
                    live: true,
                },
            }),
            Route::Unavailable(node) => {
                Err(unavailable(&format!("{shard} of {stream}: its owner {node} is down")))
            }
            Route::Unplaced => Err(unavailable(&format!("{stream} is not placed yet"))),
            // Deleted: final. Otherwise it may be newer than this broker's view.
            Route::Unknown
                if view.deleted.contains_key(stream) && !view.streams.contains_key(stream) =>
            {
                Err(Refused::Wire(WireError::new(
                    ErrorCode::StreamNotFound,
                    format!("{stream} was deleted"),
                )))
            }
            Route::Unknown if view.streams.get(stream).is_some_and(|d| shard.0 >= d.shards) => {
                Err(Refused::Wire(WireError::new(
                    ErrorCode::InvalidShard,
                    format!("{stream} has no {shard}"),
                )))
            }
            Route::Unknown => Err(unavailable(&format!("{stream} is unknown to the cluster"))),
        }
    }

    /// The shards of `stream` (of `shards`) this broker owns (leads, when replicated).
    pub fn owned(&self, stream: &str, shards: u32) -> Vec<ShardId> {
        let view = self.view.borrow();
        let me = self.agent.node();
        view.placements.get(stream).map_or_else(Vec::new, |p| {
            (0..shards.min(p.shards()))
                .filter(|s| match view.route(stream, *s) {
                    Route::Owner(m) => m.node == *me,
                    _ => false,
                })
                .map(ShardId)
                .collect()
        })
    }

    /// The cluster's definition of `stream`, if it has one.
    pub fn definition(&self, stream: &str) -> Option<StreamDef> {
        if !self.view.borrow().streams.contains_key(stream) {
            self.refresh();
        }
        self.view.borrow().streams.get(stream).copied()
    }

    /// The incarnation of the cluster's definition of `stream` (the etcd create revision of
    /// its key), if it has one.
    pub fn incarnation(&self, stream: &str) -> Option<i64> {
        self.view.borrow().incarnations.get(stream).copied()
    }

    /// Whether this broker's copy of `stream`, of incarnation `local`, belongs to a deleted
    /// stream (a tombstone covers it). Only a view loaded from etcd says so.
    pub fn is_deleted_copy(&self, stream: &str, local: Option<i64>) -> bool {
        let view = self.view.borrow();
        view.revision > 0 && view.is_deleted_copy(stream, local)
    }

    /// Deletes `stream` cluster-wide; returns the definition it had.
    pub async fn delete(&self, stream: &str) -> Result<StreamDef, WireError> {
        let r = self.agent.delete_stream(stream).await;
        self.refresh();
        r.map_err(|e| definition_error(stream, e))
    }

    /// Replaces `stream`'s definition by `def`.
    pub async fn alter(&self, stream: &str, def: StreamDef) -> Result<StreamDef, WireError> {
        let r = self.agent.alter_stream(stream, def).await;
        self.refresh();
        r.map_err(|e| definition_error(stream, e))
    }

    /// How many brokers of the cluster are live.
    pub fn live_members(&self) -> usize {
        self.view.borrow().members.len()
    }

    /// The replication factor of `stream` (1 when it has no replica groups).
    pub fn replicas_of(&self, stream: &str) -> u8 {
        self.view.borrow().replication.get(stream).copied().unwrap_or(1)
    }

    /// Every stream the cluster defines.
    pub fn stream_names(&self) -> Vec<String> {
        self.view.borrow().streams.keys().cloned().collect()
    }

    /// Where every shard of `stream` lives.
    pub fn metadata(&self, request_id: RequestId, stream: &str) -> Result<MetadataOk, WireError> {
        if !self.view.borrow().placements.contains_key(stream) {
            self.refresh();
        }
        let view = self.view.borrow();
        if !view.lease_holds(Instant::now()) {
            // Cut off from etcd, this broker's view may be stale: let another broker answer.
            return Err(WireError::new(
                ErrorCode::ShardUnavailable,
                "this broker cannot confirm its cluster membership (its view may be stale)",
            ));
        }
        if !view.streams.contains_key(stream) {
            return Err(WireError::new(ErrorCode::StreamNotFound, format!("no stream {stream}")));
        }
        let Some(p) = view.placements.get(stream) else {
            return Err(WireError::new(
                ErrorCode::ShardUnavailable,
                format!("{stream} is not placed yet"),
            ));
        };
        // A replicated shard's owner is its group's leader.
        let owners = (0..p.shards())
            .map(|s| {
                let group = view.group(stream, s);
                let node = match group {
                    Some(g) => g.leader.as_ref().or(g.replicas.first()),
                    None => p.owner(s),
                };
                let member = node.and_then(|n| view.members.get(n));
                let leads = group.is_none_or(|g| g.leader_alive(&view.member_leases));
                ShardOwner {
                    node: node.map_or_else(String::new, |n| n.to_string()),
                    address: member.map_or_else(String::new, |m| m.advertise.clone()),
                    live: member.is_some() && leads,
                }
            })
            .collect();
        Ok(MetadataOk { request_id, stream: stream.to_owned(), owners })
    }

    /// Defines `stream` cluster-wide (an existing definition wins) and waits for its
    /// placement; returns the definition in force.
    /// With `replicas` > 1 every shard gets a replica group of that many brokers.
    pub async fn define(
        &self,
        stream: &str,
        def: StreamDef,
        replicas: u8,
    ) -> Result<StreamDef, WireError> {
        let created = match replicas {
            0 | 1 => self.agent.create_stream(stream, def).await,
            n => self.agent.create_replicated_stream(stream, def, n).await,
        };
        match created {
            Ok((def, _)) => {
                // The agent's view has the placement now; so must this core's.
                self.refresh();
                Ok(def)
            }
            Err(ClusterError::TimedOut(ms)) => Err(WireError::new(
                ErrorCode::ShardUnavailable,
                format!("the cluster did not place {stream} within {ms} ms"),
            )),
            Err(ClusterError::Placement(e)) => Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("cannot create {stream}: {e}"),
            )),
            Err(e) => Err(WireError::new(ErrorCode::ShardUnavailable, format!("cluster: {e}"))),
        }
    }
}

/// What a failed delete or alter of `stream` tells the client.
fn definition_error(stream: &str, e: ClusterError) -> WireError {
    match e {
        ClusterError::NoStream(_) => {
            WireError::new(ErrorCode::StreamNotFound, format!("no stream {stream}"))
        }
        ClusterError::InvalidConfig(why) => WireError::new(ErrorCode::InvalidArgument, why),
        e => WireError::new(ErrorCode::ShardUnavailable, format!("cluster: {e}")),
    }
}

fn unavailable(message: &str) -> Refused {
    Refused::Wire(WireError::new(ErrorCode::ShardUnavailable, message))
}
