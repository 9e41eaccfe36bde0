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
    /// The agent has stopped.
    #[error("the cluster agent has stopped")]
    Stopped,
    /// A request to the agent did not finish in time.
    #[error("timed out after {0} ms")]
    TimedOut(u64),
}
