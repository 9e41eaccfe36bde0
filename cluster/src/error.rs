//! Errors of the cluster agent.

/// What went wrong in the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A node id breaks the naming rule.
    #[error("invalid node id {0:?}: 1-64 bytes of A-Z a-z 0-9 . _ -")]
    InvalidNodeId(String),
    /// The agent's configuration is unusable.
    #[error("invalid cluster configuration: {0}")]
    InvalidConfig(String),
    /// etcd answered with an error or could not be reached.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// A value stored in etcd does not parse.
    #[error("etcd key {key}: {why}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// No placement can be made.
    #[error(transparent)]
    Placement(#[from] crate::placement::PlacementError),
    /// Another live broker already uses this node id.
    #[error("node id {0} is held by another live broker")]
    NodeIdTaken(String),
    /// No stream of that name is defined.
    #[error("no stream {0}")]
    NoStream(String),
    /// The stream's definition changed while the request was on its way (another delete or
    /// alter won); nothing was written.
    #[error("stream {0} changed meanwhile; try again")]
    StreamChanged(String),
    /// The agent has stopped.
    #[error("the cluster agent has stopped")]
    Stopped,
    /// A request to the agent, or an etcd call of the agent, did not finish in time.
    #[error("timed out after {0} ms")]
    TimedOut(u64),
    /// etcd did not answer a keep-alive within half the lease TTL, or the lease's validity
    /// passed: the agent gives the connection up and starts a new session.
    #[error("etcd did not answer the membership keep-alives in time")]
    Unresponsive,
    /// A replica-group compare-and-swap was refused by the replication rules
    /// (`felix_replication::GroupState`): a stale version, a proposer that does not lead the
    /// epoch, an invalid in-sync set, or no live in-sync candidate. Node numbers in it are the
    /// group's replica positions.
    #[error("replica group: {0}")]
    Cas(#[from] felix_replication::CasError),
    /// Fencing: the proposer's lease is not the one the group's leader was elected on, or is
    /// no longer alive in etcd (or this agent holds no lease now).
    #[error("fenced: the proposer's lease is not the leader's, or has expired")]
    Fenced,
    /// An election was refused because the leader's lease still holds.
    #[error("the leader's lease still holds")]
    LeaderAlive,
    /// The node is not a replica of the group.
    #[error("node {0} is not a replica of the group")]
    NotReplica(crate::NodeId),
    /// The stream's shard has no replica-group record (not replicated, or not placed yet).
    #[error("no replica group for shard {shard} of {stream}")]
    NoGroup {
        /// The stream.
        stream: String,
        /// The shard.
        shard: u32,
    },
}
