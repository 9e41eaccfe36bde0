//! felix-cluster: many brokers as one. Membership, the controller and shard placement, kept in
//! etcd.
//!
//! Owns: the etcd key layout ([`keys`]), the placement rule ([`placement`], pure), and the
//! agent ([`agent`]) that holds a broker's membership lease, campaigns for the controller
//! role, assigns the shards of new streams, keeps each replicated shard's group record
//! ([`groups`]: leader, epoch, in-sync set, changed only by compare-and-swap; elections when a
//! leader's lease is gone), and watches what the others wrote.
//! Never does: touch a record, a data core or glommio. The agent runs on a control thread of
//! its own with a small tokio runtime (etcd clients are tokio); the broker's data cores learn
//! what it knows from bounded messages and never wait on etcd.
#![forbid(unsafe_code)]

pub mod agent;
pub mod agent_state;
mod error;
pub mod groups;
pub mod keys;
mod keyspace;
mod lease;
pub mod placement;
mod status;
pub mod testing;
mod throttle;
mod view;

pub use agent::{Agent, AgentClient, AgentConfig, AgentHandle};
pub use error::ClusterError;
pub use groups::ShardGroup;
pub use placement::{PlacementError, StreamPlacement};
pub use status::{
    cluster_status, status_of_view, ClusterStatus, GroupStatus, MemberStatus, StreamStatus,
};
pub use view::{ClusterView, Member, Route, StreamDef, Tombstone};

use serde::{Deserialize, Serialize};

/// The longest node id, in bytes.
pub const NODE_ID_BYTES_MAX: usize = 64;

/// A broker's name in the cluster (`--node-id`): 1 to [`NODE_ID_BYTES_MAX`] bytes of
/// `[A-Za-z0-9._-]`, unique among the brokers of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl NodeId {
    /// Validates `id`.
    pub fn new(id: &str) -> Result<Self, ClusterError> {
        let ok = (1..=NODE_ID_BYTES_MAX).contains(&id.len())
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(Self(id.to_owned()))
        } else {
            Err(ClusterError::InvalidNodeId(id.to_owned()))
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for NodeId {
    type Error = ClusterError;
    fn try_from(s: String) -> Result<Self, ClusterError> {
        Self::new(&s)
    }
}

impl From<NodeId> for String {
    fn from(n: NodeId) -> String {
        n.0
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad` honours width and alignment, for tables.
        f.pad(&self.0)
    }
}
