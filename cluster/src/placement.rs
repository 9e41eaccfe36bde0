//! The placement rule: which broker owns each shard of a stream. Pure: no etcd, no clock.
//!
//! A stream's shards are assigned once, when the controller first sees the stream: each shard
//! goes to the live broker that owns the fewest shards so far (ties broken by node id), so
//! load spreads evenly and a broker that just joined gets the new shards first. A placement
//! never moves afterwards: without replication a shard's records live only on its owner's
//! disk, so when the owner is down the shard is unavailable (clients get a typed error) until
//! it returns.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// Where the shards of one stream live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPlacement {
    /// `owners[s]` owns shard `s`.
    pub owners: Vec<NodeId>,
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
}

/// Shards each broker owns over every placement in `placements`.
pub fn load<'a>(
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
    Ok(StreamPlacement { owners })
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

    proptest! {
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
