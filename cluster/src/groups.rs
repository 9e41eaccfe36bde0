//! The controller's record of each replicated shard's group, kept in etcd and changed only by
//! compare-and-swap (issue 12, "Leader epochs and fencing through etcd").
//!
//! One key per shard of a replicated stream, `groups/<stream>/<shard>` ([`keys::group`]),
//! holds a [`ShardGroup`] as JSON: epoch, leader, the lease the leader held when elected, the
//! in-sync replicas and every replica. Its version is the key's etcd mod revision (not stored
//! in the value). The rules are `felix_replication::GroupState`'s, the ones the simulator
//! verified; this module only maps them onto etcd transactions:
//!
//! - **Creation** ([`ShardGroup::initial`]): with the stream's placement, in the controller's
//!   placement transaction; the placement's first replica is elected for epoch 1 there, on the
//!   lease its member key holds (the transaction also compares that).
//! - **An in-sync-set change** ([`propose_isr`]): [`GroupState::apply_isr`] on the record read
//!   at the proposal's version, then a transaction conditional on the key's mod revision being
//!   that version AND the proposer's member key being on the lease the record names as the
//!   leader's (fencing: a leader whose lease expired, or a restarted broker with a new lease,
//!   cannot write).
//! - **An election** ([`elect`]): when the record has no leader or the leader's lease is gone
//!   (its member key vanished or is on another lease), a live in-sync replica proposes itself
//!   ([`GroupState::elect`]: epoch + 1, the in-sync set shrinks to its live members) with a
//!   transaction conditional on the mod revision, on its own member key being on its lease,
//!   and on the old leader's member key NOT being on the old leader lease. Of racing
//!   candidates exactly one wins: the others' mod-revision compare fails.
//!
//! Node numbers: `felix_replication` names replicas by `NodeId(u32)`. Here that number is the
//! replica's position in the group's `replicas` list, which never changes once the group is
//! created. The numbers are local to one group (the replication runtime runs one state
//! machine per shard), deterministic, and need no registry.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Client, Compare, CompareOp, KeyValue, Txn, TxnOp};
use felix_replication::{CasError, Epoch, GroupState, IsrProposal, LeaseId};
use serde::{Deserialize, Serialize};

use crate::error::ClusterError;
use crate::keys;
use crate::NodeId;

/// The group-local replica number `felix_replication` uses (see the module docs).
pub use felix_replication::ReplicaNumber;

/// One shard's replica group as the controller records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardGroup {
    /// The key's etcd mod revision when read: the compare-and-swap version. Not stored in the
    /// value.
    #[serde(skip)]
    pub version: i64,
    /// The leader epoch (0: no election yet).
    pub epoch: u64,
    /// The leader of `epoch`, if one was elected.
    pub leader: Option<NodeId>,
    /// The etcd lease the leader held when elected: leadership belongs to that lease.
    pub leader_lease: Option<i64>,
    /// The in-sync replicas, in `replicas` order.
    pub isr: Vec<NodeId>,
    /// Every replica of the shard (distinct brokers; never changes).
    pub replicas: Vec<NodeId>,
}

impl ShardGroup {
    /// A new group on `replicas` (every one in sync), its first replica elected for epoch 1 on
    /// `leader_lease` when given, else no leader yet.
    pub fn initial(replicas: Vec<NodeId>, leader_lease: Option<i64>) -> ShardGroup {
        let blank = ShardGroup {
            version: 0,
            epoch: 0,
            leader: None,
            leader_lease: None,
            isr: replicas.clone(),
            replicas,
        };
        let (Some(lease), Some(first)) = (leader_lease, blank.replicas.first()) else {
            return blank;
        };
        let live: BTreeSet<NodeId> = blank.replicas.iter().cloned().collect();
        election(&blank, &first.clone(), lease, &live).unwrap_or(blank)
    }

    /// The replica number of `node` in this group.
    pub fn number(&self, node: &NodeId) -> Option<ReplicaNumber> {
        let i = self.replicas.iter().position(|r| r == node)?;
        Some(felix_replication::ReplicaNumber(i as u32))
    }

    /// The node of replica number `n`.
    pub fn node(&self, n: ReplicaNumber) -> Option<&NodeId> {
        self.replicas.get(n.0 as usize)
    }

    /// Whether the leader's lease still holds, given the lease each live member's key is on:
    /// false without a leader, when its member key is gone, or on another lease (a restart).
    pub fn leader_alive(&self, member_leases: &BTreeMap<NodeId, i64>) -> bool {
        match (&self.leader, self.leader_lease) {
            (Some(l), Some(lease)) => member_leases.get(l) == Some(&lease),
            _ => false,
        }
    }

    /// This record as `felix_replication`'s [`GroupState`] (replica numbers, version = mod
    /// revision).
    pub fn state(&self) -> Result<GroupState, ClusterError> {
        let corrupt = |why: &str| ClusterError::Corrupt { key: "group".into(), why: why.into() };
        let number = |n: &NodeId| self.number(n).ok_or_else(|| corrupt("names a non-replica"));
        Ok(GroupState {
            version: u64::try_from(self.version).unwrap_or(0),
            epoch: Epoch(self.epoch),
            leader: self.leader.as_ref().map(number).transpose()?,
            leader_lease: self.leader_lease.map(|l| LeaseId(l as u64)),
            isr: self.isr.iter().map(number).collect::<Result<_, _>>()?,
            replicas: (0..self.replicas.len() as u32)
                .map(felix_replication::ReplicaNumber)
                .collect(),
        })
    }

    /// This record changed to `state` (same replicas; the version stays until written).
    fn with_state(&self, state: &GroupState) -> ShardGroup {
        let node = |n: &ReplicaNumber| self.node(*n).cloned();
        ShardGroup {
            version: self.version,
            epoch: state.epoch.0,
            leader: state.leader.as_ref().and_then(node),
            leader_lease: state.leader_lease.map(|l| l.0 as i64),
            // BTreeSet order of numbers is `replicas` order.
            isr: state.isr.iter().filter_map(node).collect(),
            replicas: self.replicas.clone(),
        }
    }

    /// Parses a group key's value; the version is the key's mod revision.
    pub fn from_kv(kv: &KeyValue) -> Result<ShardGroup, ClusterError> {
        let mut g: ShardGroup =
            serde_json::from_slice(kv.value()).map_err(|e| ClusterError::Corrupt {
                key: String::from_utf8_lossy(kv.key()).into(),
                why: e.to_string(),
            })?;
        g.version = kv.mod_revision();
        Ok(g)
    }

    /// The value stored in etcd.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a group serializes")
    }
}

/// The pure in-sync-set rule: `proposer`, holding `lease`, proposes `isr` for `epoch` based on
/// version `expected_version` of `group`. [`GroupState::apply_isr`]'s checks (version,
/// leadership of the epoch, a valid set), then fencing: the proposer's lease must be the one
/// it was elected on. Returns the changed record (its version still the old one).
pub fn isr_change(
    group: &ShardGroup,
    proposer: &NodeId,
    lease: i64,
    expected_version: i64,
    epoch: u64,
    isr: &[NodeId],
) -> Result<ShardGroup, ClusterError> {
    let mut state = group.state()?;
    let proposal = proposal_of(group, proposer, expected_version, epoch, isr, None)?;
    state.apply_isr(&proposal)?;
    if group.leader_lease != Some(lease) {
        return Err(ClusterError::Fenced);
    }
    Ok(group.with_state(&state))
}

/// `proposer`'s proposal against `group`, its brokers as the group's replica numbers: a
/// broker outside the group is `NotReplica` (a member of `isr`: `Cas(InvalidIsr)`).
fn proposal_of(
    group: &ShardGroup,
    proposer: &NodeId,
    expected_version: i64,
    epoch: u64,
    isr: &[NodeId],
    transfer_to: Option<&NodeId>,
) -> Result<IsrProposal, ClusterError> {
    let number = |n: &NodeId| group.number(n).ok_or_else(|| ClusterError::NotReplica(n.clone()));
    let leader = number(proposer)?;
    let isr = isr
        .iter()
        .map(|n| group.number(n).ok_or(ClusterError::Cas(CasError::InvalidIsr)))
        .collect::<Result<BTreeSet<_>, _>>()?;
    Ok(IsrProposal {
        expected_version: u64::try_from(expected_version).unwrap_or(0),
        leader,
        epoch: Epoch(epoch),
        isr,
        transfer_to: transfer_to.map(number).transpose()?,
    })
}

/// The pure leadership-transfer rule: `proposer` (the leader of `epoch`, holding `lease`)
/// hands the next epoch to `target`, an in-sync replica holding `target_lease`, based on
/// version `expected_version` with the in-sync set `isr` unchanged
/// ([`GroupState::apply_transfer`]); fenced unless the proposer's lease is the one it was
/// elected on. Returns the changed record (its version still the old one).
#[allow(clippy::too_many_arguments)]
pub fn leadership_transfer(
    group: &ShardGroup,
    proposer: &NodeId,
    lease: i64,
    expected_version: i64,
    epoch: u64,
    isr: &[NodeId],
    target: &NodeId,
    target_lease: i64,
) -> Result<ShardGroup, ClusterError> {
    let mut state = group.state()?;
    let proposal = proposal_of(group, proposer, expected_version, epoch, isr, Some(target))?;
    state.apply_transfer(&proposal, LeaseId(target_lease as u64))?;
    if group.leader_lease != Some(lease) {
        return Err(ClusterError::Fenced);
    }
    Ok(group.with_state(&state))
}

/// The pure election rule: `candidate`, holding `lease`, takes the next epoch of `group` if it
/// is an in-sync replica and `live` ([`GroupState::elect`]); the in-sync set becomes its live
/// members. Whether the old leader's lease is gone is the caller's (and the transaction's)
/// check.
pub fn election(
    group: &ShardGroup,
    candidate: &NodeId,
    lease: i64,
    live: &BTreeSet<NodeId>,
) -> Result<ShardGroup, ClusterError> {
    let mut state = group.state()?;
    let c = group.number(candidate).ok_or_else(|| ClusterError::NotReplica(candidate.clone()))?;
    let live: BTreeSet<ReplicaNumber> = live.iter().filter_map(|n| group.number(n)).collect();
    state.elect(c, LeaseId(lease as u64), &live)?;
    Ok(group.with_state(&state))
}

/// Reads the group of `shard` of `stream`.
pub async fn read(
    client: &mut Client,
    cluster: &str,
    stream: &str,
    shard: u32,
) -> Result<ShardGroup, ClusterError> {
    let resp = client.get(keys::group(cluster, stream, shard), None).await?;
    match resp.kvs().first() {
        Some(kv) => ShardGroup::from_kv(kv),
        None => Err(ClusterError::NoGroup { stream: stream.to_owned(), shard }),
    }
}

/// `proposer` (holding etcd lease `lease`) changes the in-sync set of `shard` of `stream` to
/// `isr`, based on version `expected_version` and epoch `epoch`: [`isr_change`] on the record
/// as etcd holds it, written by a transaction conditional on the mod revision and on the
/// proposer's member key being on `lease`. Returns the new record.
///
/// Errors: `Cas(StaleVersion)` (the record moved on), `Cas(NotLeader)` (not the leader of that
/// epoch), `Cas(InvalidIsr)`, `Fenced` (the proposer's lease is not the leader's, or no longer
/// alive), `NoGroup`, `Etcd`.
#[allow(clippy::too_many_arguments)]
pub async fn propose_isr(
    client: &mut Client,
    cluster: &str,
    stream: &str,
    shard: u32,
    proposer: &NodeId,
    lease: i64,
    expected_version: i64,
    epoch: u64,
    isr: &[NodeId],
) -> Result<ShardGroup, ClusterError> {
    let key = keys::group(cluster, stream, shard);
    let current = read(client, cluster, stream, shard).await?;
    let next = isr_change(&current, proposer, lease, expected_version, epoch, isr)?;
    let member = keys::member(cluster, proposer.as_str());
    let txn = Txn::new()
        .when([
            Compare::mod_revision(key.as_str(), CompareOp::Equal, expected_version),
            Compare::lease(member.as_str(), CompareOp::Equal, lease),
        ])
        .and_then([TxnOp::put(key.as_str(), next.to_json(), None)]);
    write_or_explain(client, cluster, stream, shard, txn, next, expected_version).await
}

/// `proposer` (holding etcd lease `lease`, the leader of `epoch`) hands the leadership of
/// `shard` of `stream` to `target` ([`leadership_transfer`] on the record as etcd holds it,
/// with the lease `target`'s member key is on now), by a transaction conditional on the mod
/// revision, the proposer's member key being on `lease` and the target's on that lease.
/// Returns the new record.
///
/// Errors: those of [`propose_isr`], and `Cas(NoCandidate)` (the target is not in sync, or
/// the set changed), `NotReplica`, `Fenced` (also when the target holds no lease).
#[allow(clippy::too_many_arguments)]
pub async fn transfer_leadership(
    client: &mut Client,
    cluster: &str,
    stream: &str,
    shard: u32,
    proposer: &NodeId,
    lease: i64,
    expected_version: i64,
    epoch: u64,
    isr: &[NodeId],
    target: &NodeId,
) -> Result<ShardGroup, ClusterError> {
    let key = keys::group(cluster, stream, shard);
    let current = read(client, cluster, stream, shard).await?;
    let target_member = keys::member(cluster, target.as_str());
    let target_lease = match client.get(target_member.as_str(), None).await?.kvs().first() {
        Some(kv) if kv.lease() != 0 => kv.lease(),
        _ => return Err(ClusterError::Fenced),
    };
    let next = leadership_transfer(
        &current,
        proposer,
        lease,
        expected_version,
        epoch,
        isr,
        target,
        target_lease,
    )?;
    let member = keys::member(cluster, proposer.as_str());
    let txn = Txn::new()
        .when([
            Compare::mod_revision(key.as_str(), CompareOp::Equal, expected_version),
            Compare::lease(member.as_str(), CompareOp::Equal, lease),
            Compare::lease(target_member.as_str(), CompareOp::Equal, target_lease),
        ])
        .and_then([TxnOp::put(key.as_str(), next.to_json(), None)]);
    write_or_explain(client, cluster, stream, shard, txn, next, expected_version).await
}

/// Runs a leader's compare-and-swap `txn` writing `next` over version `expected_version`:
/// the new record (its version the write's revision), or why it failed: `Cas(StaleVersion)`
/// when the record moved on, `Fenced` otherwise (a member key not on the lease compared).
async fn write_or_explain(
    client: &mut Client,
    cluster: &str,
    stream: &str,
    shard: u32,
    txn: Txn,
    mut next: ShardGroup,
    expected_version: i64,
) -> Result<ShardGroup, ClusterError> {
    let resp = client.txn(txn).await?;
    if resp.succeeded() {
        next.version = resp.header().map_or(0, |h| h.revision());
        return Ok(next);
    }
    let now = read(client, cluster, stream, shard).await?;
    if now.version != expected_version {
        return Err(stale(expected_version, now.version));
    }
    Err(ClusterError::Fenced)
}

/// `candidate` (holding etcd lease `lease`) proposes itself as leader of the next epoch of the
/// group `expected` (as read, at its version), the members in `live` being alive
/// ([`election`]). The transaction is conditional on the mod revision, on the candidate's
/// member key being on `lease`, and on the old leader's member key not being on the old
/// leader lease. Returns the new record.
///
/// Errors: `Cas(StaleVersion)` (another change, e.g. a rival's election, won), `LeaderAlive`
/// (the leader's lease holds), `Cas(NoCandidate)` (not a live in-sync replica), `Fenced` (the
/// candidate's own lease is gone), `NotReplica`, `Etcd`.
#[allow(clippy::too_many_arguments)]
pub async fn elect(
    client: &mut Client,
    cluster: &str,
    stream: &str,
    shard: u32,
    expected: &ShardGroup,
    candidate: &NodeId,
    lease: i64,
    live: &BTreeSet<NodeId>,
) -> Result<ShardGroup, ClusterError> {
    let key = keys::group(cluster, stream, shard);
    let mut next = election(expected, candidate, lease, live)?;
    let mut when = vec![
        Compare::mod_revision(key.as_str(), CompareOp::Equal, expected.version),
        Compare::lease(keys::member(cluster, candidate.as_str()), CompareOp::Equal, lease),
    ];
    if let (Some(old), Some(old_lease)) = (&expected.leader, expected.leader_lease) {
        // A missing key compares as lease 0: a vanished leader passes.
        when.push(Compare::lease(
            keys::member(cluster, old.as_str()),
            CompareOp::NotEqual,
            old_lease,
        ));
    }
    let txn = Txn::new().when(when).and_then([TxnOp::put(key.as_str(), next.to_json(), None)]);
    let resp = client.txn(txn).await?;
    if resp.succeeded() {
        next.version = resp.header().map_or(0, |h| h.revision());
        return Ok(next);
    }
    let now = read(client, cluster, stream, shard).await?;
    if now.version != expected.version {
        return Err(stale(expected.version, now.version));
    }
    if let (Some(old), Some(old_lease)) = (&expected.leader, expected.leader_lease) {
        let resp = client.get(keys::member(cluster, old.as_str()), None).await?;
        if resp.kvs().first().is_some_and(|kv| kv.lease() == old_lease) {
            return Err(ClusterError::LeaderAlive);
        }
    }
    Err(ClusterError::Fenced)
}

fn stale(expected: i64, current: i64) -> ClusterError {
    ClusterError::Cas(CasError::StaleVersion {
        expected: u64::try_from(expected).unwrap_or(0),
        current: u64::try_from(current).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn group() -> ShardGroup {
        let mut g = ShardGroup::initial(vec![n("b1"), n("b2"), n("b3")], Some(11));
        g.version = 7;
        g
    }

    #[test]
    fn initial_group_elects_the_first_replica_and_maps_numbers_by_position() {
        let g = group();
        assert_eq!((g.epoch, g.leader.clone(), g.leader_lease), (1, Some(n("b1")), Some(11)));
        assert_eq!(g.isr, g.replicas);
        assert_eq!(g.number(&n("b3")), Some(felix_replication::ReplicaNumber(2)));
        assert_eq!(g.node(felix_replication::ReplicaNumber(1)), Some(&n("b2")));
        let blank = ShardGroup::initial(vec![n("b1"), n("b2")], None);
        assert_eq!((blank.epoch, blank.leader), (0, None));
        let mut leases = BTreeMap::new();
        assert!(!g.leader_alive(&leases));
        leases.insert(n("b1"), 12);
        assert!(!g.leader_alive(&leases), "a restarted leader (new lease) is not alive");
        leases.insert(n("b1"), 11);
        assert!(g.leader_alive(&leases));
    }

    #[test]
    fn isr_change_follows_the_replication_rules_and_fences_other_leases() {
        let g = group();
        let shrunk = isr_change(&g, &n("b1"), 11, 7, 1, &[n("b1"), n("b3")]).unwrap();
        assert_eq!(shrunk.isr, vec![n("b1"), n("b3")]);
        assert!(matches!(
            isr_change(&g, &n("b1"), 11, 6, 1, &[n("b1")]),
            Err(ClusterError::Cas(CasError::StaleVersion { expected: 6, current: 7 }))
        ));
        assert!(matches!(
            isr_change(&g, &n("b2"), 11, 7, 1, &[n("b2")]),
            Err(ClusterError::Cas(CasError::NotLeader { .. }))
        ));
        assert!(matches!(
            isr_change(&g, &n("b1"), 11, 7, 1, &[n("b2")]),
            Err(ClusterError::Cas(CasError::InvalidIsr))
        ));
        assert!(matches!(
            isr_change(&g, &n("b1"), 11, 7, 1, &[n("b1"), n("zz")]),
            Err(ClusterError::Cas(CasError::InvalidIsr))
        ));
        // The leader restarted: same node, new lease.
        assert!(matches!(
            isr_change(&g, &n("b1"), 12, 7, 1, &[n("b1")]),
            Err(ClusterError::Fenced)
        ));
        assert!(matches!(
            isr_change(&g, &n("zz"), 11, 7, 1, &[n("b1")]),
            Err(ClusterError::NotReplica(_))
        ));
    }

    #[test]
    fn election_takes_the_next_epoch_from_the_live_isr() {
        let g = group();
        let live: BTreeSet<NodeId> = [n("b2"), n("b3")].into();
        let e = election(&g, &n("b3"), 33, &live).unwrap();
        assert_eq!((e.epoch, e.leader.clone(), e.leader_lease), (2, Some(n("b3")), Some(33)));
        assert_eq!(e.isr, vec![n("b2"), n("b3")]);
        let mut out = g.clone();
        out.isr = vec![n("b1"), n("b2")];
        assert!(matches!(
            election(&out, &n("b3"), 33, &live),
            Err(ClusterError::Cas(CasError::NoCandidate))
        ));
        // Round trip through the stored JSON keeps everything but the version.
        let back: ShardGroup = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(ShardGroup { version: e.version, ..back }, e);
    }
}
