//! The invariants, checked after every step of the simulation.
//!
//! The checker keeps `truth`: the committed history, the longest committed prefix any replica
//! has shown. It never trusts the protocol's own reasoning: every comparison is batch by batch
//! (epoch, offsets, producer tag, payload), made incremental only by the logs' generation
//! counters (a log whose generation is unchanged only grew since it was last compared).
//!
//! Checked:
//! 1. committed prefixes agree: every replica's log up to its committed offset equals `truth`
//!    (or extends it, and then becomes it); `truth` only grows;
//! 2. offsets are dense in `truth` and the committed offset is a batch boundary;
//! 3. no duplicate: a producer tag appears at most once in `truth`, and every ack of a tag
//!    names the same offsets;
//! 4. an acked durable batch is committed at the acking leader and is in `truth` as acked;
//! 5. no acked (committed) batch is lost: every in-sync replica's durable image (what a crash
//!    leaves) holds all of `truth`;
//! 6. at most one node acks per epoch;
//! 7. what a reader of a replica's stored log may read (below `Replica::visible_end`) is the
//!    committed history: a truncation not yet applied to storage is never read as committed;
//! 8. a refusal says what is known (checked in `world`, where appends are delivered): one other
//!    than `OutcomeUnknown` stored nothing (the refusing node's log took no batch of that
//!    append), so a producer that is not idempotent may resend it safely;
//! 10. what a driver hands its subscribers' tail is the committed history, each batch once and
//!     in order (nothing handed is ever truncated or changed), and readers never see past the
//!     durable, committed end (7, with the driver's visible end);
//! 11. bounded queues (checked in `world`): appends waiting for an answer, proposals on their
//!     way to etcd (one per shard), disk operations queued, actions per input;
//! 12. retention deletes nothing anyone needs (checked in `world`): no replica's log starts
//!     past the durable end of any replica of the group, up or down; no replica reads for a
//!     follower what its storage deleted; and a log recovered from where retention deleted to
//!     still matches the committed history (1, numbered from its origin).
//!
//! Payloads a replica released from memory (empty) match any payload; the durable image fills
//! them in.

use std::collections::{HashMap, HashSet};

use felix_replication::log::ReplicaLog;
use felix_replication::types::{Batch, Epoch, Offset, ProducerSeq, ReplicaNumber};

/// What has been verified of one log or image: its generation and the prefix length that
/// equals `truth`.
#[derive(Clone, Copy, Default)]
struct Verified {
    generation: u64,
    batches: usize,
}

/// The invariant checker of one simulation.
pub struct Checker {
    truth: Vec<Batch>,
    /// Each producer tag in `truth`, with its batch's base.
    truth_tags: HashMap<ProducerSeq, Offset>,
    /// Batches sent again after their producer may have expired (a retry later than the
    /// expiry after the first send): stored twice is the documented limit, not a violation.
    late: HashSet<ProducerSeq>,
    acked: HashMap<ProducerSeq, (Offset, u32)>,
    ack_epochs: HashMap<Epoch, ReplicaNumber>,
    logs: Vec<Verified>,
    images: Vec<Verified>,
    readable: Vec<Verified>,
    /// Per node: the end of what its driver handed the tail (a new process starts again).
    fed: Vec<Offset>,
}

impl Checker {
    /// A checker for `nodes` replicas.
    pub fn new(nodes: usize) -> Checker {
        Checker {
            truth: Vec::new(),
            truth_tags: HashMap::new(),
            late: HashSet::new(),
            acked: HashMap::new(),
            ack_epochs: HashMap::new(),
            logs: vec![Verified::default(); nodes],
            images: vec![Verified::default(); nodes],
            readable: vec![Verified::default(); nodes],
            fed: vec![Offset(0); nodes],
        }
    }

    /// `tag` is being sent again later than the producer expiry after its first send: it may
    /// be stored (and acked) twice.
    pub fn retried_after_expiry(&mut self, tag: ProducerSeq) {
        self.late.insert(tag);
    }

    /// Whether `tag`'s batch is committed below `offset`: a log recovered from there (after
    /// retention) has forgotten the producer state of it, so a retry of it may be stored
    /// again (the documented limit, as for a retry after the producer expiry).
    pub fn committed_below(&self, tag: ProducerSeq, offset: Offset) -> bool {
        self.truth_tags.get(&tag).is_some_and(|&base| base < offset)
    }

    /// Batches known committed.
    pub fn committed_batches(&self) -> usize {
        self.truth.len()
    }

    /// Durable acks seen (distinct producer batches).
    pub fn acked_batches(&self) -> usize {
        self.acked.len()
    }

    /// Invariants 1-3 for `node`'s log up to its committed offset `committed`; `durable` is its
    /// durable image, which holds the batches its log archived.
    pub fn check_committed(
        &mut self,
        node: ReplicaNumber,
        log: &ReplicaLog,
        committed: Offset,
        durable: &[Batch],
    ) -> Result<(), String> {
        if committed > log.end() || !log.is_boundary(committed) {
            return Err(format!(
                "{node}: committed {committed} is not a batch boundary of its log (end {})",
                log.end()
            ));
        }
        // A log recovered after retention numbers its batches from its origin: the history's
        // batch there (the origin is committed, so the history reaches it).
        let origin = log.origin();
        let skip = self.truth.partition_point(|b| b.base < origin);
        if origin > Offset(0) && self.truth.get(skip).is_none_or(|b| b.base != origin) {
            let end = self.truth.last().map_or(Offset(0), Batch::end);
            if origin != end {
                return Err(format!(
                    "{node}: its log starts at {origin}, not a batch of the committed history"
                ));
            }
        }
        // Batches archived are committed and durable: those not checked yet (the driver
        // archives before this check) are checked in the durable image.
        let archived = skip + log.archived_batches() as usize;
        let batches = log.batches();
        let k = archived + batches.partition_point(|b| b.end() <= committed);
        let seen = &mut self.logs[node.0 as usize];
        if seen.generation != log.generation() {
            *seen = Verified { generation: log.generation(), batches: 0 };
        }
        let from = seen.batches.max(skip);
        if from < archived && durable.len() < archived {
            return Err(format!(
                "{node}: {archived} batches archived, its durable image holds {}",
                durable.len()
            ));
        }
        for i in from..k {
            let batch = if i < archived { &durable[i] } else { &batches[i - archived] };
            match self.truth.get_mut(i) {
                Some(t) if same(t, batch) => fill(t, batch),
                Some(t) => {
                    return Err(format!(
                        "{node}: committed batch {i} is {batch:?}, the committed history has {t:?}"
                    ))
                }
                None => extend(&mut self.truth, &mut self.truth_tags, &self.late, batch, node)?,
            }
        }
        self.logs[node.0 as usize].batches = from.max(k);
        Ok(())
    }

    /// `node`'s driver was started again (a new process): its tail starts empty.
    pub fn node_restarted(&mut self, node: ReplicaNumber) {
        self.fed[node.0 as usize] = Offset(0);
    }

    /// Invariant 10 for the batches `node`'s driver just handed its subscribers' tail (call
    /// after [`check_committed`](Self::check_committed) for `node`): each is the committed
    /// history's batch at its offset, in order, none twice.
    pub fn check_tail(&mut self, node: ReplicaNumber, batches: &[Batch]) -> Result<(), String> {
        let fed = &mut self.fed[node.0 as usize];
        for b in batches {
            if b.base < *fed {
                return Err(format!(
                    "{node}: the tail is handed the batch at {} after what ends at {fed}",
                    b.base
                ));
            }
            let i = self.truth.partition_point(|t| t.base < b.base);
            match self.truth.get(i) {
                Some(t) if same(t, b) => {}
                want => {
                    return Err(format!(
                        "{node}: the tail is handed {b:?}, the committed history has {want:?}"
                    ))
                }
            }
            *fed = b.end();
        }
        Ok(())
    }

    /// Invariant 7 for `node`'s stored image (call after
    /// [`check_committed`](Self::check_committed) for `node`, which extends `truth` to its
    /// commit point): the batches that end at or below `visible` are the committed history's.
    pub fn check_readable(
        &mut self,
        node: ReplicaNumber,
        stored: &[Batch],
        generation: u64,
        visible: Offset,
    ) -> Result<(), String> {
        let seen = &mut self.readable[node.0 as usize];
        if seen.generation != generation {
            *seen = Verified { generation, batches: 0 };
        }
        let k = stored.partition_point(|b| b.end() <= visible);
        for (i, got) in stored.iter().enumerate().take(k).skip(seen.batches) {
            match self.truth.get(i) {
                Some(want) if same(want, got) => {}
                want => {
                    return Err(format!(
                        "{node}: a reader of its stored log below {visible} reads batch {i} as \
                         {got:?}, the committed history has {want:?}"
                    ))
                }
            }
        }
        seen.batches = seen.batches.max(k);
        Ok(())
    }

    /// Invariant 6: `node` acked in `epoch`, no other node did.
    pub fn check_ack_epoch(&mut self, node: ReplicaNumber, epoch: Epoch) -> Result<(), String> {
        match self.ack_epochs.insert(epoch, node) {
            Some(other) if other != node => {
                Err(format!("{node} and {other} both acked in {epoch}"))
            }
            _ => Ok(()),
        }
    }

    /// Invariants 3 and 4 for a durable ack of `tag` at `base..base + records` by `node` (call
    /// after [`check_committed`](Self::check_committed) for `node`).
    pub fn check_ack(
        &mut self,
        node: ReplicaNumber,
        tag: ProducerSeq,
        base: Offset,
        records: u32,
    ) -> Result<(), String> {
        if let Some(&(b, r)) = self.acked.get(&tag) {
            if (b, r) != (base, records) && !self.late.contains(&tag) {
                return Err(format!("{tag:?} acked at {b}+{r} and again at {base}+{records}"));
            }
        }
        self.acked.insert(tag, (base, records));
        let i = self.truth.partition_point(|b| b.base < base);
        match self.truth.get(i) {
            Some(b) if b.base == base && b.records == records && b.producer == Some(tag) => Ok(()),
            found => Err(format!(
                "{node} acked {tag:?} at {base}+{records}, committed history has {found:?}"
            )),
        }
    }

    /// Invariant 5 for an in-sync replica's durable image.
    pub fn check_image(
        &mut self,
        node: ReplicaNumber,
        image: &[Batch],
        generation: u64,
    ) -> Result<(), String> {
        let seen = &mut self.images[node.0 as usize];
        if seen.generation != generation {
            *seen = Verified { generation, batches: 0 };
        }
        if image.len() < self.truth.len() {
            return Err(format!(
                "{node} is in sync but its durable log has {} batches, {} are committed (acked data lost)",
                image.len(),
                self.truth.len()
            ));
        }
        let mut pairs = image.iter().zip(&self.truth).enumerate().skip(seen.batches);
        if let Some((i, (got, want))) = pairs.find(|(_, (got, want))| !same(got, want)) {
            return Err(format!("{node} durable batch {i} is {got:?}, committed {want:?}"));
        }
        seen.batches = seen.batches.max(self.truth.len());
        Ok(())
    }
}

/// Whether `a` and `b` are the same batch; a released payload (empty) matches any.
fn same(a: &Batch, b: &Batch) -> bool {
    (a.epoch, a.base, a.records, a.producer, a.time_ms)
        == (b.epoch, b.base, b.records, b.producer, b.time_ms)
        && (a.payload == b.payload || a.payload.is_empty() || b.payload.is_empty())
}

/// Fills a released payload of the committed history from `b` (the same batch).
fn fill(truth: &mut Batch, b: &Batch) {
    if truth.payload.is_empty() && !b.payload.is_empty() {
        truth.payload = b.payload.clone();
    }
}

/// Appends `batch` to the committed history: dense offsets, no repeated producer tag.
fn extend(
    truth: &mut Vec<Batch>,
    tags: &mut HashMap<ProducerSeq, Offset>,
    late: &HashSet<ProducerSeq>,
    batch: &Batch,
    node: ReplicaNumber,
) -> Result<(), String> {
    let end = truth.last().map_or(Offset(0), Batch::end);
    if batch.base != end || batch.records == 0 {
        return Err(format!("{node}: committed batch at {} leaves a gap after {end}", batch.base));
    }
    if let Some(tag) = batch.producer {
        if tags.insert(tag, batch.base).is_some() && !late.contains(&tag) {
            return Err(format!("{node}: {tag:?} committed twice (a retried batch stored again)"));
        }
    }
    truth.push(batch.clone());
    Ok(())
}
