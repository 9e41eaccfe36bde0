//! A replica's disk: operations complete in order; a sync makes everything before it durable;
//! a crash keeps the durable image plus a random prefix of what completed after the last sync
//! (a torn tail, as storage's recovery leaves it), and loses everything in flight. Readers of
//! the log (subscribers) see the stored image: every completed operation applied.

use std::collections::VecDeque;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use felix_replication::disk::{DiskOp, DiskOpId};
use felix_replication::types::{Batch, Offset, Time};

/// Write latency range, ms.
pub const WRITE_LATENCY_MS: (u64, u64) = (1, 4);
/// fdatasync latency range, ms.
pub const SYNC_LATENCY_MS: (u64, u64) = (2, 12);

/// One replica's simulated disk.
#[derive(Default)]
pub struct SimDisk {
    /// What survives a crash.
    durable: Vec<Batch>,
    /// Completed since the last sync: on top of `durable`, lost (a suffix of it) by a crash.
    completed: Vec<DiskOp>,
    /// Emitted, not completed: lost by a crash.
    in_flight: VecDeque<DiskOp>,
    /// When the last emitted operation completes (operations finish in order).
    busy_until: Time,
    /// Incremented whenever `durable` loses batches (a synced truncation or a crash).
    generation: u64,
    /// What a reader of the log sees: `durable` with `completed` applied.
    stored: Vec<Batch>,
    /// Incremented whenever `stored` loses batches (a truncation or a crash).
    stored_generation: u64,
}

impl SimDisk {
    /// Queues `op`; returns when it completes.
    pub fn submit(&mut self, now: Time, op: DiskOp, rng: &mut ChaCha8Rng) -> Time {
        let (lo, hi) = match op {
            DiskOp::Sync { .. } => SYNC_LATENCY_MS,
            DiskOp::Write { .. } | DiskOp::Truncate { .. } => WRITE_LATENCY_MS,
        };
        let done = self.busy_until.max(now).plus_ms(rng.gen_range(lo..=hi));
        self.busy_until = done;
        self.in_flight.push_back(op);
        done
    }

    /// The oldest in-flight operation completed; returns its id (`None` if the queue was lost
    /// to a crash). A completed sync makes everything before it durable.
    pub fn complete_next(&mut self) -> Result<Option<DiskOpId>, String> {
        let Some(op) = self.in_flight.pop_front() else { return Ok(None) };
        let id = op.id();
        apply(&mut self.stored, &op, &mut self.stored_generation)?;
        if let DiskOp::Sync { .. } = op {
            for done in std::mem::take(&mut self.completed) {
                apply(&mut self.durable, &done, &mut self.generation)?;
            }
        } else {
            self.completed.push(op);
        }
        Ok(Some(id))
    }

    /// A crash: in-flight operations vanish, a random prefix of the unsynced completed ones
    /// reaches the durable image. Returns the recovered log.
    pub fn crash(&mut self, rng: &mut ChaCha8Rng) -> Result<Vec<Batch>, String> {
        self.in_flight.clear();
        let kept = rng.gen_range(0..=self.completed.len());
        for op in std::mem::take(&mut self.completed).into_iter().take(kept) {
            apply(&mut self.durable, &op, &mut self.generation)?;
        }
        self.generation += 1;
        self.stored = self.durable.clone();
        self.stored_generation += 1;
        Ok(self.durable.clone())
    }

    /// Operations emitted and not completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The stored image: what a reader of the log sees (completed operations, synced or not).
    pub fn stored(&self) -> &[Batch] {
        &self.stored
    }

    /// Changes whenever the stored image may have lost or replaced batches.
    pub fn stored_generation(&self) -> u64 {
        self.stored_generation
    }

    /// The durable image.
    pub fn durable(&self) -> &[Batch] {
        &self.durable
    }

    /// Changes whenever the durable image may have lost or replaced batches.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// Applies a completed write or truncation to an image; a write must continue it.
fn apply(image: &mut Vec<Batch>, op: &DiskOp, generation: &mut u64) -> Result<(), String> {
    match op {
        DiskOp::Write { batches, .. } => {
            for batch in batches {
                let end = image.last().map_or(Offset(0), Batch::end);
                if batch.base != end {
                    return Err(format!(
                        "disk write at {} does not continue the log at {}",
                        batch.base, end
                    ));
                }
                image.push(batch.clone());
            }
        }
        DiskOp::Truncate { to, .. } => {
            let keep = image.partition_point(|b| b.base < *to);
            if keep < image.len() {
                image.truncate(keep);
                *generation += 1;
            }
        }
        DiskOp::Sync { .. } => {}
    }
    Ok(())
}
