//! What replicas of one shard say to each other, and what a replica asks its driver to do.
//!
//! Replication is pull-based with long polls: a follower asks for what follows its log end and
//! reports how far it is durable; the leader answers at once when it has something new and
//! parks the fetch otherwise. Every message carries the leader epoch it belongs to; a message
//! of another epoch is ignored, so drops, duplicates and reordering are harmless.

use crate::controller::IsrProposal;
use crate::disk::DiskOp;
use crate::error::{AppendError, LogError};
use crate::types::{AppendId, Batch, Epoch, Offset, ReplicaNumber};

/// A message between two replicas of one shard (the driver adds the shard and the transport).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Follower -> leader: "where does your log leave epoch `last_epoch` (the epoch of my last
    /// batch)?" Sent before fetching from a new leader or after a restart.
    EpochQuery {
        /// The leader epoch the follower follows.
        epoch: Epoch,
        /// The epoch of the follower's last batch.
        last_epoch: Epoch,
    },
    /// Leader -> follower: the largest epoch `<= last_epoch` in the leader's log and the offset
    /// where it ends there. `answer_epoch == None`: the leader has no such epoch (truncate all).
    EpochAnswer {
        /// The leader epoch.
        epoch: Epoch,
        /// The epoch the query asked about.
        asked: Epoch,
        /// The largest epoch `<= asked` the leader has.
        answer_epoch: Option<Epoch>,
        /// Where `answer_epoch` ends in the leader's log.
        end: Offset,
    },
    /// Follower -> leader: send what follows `from`; my log is durable up to `durable_end`.
    Fetch {
        /// The leader epoch.
        epoch: Epoch,
        /// The follower's log end (its log is a prefix of the leader's up to here).
        from: Offset,
        /// The follower's fdatasync'd end.
        durable_end: Offset,
    },
    /// Leader -> follower: the batches after `from` (possibly none), the commit point and the
    /// log start.
    FetchReply {
        /// The leader epoch.
        epoch: Epoch,
        /// The offset the batches continue from.
        from: Offset,
        /// The batches, bounded by `fetch_bytes_max`.
        batches: Vec<Batch>,
        /// The leader's committed offset (high watermark).
        committed: Offset,
        /// The leader's log start (retention): the follower may delete below it.
        log_start: Offset,
    },
}

/// Something the replica asks its driver to do; drained with [`crate::Replica::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Send `message` to replica `to`.
    Send {
        /// The destination.
        to: ReplicaNumber,
        /// The message.
        message: Message,
    },
    /// Send replica `to` a [`Message::FetchReply`] of `epoch`, `committed` and `log_start` whose
    /// batches are
    /// read from this replica's stored log, because the state machine archived them
    /// ([`crate::ReplicaLog::archive`]; all are committed and durable here): the batches from
    /// `from` on that end at or below `upto`, at least one and at most `bytes_max` bytes
    /// ([`Batch::size_bytes`]) otherwise. If no stored batch starts at `from`, send nothing (the
    /// follower asks again).
    FetchFromLog {
        /// The destination.
        to: ReplicaNumber,
        /// The leader epoch.
        epoch: Epoch,
        /// The first batch's base offset.
        from: Offset,
        /// No batch past this offset (the archived prefix's end).
        upto: Offset,
        /// The leader's committed offset.
        committed: Offset,
        /// The leader's log start.
        log_start: Offset,
        /// Bytes of batches at most (at least one batch is sent).
        bytes_max: u64,
    },
    /// Execute a disk operation (in order), then call `handle_disk_done` with its id.
    Disk(DiskOp),
    /// The append `request` is acknowledged at offsets `base..base + records`.
    Ack {
        /// The client's request.
        request: AppendId,
        /// The epoch of the leader that acknowledged it.
        epoch: Epoch,
        /// Offset of its first record.
        base: Offset,
        /// Its record count.
        records: u32,
    },
    /// The append `request` is refused (nothing was stored, or a retry may be answered later).
    Reject {
        /// The client's request.
        request: AppendId,
        /// Why.
        error: AppendError,
    },
    /// Submit this compare-and-swap to the controller (etcd); the result arrives as the next
    /// group state through `handle_controller`.
    Propose(IsrProposal),
    /// The replica met what its in-memory log cannot do (a truncation into its archived,
    /// committed prefix: a protocol violation) and stopped following; the log is unchanged.
    /// Stop it and start it again from storage, which holds the whole log.
    Failed(LogError),
}
