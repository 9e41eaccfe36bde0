//! A one-shot look at a cluster, for operators (`felix cluster status`): everything the
//! agents keep in etcd, plus what is left of each member's lease. Read from etcd
//! ([`cluster_status`]), or from a broker's view ([`status_of_view`], its `/cluster` page).

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use serde::{Deserialize, Serialize};

use crate::agent::{CONNECT_TIMEOUT_MS, REQUEST_TIMEOUT_MS};
use crate::error::ClusterError;
use crate::keyspace::{apply_or_skip, Candidates};
use crate::view::{ClusterView, Member, StreamDef};
use crate::{keys, NodeId, StreamPlacement};

/// The cluster as etcd holds it at one revision.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The cluster's name.
    pub cluster: String,
    /// The etcd revision read.
    pub revision: i64,
    /// The controller, if one is elected.
    pub controller: Option<NodeId>,
    /// Live members, with the seconds left on their lease.
    pub members: Vec<MemberStatus>,
    /// Streams, their definitions and placements.
    pub streams: Vec<StreamStatus>,
}

/// One live member.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberStatus {
    /// As it registered.
    pub member: Member,
    /// Seconds left on its lease when read (it renews every third of its TTL); -1 when not
    /// known (a status read through a broker).
    pub lease_ttl_left_s: i64,
    /// Shards it owns over every stream.
    pub shards: u64,
}

/// One stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamStatus {
    /// Its name.
    pub name: String,
    /// Its definition.
    pub def: StreamDef,
    /// Its placement, once the controller made it.
    pub placement: Option<StreamPlacement>,
    /// Owners (node ids) of its shards that are not live: those shards are unavailable (for a
    /// replicated stream: its replicas that are not live; a shard stays available while an
    /// in-sync replica of it lives).
    pub down: Vec<NodeId>,
    /// Replication factor (1: one copy, no groups).
    pub replicas: u8,
    /// For a replicated stream, each shard's replica group, by shard.
    pub groups: Vec<GroupStatus>,
}

/// One shard's replica group, as its etcd record holds it. Replication lag (records, bytes)
/// is not here: it is known only to the replication runtime on the leader, which is not wired
/// to the broker yet.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupStatus {
    /// The shard.
    pub shard: u32,
    /// The leader of `epoch`, if one is elected.
    pub leader: Option<NodeId>,
    /// Whether the leader's lease still holds (its member key is on the lease it was elected
    /// on). False: an election is due.
    pub leader_live: bool,
    /// The leader epoch.
    pub epoch: u64,
    /// The in-sync replicas.
    pub isr: Vec<NodeId>,
    /// Every replica.
    pub replicas: Vec<NodeId>,
    /// The record's version (etcd mod revision).
    pub version: i64,
}

/// Reads the status of cluster `cluster` from etcd at `endpoints`.
pub async fn cluster_status(
    endpoints: &[String],
    cluster: &str,
) -> Result<ClusterStatus, ClusterError> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .with_timeout(Duration::from_millis(REQUEST_TIMEOUT_MS));
    let mut client = Client::connect(endpoints, Some(options)).await?;
    let resp = client.get(keys::root(cluster), Some(GetOptions::new().with_prefix())).await?;
    let mut view = ClusterView::default();
    let mut candidates = Candidates::new();
    let mut leases = BTreeMap::new();
    for kv in resp.kvs() {
        apply_or_skip(cluster, &mut view, &mut candidates, kv, false);
        let key = kv.key_str().map_err(ClusterError::from)?;
        if let Some(node) = keys::name_under(key, &keys::members(cluster)) {
            leases.insert(node.to_owned(), kv.lease());
        }
    }
    view.revision = resp.header().map_or(0, |h| h.revision());
    let mut left = BTreeMap::new();
    for node in view.members.keys() {
        let lease = leases.get(node.as_str()).copied().unwrap_or(0);
        let ttl = client.lease_time_to_live(lease, None).await.map_or(-1, |r| r.ttl());
        left.insert(node.clone(), ttl);
    }
    Ok(status_of_view(cluster, &view, |n| left.get(n).copied().unwrap_or(-1)))
}

/// The status `view` shows (a broker's view, or one read from etcd), with `lease_left` the
/// seconds left on a member's lease (-1: not known).
pub fn status_of_view(
    cluster: &str,
    view: &ClusterView,
    lease_left: impl Fn(&NodeId) -> i64,
) -> ClusterStatus {
    let load = crate::placement::load(view.placements.values());
    let mut members = Vec::new();
    for (node, member) in &view.members {
        let shards = load.get(node).copied().unwrap_or(0);
        let lease_ttl_left_s = lease_left(node);
        members.push(MemberStatus { member: member.clone(), lease_ttl_left_s, shards });
    }
    let streams = view
        .streams
        .iter()
        .map(|(name, def)| {
            let placement = view.placements.get(name).cloned();
            let mut down: Vec<NodeId> = placement
                .iter()
                .flat_map(|p| (0..p.shards()).flat_map(|s| p.replicas_of(s)))
                .filter(|o| !view.members.contains_key(*o))
                .cloned()
                .collect();
            down.sort();
            down.dedup();
            let groups = view
                .groups
                .range((name.clone(), 0)..=(name.clone(), u32::MAX))
                .map(|((_, shard), g)| GroupStatus {
                    shard: *shard,
                    leader: g.leader.clone(),
                    leader_live: g.leader_alive(&view.member_leases),
                    epoch: g.epoch,
                    isr: g.isr.clone(),
                    replicas: g.replicas.clone(),
                    version: g.version,
                })
                .collect();
            let replicas = view.replication.get(name).copied().unwrap_or(1);
            StreamStatus { name: name.clone(), def: *def, placement, down, replicas, groups }
        })
        .collect();
    ClusterStatus {
        cluster: cluster.to_owned(),
        revision: view.revision,
        controller: view.controller.clone(),
        members,
        streams,
    }
}
