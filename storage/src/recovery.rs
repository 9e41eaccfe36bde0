//! Opening a stream log: list segments, verify every batch, truncate a torn tail, refuse
//! (or repair) corruption before the tail, rebuild the per-shard indexes, producer tables
//! and epoch indexes. Also segment creation and rolling, which recovery must be able to
//! undo.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use felix_proto::{Offset, ShardId};

use crate::config::{StorageConfig, WriteSync};
use crate::epochs::{EpochIndex, EPOCH_CHANGES_PER_SHARD_MAX};
use crate::error::{Result, StorageError};
use crate::format::{
    align_up, SegmentHeader, OFFSET_MAX, POSITION_MAX, SEGMENT_HEADER_BYTES, SHARDS_PER_LOG_MAX,
};
use crate::index::{IndexEntry, ShardIndex};
use crate::io::{self, LogFile};
use crate::producers::ProducerTable;
use crate::scan::{scan_segment, valid_batch_beyond_window, ScanEnd};
use crate::state::{Inner, Segment, ShardState};
use crate::truncate::{Marker, MarkerWalk, Truncations};

/// Suffix of segment files; the stem is the segment's base log position, 20 digits.
pub const SEGMENT_SUFFIX: &str = ".log";

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files opened.
    pub segments: usize,
    /// Valid batches found.
    pub batches: u64,
    /// Bytes cut from a torn tail (the last write in flight at a crash).
    pub torn_bytes_dropped: u64,
    /// The file and position of a torn tail, if one was cut.
    pub torn_at: Option<(PathBuf, u64)>,
    /// A repair the operator asked for, if one was needed.
    pub repaired: Option<RepairReport>,
}

/// A corruption before the tail that `StorageConfig::repair` cut off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairReport {
    /// The damaged file.
    pub path: PathBuf,
    /// File position of the first invalid byte range; the file was truncated here.
    pub position: u64,
    /// Bytes dropped (rest of that file plus every later segment).
    pub bytes_dropped: u64,
    /// What was invalid.
    pub reason: String,
}

pub(crate) struct Recovered {
    pub(crate) segments: Vec<Segment>,
    pub(crate) shards: BTreeMap<ShardId, ShardState>,
    pub(crate) report: RecoveryReport,
    pub(crate) flushes: u64,
    pub(crate) segments_created: u64,
    pub(crate) truncations: Truncations,
    /// A repair cut the log below some markers' positions: move them to this end.
    clamp_markers_to: Option<u64>,
}

pub(crate) fn segment_path(dir: &Path, base_position: u64) -> PathBuf {
    dir.join(format!("{base_position:020}{SEGMENT_SUFFIX}"))
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Create a segment file: write and fdatasync its header block, then fsync the directory.
/// A crash in between leaves a file of at most one block that recovery deletes. Nothing is
/// reserved beyond the header block: the writer reserves blocks in `SEGMENT_GROW_BYTES`
/// steps as writes arrive (see `commit::grow`), so an idle log holds one block.
pub(crate) async fn create_segment(
    dir: &Path,
    header: &SegmentHeader,
    write_sync: WriteSync,
) -> Result<Segment> {
    let path = segment_path(dir, header.base_position);
    let mut block = vec![0u8; SEGMENT_HEADER_BYTES as usize];
    header.encode(&mut block);
    let file = LogFile::create_with(&path, block, write_sync == WriteSync::Dsync).await?;
    io::sync_dir(dir).await?;
    Ok(Segment {
        base_position: header.base_position,
        file: Rc::new(file),
        end: SEGMENT_HEADER_BYTES,
        last_timestamp_ms: header.created_ms,
        start_offsets: header.next_offsets.clone(),
    })
}

/// Why a roll failed.
pub(crate) enum RollError {
    /// The active segment's fdatasync: what it holds may not be durable, and a later
    /// fdatasync of the file may not report the error again (the log must be poisoned).
    Sync(StorageError),
    /// Creating the next segment: nothing changed (the queue fails, the log goes on).
    Create(StorageError),
}

/// Close the active segment (fdatasync it) and start the next one.
pub(crate) async fn roll(inner: &Rc<Inner>) -> std::result::Result<(), RollError> {
    let (old, header) = {
        let st = inner.state.borrow();
        let active = st.segments.last().expect("a log always has an active segment");
        let header = SegmentHeader {
            base_position: active.base_position + active.end,
            created_ms: active.last_timestamp_ms,
            next_offsets: st
                .shards
                .iter()
                .map(|(id, s)| (*id, Offset(s.index.next_offset())))
                .collect(),
        };
        (active.file.clone(), header)
    };
    old.fdatasync().await.map_err(RollError::Sync)?;
    {
        // No write is in flight at a roll: everything published is in the old segment, now
        // synced.
        let mut st = inner.state.borrow_mut();
        st.durable_pos = st.durable_pos.max(st.written_pos);
    }
    let seg = create_segment(&inner.dir, &header, inner.config.write_sync)
        .await
        .map_err(RollError::Create)?;
    let mut st = inner.state.borrow_mut();
    st.issued_end = SEGMENT_HEADER_BYTES;
    st.reserved_end = SEGMENT_HEADER_BYTES;
    // A zero fill still running is the old segment's.
    st.fill_gen += 1;
    st.stats.flushes += 3;
    st.stats.segments_created += 1;
    st.stats.bytes_written += SEGMENT_HEADER_BYTES;
    st.segments.push(seg);
    Ok(())
}

/// Recover the log in `dir` (creating it if needed) for a core owning `owned`.
///
/// Segments are opened oldest first ([`Recovery::open_segment`]); the first damage ends the
/// walk (a torn tail is cut, a repair drops everything after it, anything else is an error);
/// then [`Recovery::finish`] makes sure an active segment exists and is durable.
pub(crate) async fn recover(
    dir: &Path,
    config: &StorageConfig,
    owned: &[ShardId],
) -> Result<Recovered> {
    io::create_dir_all(dir).await?;
    let mut bases: Vec<u64> =
        io::list_dir(dir)?.iter().filter_map(|n| parse_segment_name(n)).collect();
    bases.sort_unstable();
    let truncations = crate::truncate::load(dir, bases.first().copied().unwrap_or(0)).await?;
    let mut rec = Recovery {
        walk: MarkerWalk::new(truncations.markers()),
        dir,
        config,
        limit: config.batch_bytes_max.max(crate::config::BATCH_BYTES_LIMIT),
        report: RecoveryReport::default(),
        indexes: BTreeMap::new(),
        producers: BTreeMap::new(),
        epochs: BTreeMap::new(),
        segments: Vec::new(),
        flushes: 0,
    };
    for (i, base) in bases.iter().enumerate() {
        match rec.open_segment(*base, &bases[i + 1..]).await? {
            Walk::Next => {}
            Walk::Stop => break,
        }
    }
    let mut recovered = rec.finish(owned).await?;
    recovered.truncations = match recovered.clamp_markers_to {
        Some(end) => crate::truncate::clamp(dir, truncations, end).await?,
        None => truncations,
    };
    Ok(recovered)
}

/// The walk over a log's segments, oldest first.
struct Recovery<'a> {
    dir: &'a Path,
    config: &'a StorageConfig,
    /// Largest batch accepted while scanning.
    limit: usize,
    report: RecoveryReport,
    indexes: BTreeMap<ShardId, ShardIndex>,
    /// Each shard's producer table, rebuilt from the tags of its batches in log order.
    producers: BTreeMap<ShardId, ProducerTable>,
    /// Each shard's epoch index, rebuilt from the epochs of its batches in log order.
    epochs: BTreeMap<ShardId, EpochIndex>,
    segments: Vec<Segment>,
    /// fdatasyncs (and directory fsyncs counted as flushes) done so far.
    flushes: u64,
    /// The truncation markers, applied to `indexes` as the walk passes their positions.
    walk: MarkerWalk<'a>,
}

/// Whether the walk goes on to the next segment.
enum Walk {
    Next,
    Stop,
}

/// What scanning one segment's batches found.
struct Scanned {
    last_timestamp_ms: u64,
    /// File position after the last valid batch's slot.
    valid_end: u64,
    batches: u64,
    /// The first invalid file position and why, if the segment does not end cleanly.
    damage: Option<(u64, String)>,
}

impl Recovery<'_> {
    /// Open the segment at `base`, index its batches, and deal with any damage. `later`
    /// are the bases of the segments after it.
    async fn open_segment(&mut self, base: u64, later: &[u64]) -> Result<Walk> {
        let is_last = later.is_empty();
        let path = segment_path(self.dir, base);
        let file = LogFile::open_with(&path, self.config.write_sync == WriteSync::Dsync).await?;
        let size = file.size().await?;
        let Some(header) = self.read_header(&file, &path, base, is_last, size).await? else {
            return Ok(Walk::Stop);
        };
        // Truncations before this segment are applied first (the first segment: they concern
        // deleted segments only); a marker exactly at its base may be older or newer than
        // its header (a truncation and a roll at the same position), see check_start_offsets.
        if self.segments.is_empty() {
            self.walk.skip_before(base);
        } else {
            self.apply_markers(base, false);
        }
        self.check_start_offsets(&path, &header)?;
        self.apply_markers(base, true);
        let scanned = self.index_batches(&file, base, size, header.created_ms).await?;
        self.report.batches += scanned.batches;
        let mut valid_end = scanned.valid_end;
        let mut walk = Walk::Next;
        if let Some((pos, reason)) = scanned.damage {
            walk = self.handle_damage(&file, &path, size, pos, reason, later).await?;
            valid_end = valid_end.min(pos);
        }
        self.segments.push(Segment {
            base_position: base,
            file: Rc::new(file),
            end: align_up(valid_end),
            last_timestamp_ms: scanned.last_timestamp_ms,
            start_offsets: header.next_offsets,
        });
        self.report.segments += 1;
        Ok(walk)
    }

    /// Read and check the header block. `None`: the last segment was only half created
    /// (a crash while creating it) and has been removed.
    async fn read_header(
        &mut self,
        file: &LogFile,
        path: &Path,
        base: u64,
        is_last: bool,
        size: u64,
    ) -> Result<Option<SegmentHeader>> {
        let block = file.read_at(0, SEGMENT_HEADER_BYTES as usize).await?;
        match SegmentHeader::decode(&block) {
            Ok(h) if h.base_position == base => {
                self.check_bounds(path, &h, size)?;
                Ok(Some(h))
            }
            Ok(_) => Err(corrupt(path, 0, "segment header names another position".into())),
            Err(_) if is_last && size <= SEGMENT_HEADER_BYTES => {
                // Crash while creating the segment: nothing was ever written to it.
                tracing::warn!(path = %path.display(), size, "removing half-created segment");
                file.remove().await?;
                io::sync_dir(self.dir).await?;
                self.report.torn_bytes_dropped += size;
                self.report.torn_at = Some((path.to_owned(), 0));
                Ok(None)
            }
            Err(e) => Err(corrupt(path, 0, e.to_string())),
        }
    }

    /// A header's positions and offsets must leave room to grow (a log never comes near the
    /// limits: reaching them takes 2^63 bytes or records), and its segment must start where
    /// the previous one's valid bytes end or later: past a segment's start, positions of the
    /// log map to one file only.
    fn check_bounds(&self, path: &Path, header: &SegmentHeader, size: u64) -> Result<()> {
        let base = header.base_position;
        if base > POSITION_MAX || size > POSITION_MAX - base {
            return Err(corrupt(path, 0, format!("segment at log position {base} is past the largest log position {POSITION_MAX}")));
        }
        if let Some((shard, next)) = header.next_offsets.iter().find(|(_, o)| o.0 > OFFSET_MAX) {
            return Err(corrupt(
                path,
                0,
                format!("{shard} starts at {next}, past the largest offset {OFFSET_MAX}"),
            ));
        }
        if let Some(prev) = self.segments.last() {
            let prev_end = prev.base_position + prev.end;
            if base < prev_end {
                return Err(corrupt(path, 0, format!("segment starts at log position {base}, inside the previous segment, whose batches end at {prev_end}")));
            }
        }
        Ok(())
    }

    /// The first segment's header starts the indexes; every later one must start each
    /// shard where the previous segment ended it.
    fn check_start_offsets(&mut self, path: &Path, header: &SegmentHeader) -> Result<()> {
        if self.segments.is_empty() {
            for (shard, next) in &header.next_offsets {
                self.indexes.insert(*shard, ShardIndex::new(next.0));
            }
            return Ok(());
        }
        for (shard, next) in &header.next_offsets {
            let have = self.indexes.get(shard).map_or(0, |ix| ix.next_offset());
            // The header may have been written after a truncation at exactly its base.
            let cut = self
                .walk
                .at(header.base_position)
                .filter(|m| m.shard == *shard)
                .map(|m| m.offset)
                .min();
            if have != next.0 && cut.map(|c| c.min(have)) != Some(next.0) {
                return Err(corrupt(
                    path,
                    0,
                    format!("{shard} starts at {next}, previous segment ends at {have}"),
                ));
            }
        }
        Ok(())
    }

    /// Verify the segment's batches in order and index them, up to the first invalid one or
    /// the first that does not continue its shard.
    async fn index_batches(
        &mut self,
        file: &LogFile,
        base: u64,
        size: u64,
        created_ms: u64,
    ) -> Result<Scanned> {
        let mut tables = Tables {
            indexes: &mut self.indexes,
            producers: &mut self.producers,
            epochs: &mut self.epochs,
        };
        let producers_max = self.config.producers_per_shard_max;
        let producer_expiry_ms = self.config.producer_expiry_ms;
        let walk = &mut self.walk;
        let mut last_ts = created_ms;
        let mut valid_end = SEGMENT_HEADER_BYTES;
        let mut batches = 0u64;
        let mut gap = None;
        let mut too_many = None;
        let end = scan_segment(file, SEGMENT_HEADER_BYTES, size, self.limit, |pos, h, _| {
            // A log holds at most SHARDS_PER_LOG_MAX shards: a batch of one more is refused
            // here, before the tables grow for it (no torn-tail cut: it is never written).
            if tables.indexes.len() >= SHARDS_PER_LOG_MAX && !tables.indexes.contains_key(&h.shard)
            {
                too_many = Some(pos);
                return ControlFlow::Break(());
            }
            // Truncations at or before this batch's position happened before it was written.
            apply_markers_to(&mut tables, walk, base + pos, true);
            let ix = tables.indexes.entry(h.shard).or_insert_with(|| ShardIndex::new(0));
            if h.base_offset.0 != ix.next_offset() {
                gap = Some((
                    pos,
                    format!(
                        "{} batch at offset {} where {} was expected",
                        h.shard,
                        h.base_offset,
                        ix.next_offset()
                    ),
                ));
                return ControlFlow::Break(());
            }
            ix.push(IndexEntry {
                base_offset: h.base_offset.0,
                record_count: h.record_count,
                len: h.len,
                position: base + pos,
            });
            if let Some(tag) = h.producer {
                tables
                    .producers
                    .entry(h.shard)
                    .or_insert_with(|| ProducerTable::new(producers_max, producer_expiry_ms))
                    .record(tag, h.base_offset.0, h.record_count, h.first_timestamp_ms);
            }
            // A batch that a later marker cuts wholly is left out of the epoch index: the
            // cut would remove its change anyway, and it must not push older changes out of
            // the bounded index (so a reopen rebuilds the index of the log as it ends up).
            if walk.cut_after(h.shard, base + pos).is_none_or(|cut| cut > h.base_offset.0) {
                tables
                    .epochs
                    .entry(h.shard)
                    .or_insert_with(|| EpochIndex::new(EPOCH_CHANGES_PER_SHARD_MAX))
                    .push(h.epoch, h.base_offset.0);
            }
            last_ts = last_ts.max(h.last_timestamp_ms);
            valid_end = pos + crate::format::batch_slot(u64::from(h.len));
            batches += 1;
            ControlFlow::Continue(())
        })
        .await?;
        if let Some(position) = too_many {
            return Err(StorageError::Corrupt {
                path: file.path().to_owned(),
                position,
                reason: format!("a batch of a shard past the {SHARDS_PER_LOG_MAX} one log holds"),
            });
        }
        let damage = match (end, gap) {
            (_, Some((pos, why))) => Some((pos, why)),
            (ScanEnd::Invalid(pos, e), None) => Some((pos, e.to_string())),
            (ScanEnd::Clean(_), None) => None,
        };
        Ok(Scanned { last_timestamp_ms: last_ts, valid_end, batches, damage })
    }

    /// Damage at file position `pos`: cut it if it is a torn tail (the last segment, no
    /// valid batch beyond the in-flight window), else repair if the operator asked for it
    /// (truncate here, delete the `later` segments, stop), else refuse to open.
    async fn handle_damage(
        &mut self,
        file: &LogFile,
        path: &Path,
        size: u64,
        pos: u64,
        reason: String,
        later: &[u64],
    ) -> Result<Walk> {
        let beyond = valid_batch_beyond_window(file, pos, size, self.limit).await?;
        if later.is_empty() && beyond.is_none() {
            tracing::warn!(path = %path.display(), pos, dropped = size - pos, %reason, "truncating torn tail");
            file.truncate(pos).await?;
            file.fdatasync().await?;
            self.flushes += 1;
            self.report.torn_bytes_dropped += size - pos;
            self.report.torn_at = Some((path.to_owned(), pos));
            Ok(Walk::Next)
        } else if self.config.repair {
            let mut dropped = size - pos;
            file.truncate(pos).await?;
            file.fdatasync().await?;
            self.flushes += 1;
            for later in later {
                let p = segment_path(self.dir, *later);
                let f = LogFile::open(&p).await?;
                dropped += f.size().await?;
                f.remove().await?;
            }
            io::sync_dir(self.dir).await?;
            tracing::warn!(path = %path.display(), pos, dropped, %reason, "repaired corrupt log");
            self.report.repaired = Some(RepairReport {
                path: path.to_owned(),
                position: pos,
                bytes_dropped: dropped,
                reason,
            });
            Ok(Walk::Stop)
        } else {
            Err(corrupt(path, pos, reason))
        }
    }

    /// Add the owned shards that nothing was found for, check the shard limit, and make sure
    /// an active segment exists and what recovery saw is durable.
    async fn finish(mut self, owned: &[ShardId]) -> Result<Recovered> {
        // Truncations after the last batch. A marker past the end of the log means that
        // durable data is gone (markers point at flushed positions): refuse to open, unless
        // the operator asked for a repair; then the marker still applies (the records it
        // removed stay removed) and its position moves to the end, where the next write goes.
        let end = self.segments.last().map_or(0, |s| s.base_position + s.end);
        let mut clamp_markers_to = None;
        for m in self.walk.rest() {
            if m.position > end && self.config.repair {
                tracing::warn!(shard = %m.shard, position = m.position, end, "truncation marker past the repaired end");
                clamp_markers_to = Some(end);
            } else if m.position > end {
                return Err(corrupt(
                    &self.dir.join(crate::truncate::TRUNCATIONS_FILE),
                    0,
                    format!(
                        "truncation marker of {} at log position {} is past the end of the log ({end})",
                        m.shard, m.position
                    ),
                ));
            }
            cut(&mut self.tables(), *m);
        }
        for shard in owned {
            self.indexes.entry(*shard).or_insert_with(|| ShardIndex::new(0));
        }
        if self.indexes.len() > SHARDS_PER_LOG_MAX {
            return Err(StorageError::TooManyShards {
                count: self.indexes.len(),
                limit: SHARDS_PER_LOG_MAX,
            });
        }
        let mut segments_created = 0;
        if self.segments.is_empty() {
            let header = SegmentHeader {
                base_position: 0,
                created_ms: 0,
                next_offsets: self
                    .indexes
                    .iter()
                    .map(|(id, ix)| (*id, Offset(ix.next_offset())))
                    .collect(),
            };
            self.segments.push(create_segment(self.dir, &header, self.config.write_sync).await?);
            self.flushes += 2;
            segments_created += 1;
        } else {
            // What recovery saw may be only in the page cache (after a process crash): make it
            // durable before anyone is told it is.
            self.segments.last().expect("not empty").file.fdatasync().await?;
            self.flushes += 1;
        }
        let mut producers = self.producers;
        let mut epochs = self.epochs;
        let producers_max = self.config.producers_per_shard_max;
        let producer_expiry_ms = self.config.producer_expiry_ms;
        let shards = self
            .indexes
            .into_iter()
            .map(|(id, ix)| {
                let table = producers
                    .remove(&id)
                    .unwrap_or_else(|| ProducerTable::new(producers_max, producer_expiry_ms));
                let epochs = epochs
                    .remove(&id)
                    .unwrap_or_else(|| EpochIndex::new(EPOCH_CHANGES_PER_SHARD_MAX));
                (id, ShardState::new(owned.contains(&id), ix, table, epochs))
            })
            .collect();
        Ok(Recovered {
            segments: self.segments,
            shards,
            report: self.report,
            flushes: self.flushes,
            segments_created,
            truncations: Truncations::default(),
            clamp_markers_to,
        })
    }
}

impl Recovery<'_> {
    /// The per-shard tables the walk rebuilds, borrowed together.
    fn tables(&mut self) -> Tables<'_> {
        Tables {
            indexes: &mut self.indexes,
            producers: &mut self.producers,
            epochs: &mut self.epochs,
        }
    }

    /// Apply the markers at or before log position `position` (`inclusive`) or before it.
    fn apply_markers(&mut self, position: u64, inclusive: bool) {
        while let Some(m) = self.walk.next_through(position, inclusive) {
            cut(&mut self.tables(), m);
        }
    }
}

/// The per-shard tables recovery rebuilds from the batches and cuts with the markers.
struct Tables<'a> {
    indexes: &'a mut BTreeMap<ShardId, ShardIndex>,
    producers: &'a mut BTreeMap<ShardId, ProducerTable>,
    epochs: &'a mut BTreeMap<ShardId, EpochIndex>,
}

/// [`Recovery::apply_markers`] for a walk whose tables are borrowed apart.
fn apply_markers_to(
    tables: &mut Tables<'_>,
    walk: &mut MarkerWalk<'_>,
    position: u64,
    inclusive: bool,
) {
    while let Some(m) = walk.next_through(position, inclusive) {
        cut(tables, m);
    }
}

/// Apply one marker: the shard ends at its offset, and its producer table and epoch index
/// forget the batches the marker cut (wholly or in part); they were all written before the
/// marker.
fn cut(tables: &mut Tables<'_>, m: Marker) {
    tables.indexes.entry(m.shard).or_insert_with(|| ShardIndex::new(0)).truncate(m.offset);
    if let Some(table) = tables.producers.get_mut(&m.shard) {
        table.forget_after(m.offset);
    }
    if let Some(epochs) = tables.epochs.get_mut(&m.shard) {
        epochs.truncate(m.offset);
    }
}

fn corrupt(path: &Path, position: u64, reason: String) -> StorageError {
    StorageError::Corrupt { path: path.to_owned(), position, reason }
}
