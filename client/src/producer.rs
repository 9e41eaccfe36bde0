//! Idempotent producers on the client side: a producer's id, its next sequence number, the
//! window of its unresolved batches (at most the broker's 8), and the tag each batch carries
//! while it is in flight. The publisher's workers (`crate::publisher`) own the producers and
//! decide when a batch is sent again (docs/client.md, "Idempotent publishing and retries").

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use felix_proto::{ProducerId, ProducerTag, ShardId};
use tokio::sync::Notify;

use crate::error::ClientError;

/// The most batches of one producer sent and not yet acked or failed (parked ones included):
/// the broker remembers a producer's last 8 sequence numbers (docs/protocol.md, "Idempotent
/// publishing"), so a batch sent again is always among them, and a retry is never refused as
/// too old because later batches of its producer went ahead of it.
pub const PRODUCER_IN_FLIGHT_MAX: usize = 8;

/// One idempotent producer: its id, next sequence number and what its batches share.
pub(crate) struct Producer {
    pub(crate) id: ProducerId,
    pub(crate) next_seq: u32,
    pub(crate) shared: Arc<ProducerShared>,
}

/// What a producer's batches in flight share with the worker.
#[derive(Default)]
pub(crate) struct ProducerShared {
    /// One of its batches failed for good (its sequence number is then a gap the broker would
    /// refuse): the next batch starts a new producer.
    pub(crate) broken: AtomicBool,
    /// The sequence numbers of its batches sent and not yet acked or failed, parked ones
    /// included.
    unresolved: Mutex<BTreeSet<u32>>,
    /// Signalled whenever a batch is resolved.
    pub(crate) resolved: Notify,
}

impl ProducerShared {
    /// Whether the batch with sequence number `next` may go: it lies within
    /// [`PRODUCER_IN_FLIGHT_MAX`] of the oldest unresolved one. The broker remembers a
    /// producer's last 8 sequence numbers, so then every unresolved batch is among them
    /// whatever was stored after it (a window on the count alone lets an old batch whose ack
    /// was lost fall out of it while later ones are acked).
    pub(crate) fn admits(&self, next: u32) -> bool {
        let unresolved = self.unresolved.lock().unwrap_or_else(|p| p.into_inner());
        unresolved
            .first()
            .is_none_or(|&oldest| next.wrapping_sub(oldest) < PRODUCER_IN_FLIGHT_MAX as u32)
    }

    /// Whether no batch before `seq` is unresolved: every batch the producer sent before it
    /// was acked or failed (Publish flag `OLDEST_PENDING`, so a broker that forgot the
    /// producer takes `seq` as its start).
    pub(crate) fn is_oldest(&self, seq: u32) -> bool {
        let unresolved = self.unresolved.lock().unwrap_or_else(|p| p.into_inner());
        // Within the window, `s` is earlier when `seq` is ahead of it by less than half the
        // sequence space.
        !unresolved.iter().any(|&s| s != seq && seq.wrapping_sub(s) < 1 << 31)
    }

    /// Holds a place in the window for sequence number `seq`.
    pub(crate) fn hold(self: &Arc<Self>, tag: ProducerTag) -> TagHold {
        self.unresolved.lock().unwrap_or_else(|p| p.into_inner()).insert(tag.seq);
        TagHold { tag, producer: self.clone() }
    }

    /// Batches sent and not yet resolved.
    #[cfg(test)]
    pub(crate) fn unresolved(&self) -> usize {
        self.unresolved.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Producer {
    pub(crate) fn new() -> Self {
        Self { id: new_producer_id(), next_seq: 0, shared: Arc::default() }
    }

    /// A producer for unkeyed batches whose shard (`id mod shards`) lives on broker core
    /// `core` of `cores` (shard `s` lives on core `s % cores`), so its batches need no hop
    /// inside the broker. Ids are drawn at most `PRODUCER_ID_DRAWS_MAX` times (with fewer
    /// shards than cores, none may fit: the last one drawn is kept).
    pub(crate) fn on_core(shards: u32, cores: u16, core: u16) -> Self {
        let (shards, cores) = (u64::from(shards.max(1)), u64::from(cores.max(1)));
        let mut p = Self::new();
        for _ in 0..PRODUCER_ID_DRAWS_MAX {
            if (p.id.0 % shards) % cores == u64::from(core) {
                break;
            }
            p.id = new_producer_id();
        }
        p
    }

    /// A producer whose id names `shard` of `shards` (`id mod shards == shard`): the broker
    /// stores its unkeyed batches on that shard, so in a cluster it can be sent to that shard's
    /// owner and follow the shard to its next leader (its keyed batches name their shard by
    /// their key anyway).
    pub(crate) fn on_shard(shards: u32, shard: ShardId) -> Self {
        let shards = u64::from(shards.max(1));
        let mut p = Self::new();
        // A multiple of `shards` below the id, plus the shard: no overflow.
        let base = (p.id.0 / shards).saturating_sub(1) * shards;
        p.id = ProducerId(base + u64::from(shard.0) % shards);
        p
    }
}

/// A tagged batch's tag and its place in its producer's window: dropping it (the batch acked,
/// failed or dropped) frees the place.
pub(crate) struct TagHold {
    pub(crate) tag: ProducerTag,
    pub(crate) producer: Arc<ProducerShared>,
}

impl Drop for TagHold {
    fn drop(&mut self) {
        let mut unresolved = self.producer.unresolved.lock().unwrap_or_else(|p| p.into_inner());
        unresolved.remove(&self.tag.seq);
        drop(unresolved);
        self.producer.resolved.notify_waiters();
    }
}

/// A random producer id: SipHash with the process's random keys over a counter and the clock.
fn new_producer_id() -> ProducerId {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    h.write_u128(now.map_or(0, |d| d.as_nanos()));
    ProducerId(h.finish())
}

/// Whether a tagged batch that got `e` may have been stored, or not, and is worth sending again
/// (the broker stores it once either way): a lost connection, no answer in time, or the
/// leader's own `OutcomeUnknown` (it appended the batch, then stepped down before it
/// committed). A plain batch that gets one of these fails with it: resending could store it
/// twice.
pub(crate) fn outcome_unknown(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::ConnectionLost(_)
            | ClientError::Timeout { .. }
            | ClientError::Broker { code: felix_proto::ErrorCode::OutcomeUnknown, .. }
    )
}

/// Most ids drawn for an unkeyed producer whose shard the connection's core owns (with fewer
/// shards than cores, no id may fit: the last one drawn is kept).
const PRODUCER_ID_DRAWS_MAX: usize = 256;

/// A tagged batch failed for good: its producer starts over under a new id.
pub(crate) fn mark_broken(tag: Option<&TagHold>) {
    if let Some(hold) = tag {
        hold.producer.broken.store(true, Ordering::Relaxed);
    }
}

/// The next tag of the producer at `which` in `producers` (a fresh one, `fresh`, when it has
/// none or its last one broke), or, when its window is full, what its batches share (to wait
/// on).
pub(crate) fn take_tag<K: std::hash::Hash + Eq>(
    producers: &mut HashMap<K, Producer>,
    which: K,
    fresh: impl Fn() -> Producer,
) -> Result<TagHold, Arc<ProducerShared>> {
    let p = match producers.entry(which) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(fresh()),
    };
    if p.shared.broken.load(Ordering::Relaxed) {
        *p = fresh();
    }
    if !p.shared.admits(p.next_seq) {
        return Err(p.shared.clone());
    }
    let tag = ProducerTag { producer: p.id, seq: p.next_seq };
    p.next_seq = p.next_seq.wrapping_add(1);
    Ok(p.shared.hold(tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unkeyed_producer_lands_on_its_core() {
        for core in 0..4u16 {
            for _ in 0..50 {
                let p = Producer::on_core(12, 4, core);
                assert_eq!((p.id.0 % 12) % 4, u64::from(core));
                assert_eq!(p.next_seq, 0);
            }
        }
        // Fewer shards than cores: core 3 of 4 owns none of 2 shards; a producer still comes.
        let p = Producer::on_core(2, 4, 3);
        assert!(p.id.0 % 2 < 2);
    }

    #[test]
    fn a_producer_on_a_shard_names_it() {
        for shards in [1, 2, 3, 7, 4096] {
            for shard in [0, shards / 2, shards - 1] {
                for _ in 0..50 {
                    let p = Producer::on_shard(shards, ShardId(shard));
                    assert_eq!(p.id.0 % u64::from(shards), u64::from(shard));
                }
            }
        }
    }

    #[test]
    fn a_broken_producer_is_replaced_by_a_fresh_one_of_its_kind() {
        let mut producers = HashMap::new();
        let fresh = || Producer::on_shard(5, ShardId(3));
        let hold = take_tag(&mut producers, 1u8, fresh).ok().expect("room");
        mark_broken(Some(&hold));
        drop(hold);
        let next = take_tag(&mut producers, 1u8, fresh).ok().expect("room");
        assert_eq!(next.tag.seq, 0, "a new producer");
        assert_eq!(next.tag.producer.0 % 5, 3, "on the same shard");
    }

    #[test]
    fn a_tag_holds_its_place_in_the_window_until_dropped() {
        let p = Producer::new();
        let hold = p.shared.hold(ProducerTag { producer: p.id, seq: 0 });
        assert_eq!(p.shared.unresolved(), 1);
        mark_broken(Some(&hold));
        drop(hold);
        assert_eq!(p.shared.unresolved(), 0);
        assert!(p.shared.broken.load(Ordering::Relaxed));
    }

    #[test]
    fn the_window_spans_from_the_oldest_unresolved_batch() {
        let p = Producer::new();
        let tag = |seq| ProducerTag { producer: p.id, seq };
        let oldest = p.shared.hold(tag(0));
        let mut later: Vec<TagHold> = (1..8).map(|s| p.shared.hold(tag(s))).collect();
        assert!(!p.shared.admits(8), "8 unresolved");
        // Later batches acked, the oldest not: still no room past 0 + 8.
        later.clear();
        assert_eq!(p.shared.unresolved(), 1);
        assert!(!p.shared.admits(8), "seq 8 would push 0 out of the broker's last 8");
        assert!(p.shared.admits(7));
        drop(oldest);
        assert!(p.shared.admits(8));
    }
}
