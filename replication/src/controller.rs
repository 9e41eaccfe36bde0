//! The controller's record of a replica group and the only three ways it changes: a leader's
//! in-sync-set proposal, an election after the leader's lease is gone, and a leader handing its
//! leadership to an in-sync replica (leader balance).
//!
//! In the broker the record is one etcd key per shard, written in a transaction conditional on
//! its mod revision (`version` here); the simulator keeps it in its etcd model. Both apply the
//! same pure rules below, so the compare-and-swap semantics are tested once.

use std::collections::BTreeSet;

use crate::error::CasError;
use crate::types::{Epoch, LeaseId, ReplicaNumber};

/// A shard's replica group as the controller (etcd) records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupState {
    /// Incremented by every successful change (etcd's mod revision of the key).
    pub version: u64,
    /// The leader epoch.
    pub epoch: Epoch,
    /// The leader of `epoch`, if one was elected.
    pub leader: Option<ReplicaNumber>,
    /// The controller lease the leader held when elected. Leadership belongs to that lease: a
    /// restarted broker (a new lease) never resumes an epoch it led before, because it may have
    /// lost batches of that epoch that followers still hold.
    pub leader_lease: Option<LeaseId>,
    /// The in-sync replicas: every one durably holds every committed batch.
    pub isr: BTreeSet<ReplicaNumber>,
    /// Every replica of the shard (placement), the leader and the ISR among them.
    pub replicas: Vec<ReplicaNumber>,
}

/// A leader's request to change its in-sync set (shrink a laggard, add a caught-up follower).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrProposal {
    /// The group version the proposal was computed from.
    pub expected_version: u64,
    /// The proposer, which must lead `epoch`.
    pub leader: ReplicaNumber,
    /// The proposer's epoch.
    pub epoch: Epoch,
    /// The new in-sync set; it must contain the leader.
    pub isr: BTreeSet<ReplicaNumber>,
    /// A leadership transfer instead ([`GroupState::apply_transfer`]): the in-sync replica that
    /// leads the next epoch; `isr` must then be the current in-sync set.
    pub transfer_to: Option<ReplicaNumber>,
}

impl GroupState {
    /// A new group: no leader yet, every replica in sync (all logs are empty).
    pub fn new(replicas: Vec<ReplicaNumber>) -> GroupState {
        GroupState {
            version: 1,
            epoch: Epoch::NONE,
            leader: None,
            leader_lease: None,
            isr: replicas.iter().copied().collect(),
            replicas,
        }
    }

    /// Applies a leader's in-sync-set proposal if it is based on the current version and the
    /// proposer still leads; otherwise leaves the group unchanged.
    pub fn apply_isr(&mut self, proposal: &IsrProposal) -> Result<(), CasError> {
        if proposal.transfer_to.is_some() {
            return Err(CasError::InvalidIsr);
        }
        self.check_proposer(proposal)?;
        let valid = proposal.isr.contains(&proposal.leader)
            && proposal.isr.iter().all(|n| self.replicas.contains(n));
        if !valid {
            return Err(CasError::InvalidIsr);
        }
        self.isr = proposal.isr.clone();
        self.version += 1;
        Ok(())
    }

    /// Applies a leader's transfer of its leadership to `proposal.transfer_to`, which holds
    /// `lease`: the next epoch, led by it on that lease, the in-sync set unchanged. Refused
    /// unless based on the current version, the proposer leads, the in-sync set is the current
    /// one and the target is in it (and not the proposer).
    ///
    /// Safety: the target is in sync, so it durably holds every committed batch; the old
    /// leader commits a batch only once every in-sync replica durably holds it, and the target
    /// acknowledges only what it fetched while it followed, all of which it keeps when it
    /// leads. So nothing committed before or after the change is missing from the new
    /// leader's log (docs/replication.md, "Leader balance").
    pub fn apply_transfer(
        &mut self,
        proposal: &IsrProposal,
        lease: LeaseId,
    ) -> Result<(), CasError> {
        self.check_proposer(proposal)?;
        let Some(target) = proposal.transfer_to else { return Err(CasError::NoCandidate) };
        if proposal.isr != self.isr || !self.isr.contains(&target) || target == proposal.leader {
            return Err(CasError::NoCandidate);
        }
        self.epoch = Epoch(self.epoch.0 + 1);
        self.leader = Some(target);
        self.leader_lease = Some(lease);
        self.version += 1;
        Ok(())
    }

    /// A proposal's base: the current version, proposed by the leader of the current epoch.
    fn check_proposer(&self, proposal: &IsrProposal) -> Result<(), CasError> {
        if proposal.expected_version != self.version {
            return Err(CasError::StaleVersion {
                expected: proposal.expected_version,
                current: self.version,
            });
        }
        if self.leader != Some(proposal.leader) || self.epoch != proposal.epoch {
            return Err(CasError::NotLeader { proposer: proposal.leader, epoch: self.epoch });
        }
        Ok(())
    }

    /// Elects `candidate` for the next epoch, because the leader is gone (its lease expired) or
    /// there is none. `candidate` must be in the in-sync set and `live`; the new in-sync set is
    /// the old one's live members. Safety: every in-sync replica durably holds every committed
    /// batch, so the new leader does too (docs/replication.md, "Safety").
    pub fn elect(
        &mut self,
        candidate: ReplicaNumber,
        lease: LeaseId,
        live: &BTreeSet<ReplicaNumber>,
    ) -> Result<(), CasError> {
        if !self.isr.contains(&candidate) || !live.contains(&candidate) {
            return Err(CasError::NoCandidate);
        }
        self.isr = self.isr.intersection(live).copied().collect();
        self.epoch = Epoch(self.epoch.0 + 1);
        self.leader = Some(candidate);
        self.leader_lease = Some(lease);
        self.version += 1;
        Ok(())
    }

    /// The in-sync replicas that could be elected now, given the `live` ones.
    pub fn candidates(&self, live: &BTreeSet<ReplicaNumber>) -> Vec<ReplicaNumber> {
        self.isr.intersection(live).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u32]) -> BTreeSet<ReplicaNumber> {
        ids.iter().map(|&i| ReplicaNumber(i)).collect()
    }

    #[test]
    fn cas_needs_current_version_and_leadership() {
        let mut group = GroupState::new(vec![ReplicaNumber(1), ReplicaNumber(2), ReplicaNumber(3)]);
        group.elect(ReplicaNumber(1), LeaseId(1), &set(&[1, 2, 3])).unwrap();
        assert_eq!((group.epoch, group.version), (Epoch(1), 2));
        let shrink = IsrProposal {
            expected_version: 2,
            leader: ReplicaNumber(1),
            epoch: Epoch(1),
            isr: set(&[1, 2]),
            transfer_to: None,
        };
        group.apply_isr(&shrink).unwrap();
        assert!(matches!(group.apply_isr(&shrink), Err(CasError::StaleVersion { .. })));
        let by_follower = IsrProposal {
            expected_version: 3,
            leader: ReplicaNumber(2),
            epoch: Epoch(1),
            isr: set(&[2]),
            transfer_to: None,
        };
        assert!(matches!(group.apply_isr(&by_follower), Err(CasError::NotLeader { .. })));
        let without_leader = IsrProposal {
            expected_version: 3,
            leader: ReplicaNumber(1),
            epoch: Epoch(1),
            isr: set(&[2]),
            transfer_to: None,
        };
        assert_eq!(group.apply_isr(&without_leader), Err(CasError::InvalidIsr));
    }

    #[test]
    fn election_only_from_live_isr() {
        let mut group = GroupState::new(vec![ReplicaNumber(1), ReplicaNumber(2), ReplicaNumber(3)]);
        group.elect(ReplicaNumber(1), LeaseId(1), &set(&[1, 2, 3])).unwrap();
        group.isr = set(&[1, 2]);
        assert_eq!(
            group.elect(ReplicaNumber(3), LeaseId(3), &set(&[2, 3])),
            Err(CasError::NoCandidate)
        );
        group.elect(ReplicaNumber(2), LeaseId(2), &set(&[2, 3])).unwrap();
        assert_eq!(
            (group.leader, group.epoch, group.isr.clone()),
            (Some(ReplicaNumber(2)), Epoch(2), set(&[2]))
        );
    }

    #[test]
    fn a_transfer_goes_to_an_in_sync_replica_with_the_set_unchanged() {
        let mut group = GroupState::new(vec![ReplicaNumber(1), ReplicaNumber(2), ReplicaNumber(3)]);
        group.elect(ReplicaNumber(2), LeaseId(2), &set(&[1, 2, 3])).unwrap();
        group.isr = set(&[1, 2]);
        let to = |target: u32, isr: &[u32], version: u64| IsrProposal {
            expected_version: version,
            leader: ReplicaNumber(2),
            epoch: Epoch(1),
            isr: set(isr),
            transfer_to: Some(ReplicaNumber(target)),
        };
        // Not to a replica out of sync, nor with another set, nor itself, nor as an ISR change.
        assert_eq!(
            group.apply_transfer(&to(3, &[1, 2], 2), LeaseId(3)),
            Err(CasError::NoCandidate)
        );
        assert_eq!(
            group.apply_transfer(&to(1, &[1, 2, 3], 2), LeaseId(1)),
            Err(CasError::NoCandidate)
        );
        assert_eq!(
            group.apply_transfer(&to(2, &[1, 2], 2), LeaseId(2)),
            Err(CasError::NoCandidate)
        );
        assert_eq!(group.apply_isr(&to(1, &[1, 2], 2)), Err(CasError::InvalidIsr));
        assert!(matches!(
            group.apply_transfer(&to(1, &[1, 2], 1), LeaseId(1)),
            Err(CasError::StaleVersion { .. })
        ));
        group.apply_transfer(&to(1, &[1, 2], 2), LeaseId(7)).unwrap();
        assert_eq!(
            (group.leader, group.leader_lease, group.epoch, group.isr.clone(), group.version),
            (Some(ReplicaNumber(1)), Some(LeaseId(7)), Epoch(2), set(&[1, 2]), 3)
        );
        // The old leader's next proposal, of its old epoch, is refused.
        assert!(matches!(
            group.apply_transfer(&to(1, &[1, 2], 3), LeaseId(7)),
            Err(CasError::NotLeader { .. })
        ));
    }
}
