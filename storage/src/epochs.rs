//! The epoch index of one shard: where the leader epoch of its batches changes, so that
//! replication's truncation handshake (docs/replication.md, `felix_replication::ReplicaLog`)
//! can ask a stored shard the same questions it asks its in-memory model: the last epoch,
//! the largest epoch at most some epoch, and where an epoch ends.
//!
//! Pure and in memory, like the producer table: extended at enqueue time, rebuilt by recovery
//! from the epochs in the log, cut by truncations and failed writes, never persisted on its
//! own. Rules, bound and crash behaviour: docs/storage-format.md, "Epoch index".
//!
//! A batch's epoch for these queries is the leader epoch it was stamped with, or 0 for a batch
//! without one (epoch 0 is `Epoch::NONE` in replication: before the first election).
//!
//! Call order per append: [`EpochIndex::epoch_max`] (the regression check, in `log`), then
//! [`EpochIndex::push`] once the batch has its offsets. [`EpochIndex::truncate`] drops what a
//! failed write or a truncation took back; [`EpochIndex::drop_before`] what retention deleted.

use std::collections::VecDeque;

/// Epoch changes remembered per shard (16 bytes each). Recording one more drops the oldest;
/// queries that would need it then answer conservatively (docs/storage-format.md, "Epoch
/// index").
pub const EPOCH_CHANGES_PER_SHARD_MAX: usize = 4096;

const _: () = assert!(EPOCH_CHANGES_PER_SHARD_MAX >= 2);

/// The shard's batches from `offset` on have epoch `epoch` (until the next change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EpochChange {
    pub(crate) epoch: u64,
    pub(crate) offset: u64,
}

/// The epoch index of one shard.
///
/// Two kinds of offsets are answered conservatively, so that the truncation handshake never
/// takes more of a log for a common prefix than really is one (it keeps
/// `min(leader's end_of_epoch(a), follower's end_of_epoch(a))`, so an `end_of_epoch` that is
/// too small and a `largest_epoch_at_most` that is too small but present are safe; too large
/// ones are not):
///
/// * **Unknown**: offsets below the oldest kept change once changes were dropped for the bound
///   (their epochs are at most `dropped_max`, the largest dropped one).
///   `largest_epoch_at_most(e)` is `None` when no kept change has an epoch `<= e` (the answer
///   may be among the dropped ones), and `end_of_epoch(e)` is the shard's start offset when
///   `dropped_max > e` (a later epoch may start anywhere below the oldest kept change).
/// * **Broken**: from the first batch whose epoch is lower than the one before it (an
///   epoch-less batch after stamped ones, or a decrease read from disk). Such a log no longer
///   follows log matching (a batch of epoch `e` there need not be the epoch-`e` leader's), so
///   the queries vouch for nothing at or after that offset: `largest_epoch_at_most` looks only
///   at the changes before it and `end_of_epoch` never answers past it.
pub(crate) struct EpochIndex {
    /// Oldest first; offsets increase, consecutive epochs differ.
    changes: VecDeque<EpochChange>,
    /// The largest epoch of the changes dropped for the bound; `None` if none was dropped (or
    /// retention deleted every offset they covered).
    dropped_max: Option<u64>,
    /// The offset of the first batch that lowered the epoch, if any.
    broken_at: Option<u64>,
    /// The largest epoch of the shard's batches (0 if none is stamped): appends stamped with a
    /// lower one are refused.
    epoch_max: u64,
    /// Most changes kept ([`EPOCH_CHANGES_PER_SHARD_MAX`] outside unit tests).
    changes_max: usize,
}

impl EpochIndex {
    /// An empty index keeping at most `changes_max` (>= 2) changes.
    pub(crate) fn new(changes_max: usize) -> Self {
        Self {
            changes: VecDeque::new(),
            dropped_max: None,
            broken_at: None,
            epoch_max: 0,
            changes_max: changes_max.max(2),
        }
    }

    /// The largest epoch of the shard's batches (0 if none is stamped). Stamped epochs never
    /// decrease, so it is also the last stamped one.
    pub(crate) fn epoch_max(&self) -> u64 {
        self.epoch_max
    }

    /// Record a batch stamped `epoch` (or not) whose first offset is `offset` (the shard's next
    /// offset). Returns whether the oldest change was dropped to make room.
    pub(crate) fn push(&mut self, epoch: Option<u64>, offset: u64) -> bool {
        let epoch = epoch.unwrap_or(0);
        debug_assert!(self.changes.back().is_none_or(|c| c.offset <= offset));
        let prev = self.changes.back().map(|c| c.epoch).or(self.dropped_max);
        if prev.is_some_and(|p| epoch < p) && self.broken_at.is_none() {
            self.broken_at = Some(offset);
        }
        self.epoch_max = self.epoch_max.max(epoch);
        if self.changes.back().is_some_and(|c| c.epoch == epoch) {
            return false;
        }
        let mut dropped = false;
        if self.changes.len() >= self.changes_max {
            if let Some(old) = self.changes.pop_front() {
                self.dropped_max = Some(self.dropped_max.map_or(old.epoch, |m| m.max(old.epoch)));
                dropped = true;
            }
        }
        self.changes.push_back(EpochChange { epoch, offset });
        dropped
    }

    /// The shard ends at `offset` now (a truncation, or a failed write handed the offsets
    /// from there out again): forget the changes at or after it.
    pub(crate) fn truncate(&mut self, offset: u64) {
        while self.changes.back().is_some_and(|c| c.offset >= offset) {
            self.changes.pop_back();
        }
        // The first decrease is cut with everything after it; before it the epochs increase.
        if self.broken_at.is_some_and(|b| b >= offset) {
            self.broken_at = None;
        }
        self.epoch_max = self.recompute_max();
    }

    /// Retention deleted the shard's offsets below `start`; `next` is its next offset. Keeps
    /// what a recovery of the retained batches would build: the changes that cover retained
    /// offsets, the oldest of them starting at `start`.
    pub(crate) fn drop_before(&mut self, start: u64, next: u64) {
        if start >= next {
            self.changes.clear();
        }
        while self.changes.get(1).is_some_and(|c| c.offset <= start) {
            self.changes.pop_front();
        }
        match self.changes.front_mut() {
            Some(first) if first.offset <= start => {
                first.offset = start;
                self.dropped_max = None;
            }
            Some(_) => {}
            None => self.dropped_max = None,
        }
        if self.dropped_max.is_none() {
            // Every retained offset is covered by a kept change: find the first decrease again.
            self.broken_at = self
                .changes
                .iter()
                .zip(self.changes.iter().skip(1))
                .find(|(a, b)| b.epoch < a.epoch)
                .map(|(_, b)| b.offset);
        }
        self.epoch_max = self.recompute_max();
    }

    /// The epoch of the shard's last batch (0 if it is not stamped), `None` if the shard
    /// holds no batch. When the changes covering it were dropped (only after a truncation below every
    /// kept change), an upper bound.
    pub(crate) fn last_epoch(&self) -> Option<u64> {
        self.changes.back().map(|c| c.epoch).or(self.dropped_max)
    }

    /// The largest epoch `<= epoch` of the shard's batches below the first decrease (the
    /// vouched part), if the index knows one; `next` is the shard's next offset.
    pub(crate) fn largest_epoch_at_most(&self, epoch: u64, next: u64) -> Option<u64> {
        let i = self.first_vouched_after(epoch, self.vouched_end(next));
        i.checked_sub(1).map(|i| self.changes[i].epoch)
    }

    /// Where `epoch` ends in the shard: the first offset of the first later epoch, else `next`
    /// (the shard's next offset); never past the first decrease, and `start` (the shard's
    /// first offset) when the answer lies among dropped changes. Always in `start..=next`.
    pub(crate) fn end_of_epoch(&self, epoch: u64, start: u64, next: u64) -> u64 {
        // A later epoch may start anywhere among the dropped changes.
        let end = if self.dropped_max.is_some_and(|m| m > epoch) {
            start
        } else {
            let vouched_end = self.vouched_end(next);
            let i = self.first_vouched_after(epoch, vouched_end);
            self.changes.get(i).filter(|c| c.offset < vouched_end).map_or(vouched_end, |c| c.offset)
        };
        end.clamp(start, next.max(start))
    }

    /// Changes remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.changes.len()
    }

    /// Where the vouched part of the shard ends: the first decrease, or `next`.
    fn vouched_end(&self, next: u64) -> u64 {
        self.broken_at.map_or(next, |b| b.min(next))
    }

    /// The index of the first change that is not a vouched one (offset below `vouched_end`)
    /// of an epoch `<= epoch`. The vouched changes come first and their epochs increase (the
    /// first decrease ends them), so the predicate holds for a prefix: a binary search.
    fn first_vouched_after(&self, epoch: u64, vouched_end: u64) -> usize {
        self.changes.partition_point(|c| c.offset < vouched_end && c.epoch <= epoch)
    }

    fn recompute_max(&self) -> u64 {
        self.changes.iter().map(|c| c.epoch).chain(self.dropped_max).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index fed `(epoch, records)` batches from offset 0; returns it and the next offset.
    fn fed(max: usize, batches: &[(Option<u64>, u64)]) -> (EpochIndex, u64) {
        let mut ix = EpochIndex::new(max);
        let mut next = 0;
        for (epoch, records) in batches {
            ix.push(*epoch, next);
            next += records;
        }
        (ix, next)
    }

    #[test]
    fn queries_follow_the_changes() {
        let (ix, next) = fed(16, &[(Some(1), 2), (Some(1), 3), (Some(3), 1), (Some(7), 4)]);
        assert_eq!(ix.len(), 3);
        assert_eq!(ix.last_epoch(), Some(7));
        assert_eq!(ix.largest_epoch_at_most(0, next), None);
        assert_eq!(ix.largest_epoch_at_most(2, next), Some(1));
        assert_eq!(ix.largest_epoch_at_most(3, next), Some(3));
        assert_eq!(ix.largest_epoch_at_most(100, next), Some(7));
        assert_eq!(ix.end_of_epoch(0, 0, next), 0);
        assert_eq!(ix.end_of_epoch(1, 0, next), 5);
        assert_eq!(ix.end_of_epoch(2, 0, next), 5);
        assert_eq!(ix.end_of_epoch(3, 0, next), 6);
        assert_eq!(ix.end_of_epoch(7, 0, next), 10);
        assert_eq!(ix.epoch_max(), 7);
        let empty = EpochIndex::new(16);
        assert_eq!(empty.last_epoch(), None);
        assert_eq!(empty.largest_epoch_at_most(5, 0), None);
        assert_eq!(empty.end_of_epoch(5, 0, 0), 0);
    }

    #[test]
    fn epochless_batches_are_epoch_0_and_one_after_stamped_ones_breaks_the_index() {
        let (ix, next) = fed(16, &[(None, 2), (Some(0), 1), (Some(4), 2)]);
        assert_eq!(ix.len(), 2, "an epoch-less batch and epoch 0 are the same epoch");
        assert_eq!(ix.largest_epoch_at_most(3, next), Some(0));
        assert_eq!(ix.end_of_epoch(0, 0, next), 3);
        // An epoch-less batch at 5 after epoch 4, then epoch 4 and 6 again.
        let (mut ix, next) =
            fed(16, &[(Some(2), 2), (Some(4), 3), (None, 1), (Some(4), 1), (Some(6), 1)]);
        assert_eq!(ix.last_epoch(), Some(6));
        assert_eq!(ix.epoch_max(), 6);
        // Nothing at or after offset 5 is vouched for.
        assert_eq!(ix.largest_epoch_at_most(6, next), Some(4));
        assert_eq!(ix.end_of_epoch(4, 0, next), 5);
        assert_eq!(ix.end_of_epoch(6, 0, next), 5);
        assert_eq!(ix.end_of_epoch(2, 0, next), 2);
        // Cutting the decrease away makes the rest whole again.
        ix.truncate(5);
        assert_eq!(ix.end_of_epoch(4, 0, 5), 5);
        assert_eq!(ix.last_epoch(), Some(4));
        assert_eq!(ix.epoch_max(), 4);
    }

    #[test]
    fn truncation_cuts_inside_an_epoch_or_at_its_start() {
        let (mut ix, _) = fed(16, &[(Some(1), 5), (Some(2), 5), (Some(3), 5)]);
        ix.truncate(12);
        assert_eq!(ix.last_epoch(), Some(3), "epoch 3 keeps offsets 10 and 11");
        assert_eq!(ix.end_of_epoch(3, 0, 12), 12);
        assert_eq!(ix.end_of_epoch(2, 0, 12), 10);
        ix.truncate(10);
        assert_eq!(ix.last_epoch(), Some(2));
        assert_eq!(ix.end_of_epoch(2, 0, 10), 10);
        assert_eq!(ix.largest_epoch_at_most(3, 10), Some(2));
        assert_eq!(ix.epoch_max(), 2);
        ix.truncate(5);
        assert_eq!(ix.last_epoch(), Some(1));
        assert_eq!(ix.largest_epoch_at_most(9, 5), Some(1));
        ix.truncate(0);
        assert_eq!(ix.last_epoch(), None);
        assert_eq!(ix.epoch_max(), 0);
    }

    #[test]
    fn dropped_changes_make_older_questions_conservative() {
        // Epochs 1..=6, one batch of 10 records each; 4 changes kept: 3, 4, 5, 6 (from 20).
        let batches: Vec<_> = (1..=6).map(|e| (Some(e), 10)).collect();
        let (mut ix, next) = fed(4, &batches);
        assert_eq!(ix.len(), 4);
        assert_eq!(ix.dropped_max, Some(2));
        // Above the oldest kept change: exact.
        assert_eq!(ix.largest_epoch_at_most(3, next), Some(3));
        assert_eq!(ix.end_of_epoch(3, 0, next), 30);
        assert_eq!(ix.end_of_epoch(9, 0, next), 60);
        // Below it: unknown. No epoch is claimed, and epoch 1 "ends" at the shard's start.
        assert_eq!(ix.largest_epoch_at_most(2, next), None);
        assert_eq!(ix.end_of_epoch(1, 0, next), 0);
        assert_eq!(ix.end_of_epoch(1, 7, next), 7);
        // Every dropped epoch is <= 2: epoch 2 ends where the oldest kept change starts.
        assert_eq!(ix.end_of_epoch(2, 0, next), 20);
        // A truncation below every kept change: the last epoch is an upper bound, and the
        // regression check keeps the dropped epochs' maximum.
        ix.truncate(15);
        assert_eq!(ix.len(), 0);
        assert_eq!(ix.last_epoch(), Some(2));
        assert_eq!(ix.epoch_max(), 2);
        assert_eq!(ix.end_of_epoch(2, 0, 15), 15);
        assert_eq!(ix.end_of_epoch(1, 0, 15), 0);
        assert_eq!(ix.largest_epoch_at_most(2, 15), None);
        // An epoch-less batch after that may lower the epoch: the index is broken there.
        ix.push(None, 15);
        assert_eq!(ix.broken_at, Some(15));
        assert_eq!(ix.largest_epoch_at_most(9, 16), None);
        assert_eq!(ix.end_of_epoch(9, 0, 16), 15);
        assert_eq!(ix.end_of_epoch(1, 0, 16), 0);
    }

    #[test]
    fn retention_keeps_what_recovery_of_the_retained_batches_builds() {
        let batches = [(Some(1), 10), (Some(2), 10), (None, 10), (Some(3), 10)];
        let (mut ix, next) = fed(16, &batches);
        assert_eq!(ix.broken_at, Some(20));
        ix.drop_before(15, next);
        assert_eq!(
            ix.changes,
            [
                EpochChange { epoch: 2, offset: 15 },
                EpochChange { epoch: 0, offset: 20 },
                EpochChange { epoch: 3, offset: 30 }
            ]
        );
        assert_eq!(ix.broken_at, Some(20));
        ix.drop_before(25, next);
        assert_eq!(ix.broken_at, None, "the decrease was deleted");
        assert_eq!(ix.end_of_epoch(3, 25, next), next);
        assert_eq!(ix.end_of_epoch(0, 25, next), 30);
        ix.drop_before(next, next);
        assert_eq!(ix.last_epoch(), None);
        // Retention past the unknown part of a bounded index makes it exact again.
        let batches: Vec<_> = (1..=6).map(|e| (Some(e), 10)).collect();
        let (mut ix, next) = fed(4, &batches);
        ix.drop_before(20, next);
        assert_eq!(ix.dropped_max, None);
        assert_eq!(ix.end_of_epoch(1, 20, next), 20);
        assert_eq!(ix.largest_epoch_at_most(2, next), None);
        assert_eq!(ix.epoch_max(), 6);
    }
}
