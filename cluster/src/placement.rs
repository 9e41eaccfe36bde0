//! The placement rule: which broker owns each shard of a stream. Pure: no etcd, no clock.
//!
//! A stream's shards are assigned once, when the controller first sees the stream: each shard
//! goes to the live broker that owns the fewest shards so far (ties broken by node id), so
//! load spreads evenly and a broker that just joined gets the new shards first. A placement
//! never moves afterwards: without replication a shard's records live only on its owner's
//! disk, so when the owner is down the shard is unavailable (clients get a typed error) until
//! it returns.
//!
//! A replicated stream (replication factor `r` > 1, [`assign_replicas`]) gets `r` distinct
//! brokers per shard: the `r` least loaded (every replica counts as one shard of load, ties
//! by node id); the first of them, its leader at creation, is the one among them that leads
//! the fewest shards so far. Leadership moves afterwards only through the shard's group record
//! ([`crate::groups`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// Where the shards of one stream live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPlacement {
    /// `owners[s]` owns shard `s` (for a replicated stream: its leader at creation,
    /// `replicas[s][0]`).
    pub owners: Vec<NodeId>,
    /// For a replicated stream, `replicas[s]` are the distinct brokers holding shard `s`,
    /// leader at creation first; empty for a stream with one replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<Vec<NodeId>>,
}

impl StreamPlacement {
    /// The owner of `shard`, if the stream has it.
    pub fn owner(&self, shard: u32) -> Option<&NodeId> {
        self.owners.get(shard as usize)
    }

    /// Shards the stream has.
    pub fn shards(&self) -> u32 {
        self.owners.len() as u32
    }

    /// The brokers holding `shard`: its replicas, or its owner alone.
    pub fn replicas_of(&self, shard: u32) -> Vec<&NodeId> {
        match self.replicas.get(shard as usize) {
            Some(r) => r.iter().collect(),
            None => self.owner(shard).into_iter().collect(),
        }
    }
}

/// Why no placement could be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No broker is live to take the shards.
    #[error("no live broker to place shards on")]
    NoLiveBroker,
    /// The stream has no shards.
    #[error("a stream has at least one shard")]
    NoShards,
    /// Fewer live brokers than the replication factor: replicas must be on distinct brokers.
    #[error("{replicas} replicas need {replicas} live brokers, {live} are live")]
    TooFewBrokers {
        /// The replication factor asked for.
        replicas: u8,
        /// Live brokers.
        live: usize,
    },
    /// The replication factor is outside 1..=[`REPLICAS_MAX`].
    #[error("replication factor {0} is outside 1..={REPLICAS_MAX}")]
    BadReplicas(u8),
}

/// The largest replication factor.
pub const REPLICAS_MAX: u8 = 5;

/// Shards each broker holds over every placement in `placements` (a replica counts as one).
pub fn load<'a>(
    placements: impl IntoIterator<Item = &'a StreamPlacement>,
) -> BTreeMap<NodeId, u64> {
    let mut out = BTreeMap::new();
    for p in placements {
        for shard in 0..p.shards() {
            for node in p.replicas_of(shard) {
                *out.entry(node.clone()).or_insert(0) += 1;
            }
        }
    }
    out
}

/// Shards each broker leads at creation (`owners`) over every placement in `placements`.
pub fn leaders<'a>(
    placements: impl IntoIterator<Item = &'a StreamPlacement>,
) -> BTreeMap<NodeId, u64> {
    let mut out = BTreeMap::new();
    for p in placements {
        for owner in &p.owners {
            *out.entry(owner.clone()).or_insert(0) += 1;
        }
    }
    out
}

/// Assigns `replicas` distinct brokers of `live` to each of `shards` shards (see the module
/// docs): the least loaded by `load`, the one leading the fewest by `leaders` first. With
/// `replicas` 1 this is [`assign`].
pub fn assign_replicas(
    shards: u32,
    replicas: u8,
    live: &BTreeSet<NodeId>,
    load: &BTreeMap<NodeId, u64>,
    leaders: &BTreeMap<NodeId, u64>,
) -> Result<StreamPlacement, PlacementError> {
    if replicas == 0 || replicas > REPLICAS_MAX {
        return Err(PlacementError::BadReplicas(replicas));
    }
    if replicas == 1 {
        return assign(shards, live, load);
    }
    if shards == 0 {
        return Err(PlacementError::NoShards);
    }
    if live.len() < usize::from(replicas) {
        return Err(PlacementError::TooFewBrokers { replicas, live: live.len() });
    }
    let mut counts: BTreeMap<&NodeId, u64> =
        live.iter().map(|n| (n, load.get(n).copied().unwrap_or(0))).collect();
    let mut leads: BTreeMap<&NodeId, u64> =
        live.iter().map(|n| (n, leaders.get(n).copied().unwrap_or(0))).collect();
    let mut owners = Vec::with_capacity(shards as usize);
    let mut sets = Vec::with_capacity(shards as usize);
    for _ in 0..shards {
        // Sorting is stable and `counts` iterates in node order: ties go to the smallest id.
        let mut by_load: Vec<&NodeId> = counts.keys().copied().collect();
        by_load.sort_by_key(|n| counts[n]);
        let mut chosen: Vec<&NodeId> = by_load[..usize::from(replicas)].to_vec();
        let first = (0..chosen.len()).min_by_key(|&i| leads[chosen[i]]).expect("replicas >= 2");
        chosen.swap(0, first);
        for n in &chosen {
            *counts.get_mut(n).expect("live") += 1;
        }
        *leads.get_mut(chosen[0]).expect("live") += 1;
        owners.push(chosen[0].clone());
        sets.push(chosen.into_iter().cloned().collect());
    }
    Ok(StreamPlacement { owners, replicas: sets })
}

/// Assigns `shards` shards to the brokers in `live`, each to the least loaded so far (`load`
/// counts the shards each already owns; brokers missing from it own none).
pub fn assign(
    shards: u32,
    live: &BTreeSet<NodeId>,
    load: &BTreeMap<NodeId, u64>,
) -> Result<StreamPlacement, PlacementError> {
    if shards == 0 {
        return Err(PlacementError::NoShards);
    }
    if live.is_empty() {
        return Err(PlacementError::NoLiveBroker);
    }
    let mut counts: BTreeMap<&NodeId, u64> =
        live.iter().map(|n| (n, load.get(n).copied().unwrap_or(0))).collect();
    let mut owners = Vec::with_capacity(shards as usize);
    for _ in 0..shards {
        // BTreeMap iterates in node order, so min_by_key breaks ties by the smallest id.
        let (node, count) = counts.iter_mut().min_by_key(|(_, c)| **c).expect("live is not empty");
        *count += 1;
        owners.push((*node).clone());
    }
    Ok(StreamPlacement { owners, replicas: Vec::new() })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn nodes(ids: &[&str]) -> BTreeSet<NodeId> {
        ids.iter().map(|s| NodeId::new(s).unwrap()).collect()
    }

    #[test]
    fn shards_spread_evenly_and_a_new_broker_gets_new_shards_first() {
        let live = nodes(&["b1", "b2", "b3"]);
        let first = assign(12, &live, &BTreeMap::new()).unwrap();
        let l = load([&first]);
        assert_eq!(l.values().copied().collect::<Vec<_>>(), vec![4, 4, 4]);
        let live = nodes(&["b1", "b2", "b3", "b4"]);
        let second = assign(4, &live, &l).unwrap();
        assert!(second.owners.iter().all(|o| o.as_str() == "b4"), "{second:?}");
        let third = assign(4, &live, &load([&first, &second])).unwrap();
        assert_eq!(third.owners.iter().collect::<BTreeSet<_>>().len(), 4);
    }

    #[test]
    fn nothing_to_place_on_is_an_error() {
        assert_eq!(
            assign(3, &BTreeSet::new(), &BTreeMap::new()),
            Err(PlacementError::NoLiveBroker)
        );
        assert_eq!(assign(0, &nodes(&["a"]), &BTreeMap::new()), Err(PlacementError::NoShards));
    }

    #[test]
    fn replicas_are_distinct_and_too_few_brokers_is_an_error() {
        let live = nodes(&["b1", "b2", "b3"]);
        let p = assign_replicas(3, 3, &live, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        assert_eq!(p.replicas.len(), 3);
        // Each broker leads one shard and holds all three.
        assert_eq!(leaders([&p]).values().copied().collect::<Vec<_>>(), vec![1, 1, 1]);
        assert_eq!(load([&p]).values().copied().collect::<Vec<_>>(), vec![3, 3, 3]);
        assert_eq!(
            assign_replicas(1, 4, &live, &BTreeMap::new(), &BTreeMap::new()),
            Err(PlacementError::TooFewBrokers { replicas: 4, live: 3 })
        );
        assert_eq!(
            assign_replicas(1, 6, &live, &BTreeMap::new(), &BTreeMap::new()),
            Err(PlacementError::BadReplicas(6))
        );
        let single = assign_replicas(2, 1, &live, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        assert!(single.replicas.is_empty() && single.shards() == 2);
    }

    proptest! {
        #[test]
        fn replica_sets_are_distinct_live_least_loaded_and_balanced(
            brokers in 1usize..8,
            streams in proptest::collection::vec((1u32..20, 1u8..=5), 1..10),
        ) {
            let live: BTreeSet<NodeId> =
                (0..brokers).map(|i| NodeId::new(&format!("n{i}")).unwrap()).collect();
            let mut all: Vec<StreamPlacement> = Vec::new();
            for (shards, replicas) in streams {
                let before = load(&all);
                let p = match assign_replicas(shards, replicas, &live, &before, &leaders(&all)) {
                    Err(PlacementError::TooFewBrokers { .. }) => {
                        prop_assert!(usize::from(replicas) > brokers);
                        continue;
                    }
                    other => other.unwrap(),
                };
                prop_assert_eq!(p.shards(), shards);
                for s in 0..shards {
                    let set = p.replicas_of(s);
                    prop_assert_eq!(set.len(), usize::from(replicas));
                    let distinct: BTreeSet<&NodeId> = set.iter().copied().collect();
                    prop_assert_eq!(distinct.len(), set.len(), "not distinct: {:?}", set);
                    prop_assert!(set.iter().all(|n| live.contains(*n)));
                    prop_assert_eq!(set[0], &p.owners[s as usize]);
                }
                all.push(p);
                let l = load(&all);
                let counts: Vec<u64> =
                    live.iter().map(|n| l.get(n).copied().unwrap_or(0)).collect();
                let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                prop_assert!(max - min <= 1, "unbalanced: {:?}", counts);
            }
        }

        #[test]
        fn assignment_is_balanced_and_uses_only_live_brokers(
            brokers in 1usize..8,
            streams in proptest::collection::vec(1u32..40, 1..10),
        ) {
            let live: BTreeSet<NodeId> =
                (0..brokers).map(|i| NodeId::new(&format!("n{i}")).unwrap()).collect();
            let mut all = Vec::new();
            for shards in streams {
                let p = assign(shards, &live, &load(&all)).unwrap();
                prop_assert_eq!(p.shards(), shards);
                prop_assert!(p.owners.iter().all(|o| live.contains(o)));
                all.push(p);
                let l = load(&all);
                let counts: Vec<u64> =
                    live.iter().map(|n| l.get(n).copied().unwrap_or(0)).collect();
                let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                prop_assert!(max - min <= 1, "unbalanced: {:?}", counts);
            }
        }
    }
}
