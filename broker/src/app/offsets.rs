//! Consumer-group positions of one core: the next offset each (stream, group, shard) of the
//! core's shards committed, in memory and in the core's offsets log
//! (`felix-internal/offsets/v1`, one durable record per commit, replayed at start).
//!
//! The log would grow by a record per commit for ever, and a start reads all of it back. So
//! once a segment's worth of commits (and at least four snapshots' worth) has been appended
//! since the last snapshot, the positions are written again as a snapshot and the segments
//! wholly below it are deleted (`StreamLog::delete_below`), in a task of its own (no commit's
//! answer waits for it). No commit is in flight while a snapshot is written: a snapshot first
//! takes the `turnstile` every commit passes, so no new commit starts, then every permit of the
//! `gate` each commit holds until its record is durable and in the map. A commit's record is
//! therefore either before the snapshot (whose value is then at least as new) or after it, and
//! a replay from the oldest segment kept ends at the newest value of every position. (The
//! turnstile is what keeps the snapshot from waiting for ever: glommio's semaphore wakes a
//! small waiter behind a large one it cannot serve yet.) A crash during a snapshot leaves the
//! previous one, whose segments were not deleted yet.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use felix_proto::{AckMode, CoreId, ErrorCode, Offset, Record, ShardId};
use felix_storage::{StorageError, StreamLog};
use glommio::sync::Semaphore;

use super::error::{storage_error, WireError};
use super::tasks::now_ms;

/// The stream log of each core that holds its positions.
pub const OFFSETS_LOG: &str = "felix-internal/offsets/v1";
/// Bytes read per step when positions are loaded at start.
const LOAD_READ_BYTES: usize = 4 << 20;
/// Records per batch of a snapshot.
const SNAPSHOT_BATCH_RECORDS: usize = 1024;
/// Commits in flight at once on a core (each holds one permit; a snapshot takes them all).
const COMMITS_IN_FLIGHT_MAX: u64 = 1 << 16;

/// A position's identity: stream, group, shard.
type Position = (String, String, u32);

/// One core's consumer-group positions.
pub struct GroupPositions {
    core: CoreId,
    log: StreamLog,
    positions: RefCell<HashMap<Position, u64>>,
    /// Most positions kept (`--max-group-positions-per-core`).
    max: usize,
    /// A segment's size: appending less than this between snapshots cannot free a segment.
    segment_bytes: u64,
    /// The log's stored bytes right after the last snapshot (0 before the first): what it
    /// holds beyond this was appended since (nothing else deletes from this log).
    after_snapshot: Cell<u64>,
    /// Stored bytes the last snapshot took.
    snapshot_bytes: Cell<u64>,
    snapshotting: Cell<bool>,
    /// New positions being written (counted against `max` before they are in the map).
    adding: Cell<usize>,
    /// One unit; every commit passes it, a snapshot holds it.
    turnstile: Semaphore,
    /// A permit per commit in flight; a snapshot takes them all.
    gate: Semaphore,
}

impl GroupPositions {
    /// The positions `log` holds, read back from its oldest record.
    pub async fn load(
        core: CoreId,
        log: StreamLog,
        max: usize,
        segment_bytes: u64,
    ) -> Result<GroupPositions, StorageError> {
        let this = GroupPositions {
            core,
            log,
            positions: RefCell::default(),
            max,
            segment_bytes,
            after_snapshot: Cell::new(0),
            snapshot_bytes: Cell::new(0),
            snapshotting: Cell::new(false),
            adding: Cell::new(0),
            turnstile: Semaphore::new(1),
            gate: Semaphore::new(COMMITS_IN_FLIGHT_MAX),
        };
        let mut at = this.log.start_offset(ShardId(0))?;
        loop {
            let batches = this.log.read(ShardId(0), at, LOAD_READ_BYTES).await?;
            if batches.is_empty() {
                break;
            }
            for b in batches {
                for (i, r) in b.records.iter().enumerate() {
                    if b.base_offset.0 + (i as u64) < at.0 {
                        continue;
                    }
                    let (Some(key), Ok(v)) = (&r.key, <[u8; 8]>::try_from(&r.value.to_bytes()[..]))
                    else {
                        continue;
                    };
                    if let Some(position) = parse_key(key) {
                        this.positions.borrow_mut().insert(position, u64::from_be_bytes(v));
                    }
                }
                let end = Offset(b.base_offset.0 + b.records.len() as u64);
                debug_assert!(end > at, "a scan's position advances");
                at = end;
            }
        }
        // Everything replayed counts towards the next snapshot.
        Ok(this)
    }

    /// The committed next offset of `group` on `shard` of `stream`.
    pub fn get(&self, stream: &str, group: &str, shard: ShardId) -> Option<u64> {
        self.positions.borrow().get(&(stream.to_owned(), group.to_owned(), shard.0)).copied()
    }

    /// Positions kept.
    pub fn len(&self) -> usize {
        self.positions.borrow().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.positions.borrow().is_empty()
    }

    /// Commits `offset` as `group`'s next offset on `shard` of `stream`, durably.
    pub async fn commit(
        self: &Rc<Self>,
        stream: &str,
        group: &str,
        shard: ShardId,
        offset: Offset,
    ) -> Result<(), WireError> {
        let position = (stream.to_owned(), group.to_owned(), shard.0);
        {
            // Neither semaphore is ever closed.
            drop(self.turnstile.acquire_permit(1).await.map_err(|_| closed())?);
            let _permit = self.gate.acquire_permit(1).await.map_err(|_| closed())?;
            let new = !self.positions.borrow().contains_key(&position);
            let held = self.positions.borrow().len() + self.adding.get();
            if new && held >= self.max {
                return Err(WireError::new(
                    ErrorCode::LimitReached,
                    format!(
                        "core {} keeps {held} consumer-group positions, its limit \
                         (--max-group-positions-per-core); group {group} on {shard} of {stream} \
                         would add one",
                        self.core.0
                    ),
                ));
            }
            self.adding.set(self.adding.get() + usize::from(new));
            let appended = self
                .log
                .append(ShardId(0), &[record(&position, offset.0)], now_ms(), AckMode::Durable)
                .await;
            self.adding.set(self.adding.get() - usize::from(new));
            appended.map_err(|e| storage_error(&e))?;
            self.positions.borrow_mut().insert(position, offset.0);
        }
        if self.snapshot_due() {
            self.snapshotting.set(true);
            let this = self.clone();
            glommio::spawn_local(async move {
                // A failed snapshot is tried again a segment of commits later.
                if let Err(e) = this.snapshot().await {
                    tracing::warn!(core = this.core.0, error = %e, "consumer offsets snapshot failed");
                }
            })
            .detach();
        }
        Ok(())
    }

    fn snapshot_due(&self) -> bool {
        let every = self.segment_bytes.max(4 * self.snapshot_bytes.get());
        let since = self.log.stored_bytes().saturating_sub(self.after_snapshot.get());
        !self.snapshotting.get() && since >= every
    }

    /// Writes every position again from the log's end, then deletes the segments below it.
    async fn snapshot(&self) -> Result<(), StorageError> {
        let result = async {
            let start = {
                // No commit in flight from here until the snapshot is durable.
                let _turn =
                    self.turnstile.acquire_permit(1).await.map_err(|_| StorageError::Closed)?;
                let _all = self
                    .gate
                    .acquire_permit(COMMITS_IN_FLIGHT_MAX)
                    .await
                    .map_err(|_| StorageError::Closed)?;
                let start = self.log.next_offset(ShardId(0))?;
                let before = self.log.stored_bytes();
                let records: Vec<Record> =
                    self.positions.borrow().iter().map(|(p, o)| record(p, *o)).collect();
                for batch in records.chunks(SNAPSHOT_BATCH_RECORDS) {
                    self.log.append(ShardId(0), batch, now_ms(), AckMode::Durable).await?;
                }
                self.snapshot_bytes.set(self.log.stored_bytes().saturating_sub(before));
                start
            };
            let out = self.log.delete_below(&[(ShardId(0), start)]).await?;
            tracing::debug!(
                core = self.core.0,
                positions = self.len(),
                segments_deleted = out.segments_deleted,
                "consumer offsets snapshot"
            );
            Ok(())
        }
        .await;
        // Also after a failure: the next try waits for another segment of commits.
        self.after_snapshot.set(self.log.stored_bytes());
        self.snapshotting.set(false);
        result
    }

    /// Flushes the log (shutdown).
    pub async fn flush(&self) {
        let _ = self.log.flush().await;
    }
}

fn closed() -> WireError {
    WireError::new(ErrorCode::ShuttingDown, "the consumer offsets are closed")
}

/// The log record of a position: key `stream \n group \n shard`, value the offset (big-endian).
fn record(p: &Position, offset: u64) -> Record {
    let key = format!("{}\n{}\n{}", p.0, p.1, p.2);
    Record::keyed(Bytes::from(key), Bytes::copy_from_slice(&offset.to_be_bytes()))
}

fn parse_key(key: &[u8]) -> Option<Position> {
    let key = String::from_utf8_lossy(key);
    let mut parts = key.splitn(3, '\n');
    match (parts.next(), parts.next(), parts.next().map(str::parse::<u32>)) {
        (Some(s), Some(g), Some(Ok(shard))) => Some((s.to_owned(), g.to_owned(), shard)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_key_round_trips_and_junk_is_skipped() {
        let p = ("acme/app/s".to_owned(), "billing".to_owned(), 7);
        let r = record(&p, 42);
        assert_eq!(parse_key(r.key.as_ref().unwrap()), Some(p));
        assert_eq!(parse_key(b"no newlines"), None);
        assert_eq!(parse_key(b"s\ng\nnot-a-number"), None);
    }
}
