//! The free-space floor (`--min-free-bytes`): while the data directory's file system has less
//! free space than the floor, creating streams and appending get `StorageFull` (19); reads,
//! consumer-offset commits and the acks of appends accepted before go on.
//!
//! Free space is read with one `statvfs` per core every [`DISK_CHECK_INTERVAL_MS`] by a
//! background task, and once more before a stream is created; an append only reads a `Cell`.
//! So the floor may be crossed by what is appended within one interval (bounded by the
//! in-flight budgets): it is a floor with a margin, not an exact reservation, which is why its
//! default is a share of the disk. A truly full disk still gives `StorageFull` (from ENOSPC).

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::time::Duration;

use felix_proto::ErrorCode;

use super::error::WireError;
use crate::config::MinFreeBytes;

/// How often each core re-reads the free space of the data directory's file system.
pub const DISK_CHECK_INTERVAL_MS: u64 = 100;

/// One core's view of the floor.
#[derive(Debug)]
pub struct DiskFloor {
    dir: PathBuf,
    min_free_bytes: u64,
    available_bytes: Cell<u64>,
    low: Cell<bool>,
}

impl DiskFloor {
    /// The floor of the file system holding `dir`, resolving `auto` from its size.
    pub fn open(dir: &Path, setting: MinFreeBytes) -> std::io::Result<DiskFloor> {
        let space = felix_storage::fs_space(dir)?;
        let floor = DiskFloor {
            dir: dir.to_owned(),
            min_free_bytes: setting.resolve(space.total_bytes),
            available_bytes: Cell::new(space.available_bytes),
            low: Cell::new(false),
        };
        floor.refresh();
        Ok(floor)
    }

    /// The floor in bytes (0: off).
    pub fn min_free_bytes(&self) -> u64 {
        self.min_free_bytes
    }

    /// Free bytes at the last refresh.
    pub fn available_bytes(&self) -> u64 {
        self.available_bytes.get()
    }

    /// Re-reads the free space (one `statvfs`). A failed read keeps the last state.
    pub fn refresh(&self) {
        if self.min_free_bytes == 0 {
            return;
        }
        let space = match felix_storage::fs_space(&self.dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "statvfs of the data directory failed");
                return;
            }
        };
        self.available_bytes.set(space.available_bytes);
        let low = space.available_bytes < self.min_free_bytes;
        if low != self.low.replace(low) {
            if low {
                tracing::warn!(
                    available_bytes = space.available_bytes,
                    min_free_bytes = self.min_free_bytes,
                    "free space below --min-free-bytes: refusing new streams and appends"
                );
            } else {
                tracing::info!(
                    available_bytes = space.available_bytes,
                    min_free_bytes = self.min_free_bytes,
                    "free space above --min-free-bytes again: accepting new streams and appends"
                );
            }
        }
    }

    /// Whether free space was below the floor at the last refresh.
    pub fn is_low(&self) -> bool {
        self.low.get()
    }

    /// `StorageFull` while free space is below the floor (as of the last refresh).
    pub fn check(&self) -> Result<(), WireError> {
        if self.low.get() {
            return Err(WireError::new(
                ErrorCode::StorageFull,
                "the broker's disk is nearly full (below its free-space floor): new streams and \
                 appends are refused until space is freed",
            ));
        }
        Ok(())
    }

    /// Refreshes `floor` every `DISK_CHECK_INTERVAL_MS` on the current core until it is
    /// dropped or the core stops. Does nothing when the floor is off.
    pub fn spawn_watch(floor: &Rc<DiskFloor>, tasks: &super::tasks::CoreTasks) {
        if floor.min_free_bytes == 0 {
            return;
        }
        let weak: Weak<DiskFloor> = Rc::downgrade(floor);
        tasks.spawn(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(DISK_CHECK_INTERVAL_MS)).await;
                let Some(floor) = weak.upgrade() else { return };
                floor.refresh();
            }
        });
    }
}
