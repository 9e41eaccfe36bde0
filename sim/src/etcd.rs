//! A model of etcd as the replication controller sees it: leases with a TTL, and one key holding
//! the group record, changed only through the compare-and-swap rules of [`GroupState`].

use std::collections::{BTreeMap, BTreeSet};

use rand_chacha::ChaCha8Rng;

use felix_replication::controller::{GroupState, IsrProposal};
use felix_replication::types::{LeaseId, ReplicaNumber, Time};

/// The etcd model.
pub struct Etcd {
    /// The group record (its replica number i is node i).
    pub group: GroupState,
    /// Until the stream is placed ([`Etcd::placed_at`]): a deposed controller's record of the
    /// group, whose replica number i is node `deposed.1[i]` (another order), with elections of
    /// its own. The placement replaces it with `group` (docs/replication.md, "The controller on
    /// etcd").
    pub deposed: Option<(GroupState, Vec<ReplicaNumber>)>,
    /// When the stream's placement is written.
    pub placed_at: Time,
    /// The placed group's epochs begun by a leadership transfer, each with the leader that
    /// handed it on (the epochs not named here began with an election).
    pub handed_on: BTreeMap<felix_replication::types::Epoch, ReplicaNumber>,
    /// Leadership transfers applied.
    pub transfers: u64,
    /// Live leases: holder and expiry.
    leases: BTreeMap<LeaseId, (ReplicaNumber, Time)>,
    next_lease: u64,
    lease_ttl_ms: u64,
}

impl Etcd {
    /// A fresh etcd holding a new group of `replicas`.
    pub fn new(replicas: Vec<ReplicaNumber>, lease_ttl_ms: u64) -> Etcd {
        Etcd {
            group: GroupState::new(replicas),
            deposed: None,
            placed_at: Time(0),
            handed_on: BTreeMap::new(),
            transfers: 0,
            leases: BTreeMap::new(),
            next_lease: 1,
            lease_ttl_ms,
        }
    }

    /// A keep-alive from `node` for `lease`: extends it if it is live, else grants a new one.
    /// Returns the lease the node holds now.
    pub fn keep_alive(
        &mut self,
        now: Time,
        node: ReplicaNumber,
        lease: Option<LeaseId>,
    ) -> LeaseId {
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

    /// Before `placed_at`, a deposed controller's record naming the nodes in `order` is what
    /// the nodes see.
    pub fn with_deposed_record(&mut self, order: Vec<ReplicaNumber>, placed_at: Time) {
        self.deposed =
            Some((GroupState::new((0..order.len() as u32).map(ReplicaNumber).collect()), order));
        self.placed_at = placed_at;
    }

    /// Whether the stream is placed at `now`.
    pub fn placed(&self, now: Time) -> bool {
        now >= self.placed_at
    }

    /// The record the nodes see: its state, whether the stream is placed, and the node of each
    /// replica number.
    pub fn record(&self, now: Time) -> (GroupState, bool, Vec<ReplicaNumber>) {
        match &self.deposed {
            Some((state, order)) if !self.placed(now) => (state.clone(), false, order.clone()),
            _ => (self.group.clone(), self.placed(now), self.group.replicas.clone()),
        }
    }

    /// Drops expired leases; elects a leader when the current one's lease is gone; writes the
    /// placement when it is due. Returns whether the record the nodes see changed.
    pub fn tick(&mut self, now: Time, rng: &mut ChaCha8Rng) -> bool {
        self.leases.retain(|_, (_, expiry)| *expiry > now);
        let mut changed = false;
        if self.deposed.is_some() && self.placed(now) {
            self.deposed = None;
            changed = true;
        }
        if let Some((state, order)) = &mut self.deposed {
            let leader_live = state.leader_lease.is_some_and(|l| self.leases.contains_key(&l));
            if !leader_live {
                let live_nodes: BTreeSet<ReplicaNumber> =
                    self.leases.values().map(|(n, _)| *n).collect();
                let live: BTreeSet<ReplicaNumber> = (0..order.len() as u32)
                    .map(ReplicaNumber)
                    .filter(|i| live_nodes.contains(&order[i.0 as usize]))
                    .collect();
                let candidates = state.candidates(&live);
                if let Some(candidate) = super::pick(rng, &candidates) {
                    let node = order[candidate.0 as usize];
                    let lease =
                        self.leases.iter().rev().find(|(_, (n, _))| *n == node).map(|(l, _)| *l);
                    if let Some(lease) = lease {
                        changed |= state.elect(candidate, lease, &live).is_ok();
                    }
                }
            }
        }
        changed | self.elect(rng)
    }

    fn elect(&mut self, rng: &mut ChaCha8Rng) -> bool {
        let leader_live = self.group.leader_lease.is_some_and(|l| self.leases.contains_key(&l));
        if leader_live {
            return false;
        }
        let live: BTreeSet<ReplicaNumber> = self.leases.values().map(|(n, _)| *n).collect();
        let candidates = self.group.candidates(&live);
        let Some(candidate) = super::pick(rng, &candidates) else { return false };
        let lease = self.newest_lease_of(candidate).expect("a live node holds a lease");
        self.group.elect(candidate, lease, &live).is_ok()
    }

    /// A leader's in-sync-set proposal, applied to the record the nodes see at `now`. Returns
    /// whether the record changed.
    /// A leadership transfer takes the target's newest live lease, as the broker's agent reads
    /// the target's member key.
    /// `unchecked` (the injected bug `transfer_out_of_sync`) takes a transfer from the leader
    /// without the in-sync check.
    pub fn propose(&mut self, now: Time, proposal: &IsrProposal, unchecked: bool) -> bool {
        let placed = self.placed(now);
        let lease = proposal.transfer_to.and_then(|t| self.newest_lease_of(t));
        let (state, is_placed_group) = match &mut self.deposed {
            Some((state, _)) if !placed => (state, false),
            _ => (&mut self.group, true),
        };
        match (proposal.transfer_to, lease) {
            (None, _) => state.apply_isr(proposal).is_ok(),
            (Some(target), Some(lease)) => {
                let applied = if unchecked {
                    transfer_unchecked(state, proposal, target, lease)
                } else {
                    state.apply_transfer(proposal, lease).is_ok()
                };
                if applied && is_placed_group {
                    self.handed_on.insert(self.group.epoch, proposal.leader);
                    self.transfers += 1;
                }
                applied
            }
            (Some(_), None) => false,
        }
    }

    /// Whether `leader` handed `epoch` on by a leadership transfer (the next epoch began with
    /// it): then it may still ack in `epoch` until it learns, whatever came after. Its commits
    /// need every replica of its in-sync set, the new leader among them, which keeps them
    /// (below the log end it leads from); a replica added to the in-sync set later holds that
    /// end. Invariants 4-6 check that this holds.
    pub fn handed_on(&self, epoch: felix_replication::types::Epoch, leader: ReplicaNumber) -> bool {
        let after = felix_replication::types::Epoch(epoch.0 + 1);
        self.group.epoch > epoch && self.handed_on.get(&after) == Some(&leader)
    }

    /// When `lease` expires, if etcd holds it.
    pub fn lease_expiry(&self, lease: LeaseId) -> Option<Time> {
        self.leases.get(&lease).map(|(_, expiry)| *expiry)
    }

    /// Whether `lease` is live now.
    pub fn lease_live(&self, lease: LeaseId, now: Time) -> bool {
        self.leases.get(&lease).is_some_and(|(_, expiry)| *expiry > now)
    }

    fn newest_lease_of(&self, node: ReplicaNumber) -> Option<LeaseId> {
        self.leases.iter().rev().find(|(_, (n, _))| *n == node).map(|(l, _)| *l)
    }
}

/// The injected bug `transfer_out_of_sync`'s controller: a transfer from the leader of the
/// current version and epoch, to any other replica, in-sync or not.
fn transfer_unchecked(
    state: &mut GroupState,
    proposal: &IsrProposal,
    target: ReplicaNumber,
    lease: LeaseId,
) -> bool {
    let current = proposal.expected_version == state.version
        && state.leader == Some(proposal.leader)
        && state.epoch == proposal.epoch;
    if !current || target == proposal.leader {
        return false;
    }
    state.epoch = felix_replication::types::Epoch(state.epoch.0 + 1);
    state.leader = Some(target);
    state.leader_lease = Some(lease);
    state.version += 1;
    true
}
