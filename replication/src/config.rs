//! Limits and timings of a replica, named once with their units.

/// Replicas of one shard at most (the replication factor's upper bound).
pub const REPLICAS_MAX: usize = 5;
/// Records in one batch at most.
pub const BATCH_RECORDS_MAX: u32 = 10_000;
/// Payload bytes of one batch at most.
pub const BATCH_PAYLOAD_BYTES_MAX: usize = 1024 * 1024;
/// Fixed per-batch cost counted in fetch replies and in-flight budgets.
pub const BATCH_HEADER_BYTES: u64 = 48;
/// Appends waiting for their acknowledgement on a leader at most; more are refused with
/// `Busy`.
pub const ACK_WAITERS_MAX: usize = 4096;
/// Recent batches remembered per producer for duplicate detection (a retry older than this
/// window gets `SequenceTooOld`).
pub const PRODUCER_SEQ_WINDOW: usize = 8;

/// Timings and limits of one replica. `Default` gives the broker's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// In-sync replicas (leader included) a durable append needs; appends are refused with
    /// `NotEnoughReplicas` below it. Default: a majority of the replication factor.
    pub min_insync: usize,
    /// A follower that has not durably reached the leader's log end of this long ago is removed
    /// from the in-sync set.
    pub isr_lag_max_ms: u64,
    /// An in-sync follower that holds the commit back and has sent nothing for this long since
    /// the leader last answered it is removed from the in-sync set. A live follower fetches
    /// again within a round trip of each answer, so this notices a lost follower (a crash, a
    /// pause, a cut link) long before `isr_lag_max_ms`; it must exceed a round trip between
    /// brokers plus a follower's write of `follower_unwritten_bytes_max`.
    pub follower_silence_ms: u64,
    /// A leader answers a fetch with nothing new after this long at most (long poll).
    pub fetch_park_max_ms: u64,
    /// A follower resends a fetch or epoch query unanswered for this long.
    pub fetch_retry_ms: u64,
    /// A leader resends an in-sync-set proposal the controller has not answered for this long.
    pub propose_retry_ms: u64,
    /// Bytes of batches one fetch reply carries at most (at least one batch is sent).
    pub fetch_bytes_max: u64,
    /// A follower stops fetching while this many bytes it received are not yet written.
    pub follower_unwritten_bytes_max: u64,
    /// [`crate::Replica::archive`] moves batches out of memory this many at least at a time.
    pub archive_min_batches: usize,
    /// How long and how many idempotent producers the shard remembers
    /// ([`crate::ProducerLimits`]); the same on every replica of a shard.
    pub producers: crate::ProducerLimits,
    /// Leader balance: a leader that is not its shard's preferred replica (the first of its
    /// replicas) hands its leadership to it once it has led this long and the preferred
    /// replica is in sync and caught up ([`crate::GroupState::apply_transfer`]). `None`:
    /// never.
    pub preferred_leader_after_ms: Option<u64>,
}

/// A replicated shard's retention ([`crate::Replica::apply_retention`]): its leader starts the
/// log where it would hold at most `bytes_max` payload bytes and no batch older than
/// `age_ms_max`; replicas delete below that start. Both `None`: keep everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Payload bytes one shard's log keeps at most (about: judged at batch boundaries, and at
    /// about every `ARCHIVE_MARK_BYTES` in the archived prefix).
    pub bytes_max: Option<u64>,
    /// A batch older than this (its time, ms, against the caller's clock) may go.
    pub age_ms_max: Option<u64>,
}

/// How long a leader that is not its shard's preferred replica leads before it hands the
/// shard back (the default of [`ReplicaConfig::preferred_leader_after_ms`]): a broker that
/// rejoined is caught up and has been in sync a while before it leads again.
pub const PREFERRED_LEADER_AFTER_MS: u64 = 5_000;

impl ReplicaConfig {
    /// The defaults for a replication factor of `replicas`: `min_insync` is a majority.
    pub fn for_replicas(replicas: usize) -> ReplicaConfig {
        ReplicaConfig {
            min_insync: replicas / 2 + 1,
            isr_lag_max_ms: 2_000,
            follower_silence_ms: 100,
            fetch_park_max_ms: 250,
            fetch_retry_ms: 500,
            propose_retry_ms: 500,
            fetch_bytes_max: 1024 * 1024,
            follower_unwritten_bytes_max: 8 * 1024 * 1024,
            archive_min_batches: 1024,
            producers: crate::ProducerLimits::default(),
            preferred_leader_after_ms: Some(PREFERRED_LEADER_AFTER_MS),
        }
    }
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig::for_replicas(3)
    }
}

/// Deliberate protocol bugs, for proving that the simulator's checker catches them. Every flag
/// is off in `Default`; nothing but the checker's own tests sets one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InjectedBugs {
    /// The leader commits (and acks durable appends) on its own fdatasync, without waiting for
    /// the in-sync followers.
    pub commit_without_quorum: bool,
    /// A follower of a new leader keeps its divergent suffix instead of truncating by epoch.
    pub skip_truncation: bool,
    /// The leader appends a retried idempotent batch again instead of answering with the
    /// original offsets.
    pub skip_dedup: bool,
    /// The leader accepts and acks appends without a confirmed lease.
    pub ignore_lease: bool,
    /// Readers may read the stored log up to the commit point even where a truncation has not
    /// reached storage yet ([`crate::Replica::visible_end`] ignores the written end).
    pub visible_past_written: bool,
    /// The driver feeds the subscribers' tail (and lets readers read) up to the commit point
    /// without waiting for storage to hold it (the readers' gap of 10f4ad2, in the driver).
    pub tail_past_written: bool,
    /// The driver lets a truncation below what subscribers were given through instead of
    /// stopping the replica (the guard of 45ad13f removed).
    pub truncate_below_fed: bool,
    /// The driver hands every proposal over, however many of the shard's are on their way
    /// (741370b: they piled up while etcd was away).
    pub propose_unbounded: bool,
    /// The driver starts replicas for groups of streams not placed yet and keeps one whose
    /// group's replicas changed (fa9b380).
    pub open_unplaced: bool,
    /// A leader hands its leadership to the preferred replica whether or not it is in sync or
    /// caught up, and the controller (the simulator's etcd) takes the transfer without its
    /// in-sync check.
    pub transfer_out_of_sync: bool,
    /// A leader starts its log where retention says without waiting for its followers to hold
    /// the log that far (it bounds the start by its own commit point and durable end only).
    pub retention_past_followers: bool,
}

impl InjectedBugs {
    /// Parses a comma-separated list of flag names (`commit_without_quorum`, `skip_truncation`,
    /// `skip_dedup`, `ignore_lease`, `visible_past_written`, `tail_past_written`,
    /// `truncate_below_fed`, `propose_unbounded`, `open_unplaced`, `transfer_out_of_sync`,
    /// `retention_past_followers`); the
    /// empty string is no bug.
    pub fn parse(names: &str) -> Result<InjectedBugs, String> {
        let mut bugs = InjectedBugs::default();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "commit_without_quorum" => bugs.commit_without_quorum = true,
                "skip_truncation" => bugs.skip_truncation = true,
                "skip_dedup" => bugs.skip_dedup = true,
                "ignore_lease" => bugs.ignore_lease = true,
                "visible_past_written" => bugs.visible_past_written = true,
                "tail_past_written" => bugs.tail_past_written = true,
                "truncate_below_fed" => bugs.truncate_below_fed = true,
                "propose_unbounded" => bugs.propose_unbounded = true,
                "open_unplaced" => bugs.open_unplaced = true,
                "transfer_out_of_sync" => bugs.transfer_out_of_sync = true,
                "retention_past_followers" => bugs.retention_past_followers = true,
                other => return Err(format!("unknown injected bug {other:?}")),
            }
        }
        Ok(bugs)
    }
}
