//! A model of etcd as the replication controller sees it: leases with a TTL, and one key holding
//! the group record, changed only through the compare-and-swap rules of [`GroupState`].

use std::collections::{BTreeMap, BTreeSet};

use rand_chacha::ChaCha8Rng;

use crate::controller::{GroupState, IsrProposal};
use crate::types::{LeaseId, NodeId, Time};

/// The etcd model.
pub struct Etcd {
    /// The group record.
    pub group: GroupState,
    /// Live leases: holder and expiry.
    leases: BTreeMap<LeaseId, (NodeId, Time)>,
    next_lease: u64,
    lease_ttl_ms: u64,
}

impl Etcd {
    /// A fresh etcd holding a new group of `replicas`.
    pub fn new(replicas: Vec<NodeId>, lease_ttl_ms: u64) -> Etcd {
        Etcd {
            group: GroupState::new(replicas),
            leases: BTreeMap::new(),
            next_lease: 1,
            lease_ttl_ms,
        }
    }

    /// A keep-alive from `node` for `lease`: extends it if it is live, else grants a new one.
    /// Returns the lease the node holds now.
    pub fn keep_alive(&mut self, now: Time, node: NodeId, lease: Option<LeaseId>) -> LeaseId {
        let expiry = now.plus_ms(self.lease_ttl_ms);
        if let Some(entry) = lease.and_then(|l| self.leases.get_mut(&l)) {
            entry.1 = expiry;
            return lease.expect("matched above");
        }
        let granted = LeaseId(self.next_lease);
        self.next_lease += 1;
        self.leases.insert(granted, (node, expiry));
        granted
    }

    /// Drops expired leases; elects a leader when the current one's lease is gone. Returns
    /// whether the group record changed.
    pub fn tick(&mut self, now: Time, rng: &mut ChaCha8Rng) -> bool {
        self.leases.retain(|_, (_, expiry)| *expiry > now);
        let leader_live = self.group.leader_lease.is_some_and(|l| self.leases.contains_key(&l));
        if leader_live {
            return false;
        }
        let live: BTreeSet<NodeId> = self.leases.values().map(|(n, _)| *n).collect();
        let candidates = self.group.candidates(&live);
        let Some(candidate) = super::pick(rng, &candidates) else { return false };
        let lease = self.newest_lease_of(candidate).expect("a live node holds a lease");
        self.group.elect(candidate, lease, &live).is_ok()
    }

    /// A leader's in-sync-set proposal. Returns whether the record changed.
    pub fn propose(&mut self, proposal: &IsrProposal) -> bool {
        self.group.apply_isr(proposal).is_ok()
    }

    /// Whether `lease` is live now.
    pub fn lease_live(&self, lease: LeaseId, now: Time) -> bool {
        self.leases.get(&lease).is_some_and(|(_, expiry)| *expiry > now)
    }

    fn newest_lease_of(&self, node: NodeId) -> Option<LeaseId> {
        self.leases.iter().rev().find(|(_, (n, _))| *n == node).map(|(l, _)| *l)
    }
}
