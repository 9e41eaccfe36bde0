//! What a broker knows of the cluster: members, controller, streams and placements, as of one
//! etcd revision. Built by the agent from etcd, read by everyone else.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::placement::StreamPlacement;
use crate::NodeId;

/// A live broker, as it registered itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its node id.
    pub node: NodeId,
    /// Where clients reach it (`host:port`, UDP).
    pub advertise: String,
    /// Data cores it runs.
    pub cores: u16,
    /// Its metrics endpoint (`host:port`, HTTP), if it serves one.
    pub metrics: Option<String>,
}

/// A stream's definition, cluster-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamDef {
    /// Shard count.
    pub shards: u32,
    /// Retention by size per shard log, in bytes (0: unlimited).
    pub retention_bytes: u64,
    /// Retention by age, in milliseconds (0: unlimited).
    pub retention_ms: u64,
}

/// Where a request for one shard must go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// The owner is live.
    Owner(&'a Member),
    /// The owner is not live: the shard is unavailable until it returns.
    Unavailable(&'a NodeId),
    /// The stream is defined but the controller has not placed it yet.
    Unplaced,
    /// No such stream, or no such shard.
    Unknown,
}

/// The cluster as one broker's agent last saw it.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    /// The etcd revision this view reflects.
    pub revision: i64,
    /// Live members (those whose lease holds their key).
    pub members: BTreeMap<NodeId, Member>,
    /// The controller, if one is elected.
    pub controller: Option<NodeId>,
    /// Stream definitions.
    pub streams: BTreeMap<String, StreamDef>,
    /// Placements of the streams the controller placed.
    pub placements: BTreeMap<String, StreamPlacement>,
    /// Until when this broker's own lease is known to hold (sent time of the last answered
    /// keep-alive plus the TTL); `None` while it holds none. Past it, the broker must not
    /// acknowledge writes (fencing).
    pub lease_valid_until: Option<Instant>,
}

impl ClusterView {
    /// Where `shard` of `stream` lives.
    pub fn route(&self, stream: &str, shard: u32) -> Route<'_> {
        if !self.streams.contains_key(stream) {
            return Route::Unknown;
        }
        let Some(p) = self.placements.get(stream) else { return Route::Unplaced };
        match p.owner(shard) {
            None => Route::Unknown,
            Some(node) => match self.members.get(node) {
                Some(m) => Route::Owner(m),
                None => Route::Unavailable(node),
            },
        }
    }

    /// Whether this broker's lease holds at `now`.
    pub fn lease_holds(&self, now: Instant) -> bool {
        self.lease_valid_until.is_some_and(|until| now < until)
    }
}
