//! Typed errors: why an append was refused, and why a log or a proposal was rejected.

use crate::types::{Epoch, Offset, ReplicaNumber};

/// Why a client append was refused. Every variant is retryable by an idempotent producer
/// unless noted: a retry never stores a batch twice.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// This replica does not lead the shard; `leader` is the one it believes does.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader this replica knows of, if any.
        leader: Option<ReplicaNumber>,
    },
    /// This replica's controller lease is not confirmed: it may have been replaced. Nothing
    /// was appended.
    #[error("leader lease expired")]
    LeaseExpired,
    /// The batch was appended to this leader's log, but the leader stepped down (or its lease
    /// lapsed, or the replica stopped) before the batch was committed: a new leader may keep it
    /// or truncate it. Unlike every other variant, this one does not mean "nothing was stored":
    /// only an idempotent producer may send the batch again without risking a duplicate.
    #[error("appended, but the leader stepped down before it committed: outcome unknown")]
    OutcomeUnknown {
        /// The leader this replica knows of now, if any.
        leader: Option<ReplicaNumber>,
    },
    /// Fewer in-sync replicas than `min_insync`: a durable append cannot be committed safely.
    #[error("in-sync replicas {insync} below min_insync {min_insync}")]
    NotEnoughReplicas {
        /// In-sync replicas now (leader included).
        insync: usize,
        /// The configured minimum.
        min_insync: usize,
    },
    /// Too many appends wait for their acknowledgement (`ACK_WAITERS_MAX`).
    #[error("too many appends waiting for acknowledgement")]
    Busy,
    /// The batch has no records, more than `BATCH_RECORDS_MAX` or a payload over
    /// `BATCH_PAYLOAD_BYTES_MAX`. Not retryable.
    #[error("invalid batch: {0}")]
    InvalidBatch(&'static str),
    /// The producer's sequence number skips ahead of its last one. Not retryable as is.
    #[error("out-of-order producer sequence")]
    OutOfOrderSequence,
    /// A retry older than the remembered window (`PRODUCER_SEQ_WINDOW`): it cannot be told from
    /// a new batch. Not retryable.
    #[error("producer sequence older than the deduplication window")]
    SequenceTooOld,
    /// A retry of a stored batch (same producer and sequence number) with another record
    /// count: it is not the same batch, and acknowledging it would name offsets holding other
    /// records. Not retryable.
    #[error("retry of a batch stored with {stored} records carries {retry}")]
    SequenceMismatch {
        /// Records of the stored batch.
        stored: u32,
        /// Records of the retry.
        retry: u32,
    },
}

impl AppendError {
    /// Whether the batch may have been stored ([`AppendError::OutcomeUnknown`]); every other
    /// refusal stored nothing.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, AppendError::OutcomeUnknown { .. })
    }
}

/// A batch that cannot extend a log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// The batch does not start at the log's end.
    #[error("batch at {got} does not continue the log at {expected}")]
    NotContiguous {
        /// The log's end.
        expected: Offset,
        /// The batch's base offset.
        got: Offset,
    },
    /// The batch has no records.
    #[error("empty batch at {base}")]
    EmptyBatch {
        /// Its base offset.
        base: Offset,
    },
    /// The batch's epoch is older than the log's last.
    #[error("batch epoch {got} after epoch {last}")]
    EpochDecreased {
        /// The log's last epoch.
        last: Epoch,
        /// The batch's.
        got: Epoch,
    },
    /// A truncation below the archived prefix ([`crate::ReplicaLog::archive`]), which holds
    /// only committed batches: a new leader's log always holds them, so this is a protocol
    /// violation, and the log is left as it was.
    #[error("truncation to {to} below the archived, committed prefix ending at {archived}")]
    TruncateBelowArchive {
        /// Where the truncation asked to cut.
        to: Offset,
        /// The archived prefix's end.
        archived: Offset,
    },
}

/// Why the controller refused a compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CasError {
    /// The group changed since the proposer read it (`expected` is stale).
    #[error("version {expected} is stale (now {current})")]
    StaleVersion {
        /// The version the proposal was based on.
        expected: u64,
        /// The version now.
        current: u64,
    },
    /// The proposer does not lead the group at the current epoch.
    #[error("proposer {proposer} is not the leader of epoch {epoch}")]
    NotLeader {
        /// Who proposed.
        proposer: ReplicaNumber,
        /// The current epoch.
        epoch: Epoch,
    },
    /// The proposed in-sync set is empty, misses the leader, or names a non-replica.
    #[error("invalid in-sync set")]
    InvalidIsr,
    /// No live in-sync replica can lead (an unclean election is never made).
    #[error("no live in-sync replica")]
    NoCandidate,
}
