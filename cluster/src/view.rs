//! What a broker knows of the cluster: members, controller, streams and placements, as of one
//! etcd revision. Built by the agent from etcd, read by everyone else.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::groups::ShardGroup;
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
    /// Whether it has connected to every other live broker as a replication peer (mutual TLS
    /// verified both ways, Hello with `REPLICATION` answered). The controller places replicas
    /// only on such brokers: one whose certificate its peers do not trust would lead shards
    /// nobody can follow. A broker registers unverified and says so once it is
    /// ([`crate::AgentHandle::mark_peers_verified`]); records without the field (written by
    /// older brokers) read as verified.
    #[serde(default = "verified_by_default")]
    pub peers_verified: bool,
}

fn verified_by_default() -> bool {
    true
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

/// A deleted stream's mark (`deleted/<stream>`): every broker deletes its copy of the stream
/// when the copy is of this incarnation or an older one. Kept after the name is used again,
/// so that a broker down through a delete and a re-create still deletes the old copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// The incarnation deleted: the etcd create revision of the definition's key.
    pub incarnation: i64,
}

/// A stream key's value: the definition plus the replication factor (absent in keys written
/// before replication: 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StreamRecord {
    #[serde(flatten)]
    pub def: StreamDef,
    #[serde(default = "one_replica")]
    pub replicas: u8,
}

fn one_replica() -> u8 {
    1
}

/// Where a request for one shard must go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// The owner (for a replicated shard: the leader of its current epoch) is live.
    Owner(&'a Member),
    /// The owner is not live (a replicated shard: its leader's lease is gone, or no leader is
    /// elected yet, named by its leader or first replica): unavailable until it returns or an
    /// election.
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
    /// Each defined stream's incarnation: the etcd create revision of its definition's key, so
    /// a stream deleted and defined again under the same name is told from the old one.
    pub incarnations: BTreeMap<String, i64>,
    /// Deleted streams: the newest incarnation of each that was deleted.
    pub deleted: BTreeMap<String, Tombstone>,
    /// Placements of the streams the controller placed.
    pub placements: BTreeMap<String, StreamPlacement>,
    /// Replication factor of each stream defined with more than one replica.
    pub replication: BTreeMap<String, u8>,
    /// The replica group of each shard of a replicated stream, by (stream, shard): leader,
    /// epoch, in-sync set, replicas, and the version (mod revision) to propose against.
    pub groups: BTreeMap<(String, u32), ShardGroup>,
    /// The etcd lease each live member's key is on (a restarted broker's differs from the one
    /// it led an epoch on).
    pub member_leases: BTreeMap<NodeId, i64>,
    /// Until when this broker's own lease is known to hold (sent time of the last answered
    /// keep-alive plus the TTL); `None` while it holds none. Past it, the broker must not
    /// acknowledge writes (fencing).
    pub lease_valid_until: Option<Instant>,
    /// Keys under the cluster's prefix that did not parse, in the load this view started
    /// from and the watch events since: each is logged as a warning and left out.
    pub keys_skipped: u64,
}

impl ClusterView {
    /// Where `shard` of `stream` lives.
    pub fn route(&self, stream: &str, shard: u32) -> Route<'_> {
        if !self.streams.contains_key(stream) {
            return Route::Unknown;
        }
        let Some(p) = self.placements.get(stream) else { return Route::Unplaced };
        if let Some(g) = self.groups.get(&(stream.to_owned(), shard)) {
            let named = g.leader.as_ref().or(g.replicas.first());
            return match named {
                Some(l) if g.leader_alive(&self.member_leases) => match self.members.get(l) {
                    Some(m) => Route::Owner(m),
                    None => Route::Unavailable(l),
                },
                Some(l) => Route::Unavailable(l),
                None => Route::Unknown,
            };
        }
        match p.owner(shard) {
            None => Route::Unknown,
            Some(node) => match self.members.get(node) {
                Some(m) => Route::Owner(m),
                None => Route::Unavailable(node),
            },
        }
    }

    /// The replica group of `shard` of `stream`, if the stream is replicated.
    pub fn group(&self, stream: &str, shard: u32) -> Option<&ShardGroup> {
        self.groups.get(&(stream.to_owned(), shard))
    }

    /// Whether a broker's copy of `stream` of incarnation `local` (`None`: not recorded,
    /// written before incarnations were) is a deleted one: a tombstone covers it and the
    /// stream in force, if any, is another incarnation.
    pub fn is_deleted_copy(&self, stream: &str, local: Option<i64>) -> bool {
        let Some(t) = self.deleted.get(stream) else { return false };
        let local = local.unwrap_or(0);
        local <= t.incarnation && self.incarnations.get(stream) != Some(&local)
    }

    /// Whether this broker's lease holds at `now`.
    pub fn lease_holds(&self, now: Instant) -> bool {
        self.lease_valid_until.is_some_and(|until| now < until)
    }
}
