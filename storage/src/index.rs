//! The per-shard index: shard offset -> log position. Pure and in memory; rebuilt from the
//! log on recovery, never persisted and so never trusted from disk.
//!
//! The newest `INDEX_RECENT_MAX` batches of a shard are indexed densely. Older entries are
//! kept sparse (one in `INDEX_SPARSE_EVERY`); a read that lands there scans the log from the
//! nearest sparse entry, skipping the other shards' batches.

use std::collections::VecDeque;

/// Dense entries kept per shard.
pub const INDEX_RECENT_MAX: usize = 4096;
/// One older entry in this many is kept.
pub const INDEX_SPARSE_EVERY: u64 = 64;

/// Where one batch of a shard lies in the physical log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the batch's first record.
    pub base_offset: u64,
    /// Records in the batch.
    pub record_count: u32,
    /// Encoded length of the batch.
    pub len: u32,
    /// Log position of the batch header.
    pub position: u64,
}

impl IndexEntry {
    /// The offset after the batch.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
}

/// Answer of [`ShardIndex::lookup`].
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// `from` was deleted by retention; the shard starts at the given offset.
    BeforeStart(u64),
    /// Nothing at or after `from` is written yet.
    AtEnd,
    /// Dense entries: the batch holding `from` and the ones after it, within the byte budget
    /// (at least one entry).
    Recent(Vec<IndexEntry>),
    /// Scan the log from this position (`None`: from the first segment) up to `until`
    /// (the position of the first dense entry, or `None` for the end of the log).
    Scan {
        /// Where to start scanning.
        from_position: Option<u64>,
        /// Where the dense index takes over.
        until: Option<u64>,
    },
}

/// The index of one shard.
#[derive(Debug, Default)]
pub struct ShardIndex {
    start_offset: u64,
    next_offset: u64,
    recent: VecDeque<IndexEntry>,
    sparse: Vec<IndexEntry>,
    evicted: u64,
}

impl ShardIndex {
    /// An empty index of a shard whose first stored offset is `start_offset`.
    pub fn new(start_offset: u64) -> Self {
        Self { start_offset, next_offset: start_offset, ..Default::default() }
    }

    /// First offset still stored.
    pub fn start_offset(&self) -> u64 {
        self.start_offset
    }

    /// The offset after the last indexed batch.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Entries held (dense + sparse), for tests and stats.
    pub fn entries(&self) -> usize {
        self.recent.len() + self.sparse.len()
    }

    /// Index a newly written batch. Offsets are dense: `entry.base_offset` must be the
    /// current next offset (the caller guarantees it; recovery checks it on disk data).
    pub fn push(&mut self, entry: IndexEntry) {
        assert_eq!(entry.base_offset, self.next_offset, "shard offsets must be dense");
        self.next_offset = entry.next_offset();
        self.recent.push_back(entry);
        if self.recent.len() > INDEX_RECENT_MAX {
            let old = self.recent.pop_front().expect("recent is longer than its limit");
            if self.evicted.is_multiple_of(INDEX_SPARSE_EVERY) {
                self.sparse.push(old);
            }
            self.evicted += 1;
        }
    }

    /// Find what to read for offsets from `from`, about `max_bytes` worth.
    pub fn lookup(&self, from: u64, max_bytes: usize) -> Lookup {
        if from < self.start_offset {
            return Lookup::BeforeStart(self.start_offset);
        }
        if from >= self.next_offset {
            return Lookup::AtEnd;
        }
        match self.recent.front() {
            Some(first) if from >= first.base_offset => {
                let i = self.recent.partition_point(|e| e.next_offset() <= from);
                let mut out = Vec::new();
                let mut bytes = 0usize;
                for e in self.recent.iter().skip(i) {
                    if !out.is_empty() && bytes + e.len as usize > max_bytes {
                        break;
                    }
                    bytes += e.len as usize;
                    out.push(*e);
                }
                Lookup::Recent(out)
            }
            first => {
                let i = self.sparse.partition_point(|e| e.base_offset <= from);
                let from_position = i.checked_sub(1).map(|i| self.sparse[i].position);
                Lookup::Scan { from_position, until: first.map(|e| e.position) }
            }
        }
    }

    /// Logical truncation: forget every offset at or after `offset`. Entries that start
    /// there or later are dropped; an entry that holds `offset` keeps only the records
    /// before it (readers trim the batch to the entry's `record_count`). The shard's next
    /// offset becomes `offset`; its start moves down to `offset` if it was above (recovery
    /// meets this when retention deleted the segments before a truncation's position).
    /// Nothing happens if `offset` is at or past the next offset.
    pub fn truncate(&mut self, offset: u64) {
        if offset >= self.next_offset {
            return;
        }
        trim_entries(&mut self.recent, offset);
        let keep = self.sparse.partition_point(|e| e.base_offset < offset);
        self.sparse.truncate(keep);
        if let Some(last) = self.sparse.last_mut() {
            trim_entry(last, offset);
        }
        self.next_offset = offset;
        self.start_offset = self.start_offset.min(offset);
    }

    /// Retention deleted every log position below `position`; the shard now starts at
    /// `start_offset` (from the next segment's header).
    pub fn drop_before(&mut self, position: u64, start_offset: u64) {
        self.sparse.retain(|e| e.position >= position);
        while self.recent.front().is_some_and(|e| e.position < position) {
            self.recent.pop_front();
        }
        self.start_offset = start_offset.min(self.next_offset);
    }
}

/// Drop the entries of `entries` (in offset order) at or after `offset`; trim the one that
/// holds it.
fn trim_entries(entries: &mut VecDeque<IndexEntry>, offset: u64) {
    while entries.back().is_some_and(|e| e.base_offset >= offset) {
        entries.pop_back();
    }
    if let Some(last) = entries.back_mut() {
        trim_entry(last, offset);
    }
}

/// Keep only the records of `entry` before `offset`.
fn trim_entry(entry: &mut IndexEntry, offset: u64) {
    if entry.next_offset() > offset {
        debug_assert!(entry.base_offset < offset, "entries at or after offset were dropped");
        entry.record_count = (offset - entry.base_offset) as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(base: u64, position: u64) -> IndexEntry {
        IndexEntry { base_offset: base, record_count: 10, len: 100, position }
    }

    #[test]
    fn dense_lookup_finds_the_batch_holding_the_offset() {
        let mut ix = ShardIndex::new(0);
        for i in 0..5 {
            ix.push(entry(i * 10, i * 1000));
        }
        assert_eq!(ix.lookup(50, 1 << 20), Lookup::AtEnd);
        let Lookup::Recent(es) = ix.lookup(25, 250) else { panic!("expected dense entries") };
        assert_eq!(es.iter().map(|e| e.base_offset).collect::<Vec<_>>(), vec![20, 30]);
        // At least one entry even if it alone exceeds the budget.
        let Lookup::Recent(es) = ix.lookup(0, 1) else { panic!("expected dense entries") };
        assert_eq!(es.len(), 1);
    }

    #[test]
    #[should_panic(expected = "dense")]
    fn a_gap_is_refused() {
        let mut ix = ShardIndex::new(0);
        ix.push(entry(5, 0));
    }

    #[test]
    fn truncate_drops_the_suffix_and_trims_the_batch_holding_the_offset() {
        let mut ix = ShardIndex::new(0);
        for i in 0..5 {
            ix.push(entry(i * 10, i * 1000));
        }
        ix.truncate(25);
        assert_eq!(ix.next_offset(), 25);
        assert_eq!(ix.lookup(25, 1 << 20), Lookup::AtEnd);
        let Lookup::Recent(es) = ix.lookup(0, 1 << 20) else { panic!("expected dense entries") };
        assert_eq!(
            es.iter().map(|e| (e.base_offset, e.record_count)).collect::<Vec<_>>(),
            vec![(0, 10), (10, 10), (20, 5)]
        );
        // New batches continue at the truncation point; truncating past the end does nothing.
        ix.push(entry(25, 9000));
        ix.truncate(100);
        assert_eq!(ix.next_offset(), 35);
        ix.truncate(0);
        assert_eq!((ix.start_offset(), ix.next_offset(), ix.entries()), (0, 0, 0));
        assert_eq!(ix.lookup(0, 1), Lookup::AtEnd);
    }

    #[test]
    fn truncate_reaches_into_sparse_entries() {
        let mut ix = ShardIndex::new(0);
        let n = INDEX_RECENT_MAX as u64 + 200;
        for i in 0..n {
            ix.push(entry(i * 10, i * 1000));
        }
        ix.truncate(645);
        assert_eq!(ix.next_offset(), 645);
        assert_eq!(ix.entries(), 2, "sparse entries at 0 and 640 remain");
        assert_eq!(ix.lookup(641, 1), Lookup::Scan { from_position: Some(64_000), until: None });
        assert_eq!(ix.lookup(645, 1), Lookup::AtEnd);
    }

    #[test]
    fn old_entries_become_sparse() {
        let mut ix = ShardIndex::new(0);
        let n = INDEX_RECENT_MAX as u64 + 200;
        for i in 0..n {
            ix.push(entry(i * 10, i * 1000));
        }
        assert_eq!(ix.entries(), INDEX_RECENT_MAX + 200usize.div_ceil(64));
        assert_eq!(
            ix.lookup(655, 1),
            Lookup::Scan { from_position: Some(64_000), until: Some(200_000) }
        );
        ix.drop_before(100_000, 1000);
        assert_eq!(ix.lookup(5, 1), Lookup::BeforeStart(1000));
        assert_eq!(ix.lookup(1005, 1), Lookup::Scan { from_position: None, until: Some(200_000) });
        assert_eq!(
            ix.lookup(1925, 1),
            Lookup::Scan { from_position: Some(192_000), until: Some(200_000) }
        );
    }
}
