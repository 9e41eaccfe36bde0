//! Reading a shard: [`StreamLog::read`] (owned batches) and [`StreamLog::read_with`], which
//! shows each batch to a visitor as a [`BatchView`] borrowed from the buffer the kernel read it
//! into, so a reader that turns batches into something else (the broker's EventBatch frames)
//! copies each payload byte once, not twice.
//!
//! Batches come from the dense part of the shard index (one I/O per run of nearby batches) or,
//! below it, from a scan of the segments, which steps over the other shards' batches by their
//! headers. Every batch shown is verified (CRC and structure) first; a bad one is
//! `StorageError::Corrupt` naming file and position.

use std::ops::ControlFlow;
use std::path::Path;
use std::rc::Rc;

use bytes::Bytes;
use felix_proto::{Offset, ProducerTag, ShardId};

use crate::cache::{self, Written, READ_CACHE_BATCH_BYTES_MAX};
use crate::error::{Result, StorageError};
use crate::format::{
    decode_records, verify_batch, BatchHeader, FormatError, RECORD_FLAG_KEY, RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
};
use crate::index::{IndexEntry, Lookup};
use crate::io::LogFile;
use crate::log::{owned_shard, StoredBatch, StreamLog, READ_GAP_BYTES_MAX};
use crate::scan::{scan_segment_for, ScanEnd};

/// One verified batch as read, borrowed from the read buffer.
pub struct BatchView<'a> {
    header: &'a BatchHeader,
    bytes: &'a [u8],
    /// Records visible to readers (a truncation may have cut the batch).
    records: u32,
    path: &'a Path,
    /// The batch's position in its file (for errors).
    position: u64,
}

impl<'a> BatchView<'a> {
    /// The shard.
    pub fn shard(&self) -> ShardId {
        self.header.shard
    }

    /// Offset of the first record.
    pub fn base_offset(&self) -> Offset {
        self.header.base_offset
    }

    /// Records in the batch that readers see.
    pub fn record_count(&self) -> u32 {
        self.records
    }

    /// The offset after the last visible record.
    pub fn end(&self) -> u64 {
        self.header.base_offset.0 + u64::from(self.records)
    }

    /// Timestamp of the first record (ms since the Unix epoch).
    pub fn first_timestamp_ms(&self) -> u64 {
        self.header.first_timestamp_ms
    }

    /// The producer tag of an idempotent batch.
    pub fn producer(&self) -> Option<ProducerTag> {
        self.header.producer
    }

    /// The leader epoch the batch was stamped with.
    pub fn epoch(&self) -> Option<u64> {
        self.header.epoch
    }

    /// The visible records in order: `(key, value)`, both slices of the read buffer.
    pub fn records(&self) -> RecordSlices<'a> {
        RecordSlices {
            rest: self.bytes.get(self.header.records_start()..).unwrap_or(&[]),
            left: self.records,
        }
    }

    /// The batch as an owned [`StoredBatch`] (one copy of its bytes).
    pub fn to_stored(&self) -> Result<StoredBatch> {
        let bytes = Bytes::copy_from_slice(self.bytes);
        let mut batch = stored(&bytes, self.header).map_err(|e| self.corrupt(e.to_string()))?;
        batch.records.truncate(self.records as usize);
        Ok(batch)
    }

    fn corrupt(&self, reason: String) -> StorageError {
        StorageError::Corrupt { path: self.path.to_owned(), position: self.position, reason }
    }
}

/// The records of a [`BatchView`]; see [`BatchView::records`].
#[derive(Clone)]
pub struct RecordSlices<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Iterator for RecordSlices<'a> {
    type Item = (Option<&'a [u8]>, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 || self.rest.len() < RECORD_HEADER_BYTES {
            return None;
        }
        let flags = self.rest[0];
        let key_len = u32_le(&self.rest[1..5]) as usize;
        let value_len = u32_le(&self.rest[5..9]) as usize;
        let body = &self.rest[RECORD_HEADER_BYTES..];
        // The batch was verified, so the lengths fit; a short one ends the iteration.
        if body.len() < key_len || body.len() - key_len < value_len {
            self.left = 0;
            return None;
        }
        let (key, body) = body.split_at(key_len);
        let (value, rest) = body.split_at(value_len);
        self.rest = rest;
        self.left -= 1;
        Some((if flags & RECORD_FLAG_KEY != 0 { Some(key) } else { None }, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left as usize))
    }
}

fn u32_le(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_le_bytes(a)
}

impl StreamLog {
    /// Read batches of `shard` starting with the one that holds `from`, up to about
    /// `max_bytes` of encoded batches (always at least one batch if any exists). Returns an
    /// empty vector if nothing at or after `from` is written yet. Only written batches are
    /// visible (acked `Written` or better, possibly not yet durable).
    pub async fn read(
        &self,
        shard: ShardId,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Vec<StoredBatch>> {
        let mut out = Vec::new();
        let mut failed = None;
        self.read_with(shard, from, max_bytes, |view| match view.to_stored() {
            Ok(b) => out.push(b),
            Err(e) => failed = failed.take().or(Some(e)),
        })
        .await?;
        failed.map_or(Ok(out), Err)
    }

    /// [`StreamLog::read`] without making the batches owned: `visit` sees each batch, in
    /// offset order, borrowed from the read buffer, and keeps what it needs.
    pub async fn read_with(
        &self,
        shard: ShardId,
        from: Offset,
        max_bytes: usize,
        mut visit: impl FnMut(BatchView<'_>),
    ) -> Result<()> {
        let lookup = {
            let mut st = self.inner.state.borrow_mut();
            let s = owned_shard(&self.inner.name, &mut st.shards, shard)?;
            s.index.lookup(from.0, max_bytes)
        };
        match lookup {
            Lookup::BeforeStart(start) => Err(StorageError::OffsetBeforeStart {
                shard,
                requested: from,
                start: Offset(start),
            }),
            Lookup::AtEnd => Ok(()),
            Lookup::Recent(entries) => self.read_entries(shard, from, &entries, &mut visit).await,
            Lookup::Scan { from_position, until } => {
                self.read_scan(shard, from, max_bytes, from_position, until, &mut visit).await
            }
        }
    }

    async fn read_entries(
        &self,
        shard: ShardId,
        from: Offset,
        entries: &[IndexEntry],
        visit: &mut impl FnMut(BatchView<'_>),
    ) -> Result<()> {
        let mut i = 0;
        while i < entries.len() {
            let (seg_base, seg_end, file, sealed) =
                self.segment_at(shard, from, entries[i].position)?;
            // A run of nearby batches: one read would cover it, the other shards' batches
            // between them included.
            let mut j = i + 1;
            while j < entries.len()
                && entries[j].position < seg_end
                && entries[j].position - (entries[j - 1].position + u64::from(entries[j - 1].len))
                    <= READ_GAP_BYTES_MAX
            {
                j += 1;
            }
            // A run goes through the core's read cache as far as the cache may keep the
            // segment: its blocks hold the other shards' batches between ours, which their
            // readers want too. A batch on its own, and the rest of the run (in the last,
            // partial block of the segment being written), take one read.
            let written = Written { end: seg_end - seg_base, sealed };
            let mut k = i;
            if j - i > 1 && self.inner.cache.borrow().enabled() {
                let cacheable_end = seg_base + written.cacheable_end();
                while k < j && entries[k].position + u64::from(entries[k].len) <= cacheable_end {
                    let e = &entries[k];
                    let rel = e.position - seg_base;
                    let cached = if e.len < READ_CACHE_BATCH_BYTES_MAX {
                        cache::block(&self.inner.cache, &file, rel, e.len as usize, written).await?
                    } else {
                        None
                    };
                    match cached {
                        Some((buf, block_start)) => {
                            let at = (rel - block_start) as usize;
                            let bytes = &buf[at..at + e.len as usize];
                            show_entry(shard, e, bytes, &file, seg_base, visit)?;
                        }
                        None => {
                            let buf = file.read_buf(rel, e.len as usize).await?;
                            show_entry(shard, e, &buf, &file, seg_base, visit)?;
                        }
                    }
                    k += 1;
                }
            }
            if k < j {
                let start = entries[k].position;
                let end = entries[j - 1].position + u64::from(entries[j - 1].len);
                let buf = file.read_buf(start - seg_base, (end - start) as usize).await?;
                for e in &entries[k..j] {
                    let at = (e.position - start) as usize;
                    let bytes = buf.get(at..(at + e.len as usize).min(buf.len())).unwrap_or(&[]);
                    show_entry(shard, e, bytes, &file, seg_base, visit)?;
                }
            }
            i = j;
        }
        Ok(())
    }

    async fn read_scan(
        &self,
        shard: ShardId,
        from: Offset,
        max_bytes: usize,
        from_position: Option<u64>,
        until: Option<u64>,
        visit: &mut impl FnMut(BatchView<'_>),
    ) -> Result<()> {
        let (segments, truncations): (Vec<(u64, u64, Rc<LogFile>)>, _) = {
            let st = self.inner.state.borrow();
            let segments =
                st.segments.iter().map(|s| (s.base_position, s.end, s.file.clone())).collect();
            (segments, st.truncations.of_shard(shard))
        };
        let last = segments.len().saturating_sub(1);
        let cache_on = self.inner.cache.borrow().enabled();
        let start = from_position.unwrap_or(segments.first().map_or(0, |s| s.0));
        let until = until.unwrap_or(u64::MAX);
        let limit = crate::config::BATCH_BYTES_LIMIT;
        let mut shown = 0usize;
        let mut bytes_out = 0usize;
        // The batches shown must be consecutive, the first holding `from`: a gap means a
        // damaged header made the scan step over one of ours (position, what was found).
        let mut last_end: Option<u64> = None;
        let mut gap: Option<(u64, String)> = None;
        // Set when the byte budget stopped the scan inside a segment: the batches after
        // that point (in this segment and the next ones) are for the next read, so the scan
        // must not go on in a later segment, or it would skip them.
        let mut full = false;
        for (n, (base, end, file)) in segments.iter().enumerate() {
            if base + end <= start || *base >= until {
                continue;
            }
            let from_rel = start.saturating_sub(*base).max(SEGMENT_HEADER_BYTES);
            let to_rel = (*end).min(until.saturating_sub(*base));
            // Other shards' batches, and ours that end before `from`, are stepped over unread
            // (an end that overflows is wanted, so verification reports it).
            let wanted = |h: &BatchHeader| {
                h.shard == shard
                    && h.base_offset
                        .0
                        .checked_add(u64::from(h.record_count))
                        .is_none_or(|e| e > from.0)
            };
            let written = Written { end: *end, sealed: n < last };
            let cache = cache_on.then_some((&self.inner.cache, file, written));
            let done =
                scan_segment_for(file, from_rel, to_rel, limit, cache, wanted, |pos, h, bytes| {
                    if h.shard != shard {
                        return ControlFlow::Continue(());
                    }
                    // Records a later truncation removed are skipped (`truncate::limit_at`).
                    let cut = crate::truncate::limit_at(&truncations, base + pos);
                    let visible_end = cut.map_or(h.next_offset(), |c| c.min(h.next_offset()));
                    if visible_end <= from.0 || visible_end <= h.base_offset.0 {
                        return ControlFlow::Continue(());
                    }
                    if shown > 0 && bytes_out + bytes.len() > max_bytes {
                        full = true;
                        return ControlFlow::Break(());
                    }
                    let in_order = match last_end {
                        None => h.base_offset.0 <= from.0,
                        Some(e) => h.base_offset.0 == e,
                    };
                    if !in_order {
                        let expected = last_end.unwrap_or(from.0);
                        let reason = format!(
                            "shard {shard}: batch at offset {} where offset {expected} was due",
                            h.base_offset
                        );
                        gap = Some((pos, reason));
                        return ControlFlow::Break(());
                    }
                    last_end = Some(visible_end);
                    shown += 1;
                    bytes_out += bytes.len();
                    visit(BatchView {
                        header: h,
                        bytes,
                        records: (visible_end - h.base_offset.0) as u32,
                        path: file.path(),
                        position: pos,
                    });
                    ControlFlow::Continue(())
                })
                .await?;
            if let Some((position, reason)) = gap {
                return Err(StorageError::Corrupt {
                    path: file.path().to_owned(),
                    position,
                    reason,
                });
            }
            if let ScanEnd::Invalid(pos, e) = done {
                return Err(StorageError::Corrupt {
                    path: file.path().to_owned(),
                    position: pos,
                    reason: e.to_string(),
                });
            }
            if full || bytes_out >= max_bytes {
                break;
            }
        }
        Ok(())
    }

    /// The segment holding `position`: its base position, end (log positions), file, and
    /// whether it is sealed (not the one being written).
    fn segment_at(
        &self,
        shard: ShardId,
        from: Offset,
        position: u64,
    ) -> Result<(u64, u64, Rc<LogFile>, bool)> {
        let st = self.inner.state.borrow();
        let i = st.segments.partition_point(|s| s.base_position <= position);
        let sealed = i < st.segments.len();
        match i.checked_sub(1).map(|i| &st.segments[i]) {
            Some(s) => Ok((s.base_position, s.base_position + s.end, s.file.clone(), sealed)),
            None => {
                let start = st.shards.get(&shard).map_or(0, |s| s.index.start_offset());
                Err(StorageError::OffsetBeforeStart {
                    shard,
                    requested: from,
                    start: Offset(start),
                })
            }
        }
    }
}

/// Verify the batch an index entry points at and show it to `visit`.
fn show_entry(
    shard: ShardId,
    e: &IndexEntry,
    bytes: &[u8],
    file: &LogFile,
    seg_base: u64,
    visit: &mut impl FnMut(BatchView<'_>),
) -> Result<()> {
    let corrupt = |reason: String| StorageError::Corrupt {
        path: file.path().to_owned(),
        position: e.position - seg_base,
        reason,
    };
    let header = verify_batch(bytes, crate::config::BATCH_BYTES_LIMIT)
        .map_err(|e| corrupt(e.to_string()))?;
    if header.shard != shard || header.base_offset.0 != e.base_offset {
        return Err(corrupt("batch does not match the index".into()));
    }
    // A truncation may have cut the batch (the index entry holds fewer records).
    let records = e.record_count.min(header.record_count);
    visit(BatchView {
        header: &header,
        bytes,
        records,
        path: file.path(),
        position: e.position - seg_base,
    });
    Ok(())
}

fn stored(bytes: &Bytes, h: &BatchHeader) -> std::result::Result<StoredBatch, FormatError> {
    Ok(StoredBatch {
        shard: h.shard,
        base_offset: h.base_offset,
        first_timestamp_ms: h.first_timestamp_ms,
        last_timestamp_ms: h.last_timestamp_ms,
        producer: h.producer,
        epoch: h.epoch,
        records: decode_records(bytes, h)?,
    })
}
