//! One replicated shard on this core: its `felix_replication::Replica`, the appends waiting
//! for its acks, and the ordered execution of its disk operations through `felix-storage`.
//!
//! Everything here runs on the shard's core. Inputs (appends, messages, ticks, controller
//! records, disk completions) go into the state machine, then [`ShardReplica::drain`] takes
//! every output: messages go to the host's peer links, disk operations to the shard's disk
//! task (in order), acks to the waiting appends, proposals to the cluster agent.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use felix_proto::{Offset, ProducerTag, Record, ShardId};
use felix_replication::{
    AckMode, AppendError, AppendRequest, Batch, DiskOp, DiskOpId, Epoch, Message, NodeId, Output,
    ProducerId, ProducerSeq, Replica, ReplicaConfig, ReplicaLog, RequestId, Seq,
};
use felix_storage::{BatchMeta, StorageError, StreamLog};
use futures_lite::future::poll_once;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use tokio::sync::oneshot;

use super::payload;
use super::{Host, RECOVERY_READ_BYTES};
use crate::app::core::StreamEntry;

/// What an append waits for: the base offset its records got, or why it was refused.
pub type AppendResult = Result<Offset, AppendError>;

/// An append waiting for its answer, with its producer tag (for the log).
type Waiter = (oneshot::Sender<AppendResult>, Option<ProducerSeq>);

/// A queued storage operation's completion, reported in order.
type Pending = Pin<Box<dyn Future<Output = Result<(), StorageError>>>>;

/// One replicated shard on this core.
pub struct ShardReplica {
    /// The stream.
    pub stream: String,
    /// The shard.
    pub shard: ShardId,
    /// The broker of each replica number (the group's `replicas`, fixed at creation).
    pub nodes: Vec<felix_cluster::NodeId>,
    /// This broker's replica number in the group.
    pub me: NodeId,
    replica: RefCell<Replica>,
    waiters: RefCell<HashMap<u64, Waiter>>,
    next_request: Cell<u64>,
    /// The disk task's queue; taken by [`ShardReplica::stop`], which ends that task once it
    /// has done what was queued.
    disk_tx: RefCell<Option<LocalSender<DiskOp>>>,
    /// The disk task, awaited by [`ShardReplica::stopped`].
    disk_task: RefCell<Option<glommio::task::JoinHandle<()>>>,
    log: StreamLog,
    entry: Rc<StreamEntry>,
    /// The subscribers' tail has every committed batch below this.
    fed: Cell<Offset>,
    /// Set when a storage operation failed: the replica stops (see `fail`).
    pub failed: Cell<bool>,
    /// Payload bytes of the newest committed batches kept in memory.
    resident_bytes: u64,
    /// A checkpoint write is in flight (`save_checkpoint`).
    checkpointing: Rc<Cell<bool>>,
}

impl ShardReplica {
    /// The replica of `shard`, its log recovered from storage (every stored batch; payloads of
    /// all but the last `resident_bytes` are read back from storage when needed).
    pub async fn open(
        entry: Rc<StreamEntry>,
        log: StreamLog,
        shard: ShardId,
        nodes: Vec<felix_cluster::NodeId>,
        me: NodeId,
        config: ReplicaConfig,
        resident_bytes: u64,
    ) -> Result<(Rc<ShardReplica>, LocalReceiver<DiskOp>), String> {
        let recovered = recover(&log, shard, resident_bytes, config.producers).await?;
        let (disk_tx, disk_rx) = local_channel::new_bounded(super::DISK_OPS_MAX);
        let replica = Replica::new(me, config, recovered);
        let shard_replica = Rc::new(ShardReplica {
            stream: entry.meta.name.as_str().to_owned(),
            shard,
            nodes,
            me,
            replica: RefCell::new(replica),
            waiters: RefCell::default(),
            next_request: Cell::new(1),
            disk_tx: RefCell::new(Some(disk_tx)),
            disk_task: RefCell::default(),
            log,
            entry,
            // Nothing is visible until the replica knows what is committed: a recovered log
            // may end in batches a new leader takes back.
            fed: Cell::new(Offset(0)),
            failed: Cell::new(false),
            resident_bytes,
            checkpointing: Rc::default(),
        });
        Ok((shard_replica, disk_rx))
    }

    /// Runs `f` on the state machine, then drains its outputs.
    pub fn with(&self, host: &Rc<Host>, f: impl FnOnce(&mut Replica)) {
        if self.failed.get() {
            return;
        }
        let before = self.replica.borrow().role();
        f(&mut self.replica.borrow_mut());
        let after = self.replica.borrow().role();
        if before != after {
            let r = self.replica.borrow();
            tracing::info!(
                stream = %self.stream,
                shard = self.shard.0,
                role = ?after,
                log_end = r.log().end().0,
                committed = r.committed().0,
                "replica role changed"
            );
        }
        self.drain(host);
    }

    /// The state machine, for reading.
    pub fn replica(&self) -> std::cell::Ref<'_, Replica> {
        self.replica.borrow()
    }

    /// Subscribers may read below this offset: the commit point, where storage holds it
    /// (`Replica::visible_end`; a truncation still queued for storage leaves the old suffix
    /// there).
    pub fn visible_end(&self) -> Offset {
        self.fed.get().min(self.replica.borrow().visible_end())
    }

    /// Appends a client's batch; resolves to its base offset once the ack mode is met
    /// (`Durable`: committed on a quorum). `producer`: the tag, and whether the producer says
    /// nothing earlier of it is unresolved (`AppendRequest::oldest_pending`).
    pub fn append(
        &self,
        host: &Rc<Host>,
        records: &[Record],
        timestamp_ms: u64,
        mode: AckMode,
        producer: Option<(ProducerTag, bool)>,
    ) -> oneshot::Receiver<AppendResult> {
        let (tx, rx) = oneshot::channel();
        if self.failed.get() {
            let _ = tx.send(Err(AppendError::NotLeader { leader: None }));
            return rx;
        }
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        let oldest_pending = producer.is_some_and(|(_, oldest)| oldest);
        let producer = producer
            .map(|(t, _)| ProducerSeq { producer: ProducerId(t.producer.0), seq: Seq(t.seq) });
        self.waiters.borrow_mut().insert(id, (tx, producer));
        let request = AppendRequest {
            request: RequestId(id),
            producer,
            records: records.len() as u32,
            oldest_pending,
            time_ms: timestamp_ms,
            payload: payload::encode(timestamp_ms, records),
            mode,
        };
        let now = host.now();
        self.with(host, |r| r.handle_append(now, request));
        rx
    }

    /// Takes every output of the state machine.
    pub fn drain(&self, host: &Rc<Host>) {
        loop {
            let out = self.replica.borrow_mut().poll();
            let Some(out) = out else { break };
            match out {
                Output::Send { to, message } => self.send(host, to, message),
                Output::Disk(DiskOp::Truncate { id, to }) => {
                    tracing::info!(stream = %self.stream, shard = self.shard.0, to = to.0, "replica truncates its log");
                    if to < self.fed.get() {
                        // The protocol never cuts below the commit point (claim C in
                        // docs/replication.md), and subscribers were given everything below
                        // `fed`: cutting there would take back delivered records. Stop the
                        // replica rather than serve a history that forks from what was read.
                        self.fail(&format!(
                            "a truncation to {} goes below what subscribers were given ({})",
                            to.0,
                            self.fed.get().0
                        ));
                        return;
                    }
                    if !self.queue_disk(DiskOp::Truncate { id, to }) {
                        return;
                    }
                }
                Output::Disk(op) => {
                    if !self.queue_disk(op) {
                        return;
                    }
                }
                Output::Ack { request, base, .. } => self.answer(request, Ok(base)),
                Output::Reject { request, error } => self.answer(request, Err(error)),
                Output::Propose(p) => host.propose(self, p),
                Output::FetchFromLog { to, epoch, from, upto, committed, bytes_max } => {
                    let read = ArchivedRead { epoch, from, upto, committed, bytes_max };
                    self.send_from_storage(host, to, read);
                }
                Output::Failed(error) => {
                    self.fail(&format!("{error}; restart the broker to recover it from its log"));
                    return;
                }
            }
        }
        self.feed_tail();
        let committed = self.replica.borrow().committed();
        let keep_from = self.resident_start(committed);
        let mut replica = self.replica.borrow_mut();
        replica.release_payloads(keep_from);
        // Batches whose payloads left memory leave it too, but for a small index.
        if replica.archive(keep_from) > 0 {
            let checkpoint = replica.log().checkpoint();
            drop(replica);
            self.save_checkpoint(checkpoint);
        }
    }

    /// Writes the checkpoint of the log's archived prefix beside the log
    /// (`replica-<shard>.ckpt`), so a restart reads only the batches after it. One write at a
    /// time: an archive while one is in flight is saved by the next (any checkpoint of the
    /// archive is valid: archived batches are committed and never truncated).
    fn save_checkpoint(&self, checkpoint: Option<Vec<u8>>) {
        let Some(bytes) = checkpoint else { return };
        if self.checkpointing.replace(true) {
            return;
        }
        let (log, busy, shard) = (self.log.clone(), self.checkpointing.clone(), self.shard);
        glommio::spawn_local(async move {
            if let Err(e) = log.write_sidecar(&checkpoint_name(shard), bytes).await {
                tracing::warn!(shard = shard.0, error = %e, "writing a replica checkpoint");
            }
            busy.set(false);
        })
        .detach();
    }

    /// Answers a fetch of archived batches ([`Output::FetchFromLog`]) from storage.
    fn send_from_storage(&self, host: &Rc<Host>, to: NodeId, read: ArchivedRead) {
        let Some(node) = self.nodes.get(to.0 as usize).cloned() else { return };
        self.send_once_read(host, node, move |log, shard| async move {
            read_archived(&log, shard, read).await
        });
    }

    /// Sends `node` the message a read of this shard's stored log makes, once it is read
    /// (nothing if the read makes none: the follower asks again).
    fn send_once_read<F: Future<Output = Option<Message>> + 'static>(
        &self,
        host: &Rc<Host>,
        node: felix_cluster::NodeId,
        read: impl FnOnce(StreamLog, ShardId) -> F,
    ) {
        let (host, shard, stream, me) = (host.clone(), self.shard, self.stream.clone(), self.me);
        let reading = read(self.log.clone(), shard);
        glommio::spawn_local(async move {
            if let Some(message) = reading.await {
                host.send(&node, &stream, shard, me, &message);
            }
        })
        .detach();
    }

    fn answer(&self, request: RequestId, result: AppendResult) {
        if let Some((tx, producer)) = self.waiters.borrow_mut().remove(&request.0) {
            if let (Ok(base), Some(p)) = (&result, producer) {
                tracing::trace!(
                    stream = %self.stream,
                    shard = self.shard.0,
                    producer = p.producer.0,
                    seq = p.seq.0,
                    base = base.0,
                    "append acked"
                );
            }
            if let (Err(error), Some(p)) = (&result, producer) {
                tracing::debug!(
                    stream = %self.stream,
                    shard = self.shard.0,
                    producer = p.producer.0,
                    seq = p.seq.0,
                    %error,
                    "append refused"
                );
            }
            let _ = tx.send(result);
        }
    }

    /// Sends `message` to replica `to`; a fetch reply whose older batches were released from
    /// memory is completed from storage first.
    fn send(&self, host: &Rc<Host>, to: NodeId, message: Message) {
        if matches!(message, Message::EpochAnswer { .. } | Message::EpochQuery { .. }) {
            tracing::debug!(stream = %self.stream, shard = self.shard.0, to = to.0, ?message, "replica sends");
        }
        let Some(node) = self.nodes.get(to.0 as usize).cloned() else { return };
        let needs_read = matches!(&message, Message::FetchReply { batches, .. }
            if batches.iter().any(|b| b.payload.is_empty()));
        if !needs_read {
            host.send(&node, &self.stream, self.shard, self.me, &message);
            return;
        }
        self.send_once_read(host, node, move |log, shard| async move {
            fill_from_storage(&log, shard, message).await
        });
    }

    /// Gives the subscribers' tail every batch that became committed and is in storage (a
    /// reader that misses the tail reads storage up to `fed`).
    fn feed_tail(&self) {
        let replica = self.replica.borrow();
        let committed = replica.visible_end().min(replica.log().end());
        let fed = self.fed.get();
        if committed <= fed {
            return;
        }
        let batches = replica.log().batches();
        let start = batches.partition_point(|b| b.end() <= fed);
        for b in &batches[start..] {
            if b.base >= committed {
                break;
            }
            if b.payload.is_empty() {
                continue; // released: subscribers read it from storage
            }
            match payload::decode(&b.payload, b.records) {
                Ok((ts, records)) => self.entry.tails.with(self.shard, |t| {
                    t.handle_append(Instant::now(), self.shard, b.base, ts, records)
                }),
                Err(e) => {
                    tracing::warn!(stream = %self.stream, shard = self.shard.0, error = %e, "tail feed")
                }
            }
        }
        self.fed.set(committed);
    }

    /// Payloads of committed batches below the returned offset leave memory: the newest
    /// `resident_bytes` stay for fetches and the tail.
    fn resident_start(&self, committed: Offset) -> Offset {
        self.replica.borrow().log().keeping_last_bytes(committed, self.resident_bytes)
    }

    /// Answers every waiting append with `OutcomeUnknown` (the broker's lease ran out: none
    /// can be acked here until it is confirmed again, if ever; but each is in this log, and a
    /// new leader may keep it). An idempotent client sends them again (stored once); a plain
    /// one is told the outcome is unknown, not that nothing was stored. The state machine's
    /// late ack of one, if the lease comes back, finds no waiter.
    pub fn refuse_waiting(&self) {
        let waiting: Vec<u64> = self.waiters.borrow().keys().copied().collect();
        for id in waiting {
            self.answer(RequestId(id), Err(AppendError::OutcomeUnknown { leader: None }));
        }
    }

    /// Hands `op` to the disk task; false (and the replica stops) if its queue is full.
    fn queue_disk(&self, op: DiskOp) -> bool {
        let queued = self.disk_tx.borrow().as_ref().is_some_and(|tx| tx.try_send(op).is_ok());
        if !queued {
            self.fail("the disk queue is full");
        }
        queued
    }

    /// Stops the replica for good (its host replaces it): waiting appends are refused, no
    /// input reaches the state machine any more, and its disk task ends once the operations
    /// already queued are done ([`ShardReplica::stopped`]).
    pub fn stop(&self) {
        self.failed.set(true);
        for (_, (tx, _)) in self.waiters.borrow_mut().drain() {
            let _ = tx.send(Err(AppendError::OutcomeUnknown { leader: None }));
        }
        self.disk_tx.borrow_mut().take();
    }

    /// Runs the disk task ([`ShardReplica::run_disk`]) on this core.
    pub fn spawn_disk(self: &Rc<Self>, host: Rc<Host>, rx: LocalReceiver<DiskOp>) {
        let task = glommio::spawn_local(self.clone().run_disk(host, rx)).detach();
        *self.disk_task.borrow_mut() = Some(task);
    }

    /// Resolves once the disk task has ended: after [`ShardReplica::stop`], when everything it
    /// was given is in storage (or failed), so another replica may recover the shard's log.
    pub async fn stopped(&self) {
        let task = self.disk_task.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
    }

    /// Stops the replica after a storage failure: waiting appends are refused, nothing more is
    /// written or acked here until the broker restarts (the other replicas carry on; the
    /// leader drops this one from the in-sync set).
    fn fail(&self, why: &str) {
        if self.failed.replace(true) {
            return;
        }
        tracing::error!(stream = %self.stream, shard = self.shard.0, "replica stopped: {why}");
        for (_, (tx, _)) in self.waiters.borrow_mut().drain() {
            let _ = tx.send(Err(AppendError::OutcomeUnknown { leader: None }));
        }
    }

    /// Executes the disk operations in order, queueing consecutive writes in storage at once
    /// (group commit) and reporting completions in order.
    pub async fn run_disk(self: Rc<Self>, host: Rc<Host>, rx: LocalReceiver<DiskOp>) {
        let mut inflight: VecDeque<(Option<DiskOpId>, Pending)> = VecDeque::new();
        let mut queued: VecDeque<DiskOp> = VecDeque::new();
        loop {
            if queued.is_empty() {
                if let Some((id, fut)) = inflight.pop_front() {
                    // Take what else arrived while the oldest write completes.
                    let r = fut.await;
                    if !self.completed(&host, id, r) {
                        return;
                    }
                    while let Some(Some(op)) = poll_once(rx.recv()).await {
                        queued.push_back(op);
                    }
                    continue;
                }
                match rx.recv().await {
                    Some(op) => queued.push_back(op),
                    None => return,
                }
            }
            let Some(op) = queued.pop_front() else { continue };
            match op {
                DiskOp::Write { id, batches } => {
                    let n = batches.len();
                    for (i, b) in batches.into_iter().enumerate() {
                        // Queued in storage now, in order; awaited later.
                        inflight.push_back((None, self.write(b)));
                        if i + 1 == n {
                            if let Some(last) = inflight.back_mut() {
                                last.0 = Some(id);
                            }
                        }
                    }
                }
                DiskOp::Sync { id } | DiskOp::Truncate { id, .. } => {
                    while let Some((done, fut)) = inflight.pop_front() {
                        let r = fut.await;
                        if !self.completed(&host, done, r) {
                            return;
                        }
                    }
                    let r = match op {
                        DiskOp::Truncate { to, .. } => {
                            self.log.truncate_shard(self.shard, to).await
                        }
                        _ => self.log.flush().await,
                    };
                    if !self.completed(&host, Some(id), r) {
                        return;
                    }
                }
            }
        }
    }

    /// The storage append of one replicated batch, at its offset, stamped with its epoch:
    /// queued when this returns (so batches are stored in call order), done when the returned
    /// future is.
    fn write(&self, b: Batch) -> Pending {
        let queued = payload::decode(&b.payload, b.records)
            .map_err(|e| StorageError::Io {
                context: "decoding a replicated batch",
                path: std::path::PathBuf::new(),
                source: std::io::Error::other(e),
            })
            .and_then(|(ts, records)| {
                let meta = BatchMeta {
                    producer: b.producer.map(|p| ProducerTag {
                        producer: felix_proto::ProducerId(p.producer.0),
                        seq: p.seq.0,
                    }),
                    epoch: Some(b.epoch.0),
                    expected_base: Some(b.base),
                };
                self.log.submit(self.shard, &records, ts, felix_proto::AckMode::Written, meta)
            });
        match queued {
            Ok(appending) => Box::pin(async move { appending.done().await.map(|_| ()) }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    /// Reports a completed operation; false (and the replica stops) if it failed.
    fn completed(
        &self,
        host: &Rc<Host>,
        id: Option<DiskOpId>,
        r: Result<(), StorageError>,
    ) -> bool {
        if let Err(e) = r {
            self.fail(&format!("storage: {e}"));
            return false;
        }
        if let Some(id) = id {
            let now = host.now();
            self.with(host, |r| r.handle_disk_done(now, id));
        }
        true
    }
}

/// Every batch of `shard` in `log`, as the state machine's batches; the payloads of all but
/// the newest `resident_bytes` left out (read back when a fetch needs them).
async fn recover(
    log: &StreamLog,
    shard: ShardId,
    resident_bytes: u64,
    producers: felix_replication::ProducerLimits,
) -> Result<ReplicaLog, String> {
    let mut at = log.start_offset(shard).map_err(|e| e.to_string())?;
    if at.0 != 0 {
        return Err(format!(
            "{shard} starts at {} (retention): not supported on replicated streams",
            at.0
        ));
    }
    let mut recovered = ReplicaLog::with_producer_limits(producers);
    if let Some(from_checkpoint) = from_checkpoint(log, shard, producers).await {
        at = from_checkpoint.end();
        recovered = from_checkpoint;
    }
    let mut out: Vec<(Batch, u64)> = Vec::new();
    let (mut resident, mut released) = (0u64, 0usize);
    loop {
        let read = log.read(shard, at, RECOVERY_READ_BYTES).await.map_err(|e| e.to_string())?;
        let Some(last) = read.last() else { break };
        at = Offset(last.base_offset.0 + last.records.len() as u64);
        for b in read {
            let b = to_batch(b);
            let bytes = b.payload.len() as u64;
            resident += bytes;
            out.push((b, bytes));
        }
        // Keep only the newest payloads in memory while reading.
        while resident > resident_bytes && released + 1 < out.len() {
            resident -= out[released].1;
            out[released].0.payload = Bytes::new();
            released += 1;
        }
    }
    let (archived, after) = (recovered.archived_end().0, out.len());
    for (batch, bytes) in out {
        recovered.append_sized(batch, bytes).map_err(|e| format!("recovered log: {e}"))?;
    }
    tracing::info!(
        shard = shard.0,
        checkpoint_end = archived,
        batches_after = after,
        "replica log recovered"
    );
    Ok(recovered)
}

/// The sidecar file holding the checkpoint of `shard`'s replica log.
fn checkpoint_name(shard: ShardId) -> String {
    format!("replica-{}.ckpt", shard.0)
}

/// The replica log as of `shard`'s checkpoint, if there is one that is whole, made with these
/// producer limits, and whose last batch storage holds as it says (else the log is read from
/// its start, and the next archive writes a new checkpoint).
async fn from_checkpoint(
    log: &StreamLog,
    shard: ShardId,
    producers: felix_replication::ProducerLimits,
) -> Option<ReplicaLog> {
    let bytes = match log.read_sidecar(&checkpoint_name(shard)).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(shard = shard.0, error = %e, "reading the replica checkpoint; reading the whole log");
            return None;
        }
    };
    let (recovered, (base, records, epoch)) = match ReplicaLog::from_checkpoint(&bytes, producers) {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(shard = shard.0, error = %e, "replica checkpoint not used; reading the whole log");
            return None;
        }
    };
    let stored = log.read(shard, base, 1).await.ok().and_then(|r| r.into_iter().next());
    let matches = stored.as_ref().is_some_and(|b| {
        b.base_offset == base
            && b.records.len() as u32 == records
            && b.epoch.unwrap_or(0) == epoch.0
    });
    if !matches {
        tracing::warn!(
            shard = shard.0,
            checkpoint_end = recovered.archived_end().0,
            "the replica checkpoint's last batch is not in the log as it says; reading the whole log"
        );
        return None;
    }
    Some(recovered)
}

fn to_batch(b: felix_storage::StoredBatch) -> Batch {
    Batch {
        epoch: Epoch(b.epoch.unwrap_or(0)),
        base: b.base_offset,
        records: b.records.len() as u32,
        producer: b
            .producer
            .map(|t| ProducerSeq { producer: ProducerId(t.producer.0), seq: Seq(t.seq) }),
        time_ms: b.first_timestamp_ms,
        payload: payload::encode(b.first_timestamp_ms, &b.records),
    }
}

/// A fetch reply to read from storage ([`Output::FetchFromLog`]).
struct ArchivedRead {
    epoch: Epoch,
    from: Offset,
    upto: Offset,
    committed: Offset,
    bytes_max: u64,
}

/// The fetch reply `read` asks for, its batches read from storage: those from `read.from` on
/// that end at or below `read.upto`, at least one and at most `read.bytes_max` bytes otherwise.
/// `None` when storage has no batch starting at `read.from` (the follower asks again).
async fn read_archived(log: &StreamLog, shard: ShardId, read: ArchivedRead) -> Option<Message> {
    let ArchivedRead { epoch, from, upto, committed, bytes_max } = read;
    let stored = match log.read(shard, from, bytes_max as usize).await {
        Ok(stored) => stored,
        Err(e) => {
            tracing::warn!(shard = shard.0, error = %e, "reading archived batches for a follower");
            return None;
        }
    };
    if stored.first().is_none_or(|b| b.base_offset != from) {
        tracing::warn!(
            shard = shard.0,
            from = from.0,
            "no stored batch starts where a follower fetches"
        );
        return None;
    }
    let (mut batches, mut bytes) = (Vec::new(), 0);
    for b in stored.into_iter().map(to_batch) {
        bytes += b.size_bytes();
        if b.end() > upto || (!batches.is_empty() && bytes > bytes_max) {
            break;
        }
        batches.push(b);
    }
    if batches.is_empty() {
        return None;
    }
    Some(Message::FetchReply { epoch, from, batches, committed })
}

/// `message` (a fetch reply) with the payloads it lacks read from storage; cut short at the
/// first batch storage cannot give (the follower fetches the rest again). `None` when not
/// even the first can be read.
async fn fill_from_storage(log: &StreamLog, shard: ShardId, message: Message) -> Option<Message> {
    let Message::FetchReply { epoch, from, batches, committed } = message else {
        return Some(message);
    };
    let mut out = Vec::with_capacity(batches.len());
    for mut b in batches {
        if b.payload.is_empty() {
            let read = match log.read(shard, b.base, 1).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(shard = shard.0, error = %e, "reading a batch for a follower");
                    break;
                }
            };
            match read.into_iter().next() {
                // The same batch: offsets, epoch and producer tag (storage below the written
                // end holds the log's batches; a mismatch ends the reply, the follower asks
                // again).
                Some(s)
                    if s.base_offset == b.base
                        && s.records.len() as u32 == b.records
                        && s.epoch.unwrap_or(0) == b.epoch.0
                        && s.producer.map(|t| (t.producer.0, t.seq))
                            == b.producer.map(|p| (p.producer.0, p.seq.0)) =>
                {
                    b.payload = payload::encode(s.first_timestamp_ms, &s.records);
                }
                _ => break,
            }
        }
        out.push(b);
    }
    if out.is_empty() {
        return None;
    }
    Some(Message::FetchReply { epoch, from, batches: out, committed })
}
