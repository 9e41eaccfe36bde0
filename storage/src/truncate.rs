//! Logical truncation of one shard's suffix in a log that holds several shards
//! ([`StreamLog::truncate_shard`]): replication makes a follower drop the records the new
//! leader does not have before it accepts new data (docs/replication.md).
//!
//! The physical log keeps the old bytes. A durable **truncation marker** (shard, offset T,
//! log position P) in the stream directory's `truncations` file says: the records of that
//! shard at offsets >= T in batches that start before log position P are gone. Every batch
//! of the shard written after the truncation starts at or after P, so recovery applies the
//! markers by position while it walks the log (`recovery`), and reads below the dense index
//! (which scan the log) apply them to each batch they see (`limit_at`).
//!
//! The marker file is a sequence of 4096-byte blocks, one marker per block, each written
//! once (O_DIRECT) and fdatasync'd before the truncation is acknowledged: a torn write can
//! only damage the block being written, which recovery drops (the truncation was not
//! acknowledged). Byte layout, recovery rule and crash analysis: docs/storage-format.md
//! ("Truncation marker file", step 7 of section 3, section 4).
//!
//! Pure part: [`Marker`] encoding and the position rules of [`Truncations`]. I/O goes through
//! `io` only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use felix_proto::{Offset, ShardId};

use crate::error::{Result, StorageError};
use crate::format::FORMAT_ALIGN_BYTES;
use crate::io::{self, LogFile};
use crate::log::StreamLog;

/// Name of the marker file in a stream log's directory.
pub const TRUNCATIONS_FILE: &str = "truncations";
/// Bytes of one marker block.
pub const MARKER_BLOCK_BYTES: u64 = FORMAT_ALIGN_BYTES;
/// Markers one log's file may hold (4 MiB of blocks). Recovery rewrites the file without the
/// markers that no longer matter (those before the oldest segment), so the limit counts the
/// truncations whose old bytes are still retained.
pub const TRUNCATION_MARKERS_MAX: usize = 1024;
/// Magic of a marker block: "FXT1".
pub const MARKER_MAGIC: u32 = u32::from_le_bytes(*b"FXT1");
/// The only marker version written and read.
const MARKER_VERSION: u8 = 1;
/// Bytes of a marker block that carry fields; the rest is zero.
const MARKER_FIELDS_BYTES: usize = 40;
/// Name of the temporary file a marker file is rewritten through.
const TRUNCATIONS_TMP_FILE: &str = "truncations.tmp";

const _: () = assert!(MARKER_BLOCK_BYTES.is_multiple_of(FORMAT_ALIGN_BYTES));
const _: () = assert!(MARKER_FIELDS_BYTES <= MARKER_BLOCK_BYTES as usize);

/// One durable truncation: records of `shard` at offsets >= `offset` in batches that start
/// before log position `position` are gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    /// The truncated shard.
    pub shard: ShardId,
    /// The shard's next offset after the truncation.
    pub offset: u64,
    /// Log position: every batch of the shard written after the truncation starts here or
    /// later, every batch it removed starts before.
    pub position: u64,
}

impl Marker {
    /// Encode into one zeroed block of `MARKER_BLOCK_BYTES`.
    pub fn encode(&self, block: &mut [u8]) {
        debug_assert_eq!(block.len() as u64, MARKER_BLOCK_BYTES);
        block.fill(0);
        block[0..4].copy_from_slice(&MARKER_MAGIC.to_le_bytes());
        block[4] = MARKER_VERSION;
        block[16..20].copy_from_slice(&self.shard.0.to_le_bytes());
        block[24..32].copy_from_slice(&self.offset.to_le_bytes());
        block[32..40].copy_from_slice(&self.position.to_le_bytes());
        let crc = block_crc(block);
        block[8..12].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decode and verify one block.
    pub fn decode(block: &[u8]) -> std::result::Result<Marker, &'static str> {
        if block.len() as u64 != MARKER_BLOCK_BYTES {
            return Err("short marker block");
        }
        if block[0..4] != MARKER_MAGIC.to_le_bytes() {
            return Err("bad marker magic");
        }
        if block[4] != MARKER_VERSION {
            return Err("unknown marker version");
        }
        let stored = u32::from_le_bytes(block[8..12].try_into().expect("4 bytes"));
        if stored != block_crc(block) {
            return Err("marker crc32c mismatch");
        }
        if block[5..8].iter().chain(&block[12..16]).chain(&block[20..24]).any(|b| *b != 0) {
            return Err("marker reserved bytes are not zero");
        }
        Ok(Marker {
            shard: ShardId(u32::from_le_bytes(block[16..20].try_into().expect("4 bytes"))),
            offset: u64::from_le_bytes(block[24..32].try_into().expect("8 bytes")),
            position: u64::from_le_bytes(block[32..40].try_into().expect("8 bytes")),
        })
    }
}

/// CRC32C of a marker block: bytes 0..8 followed by bytes 12..end.
fn block_crc(block: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&block[0..8]), &block[12..])
}

/// The markers of one log, oldest first (positions never decrease), and their file.
#[derive(Default)]
pub(crate) struct Truncations {
    markers: Vec<Marker>,
    file: Option<Rc<LogFile>>,
    /// Blocks in the file.
    blocks: u64,
    /// A truncation is under way: others wait (one marker at a time), and the writer starts
    /// no segment roll, so a segment header never holds a shard's next offset from before a
    /// marker whose position lies before the segment (recovery checks headers against the
    /// indexes with the markers applied; retention takes start offsets from headers).
    pub(crate) busy: bool,
}

impl Truncations {
    /// Markers in position order.
    pub(crate) fn markers(&self) -> &[Marker] {
        &self.markers
    }

    /// The markers of `shard` as (position, offset), for a scan of the log.
    pub(crate) fn of_shard(&self, shard: ShardId) -> Vec<(u64, u64)> {
        self.markers.iter().filter(|m| m.shard == shard).map(|m| (m.position, m.offset)).collect()
    }

    /// The first shard offset that retention may leave readable once every log position
    /// below `position` is deleted, given `header_start` from the next segment's header:
    /// a truncation at or after `position` may have moved the shard's end below it, and the
    /// records written since then start at its offset.
    pub(crate) fn start_after_drop(&self, shard: ShardId, position: u64, header_start: u64) -> u64 {
        self.markers
            .iter()
            .filter(|m| m.shard == shard && m.position >= position)
            .map(|m| m.offset)
            .fold(header_start, u64::min)
    }
}

/// The first offset of a batch of a shard that starts at log position `position` that is
/// gone, if any: the smallest offset of the shard's markers after `position` (`markers` as
/// from [`Truncations::of_shard`]).
pub(crate) fn limit_at(markers: &[(u64, u64)], position: u64) -> Option<u64> {
    markers.iter().filter(|(p, _)| *p > position).map(|(_, o)| *o).min()
}

/// Load the marker file of the log in `dir`. A torn last block (a crash while a truncation
/// wrote it, before it was acknowledged) is cut off; any other invalid block refuses the
/// log (`Corrupt`). Markers before `first_position` (the oldest segment's base) no longer
/// matter: if there are any, the file is rewritten without them.
pub(crate) async fn load(dir: &Path, first_position: u64) -> Result<Truncations> {
    let path = dir.join(TRUNCATIONS_FILE);
    let tmp = dir.join(TRUNCATIONS_TMP_FILE);
    if tmp.exists() {
        // A rewrite that did not reach its rename: the old file is still complete.
        let f = LogFile::open(&tmp).await?;
        f.remove().await?;
        io::sync_dir(dir).await?;
    }
    if !path.exists() {
        return Ok(Truncations::default());
    }
    let file = LogFile::open(&path).await?;
    let size = file.size().await?;
    let full = size / MARKER_BLOCK_BYTES;
    let mut markers = Vec::new();
    let mut torn_at = (size % MARKER_BLOCK_BYTES != 0).then_some(full);
    for i in 0..full {
        let block = file.read_at(i * MARKER_BLOCK_BYTES, MARKER_BLOCK_BYTES as usize).await?;
        let marker = match Marker::decode(&block) {
            Ok(m) => m,
            Err(_) if i + 1 == full => {
                torn_at = Some(i);
                break;
            }
            Err(why) => return Err(corrupt(&path, i * MARKER_BLOCK_BYTES, why.to_owned())),
        };
        if markers.last().is_some_and(|m: &Marker| m.position > marker.position) {
            return Err(corrupt(&path, i * MARKER_BLOCK_BYTES, "marker positions go back".into()));
        }
        markers.push(marker);
    }
    if let Some(block) = torn_at {
        tracing::warn!(path = %path.display(), block, "dropping torn truncation marker");
        file.truncate(block * MARKER_BLOCK_BYTES).await?;
        file.fdatasync().await?;
    }
    let kept: Vec<Marker> =
        markers.iter().copied().filter(|m| m.position >= first_position).collect();
    if kept.is_empty() {
        // Nothing to keep: remove the file; the next truncation creates it again.
        file.remove().await?;
        io::sync_dir(dir).await?;
        return Ok(Truncations::default());
    }
    if kept.len() < markers.len() {
        return rewrite(dir, kept).await;
    }
    let blocks = markers.len() as u64;
    Ok(Truncations { markers, file: Some(Rc::new(file)), blocks, busy: false })
}

/// After a repair cut the log at `end`: move the markers past it to `end` and rewrite the
/// file. Still sound: the records they removed lie before `end` or were cut, and every
/// later write starts at or after `end`.
pub(crate) async fn clamp(dir: &Path, truncations: Truncations, end: u64) -> Result<Truncations> {
    let markers = truncations
        .markers
        .iter()
        .map(|m| Marker { position: m.position.min(end), ..*m })
        .collect();
    drop(truncations);
    rewrite(dir, markers).await
}

/// Replace the marker file by one holding `markers`: write a temporary file, fdatasync it,
/// rename it over the old one, fsync the directory.
async fn rewrite(dir: &Path, markers: Vec<Marker>) -> Result<Truncations> {
    let path = dir.join(TRUNCATIONS_FILE);
    let tmp = dir.join(TRUNCATIONS_TMP_FILE);
    let mut bytes = vec![0u8; markers.len() * MARKER_BLOCK_BYTES as usize];
    for (m, block) in markers.iter().zip(bytes.chunks_mut(MARKER_BLOCK_BYTES as usize)) {
        m.encode(block);
    }
    let file = LogFile::create(&tmp, bytes).await?;
    io::rename(&tmp, &path)?;
    io::sync_dir(dir).await?;
    let blocks = markers.len() as u64;
    Ok(Truncations { markers, file: Some(Rc::new(file)), blocks, busy: false })
}

/// Write `marker` as the next block of the file (creating it if needed) and make it durable.
async fn write_marker(dir: &Path, files: FileSlot, marker: Marker) -> Result<Rc<LogFile>> {
    let path = dir.join(TRUNCATIONS_FILE);
    match files {
        FileSlot::None => {
            let mut block = vec![0u8; MARKER_BLOCK_BYTES as usize];
            marker.encode(&mut block);
            let file = LogFile::create(&path, block).await?;
            io::sync_dir(dir).await?;
            Ok(Rc::new(file))
        }
        FileSlot::At(file, blocks) => {
            let mut buf = file.alloc(MARKER_BLOCK_BYTES as usize);
            marker.encode(buf.as_mut());
            file.write_at(buf, blocks * MARKER_BLOCK_BYTES).await?;
            file.fdatasync().await?;
            Ok(file)
        }
    }
}

/// The marker file as a truncation finds it.
enum FileSlot {
    None,
    At(Rc<LogFile>, u64),
}

impl StreamLog {
    /// Truncate `shard` at `from`: afterwards its records end at `from`, the next append of
    /// the shard gets `from`, and the other shards are untouched. Durable when it returns:
    /// after a close, a crash or a power loss, recovery rebuilds exactly this (the removed
    /// records never come back; records appended later at the same offsets are the ones
    /// read). The physical log keeps the old bytes (logical truncation).
    ///
    /// The caller must have no appends of `shard` in flight (replication truncates a
    /// follower's shard before it accepts data): if any are queued or being written, this
    /// returns `ShardBusy`, and appends of `shard` offered while the truncation runs get
    /// `ShardBusy` too. Appends and reads of other shards go on meanwhile. `from` must lie in
    /// `start_offset..=next_offset` (`TruncateOutOfRange`); `from == next_offset` does
    /// nothing. Truncations of one log run one at a time; a second call waits for the first.
    /// A read that raced the truncation may have returned the old records; tail waiters keep
    /// waiting for their offset (it is written again by later appends).
    ///
    /// Steps: flush the log (so that the marker's position is durable data), write and
    /// fdatasync the marker, then cut the shard's index. Meanwhile the writer holds back
    /// segment rolls (other shards' writes into the active segment go on). An I/O error while writing the
    /// marker poisons the log (the marker may or may not be on disk; reopening decides).
    pub async fn truncate_shard(&self, shard: ShardId, from: Offset) -> Result<()> {
        loop {
            {
                let mut st = self.inner.state.borrow_mut();
                let st = &mut *st;
                if !st.truncations.busy {
                    if let Some(reason) = &st.poisoned {
                        return Err(StorageError::Poisoned { reason: reason.clone() });
                    }
                    let s = match st.shards.get_mut(&shard) {
                        Some(s) if s.owned => s,
                        _ => {
                            return Err(StorageError::UnknownShard {
                                stream: self.inner.name.clone(),
                                shard,
                            })
                        }
                    };
                    if s.next_offset != s.index.next_offset() {
                        return Err(StorageError::ShardBusy {
                            shard,
                            reason: "appends of the shard are in flight",
                        });
                    }
                    let (start, next) = (s.index.start_offset(), s.index.next_offset());
                    if from.0 < start || from.0 > next {
                        return Err(StorageError::TruncateOutOfRange {
                            shard,
                            requested: from,
                            start: Offset(start),
                            next: Offset(next),
                        });
                    }
                    if from.0 == next {
                        return Ok(());
                    }
                    if st.truncations.blocks as usize >= TRUNCATION_MARKERS_MAX {
                        return Err(StorageError::TooManyTruncations {
                            limit: TRUNCATION_MARKERS_MAX,
                        });
                    }
                    s.truncating = true;
                    st.truncations.busy = true;
                    break;
                }
            }
            io::sleep(std::time::Duration::from_millis(1)).await;
        }
        let result = self.truncate_durably(shard, from.0).await;
        {
            let mut st = self.inner.state.borrow_mut();
            st.truncations.busy = false;
            if let Some(s) = st.shards.get_mut(&shard) {
                s.truncating = false;
            }
        }
        // The writer holds back segment rolls while a marker is written.
        self.inner.writer.notify();
        result
    }

    async fn truncate_durably(&self, shard: ShardId, offset: u64) -> Result<()> {
        // Every batch of the shard is published (none in flight, new ones refused): after
        // this flush they all end at or before `durable_pos`, which is durable, and every
        // later write starts at or after it (published data is never taken back).
        self.flush().await?;
        let (marker, slot) = {
            let st = self.inner.state.borrow();
            if let Some(reason) = &st.poisoned {
                return Err(StorageError::Poisoned { reason: reason.clone() });
            }
            let marker = Marker { shard, offset, position: st.durable_pos };
            let t = &st.truncations;
            let slot = match &t.file {
                Some(f) => FileSlot::At(f.clone(), t.blocks),
                None => FileSlot::None,
            };
            (marker, slot)
        };
        let file = match write_marker(&self.inner.dir, slot, marker).await {
            Ok(f) => f,
            Err(e) => {
                crate::commit::poison(&self.inner, "writing a truncation marker", &e);
                return Err(e);
            }
        };
        let mut st = self.inner.state.borrow_mut();
        let st = &mut *st;
        st.truncations.file = Some(file);
        st.truncations.blocks += 1;
        st.truncations.markers.push(marker);
        let s = st.shards.get_mut(&shard).expect("a truncated shard stays in the log");
        s.index.truncate(offset);
        s.next_offset = offset;
        // The batches the cut removed, wholly or in part, are no longer stored: a retry of
        // one is not a duplicate (docs/storage-format.md, "Producer table"), and the epoch
        // changes at or after the cut are gone ("Epoch index").
        s.producers.forget_after(offset);
        s.epochs.truncate(offset);
        st.debug_assert_invariants();
        tracing::info!(stream = %self.inner.name, %shard, offset, position = marker.position, "truncated shard");
        Ok(())
    }
}

fn corrupt(path: &Path, position: u64, reason: String) -> StorageError {
    StorageError::Corrupt { path: PathBuf::from(path), position, reason }
}

/// Recovery's view of the markers: applied to the shard indexes in position order.
pub(crate) struct MarkerWalk<'a> {
    markers: &'a [Marker],
    applied: usize,
    /// Per shard, its markers as (position, the smallest offset of this marker and of every
    /// later one of the shard), in position order: [`MarkerWalk::cut_after`].
    later_cuts: BTreeMap<ShardId, Vec<(u64, u64)>>,
}

impl<'a> MarkerWalk<'a> {
    pub(crate) fn new(markers: &'a [Marker]) -> Self {
        let mut later_cuts: BTreeMap<ShardId, Vec<(u64, u64)>> = BTreeMap::new();
        for m in markers {
            later_cuts.entry(m.shard).or_default().push((m.position, m.offset));
        }
        for cuts in later_cuts.values_mut() {
            let mut min = u64::MAX;
            for (_, offset) in cuts.iter_mut().rev() {
                min = min.min(*offset);
                *offset = min;
            }
        }
        Self { markers, applied: 0, later_cuts }
    }

    /// The first offset of `shard` that some marker after log position `position` cuts, if
    /// any: the records of a batch at `position` from there on are gone once the walk ends
    /// ([`limit_at`], in O(log n)).
    pub(crate) fn cut_after(&self, shard: ShardId, position: u64) -> Option<u64> {
        let cuts = self.later_cuts.get(&shard)?;
        let i = cuts.partition_point(|(p, _)| *p <= position);
        cuts.get(i).map(|(_, offset)| *offset)
    }

    /// Skip the markers before `position` (they concern deleted segments only).
    pub(crate) fn skip_before(&mut self, position: u64) {
        while self.markers.get(self.applied).is_some_and(|m| m.position < position) {
            self.applied += 1;
        }
    }

    /// The next marker not yet applied, if it is at or before `position` (`inclusive`) or
    /// before it; marks it applied.
    pub(crate) fn next_through(&mut self, position: u64, inclusive: bool) -> Option<Marker> {
        let m = *self.markers.get(self.applied)?;
        if m.position < position || (inclusive && m.position == position) {
            self.applied += 1;
            Some(m)
        } else {
            None
        }
    }

    /// The unapplied markers exactly at `position`.
    pub(crate) fn at(&self, position: u64) -> impl Iterator<Item = &Marker> {
        self.markers[self.applied..].iter().take_while(move |m| m.position == position)
    }

    /// The markers not applied yet.
    pub(crate) fn rest(&mut self) -> &'a [Marker] {
        let rest = &self.markers[self.applied..];
        self.applied = self.markers.len();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trips_and_rejects_damage() {
        let m = Marker { shard: ShardId(7), offset: 42, position: 8192 };
        let mut block = vec![0u8; MARKER_BLOCK_BYTES as usize];
        m.encode(&mut block);
        assert_eq!(&block[0..4], b"FXT1");
        assert_eq!(Marker::decode(&block), Ok(m));
        for at in [0usize, 4, 9, 17, 30, 39, 100, 4095] {
            let mut bad = block.clone();
            bad[at] ^= 0x40;
            assert!(Marker::decode(&bad).is_err(), "flipped byte {at} accepted");
        }
        assert!(Marker::decode(&block[..100]).is_err());
        assert!(Marker::decode(&vec![0u8; MARKER_BLOCK_BYTES as usize]).is_err());
    }

    #[test]
    fn limit_is_the_smallest_offset_of_later_markers() {
        let ms = [(100u64, 50u64), (200, 80), (300, 60)];
        assert_eq!(limit_at(&ms, 0), Some(50));
        assert_eq!(limit_at(&ms, 99), Some(50));
        assert_eq!(limit_at(&ms, 100), Some(60));
        assert_eq!(limit_at(&ms, 250), Some(60));
        assert_eq!(limit_at(&ms, 300), None);
    }

    #[test]
    fn cut_after_is_limit_at_per_shard() {
        let markers = [
            Marker { shard: ShardId(1), offset: 50, position: 100 },
            Marker { shard: ShardId(2), offset: 7, position: 150 },
            Marker { shard: ShardId(1), offset: 80, position: 200 },
            Marker { shard: ShardId(1), offset: 60, position: 300 },
        ];
        let walk = MarkerWalk::new(&markers);
        let of_1: Vec<(u64, u64)> = markers
            .iter()
            .filter(|m| m.shard == ShardId(1))
            .map(|m| (m.position, m.offset))
            .collect();
        for position in [0u64, 99, 100, 150, 199, 200, 250, 300, 301] {
            assert_eq!(
                walk.cut_after(ShardId(1), position),
                limit_at(&of_1, position),
                "{position}"
            );
        }
        assert_eq!(walk.cut_after(ShardId(2), 149), Some(7));
        assert_eq!(walk.cut_after(ShardId(2), 150), None);
        assert_eq!(walk.cut_after(ShardId(3), 0), None);
    }

    #[test]
    fn retention_start_takes_later_truncations_into_account() {
        let t = Truncations {
            markers: vec![
                Marker { shard: ShardId(1), offset: 30, position: 4096 },
                Marker { shard: ShardId(1), offset: 50, position: 8192 },
                Marker { shard: ShardId(2), offset: 5, position: 8192 },
            ],
            ..Default::default()
        };
        assert_eq!(t.start_after_drop(ShardId(1), 8192, 100), 50);
        assert_eq!(t.start_after_drop(ShardId(1), 8193, 100), 100);
        assert_eq!(t.start_after_drop(ShardId(1), 0, 100), 30);
        assert_eq!(t.start_after_drop(ShardId(3), 0, 100), 100);
    }
}
