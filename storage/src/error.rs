//! The one error type of the crate. Every variant is documented; no input from disk or
//! from a caller panics the store.

use std::path::PathBuf;

use felix_proto::{Offset, ProducerId, ShardId};

/// Everything that can go wrong in `felix-storage`.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The stream log does not own this shard (the broker routed a batch to the wrong core,
    /// or the shard id is out of range).
    #[error("stream {stream:?} on this core does not own {shard}")]
    UnknownShard {
        /// The stream's name as the broker gave it.
        stream: String,
        /// The shard that was asked for.
        shard: ShardId,
    },
    /// A stream name that cannot be stored (empty, too long, empty component, control chars).
    #[error("invalid stream name {name:?}: {reason}")]
    InvalidStreamName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A configuration value is out of its allowed range.
    #[error("invalid storage configuration: {reason}")]
    InvalidConfig {
        /// Which rule was broken.
        reason: &'static str,
    },
    /// The encoded batch exceeds `StorageConfig::batch_bytes_max`.
    #[error("batch of {bytes} encoded bytes exceeds the limit of {limit}")]
    BatchTooLarge {
        /// The encoded size of the batch, header included.
        bytes: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The batch has more records than `StorageConfig::batch_records_max`.
    #[error("batch of {count} records exceeds the limit of {limit}")]
    TooManyRecords {
        /// Records in the batch.
        count: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A batch with no records was offered.
    #[error("a batch must hold at least one record")]
    EmptyBatch,
    /// More shards were given to one stream log than a segment header can describe.
    #[error("{count} shards exceed the per-log limit of {limit}")]
    TooManyShards {
        /// Shards asked for.
        count: usize,
        /// `SHARDS_PER_LOG_MAX`.
        limit: usize,
    },
    /// Too many bytes are queued for writing; the caller should back off and retry.
    #[error("{queued_bytes} bytes already queued, limit {limit}")]
    QueueFull {
        /// Bytes queued and not yet written.
        queued_bytes: usize,
        /// `StorageConfig::queue_bytes_max`.
        limit: usize,
    },
    /// The requested offset was deleted by retention (or never existed below the start).
    #[error("{shard} offset {requested} is below the log start {start}")]
    OffsetBeforeStart {
        /// The shard read.
        shard: ShardId,
        /// The offset asked for.
        requested: Offset,
        /// The first offset still stored.
        start: Offset,
    },
    /// The file system is full (ENOSPC) or the writer's disk quota is spent (EDQUOT). The
    /// batches of the failed write and every batch queued behind it were rejected; nothing
    /// acknowledged before was touched and the log stays readable and appendable once space
    /// is freed.
    #[error("no space left on device writing {path}")]
    NoSpace {
        /// The segment file being written.
        path: PathBuf,
    },
    /// Recovery found damage before the tail of the log and `repair` was not requested.
    #[error("corrupt log {path} at byte {position}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte position inside that file of the first invalid batch (or header).
        position: u64,
        /// What was wrong.
        reason: String,
    },
    /// An earlier fdatasync or truncate failed; the log refuses further work because the
    /// state of the file is unknown (see "fsync errors" in docs/storage-format.md).
    #[error("stream log is poisoned: {reason}")]
    Poisoned {
        /// The first failure.
        reason: String,
    },
    /// `StreamLog::truncate_shard` was asked to cut outside the shard's stored range.
    #[error("cannot truncate {shard} at {requested}: it holds offsets {start}..{next}")]
    TruncateOutOfRange {
        /// The shard.
        shard: ShardId,
        /// The offset asked for.
        requested: Offset,
        /// The shard's first stored offset.
        start: Offset,
        /// The shard's next offset.
        next: Offset,
    },
    /// A truncation and appends of the same shard overlapped: `truncate_shard` was called
    /// while appends of the shard were queued or being written, or an append was offered
    /// while the shard was being truncated. The caller serializes them (replication
    /// truncates a follower's shard before it accepts data).
    #[error("{shard} is busy: {reason}")]
    ShardBusy {
        /// The shard.
        shard: ShardId,
        /// Which of the two overlaps happened.
        reason: &'static str,
    },
    /// The log's truncation marker file is full (`TRUNCATION_MARKERS_MAX`); markers before
    /// the oldest segment are dropped when the log is reopened.
    #[error("too many truncations retained in one log (limit {limit})")]
    TooManyTruncations {
        /// `TRUNCATION_MARKERS_MAX`.
        limit: usize,
    },
    /// A tagged batch skipped sequence numbers: the shard expected `expected` from this
    /// producer (the one after its last stored batch). Nothing was appended. The batches in
    /// between were never stored (e.g. lost with a failed write); the client resends from
    /// `expected`, or starts a new producer id if it no longer has them.
    #[error(
        "{producer} on {shard}: sequence {got} is ahead of the next expected {expected}; \
         nothing was stored: resend the batches from sequence {expected} in order"
    )]
    OutOfOrderSequence {
        /// The shard.
        shard: ShardId,
        /// The producer.
        producer: ProducerId,
        /// The sequence number the shard would have appended.
        expected: u32,
        /// The sequence number offered.
        got: u32,
    },
    /// A tagged batch older than every batch the shard remembers of this producer (the last
    /// `PRODUCER_SEQ_WINDOW`). Nothing was appended, and whether the original was stored is
    /// unknown here: the client must not resend it under this producer id (it may read the
    /// shard to find out), and goes on with newer sequence numbers.
    #[error(
        "{producer} on {shard}: sequence {seq} is older than the oldest one remembered \
         ({oldest_kept}); nothing was stored and its fate is unknown: do not retry it"
    )]
    SequenceTooOld {
        /// The shard.
        shard: ShardId,
        /// The producer.
        producer: ProducerId,
        /// The sequence number offered.
        seq: u32,
        /// The oldest sequence number the shard remembers of the producer.
        oldest_kept: u32,
    },
    /// A retry of a stored tagged batch with a different number of records: not the same
    /// batch. Nothing was appended. A retry must resend exactly the original batch; new data
    /// takes a new sequence number.
    #[error(
        "{producer} on {shard}: sequence {seq} was stored with {stored_records} records but \
         the retry has {retry_records}; nothing was stored: a retry must resend the same batch"
    )]
    SequenceMismatch {
        /// The shard.
        shard: ShardId,
        /// The producer.
        producer: ProducerId,
        /// The sequence number offered.
        seq: u32,
        /// Records of the stored batch.
        stored_records: u32,
        /// Records of the retry.
        retry_records: u32,
    },
    /// A follower's copy of a leader's batch (`BatchMeta::expected_base`) would not land at
    /// the leader's offset: the shard's next offset (queued appends included) is `next`.
    /// Nothing was stored. The follower's log does not continue the leader's there: it
    /// fetches from `next`, or truncates (the epoch handshake) first.
    #[error(
        "{shard}: the batch must land at offset {expected} but the shard's next offset is \
         {next}; nothing was stored"
    )]
    OffsetMismatch {
        /// The shard.
        shard: ShardId,
        /// Where the batch had to land (`BatchMeta::expected_base`).
        expected: Offset,
        /// The shard's next offset.
        next: Offset,
    },
    /// A batch stamped with a leader epoch lower than the shard's last epoch (the largest
    /// epoch stamped on a batch of the shard, queued ones included): epochs of one shard never
    /// decrease. Nothing was stored. A deposed leader's append, or a follower that did not
    /// truncate to its new leader's log first.
    #[error(
        "{shard}: epoch {epoch} is lower than the shard's last epoch {last}; nothing was stored"
    )]
    EpochRegression {
        /// The shard.
        shard: ShardId,
        /// The epoch offered.
        epoch: u64,
        /// The shard's last epoch.
        last: u64,
    },
    /// The log was closed (or dropped) before the operation completed.
    #[error("stream log closed")]
    Closed,
    /// Any other I/O error.
    #[error("{context} {path:?}: {source}")]
    Io {
        /// The operation.
        context: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    /// Classify an I/O error: ENOSPC and EDQUOT become [`StorageError::NoSpace`].
    pub(crate) fn io(context: &'static str, path: PathBuf, source: std::io::Error) -> Self {
        if is_no_space(&source) {
            StorageError::NoSpace { path }
        } else {
            StorageError::Io { context, path, source }
        }
    }

    /// A copy good enough to hand to every waiter of a failed write or flush.
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            StorageError::NoSpace { path } => StorageError::NoSpace { path: path.clone() },
            StorageError::Closed => StorageError::Closed,
            StorageError::Io { context, path, source } => StorageError::Io {
                context,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            other => StorageError::Poisoned { reason: other.to_string() },
        }
    }
}

/// Whether an I/O error means "no space": the file system is full (ENOSPC) or the writer's
/// quota is spent (EDQUOT). Both are cured the same way, by freeing space.
pub fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == std::io::ErrorKind::StorageFull
}

/// Result alias of the crate.
pub type Result<T> = std::result::Result<T, StorageError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enospc_and_edquot_are_no_space() {
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e =
                StorageError::io("writing", "/x".into(), std::io::Error::from_raw_os_error(errno));
            assert!(matches!(e, StorageError::NoSpace { .. }), "{errno}: {e:?}");
        }
        let e =
            StorageError::io("writing", "/x".into(), std::io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(e, StorageError::Io { .. }));
    }
}
