//! The disk operations a replica asks for, and its bookkeeping of which of its in-memory log is
//! written and which is durable.
//!
//! Contract with the driver: operations are executed **in the order they were emitted**, and
//! the completion of operation `id` means every operation up to `id` completed. A `Sync`
//! covers every operation emitted before it (storage's flusher fdatasyncs after the earlier
//! writes completed). A `Truncate` may be logical (the shard index) but must be ordered: a
//! later `Sync` makes it durable too.

use std::collections::VecDeque;

use crate::types::{Batch, Offset};

/// Identifies one disk operation of one replica; ids increase by one per operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DiskOpId(pub u64);

/// A disk operation for the driver to execute in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskOp {
    /// Append these batches to the shard's log (they continue it).
    Write {
        /// Its id.
        id: DiskOpId,
        /// The batches, in offset order.
        batches: Vec<Batch>,
    },
    /// fdatasync everything emitted before.
    Sync {
        /// Its id.
        id: DiskOpId,
    },
    /// Drop every batch at or after `to` (a batch boundary).
    Truncate {
        /// Its id.
        id: DiskOpId,
        /// The new end of the shard's log.
        to: Offset,
    },
}

impl DiskOp {
    /// Its id.
    pub fn id(&self) -> DiskOpId {
        match self {
            DiskOp::Write { id, .. } | DiskOp::Sync { id } | DiskOp::Truncate { id, .. } => *id,
        }
    }
}

/// A pending operation, reduced to what its completion changes. Ends are clipped when the
/// in-memory log is truncated below them, so a completion never vouches for replaced bytes.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Write { end: Offset, bytes: u64 },
    Sync { covers: Offset },
    Truncate { to: Offset },
}

/// Tracks the in-memory log's written and durable prefixes through the pending operations.
#[derive(Debug)]
pub(crate) struct DiskTracker {
    next_id: u64,
    pending: VecDeque<(DiskOpId, Pending)>,
    written_end: Offset,
    durable_end: Offset,
    emitted_end: Offset,
    sync_in_flight: bool,
    unwritten_bytes: u64,
}

impl DiskTracker {
    /// A tracker for a log recovered from disk up to `end` (all of it durable).
    pub(crate) fn recovered(end: Offset) -> DiskTracker {
        DiskTracker {
            next_id: 0,
            pending: VecDeque::new(),
            written_end: end,
            durable_end: end,
            emitted_end: end,
            sync_in_flight: false,
            unwritten_bytes: 0,
        }
    }

    /// The in-memory log is written up to here.
    pub(crate) fn written_end(&self) -> Offset {
        self.written_end
    }

    /// The in-memory log is fdatasync'd up to here.
    pub(crate) fn durable_end(&self) -> Offset {
        self.durable_end
    }

    /// Every write emitted so far ends at or below this.
    pub(crate) fn emitted_end(&self) -> Offset {
        self.emitted_end
    }

    /// Panics (debug builds) if its ends are out of order or its pending operations do not
    /// account for its unwritten bytes.
    pub(crate) fn debug_assert_invariants(&self) {
        debug_assert!(self.durable_end <= self.written_end, "durable past written: {self:?}");
        debug_assert!(self.written_end <= self.emitted_end, "written past emitted: {self:?}");
        debug_assert!(
            self.pending.iter().all(|(id, _)| id.0 < self.next_id),
            "a pending operation's id was never handed out: {self:?}"
        );
        debug_assert!(
            self.pending.iter().filter(|(_, op)| matches!(op, Pending::Sync { .. })).count()
                == usize::from(self.sync_in_flight),
            "sync_in_flight disagrees with the pending syncs: {self:?}"
        );
        debug_assert!(
            self.unwritten_bytes
                == self
                    .pending
                    .iter()
                    .map(|(_, op)| match op {
                        Pending::Write { bytes, .. } => *bytes,
                        _ => 0,
                    })
                    .sum::<u64>(),
            "unwritten bytes disagree with the pending writes: {self:?}"
        );
    }

    /// Bytes emitted in writes that have not completed.
    pub(crate) fn unwritten_bytes(&self) -> u64 {
        self.unwritten_bytes
    }

    /// A write of `batches` (non-empty, continuing the log).
    pub(crate) fn write(&mut self, batches: Vec<Batch>) -> DiskOp {
        let end = batches.last().map_or(self.emitted_end, Batch::end);
        let bytes = batches.iter().map(Batch::size_bytes).sum();
        self.emitted_end = end;
        self.unwritten_bytes += bytes;
        let id = self.push(Pending::Write { end, bytes });
        DiskOp::Write { id, batches }
    }

    /// A truncation of the in-memory log to `to`: clips every pending operation's claim.
    pub(crate) fn truncate(&mut self, to: Offset) -> DiskOp {
        for (_, op) in &mut self.pending {
            match op {
                Pending::Write { end, .. } => *end = (*end).min(to),
                Pending::Sync { covers } => *covers = (*covers).min(to),
                Pending::Truncate { to: t } => *t = (*t).min(to),
            }
        }
        self.written_end = self.written_end.min(to);
        self.durable_end = self.durable_end.min(to);
        self.emitted_end = self.emitted_end.min(to);
        let id = self.push(Pending::Truncate { to });
        DiskOp::Truncate { id, to }
    }

    /// A sync, if something emitted is not yet covered and no sync is in flight.
    pub(crate) fn sync_if_needed(&mut self) -> Option<DiskOp> {
        if self.sync_in_flight || self.emitted_end <= self.durable_end {
            return None;
        }
        self.sync_in_flight = true;
        let id = self.push(Pending::Sync { covers: self.emitted_end });
        Some(DiskOp::Sync { id })
    }

    /// Operations up to `id` completed. Returns whether the durable end moved.
    pub(crate) fn complete(&mut self, id: DiskOpId) -> bool {
        let before = self.durable_end;
        while self.pending.front().is_some_and(|(op_id, _)| *op_id <= id) {
            let (_, op) = self.pending.pop_front().expect("checked non-empty");
            match op {
                Pending::Write { end, bytes } => {
                    self.written_end = self.written_end.max(end);
                    self.unwritten_bytes -= bytes;
                }
                Pending::Sync { covers } => {
                    self.durable_end = self.durable_end.max(covers.min(self.written_end));
                    self.sync_in_flight = false;
                }
                Pending::Truncate { to } => {
                    self.written_end = self.written_end.min(to);
                    self.durable_end = self.durable_end.min(to);
                }
            }
        }
        self.durable_end != before
    }

    fn push(&mut self, op: Pending) -> DiskOpId {
        let id = DiskOpId(self.next_id);
        self.next_id += 1;
        self.pending.push_back((id, op));
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Epoch;
    use bytes::Bytes;

    fn batch(base: u64) -> Batch {
        Batch {
            epoch: Epoch(1),
            base: Offset(base),
            records: 1,
            producer: None,
            time_ms: 0,
            payload: Bytes::new(),
        }
    }

    #[test]
    fn a_sync_before_a_truncation_never_vouches_for_the_new_bytes() {
        let mut disk = DiskTracker::recovered(Offset(0));
        disk.write(vec![batch(0), batch(1)]);
        let sync = disk.sync_if_needed().unwrap();
        disk.truncate(Offset(1));
        let rewrite = disk.write(vec![batch(1)]);
        disk.complete(sync.id());
        assert_eq!(disk.durable_end(), Offset(1), "the old byte at 1 was synced, not the new");
        disk.complete(rewrite.id());
        assert_eq!(disk.written_end(), Offset(2));
        assert!(disk.sync_if_needed().is_some());
    }
}
