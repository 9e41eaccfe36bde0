//! Idempotent producers on the client side: a producer's id, its next sequence number, the
//! window of its unresolved batches (at most the broker's 8), and the tag each batch carries
//! while it is in flight. The publisher's workers (`crate::publisher`) own the producers and
//! decide when a batch is sent again (docs/client.md, "Idempotent publishing and retries").

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use felix_proto::{ProducerId, ProducerTag};
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
    /// Batches sent and not yet acked or failed, parked ones included.
    pub(crate) unresolved: AtomicUsize,
    /// Signalled whenever `unresolved` drops.
    pub(crate) resolved: Notify,
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
}

/// A tagged batch's tag and its place in its producer's window: dropping it (the batch acked,
/// failed or dropped) frees the place.
pub(crate) struct TagHold {
    pub(crate) tag: ProducerTag,
    pub(crate) producer: Arc<ProducerShared>,
}

impl Drop for TagHold {
    fn drop(&mut self) {
        self.producer.unresolved.fetch_sub(1, Ordering::Relaxed);
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
/// (the broker stores it once either way).
pub(crate) fn outcome_unknown(e: &ClientError) -> bool {
    matches!(e, ClientError::ConnectionLost(_) | ClientError::Timeout { .. })
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
    fn a_tag_holds_its_place_in_the_window_until_dropped() {
        let p = Producer::new();
        p.shared.unresolved.fetch_add(1, Ordering::Relaxed);
        let hold =
            TagHold { tag: ProducerTag { producer: p.id, seq: 0 }, producer: p.shared.clone() };
        assert_eq!(p.shared.unresolved.load(Ordering::Relaxed), 1);
        mark_broken(Some(&hold));
        drop(hold);
        assert_eq!(p.shared.unresolved.load(Ordering::Relaxed), 0);
        assert!(p.shared.broken.load(Ordering::Relaxed));
    }
}
