//! The I/O side of one replicated shard on this core ([`ShardShell`]): the appends waiting for
//! the driver's answers, the ordered execution of its disk operations through
//! `felix-storage`, the subscribers' tail it feeds, its checkpoint writes; and the storage
//! reads the driver asks for (recovery, archived batches, released payloads).
//!
//! Everything here runs on the shard's core; the decisions are the driver's
//! (`felix_replication::driver`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use bytes::Bytes;
use felix_proto::{Offset, ProducerTag, ShardId};
use felix_replication::{
    AppendError, AppendId, Batch, DiskOp, DiskOpId, Epoch, Message, ProducerId, ProducerSeq,
    ReplicaLog, Seq, ShardKey,
};
use felix_storage::{BatchMeta, StorageError, StreamLog};
use futures_lite::future::poll_once;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use tokio::sync::oneshot;

use super::payload;
use super::{ReplicationShell, TailFeed, RECOVERY_READ_BYTES};

/// What an append waits for: the base offset its records got, or why it was refused.
pub type AppendResult = Result<Offset, AppendError>;

/// An append waiting for its answer, with its producer tag (for the log).
type Waiter = (oneshot::Sender<AppendResult>, Option<ProducerSeq>);

/// A queued storage operation's completion, reported in order.
type Pending = Pin<Box<dyn Future<Output = Result<(), StorageError>>>>;

/// The I/O side of one replicated shard on this core.
pub struct ShardShell {
    key: ShardKey,
    shard: ShardId,
    /// The appends the driver has not answered, by the driver's request id.
    waiters: RefCell<HashMap<AppendId, Waiter>>,
    /// The disk task's queue; taken by [`ShardShell::stop`], which ends that task once it has
    /// done what was queued.
    disk_tx: RefCell<Option<LocalSender<DiskOp>>>,
    /// The disk task, awaited by [`ShardShell::stopped`].
    disk_task: RefCell<Option<glommio::task::JoinHandle<()>>>,
    log: StreamLog,
    tail: Rc<dyn TailFeed>,
    /// A checkpoint write is in flight (`save_checkpoint`).
    checkpointing: Rc<Cell<bool>>,
}

impl ShardShell {
    /// The shell of `key`'s replica on `log`, its disk task running.
    pub fn open(
        host: &Rc<ReplicationShell>,
        key: ShardKey,
        tail: Rc<dyn TailFeed>,
        log: StreamLog,
    ) -> Rc<Self> {
        let (disk_tx, disk_rx) = local_channel::new_bounded(super::DISK_OPS_MAX);
        let shell = Rc::new(ShardShell {
            shard: ShardId(key.shard),
            key,
            waiters: RefCell::default(),
            disk_tx: RefCell::new(Some(disk_tx)),
            disk_task: RefCell::default(),
            log,
            tail,
            checkpointing: Rc::default(),
        });
        let task = glommio::spawn_local(shell.clone().run_disk(host.clone(), disk_rx)).detach();
        *shell.disk_task.borrow_mut() = Some(task);
        shell
    }

    /// The shard's stored log.
    pub fn log(&self) -> &StreamLog {
        &self.log
    }

    /// Registers the append `id` (the driver's); resolves with the driver's answer.
    pub fn wait(
        &self,
        id: AppendId,
        producer: Option<ProducerSeq>,
    ) -> oneshot::Receiver<AppendResult> {
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().insert(id, (tx, producer));
        rx
    }

    /// Answers the append `request`.
    pub fn answer(&self, request: AppendId, result: AppendResult) {
        let Some((tx, producer)) = self.waiters.borrow_mut().remove(&request) else { return };
        if let Some(p) = producer {
            let (stream, shard) = (&self.key.stream, self.key.shard);
            match &result {
                Ok(base) => tracing::trace!(%stream, shard, producer = p.producer.0,
                    seq = p.seq.0, base = base.0, "append acked"),
                Err(error) => tracing::debug!(%stream, shard, producer = p.producer.0,
                    seq = p.seq.0, %error, "append refused"),
            }
        }
        let _ = tx.send(result);
    }

    /// Gives the subscribers' tail these committed batches.
    pub fn feed_tail(&self, batches: &[Batch]) {
        for b in batches {
            match payload::decode(&b.payload, b.records) {
                Ok((ts, records)) => self.tail.feed(self.shard, b.base, ts, records),
                Err(e) => {
                    tracing::warn!(stream = %self.key.stream, shard = self.shard.0, error = %e, "tail feed")
                }
            }
        }
    }

    /// Writes the checkpoint of the log's archived prefix beside the log
    /// (`replica-<shard>.ckpt`), so a restart reads only the batches after it. One write at a
    /// time: an archive while one is in flight is saved by the next (any checkpoint of the
    /// archive is valid: archived batches are committed and never truncated).
    pub fn save_checkpoint(&self, bytes: Vec<u8>) {
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

    /// Hands `op` to the disk task; false if its queue is full (the driver stops the replica).
    pub fn queue_disk(&self, op: DiskOp) -> bool {
        self.disk_tx.borrow().as_ref().is_some_and(|tx| tx.try_send(op).is_ok())
    }

    /// Stops the shell: appends still waiting (none, the driver answered them) are told the
    /// outcome is unknown, and the disk task ends once the operations already queued are done
    /// ([`ShardShell::stopped`]).
    pub fn stop(&self) {
        for (_, (tx, _)) in self.waiters.borrow_mut().drain() {
            let _ = tx.send(Err(AppendError::OutcomeUnknown { leader: None }));
        }
        self.disk_tx.borrow_mut().take();
    }

    /// Resolves once the disk task has ended: after [`ShardShell::stop`], when everything it
    /// was given is in storage (or failed), so another replica may recover the shard's log.
    pub async fn stopped(&self) {
        let task = self.disk_task.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
    }

    /// Executes the disk operations in order, queueing consecutive writes in storage at once
    /// (group commit) and reporting completions in order.
    async fn run_disk(self: Rc<Self>, host: Rc<ReplicationShell>, rx: LocalReceiver<DiskOp>) {
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
        host: &Rc<ReplicationShell>,
        id: Option<DiskOpId>,
        r: Result<(), StorageError>,
    ) -> bool {
        if let Err(e) = r {
            host.fail(&self.key, format!("storage: {e}"));
            return false;
        }
        if let Some(id) = id {
            host.disk_done(&self.key, id);
        }
        true
    }
}

/// Every batch of `shard` in `log`, as the state machine's batches; the payloads of all but
/// the newest `resident_bytes` left out (read back when a fetch needs them).
pub async fn recover(
    log: &StreamLog,
    shard: ShardId,
    resident_bytes: u64,
    producers: felix_replication::ProducerLimits,
) -> Result<ReplicaLog, String> {
    // Retention may have deleted the log's oldest segments: the log starts there, knowing
    // epochs and producers from there on, unless the checkpoint (whose last batch storage
    // still holds) knows them from further back.
    let start = log.start_offset(shard).map_err(|e| e.to_string())?;
    let mut at = start;
    let mut recovered = ReplicaLog::starting_at(start, producers);
    if let Some(mut from_checkpoint) = from_checkpoint(log, shard, producers).await {
        if from_checkpoint.origin() <= start {
            from_checkpoint.raise_start(start);
            at = from_checkpoint.end();
            recovered = from_checkpoint;
        }
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
pub struct ArchivedRead {
    pub epoch: Epoch,
    pub from: Offset,
    pub upto: Offset,
    pub committed: Offset,
    pub log_start: Offset,
    pub bytes_max: u64,
}

/// The fetch reply `read` asks for, its batches read from storage: those from `read.from` on
/// that end at or below `read.upto`, at least one and at most `read.bytes_max` bytes otherwise.
/// `None` when storage has no batch starting at `read.from` (the follower asks again).
pub async fn read_archived(log: &StreamLog, shard: ShardId, read: ArchivedRead) -> Option<Message> {
    let ArchivedRead { epoch, from, upto, committed, log_start, bytes_max } = read;
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
        tracing::warn!(
            shard = shard.0,
            from = from.0,
            upto = upto.0,
            "the stored batch where a follower fetches ends past the archive"
        );
        return None;
    }
    Some(Message::FetchReply { epoch, from, batches, committed, log_start })
}

/// `message` (a fetch reply) with the payloads it lacks read from storage; cut short at the
/// first batch storage cannot give (the follower fetches the rest again). `None` when not
/// even the first can be read.
pub async fn fill_from_storage(
    log: &StreamLog,
    shard: ShardId,
    message: Message,
) -> Option<Message> {
    let Message::FetchReply { epoch, from, batches, committed, log_start } = message else {
        return Some(message);
    };
    let mut out = Vec::with_capacity(batches.len());
    for mut b in batches {
        if b.payload.is_empty() {
            let read = match log.read(shard, b.base, 1).await {
                Ok(read) => read,
                // Retention deleted it after the reply was made: the fetch was a stale one (a
                // follower's log never ends below its leader's start); it asks again.
                Err(e @ StorageError::OffsetBeforeStart { .. }) => {
                    tracing::debug!(shard = shard.0, error = %e, "a stale fetch of deleted batches");
                    break;
                }
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
                other => {
                    tracing::warn!(shard = shard.0, base = b.base.0, records = b.records, epoch = b.epoch.0,
                        stored = ?other.map(|s| (s.base_offset, s.records.len(), s.epoch)), "a released batch is not in storage as the log has it");
                    break;
                }
            }
        }
        out.push(b);
    }
    if out.is_empty() {
        return None;
    }
    Some(Message::FetchReply { epoch, from, batches: out, committed, log_start })
}
