//! Sequential scanning of one segment file: batches are verified (CRC and structure) as
//! they are read. Used by recovery and by reads below the dense part of a shard index.

use std::ops::ControlFlow;
use std::rc::Rc;

use crate::cache::{SharedCache, Written};
use crate::config::WRITE_IN_FLIGHT_BYTES_MAX;
use crate::error::Result;
use crate::format::{
    align_up, batch_slot, probe, verify_batch, BatchHeader, FormatError, Probe, FORMAT_ALIGN_BYTES,
};
use crate::io::{LogFile, ReadBuf};

/// Bytes read per scan I/O (a whole batch is read at once if it is larger).
pub const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// How a scan ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ScanEnd {
    /// Reached `end` (or the visitor stopped) at this file position.
    Clean(u64),
    /// Invalid bytes at this file position.
    Invalid(u64, FormatError),
}

/// A read cache, the file (shared, for reads ahead) and how far its segment is written.
pub(crate) type CacheAt<'a> = Option<(&'a SharedCache, &'a Rc<LogFile>, Written)>;

/// Buffered sequential reader over `[start, end)` of one file.
struct Window<'a> {
    file: &'a LogFile,
    end: u64,
    buf: Option<ReadBuf>,
    buf_pos: u64,
    cache: CacheAt<'a>,
}

impl Window<'_> {
    /// The bytes at `[pos, pos + need)`, or fewer if the range ends first.
    async fn get(&mut self, pos: u64, need: usize) -> Result<&[u8]> {
        let need = (need as u64).min(self.end.saturating_sub(pos)) as usize;
        let have_end = self.buf_pos + self.buf.as_ref().map_or(0, |b| b.len()) as u64;
        if self.buf.is_none() || pos < self.buf_pos || pos + need as u64 > have_end {
            self.buf = None;
            let cached = match self.cache {
                Some((cache, file, written)) => {
                    crate::cache::block(cache, file, pos, need, written).await?
                }
                None => None,
            };
            if let Some((buf, start)) = cached {
                self.buf = Some(buf);
                self.buf_pos = start;
            } else {
                // A batch across two cached blocks: just it (the scan goes back to the blocks
                // after it). Otherwise a chunk, for the batches after it too.
                let block = crate::cache::READ_CACHE_BLOCK_BYTES;
                let across = self.cache.is_some()
                    && need > 0
                    && pos / block != (pos + need as u64 - 1) / block;
                let chunk = if across { need } else { need.max(SCAN_CHUNK_BYTES) };
                let len = (chunk as u64).min(self.end.saturating_sub(pos));
                self.buf = Some(self.file.read_buf(pos, len as usize).await?);
                self.buf_pos = pos;
            }
        }
        let buf: &[u8] = self.buf.as_deref().unwrap_or(&[]);
        let from = ((pos - self.buf_pos) as usize).min(buf.len());
        let to = (from + need).min(buf.len());
        Ok(&buf[from..to])
    }
}

/// Visit every valid batch in `[start, end)` of `file` in order. `visit` gets the batch's
/// file position, header and bytes, and may stop the scan.
pub(crate) async fn scan_segment(
    file: &LogFile,
    start: u64,
    end: u64,
    batch_bytes_limit: usize,
    visit: impl FnMut(u64, &BatchHeader, &[u8]) -> ControlFlow<()>,
) -> Result<ScanEnd> {
    scan_segment_for(file, start, end, batch_bytes_limit, None, |_| true, visit).await
}

/// [`scan_segment`] for a reader that wants only some batches: a batch whose header `wanted`
/// refuses is stepped over once its header checks out (a reader of one shard of a log that
/// interleaves many neither reads the others' records twice nor computes their CRCs). Only
/// for written ranges: recovery, which must find torn and corrupt batches, scans them all.
/// With `cache`, the scan reads through the core's read cache (`crate::cache`).
pub(crate) async fn scan_segment_for(
    file: &LogFile,
    start: u64,
    end: u64,
    batch_bytes_limit: usize,
    cache: CacheAt<'_>,
    wanted: impl Fn(&BatchHeader) -> bool,
    mut visit: impl FnMut(u64, &BatchHeader, &[u8]) -> ControlFlow<()>,
) -> Result<ScanEnd> {
    let mut w = Window { file, end, buf: None, buf_pos: start, cache };
    let mut pos = start;
    while pos < end {
        // Enough for a header with every extension; a plain one needs only its first 48 bytes.
        let head = w.get(pos, crate::format::BATCH_HEADER_BYTES_MAX).await?;
        let header = match probe(head, batch_bytes_limit) {
            Probe::Padding => {
                pos = align_up(pos + 1).min(end);
                continue;
            }
            Probe::Short => return Ok(ScanEnd::Invalid(pos, FormatError::BadLength(0))),
            Probe::Invalid(e) => return Ok(ScanEnd::Invalid(pos, e)),
            Probe::Header(h) => h,
        };
        if !wanted(&header) {
            pos += batch_slot(u64::from(header.len));
            continue;
        }
        let bytes = w.get(pos, header.len as usize).await?;
        if bytes.len() < header.len as usize {
            return Ok(ScanEnd::Invalid(pos, FormatError::BadLength(header.len)));
        }
        if let Err(e) = verify_batch(bytes, batch_bytes_limit) {
            return Ok(ScanEnd::Invalid(pos, e));
        }
        if visit(pos, &header, bytes).is_break() {
            return Ok(ScanEnd::Clean(pos));
        }
        pos += batch_slot(u64::from(header.len));
    }
    Ok(ScanEnd::Clean(pos))
}

/// Is there a valid batch at an aligned position at or after
/// `damage + WRITE_IN_FLIGHT_BYTES_MAX`?
///
/// Every write starts aligned, so if any write landed beyond the ones that could have been
/// in flight at a crash, its first batch is found here. Returns that position.
pub(crate) async fn valid_batch_beyond_window(
    file: &LogFile,
    damage: u64,
    end: u64,
    batch_bytes_limit: usize,
) -> Result<Option<u64>> {
    let mut pos = align_up(damage + WRITE_IN_FLIGHT_BYTES_MAX as u64);
    while pos < end {
        let chunk_len = (SCAN_CHUNK_BYTES as u64).min(end - pos);
        // One read covers every batch that may start in this chunk (a batch is at most
        // `batch_bytes_limit`): a read per plausible header would read up to that limit for
        // each aligned block, thousands of times the file for crafted or random headers.
        let span = (chunk_len + batch_bytes_limit as u64).min(end - pos);
        let bytes = file.read_at(pos, span as usize).await?;
        let mut at = 0usize;
        while at < chunk_len as usize && at + crate::format::BATCH_HEADER_BYTES <= bytes.len() {
            if let Probe::Header(h) = probe(&bytes[at..], batch_bytes_limit) {
                let batch = bytes.get(at..at + h.len as usize);
                if batch.is_some_and(|b| verify_batch(b, batch_bytes_limit).is_ok()) {
                    return Ok(Some(pos + at as u64));
                }
            }
            at += FORMAT_ALIGN_BYTES as usize;
        }
        pos += chunk_len.max(1);
    }
    Ok(None)
}
