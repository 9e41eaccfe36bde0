//! The receive task's buffers: one slab per message of a `recvmmsg` batch, and the slabs
//! waiting to be written again.
//!
//! The kernel writes each datagram (or GRO run of datagrams) straight into a slab; what arrived
//! is cut off the slab's front and handed to quinn-proto as is, so a received byte is not
//! copied before decryption, and after it only into the storage write buffer (or a subscriber's
//! encoded frame). A slab with less than a GRO run free is retired behind the others and
//! written again once every datagram cut off it has been dropped: decrypted, read by the
//! application, stored and acked, and encoded or let go by the tail (which keeps records as
//! received for `app::tail::TAIL_RAW_AGE_MS` at most, for this reason). Memory is bounded:
//! `BATCH_SIZE` slabs in use and at most [`RETIRED_MAX`] retired (past that the oldest is let
//! go and freed when its last datagram is); an idle socket trims the retired ones nothing holds
//! to [`IDLE_KEEP`].

use std::collections::VecDeque;
use std::io::IoSliceMut;

use bytes::BytesMut;

use crate::sys::slab::RecvSlab;

/// Largest GRO run: the kernel coalesces at most 64 KiB into one receive.
pub(crate) const MAX_GRO_BYTES: usize = 64 * 1024;
/// One slab: two full GRO runs, or about a hundred single datagrams.
pub(crate) const SLAB_BYTES: usize = 2 * MAX_GRO_BYTES;
/// Retired slabs kept for reuse (128 MiB of slabs at most, nearly all of it held by others:
/// a core's records in flight, up to `--inflight-bytes-per-core` (64 MiB by default), quinn's
/// receive windows and the tail's unread records). Measured at saturation (one connection,
/// 4 KiB records): a pool of ~450 slabs, reused in steady state; with 256 the pool ran dry
/// and new slabs were zeroed (6-9 % of the core).
pub(crate) const RETIRED_MAX: usize = 1024;
/// Free retired slabs an idle socket keeps.
pub(crate) const IDLE_KEEP: usize = 8;
/// How many of the newest, then of the oldest, retired slabs are tried before a new one is
/// allocated.
const NEWEST_TRIES: usize = 2;
const OLDEST_TRIES: usize = 4;

/// The slabs of one receive task (see the module docs).
pub(crate) struct RecvSlabs {
    slots: Vec<RecvSlab>,
    retired: VecDeque<RecvSlab>,
    /// Slabs allocated since the start (not reused ones).
    allocated: u64,
}

impl RecvSlabs {
    /// `slots` slabs, one per message a `recvmmsg` may return.
    pub(crate) fn new(slots: usize) -> RecvSlabs {
        RecvSlabs {
            slots: (0..slots).map(|_| RecvSlab::new(SLAB_BYTES)).collect(),
            retired: VecDeque::with_capacity(RETIRED_MAX),
            allocated: slots as u64,
        }
    }

    /// One buffer of `MAX_GRO_BYTES` per slot, to receive into.
    pub(crate) fn iovs<const N: usize>(&mut self) -> [IoSliceMut<'_>; N] {
        let mut slots = self.slots.iter_mut();
        std::array::from_fn(|_| match slots.next() {
            Some(s) => IoSliceMut::new(&mut s.free_mut()[..MAX_GRO_BYTES]),
            None => IoSliceMut::new(&mut []),
        })
    }

    /// The `len` bytes just received into slot `slot`, cut off its slab.
    pub(crate) fn take(&mut self, slot: usize, len: usize) -> BytesMut {
        let Some(s) = self.slots.get_mut(slot) else { return BytesMut::new() };
        let data = s.split_to(len.min(MAX_GRO_BYTES));
        if s.free_len() < MAX_GRO_BYTES {
            let next = self.next_slab();
            let old = std::mem::replace(&mut self.slots[slot], next);
            if self.retired.len() == RETIRED_MAX {
                self.retired.pop_front();
            }
            self.retired.push_back(old);
        }
        data
    }

    /// Slabs allocated so far (reused ones not counted).
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Frees the retired slabs nothing holds, past the first [`IDLE_KEEP`] of them.
    pub(crate) fn trim(&mut self) {
        let mut free = 0;
        self.retired.retain_mut(|s| {
            if !s.try_reuse() {
                return true;
            }
            free += 1;
            free <= IDLE_KEEP
        });
    }

    /// A slab to receive into: a retired one nothing holds any more, else a new one. The newest
    /// retired slabs are tried first (freed at once when their datagrams were consumed in the
    /// same round, they are still in cache), then the oldest (freed in arrival order when
    /// records are held until stored and acked).
    fn next_slab(&mut self) -> RecvSlab {
        let n = self.retired.len();
        let newest = (n.saturating_sub(NEWEST_TRIES)..n).rev();
        let oldest = 0..n.min(OLDEST_TRIES).min(n.saturating_sub(NEWEST_TRIES));
        for i in newest.chain(oldest) {
            if self.retired[i].try_reuse() {
                if let Some(s) = self.retired.remove(i) {
                    return s;
                }
            }
        }
        self.allocated += 1;
        RecvSlab::new(SLAB_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Receives `len` bytes of `fill` into slot 0 as the kernel would, and takes them.
    fn receive(slabs: &mut RecvSlabs, len: usize, fill: u8) -> BytesMut {
        let mut iovs: [IoSliceMut<'_>; 2] = slabs.iovs();
        iovs[0][..len].fill(fill);
        slabs.take(0, len)
    }

    #[test]
    fn dropped_datagrams_let_slabs_be_reused() {
        let mut slabs = RecvSlabs::new(2);
        for i in 0..10_000u32 {
            let d = receive(&mut slabs, 1200 + (i as usize % 3) * 20_000, i as u8);
            assert!(d.iter().all(|&b| b == i as u8));
        }
        // 10,000 receives of up to 41 KB each: a few slabs, all the rest reused.
        assert!(slabs.allocated() <= 2 + 2, "allocated {}", slabs.allocated());
    }

    #[test]
    fn a_held_datagram_is_never_written_again() {
        let mut slabs = RecvSlabs::new(2);
        let held = receive(&mut slabs, 1200, 0xAB);
        let mut more = Vec::new();
        for i in 0..5_000u32 {
            let d = receive(&mut slabs, 9000, i as u8);
            if i % 1000 == 0 {
                more.push(d);
            }
        }
        assert!(held.iter().all(|&b| b == 0xAB), "a live datagram's bytes were overwritten");
        for (k, d) in more.iter().enumerate() {
            assert!(d.iter().all(|&b| b == (k * 1000) as u8));
        }
        // Slabs pinned by live datagrams are let go, not kept: the retired queue stays bounded.
        assert!(slabs.retired.len() <= RETIRED_MAX);
        drop(held);
    }

    #[test]
    fn trimming_frees_what_nothing_holds_and_keeps_the_rest() {
        let mut slabs = RecvSlabs::new(1);
        let mut held = Vec::new();
        for i in 0..40 {
            let d = receive(&mut slabs, MAX_GRO_BYTES, i as u8);
            if i % 2 == 0 {
                held.push(d);
            }
        }
        // 40 full GRO runs: 20 slabs retired, every one holding a live datagram.
        assert_eq!(slabs.retired.len(), 20);
        slabs.trim();
        assert_eq!(slabs.retired.len(), 20, "held slabs stay");
        held.clear();
        slabs.trim();
        assert_eq!(slabs.retired.len(), IDLE_KEEP);
        assert!(slabs.retired.iter().all(|s| s.free_len() == SLAB_BYTES));
    }

    #[test]
    fn every_slot_offers_a_whole_gro_run() {
        let mut slabs = RecvSlabs::new(3);
        for round in 0..50 {
            let iovs: [IoSliceMut<'_>; 4] = slabs.iovs();
            assert!(iovs[..3].iter().all(|v| v.len() == MAX_GRO_BYTES));
            assert_eq!(iovs[3].len(), 0);
            for slot in 0..3 {
                let d = slabs.take(slot, MAX_GRO_BYTES - round);
                assert_eq!(d.len(), MAX_GRO_BYTES - round);
            }
        }
    }
}
