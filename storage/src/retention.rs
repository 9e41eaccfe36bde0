//! Retention: delete the oldest segments of a stream log by size and by age, or below offsets
//! its owner no longer needs (`delete_below`). The active segment is never deleted. `now_ms` is
//! an input; the background task in `store` reads the clock.

use felix_proto::{Offset, ShardId};

use crate::error::Result;
use crate::io;
use crate::log::{RetentionOutcome, StreamLog};
use crate::state::State;

impl StreamLog {
    /// Delete segments, oldest first, while the log is over its byte limit or the oldest
    /// segment's newest batch is older than the age limit. Reads of deleted offsets get
    /// `OffsetBeforeStart`; offsets are never reused (segment headers carry them).
    pub async fn enforce_retention(&self, now_ms: u64) -> Result<RetentionOutcome> {
        let retention = self.inner.retention.get();
        self.delete_oldest_while(|st| {
            let total: u64 = st.segments.iter().map(|s| s.end).sum();
            let oldest = &st.segments[0];
            let by_size = retention.bytes_max.is_some_and(|max| total > max);
            let by_age = retention
                .age_ms_max
                .is_some_and(|max| oldest.last_timestamp_ms.saturating_add(max) < now_ms);
            by_size || by_age
        })
        .await
    }

    /// Replaces the log's retention limits; the next [`enforce_retention`] pass applies them.
    ///
    /// [`enforce_retention`]: StreamLog::enforce_retention
    pub fn set_retention(&self, retention: crate::RetentionConfig) {
        self.inner.retention.set(retention);
    }

    /// The log's retention limits.
    pub fn retention(&self) -> crate::RetentionConfig {
        self.inner.retention.get()
    }

    /// Delete segments, oldest first, while everything they hold lies below `keep` for every
    /// shard of the log; a shard `keep` does not name keeps all it has. For an owner that
    /// knows what it no longer needs: the broker's offsets log, once a snapshot of its
    /// positions is durable from `keep` on. The active segment is never deleted.
    pub async fn delete_below(&self, keep: &[(ShardId, Offset)]) -> Result<RetentionOutcome> {
        self.delete_oldest_while(|st| {
            // The next segment's header says where each shard stood when it began: the oldest
            // segment holds only offsets below that.
            let next = &st.segments[1];
            st.shards.keys().all(|id| {
                let Some(&(_, below)) = keep.iter().find(|(k, _)| k == id) else { return false };
                next.start_offsets.iter().any(|(sid, start)| sid == id && *start <= below)
            })
        })
        .await
    }

    /// Deletes the oldest segment while there is more than one and `delete` says so.
    async fn delete_oldest_while(
        &self,
        mut delete: impl FnMut(&State) -> bool,
    ) -> Result<RetentionOutcome> {
        let mut outcome = RetentionOutcome::default();
        loop {
            let victim = {
                let mut st = self.inner.state.borrow_mut();
                let st = &mut *st;
                if st.segments.len() <= 1 || !delete(st) {
                    break;
                }
                let victim = st.segments.remove(0);
                let next = &st.segments[0];
                for (id, s) in st.shards.iter_mut() {
                    let start = next
                        .start_offsets
                        .iter()
                        .find(|(sid, _)| sid == id)
                        .map_or(s.index.start_offset(), |(_, o): &(_, Offset)| o.0);
                    let start = st.truncations.start_after_drop(*id, next.base_position, start);
                    s.index.drop_before(next.base_position, start);
                    s.epochs.drop_before(s.index.start_offset(), s.next_offset);
                }
                st.stats.segments_deleted += 1;
                st.stats.retention_bytes_deleted += victim.end;
                victim
            };
            outcome.segments_deleted += 1;
            outcome.bytes_deleted += victim.end;
            tracing::info!(stream = %self.inner.name, path = %victim.file.path().display(), "retention deletes segment");
            self.inner.cache.borrow_mut().forget_file(victim.file.id());
            victim.file.remove().await?;
            io::sync_dir(&self.inner.dir).await?;
        }
        Ok(outcome)
    }
}
