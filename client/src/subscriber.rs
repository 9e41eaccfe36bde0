//! The subscriber: one subscription made of parts (one per broker core that owns some of its
//! shards, below; in a cluster per broker and core), merged, records with their shard and
//! offset, consumer-group commits.
//!
//! Call order: [`crate::Client::subscribe`] with [`SubscribeOptions`], then [`Subscriber::next`]
//! in a loop; with a group, [`Subscriber::commit_consumed`] (or [`Subscriber::commit`]) whenever
//! the application has processed what it received. Records are read straight from the
//! subscription's QUIC stream, so a slow reader slows the broker's sending (flow control), and
//! nothing is buffered beyond one decoded batch per part.
//!
//! With `ClientConfig::subscribe_per_core` (the default), the shards of one broker are grouped
//! by the core that owns them (`s % core_count`), and each group is a part of its own, on the
//! pool's connection owned by that core: every core of the broker encrypts and sends its own
//! shards' records and reads them from its own logs, instead of one connection's core sending
//! them all (and reading the other cores' shards over the core mesh). A subscription to every
//! shard of a stream asks the broker how many shards it has first (DescribeStream); when that
//! fails, or the pool reaches one core, the subscription is one part as without the option.
//!
//! In a cluster, the shards to read (all of the placement's, or those asked for) are grouped by
//! owner (and by the owner's core, as above), and each group gets a Subscribe naming its
//! shards; a part refused with `NotOwner` is grouped again after a fresh placement, and an
//! unavailable shard is retried within `cluster::SHARD_UNAVAILABLE_DEADLINE_MS`. Commits go to
//! the part that reads the shard, on its owner, following `NotOwner` like the publisher.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use felix_proto::{
    CommitOffset, ErrorCode, Frame, FrameType, Offset, ShardId, StartAt, Subscribe, SubscribeOk,
    SubscriptionId,
};

use crate::client::Client;
use crate::cluster::{is_unreachable, Cluster, Patience, NOT_OWNER_REDIRECTS_MAX};
use crate::conn::{unexpected, Conn, SubStream};
use crate::error::ClientError;

/// Bytes asked of quinn per read.
const READ_CHUNK_BYTES: usize = 256 * 1024;

/// What to subscribe to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// `tenant/namespace/stream`.
    pub stream: String,
    /// Where each shard starts (for a group: only where it has no committed position).
    pub start: StartAt,
    /// A consumer group: resume from its committed positions; enables commits.
    pub group: Option<String>,
    /// The shards to read; `None` reads all.
    pub shards: Option<Vec<ShardId>>,
    /// Whether a lost connection resumes the subscription on a fresh one (see
    /// [`Subscriber::next`]).
    pub resume: bool,
}

impl SubscribeOptions {
    /// Every shard of `stream`, from the next record stored, no group.
    pub fn new(stream: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            start: StartAt::Latest,
            group: None,
            shards: None,
            resume: true,
        }
    }

    /// Sets where the subscription starts.
    pub fn start(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// Sets the consumer group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Restricts the subscription to `shards`.
    pub fn shards(mut self, shards: Vec<ShardId>) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Turns resuming after a lost connection on or off (default on).
    pub fn resume(mut self, resume: bool) -> Self {
        self.resume = resume;
        self
    }
}

/// A record received from a subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedRecord {
    /// The shard it was stored in.
    pub shard: ShardId,
    /// Its offset in the shard.
    pub offset: Offset,
    /// When its batch was stored (Unix ms).
    pub timestamp_ms: u64,
    /// Its key, if any.
    pub key: Option<Bytes>,
    /// Its payload.
    pub value: Bytes,
}

/// A running subscription.
pub struct Subscriber {
    client: Client,
    options: SubscribeOptions,
    /// One per broker core the subscription reads from (see the module); one when it is not
    /// split.
    parts: Vec<Part>,
    /// Whether the parts name their shards (split by core, or in a cluster): a resumed part
    /// then asks for its own shards again.
    split: bool,
    /// The shards read, over every part, sorted.
    shards: Vec<ShardId>,
    /// The part read first next time (the parts take turns).
    next_part: usize,
    buffered: VecDeque<ReceivedRecord>,
    /// The next offset to read per shard, from the records handed out.
    consumed: BTreeMap<ShardId, Offset>,
    /// What this subscriber committed per shard (`commit` takes `&self`, hence the lock; it is
    /// never held across an await).
    committed: std::sync::Mutex<BTreeMap<ShardId, Offset>>,
    resumes: u64,
    /// Records skipped because retention deleted them before they were read.
    skipped: u64,
}

/// One Subscribe on one connection and the stream it delivers on.
struct Part {
    conn: Arc<Conn>,
    id: SubscriptionId,
    shards: Vec<ShardId>,
    stream: SubStream,
    ended: bool,
    /// The broker reset the stream with `ShuttingDown`: the part is to resume.
    stopping: bool,
}

impl Subscriber {
    pub(crate) async fn start(
        client: Client,
        options: SubscribeOptions,
    ) -> Result<Self, ClientError> {
        let per_core = client.shared.config.subscribe_per_core;
        let (parts, split) = match client.shared.cluster.clone() {
            Some(cluster) => {
                let shards = options.shards.clone();
                (open_in_cluster(&cluster, &options, shards, options.start, per_core).await?, true)
            }
            None => open_at_home(&client, &options, options.shards.clone(), options.start).await?,
        };
        let mut sub = Self {
            client,
            options,
            parts,
            split,
            shards: Vec::new(),
            next_part: 0,
            buffered: VecDeque::new(),
            consumed: BTreeMap::new(),
            committed: std::sync::Mutex::new(BTreeMap::new()),
            resumes: 0,
            skipped: 0,
        };
        sub.update_shards();
        Ok(sub)
    }

    /// How many times the subscription resumed after a lost connection.
    pub fn resumes(&self) -> u64 {
        self.resumes
    }

    /// How many records of the shards read were skipped because retention deleted them
    /// before this subscriber read them: a shard whose next record is gone continues at its
    /// oldest retained one (when the broker's reading falls behind retention, or when a resume
    /// finds the position it needs deleted). Each skip is also logged.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The broker's id for this subscription (of its first part, when it has several).
    pub fn id(&self) -> SubscriptionId {
        self.parts.first().map_or(SubscriptionId(0), |p| p.id)
    }

    /// The shards this subscription reads (from the SubscribeOk answers).
    pub fn shards(&self) -> &[ShardId] {
        &self.shards
    }

    /// How many parts the subscription is made of: one per broker core it reads from (see the
    /// module), or one when it is not split.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// The options it was started with.
    pub fn options(&self) -> &SubscribeOptions {
        &self.options
    }

    /// The next record; `Ok(None)` once the broker has finished every part's stream.
    /// Cancel-safe: dropping the future loses no record. An error that ends one part (its
    /// stream reset, or a lost connection it cannot resume from) is returned once; the other
    /// parts go on, and their records come on later calls.
    ///
    /// When the connection is lost and `resume` is on, the part on that connection (in a
    /// cluster: at its shards' current owners) is opened again on a fresh
    /// connection (with the client's reconnect backoff) and records already returned are
    /// skipped, so nothing is returned twice and nothing is missed. It resumes from the next
    /// offset (a single shard that returned records), from the group's commits (with a group),
    /// or from the original start (earliest, an offset or a time). A subscription that started
    /// at `Latest` over several shards, without a commit of this subscriber on each of them
    /// (or on one shard before its first record; in a cluster, where positions are not
    /// replicated, always), cannot resume without possibly missing records: it fails with
    /// `ConnectionLost` instead. A stopping broker resets its subscription streams with
    /// `ShuttingDown`: the part resumes the same way once the connection is closed (it fails
    /// with `ConnectionLost` when it cannot resume), and never ends with `Ok(None)`. Where records
    /// were deleted by retention before they were read, a shard continues at its oldest
    /// retained record (see [`Subscriber::skipped`]).
    pub async fn next(&mut self) -> Result<Option<ReceivedRecord>, ClientError> {
        loop {
            if let Some(r) = self.buffered.pop_front() {
                if let Some(next) = self.consumed.get(&r.shard).copied() {
                    if r.offset < next {
                        continue; // returned before a resume
                    }
                    if r.offset > next {
                        let gap = r.offset.0 - next.0;
                        tracing::warn!(
                            stream = %self.options.stream, shard = r.shard.0, from = next.0, gap,
                            "records deleted by retention before they were read are skipped"
                        );
                        self.skipped += gap;
                    }
                }
                self.consumed.insert(r.shard, Offset(r.offset.0 + 1));
                return Ok(Some(r));
            }
            if self.parts.iter().all(|p| p.ended) {
                return Ok(None);
            }
            if let Some(i) = self.parts.iter().position(|p| p.stopping && !p.ended) {
                // The broker is stopping (a restart, say): it closes the connection once it
                // has drained, and the part resumes on a fresh one. A part whose resume is
                // cancelled (this future dropped) or fails is resumed again next time.
                let conn = self.parts[i].conn.clone();
                conn.closed_within(conn.ack_timeout()).await;
                let lost = ClientError::ConnectionLost("the broker is shutting down".into());
                self.resume_after(i, lost).await?;
                continue;
            }
            self.decode_buffered()?;
            if !self.buffered.is_empty() {
                continue;
            }
            let (i, read) = self.read_any().await;
            match read {
                Ok(Some(chunk)) => self.parts[i].stream.decoder.handle_chunk(chunk),
                Ok(None) => self.parts[i].ended = true,
                Err(quinn::ReadError::Reset(code)) => {
                    let code = u16::try_from(code.into_inner())
                        .map_or(ErrorCode::Unknown, ErrorCode::from_u16);
                    if code == ErrorCode::ShuttingDown {
                        // Resumed above, next time round (the stream reads as ended now).
                        self.parts[i].stopping = true;
                        continue;
                    }
                    self.parts[i].ended = true;
                    let message = "the broker reset the subscription stream".to_owned();
                    return Err(ClientError::Broker { code, message });
                }
                Err(e) => {
                    let lost = ClientError::ConnectionLost(e.to_string());
                    self.resume_after(i, lost).await?;
                }
            }
        }
    }

    /// Decodes what the parts have received, until some records are buffered.
    fn decode_buffered(&mut self) -> Result<(), ClientError> {
        let n = self.parts.len();
        for k in 0..n {
            let part = &mut self.parts[(self.next_part + k) % n];
            while let Some(item) = part.stream.decoder.poll_frame() {
                match item {
                    Ok(Frame::EventBatch(b)) => {
                        // Offsets end below u64::MAX (the next offset after each record is
                        // computed unchecked below).
                        if b.base_offset.0.checked_add(b.records.len() as u64).is_none() {
                            return Err(ClientError::Protocol(format!(
                                "EventBatch of {} at offset {} runs past the last offset",
                                b.shard, b.base_offset.0
                            )));
                        }
                        for (i, rec) in b.records.into_iter().enumerate() {
                            self.buffered.push_back(ReceivedRecord {
                                shard: b.shard,
                                offset: Offset(b.base_offset.0 + i as u64),
                                timestamp_ms: b.timestamp_ms,
                                key: rec.key,
                                value: rec.value.into_bytes(),
                            });
                        }
                    }
                    Ok(Frame::Error(e)) => {
                        return Err(ClientError::from_broker(e.code, e.message));
                    }
                    Ok(Frame::Ping(_) | Frame::Pong(_)) => {}
                    Ok(other) => return Err(unexpected(&other, FrameType::EventBatch)),
                    Err(e) if e.fatal => {
                        part.ended = true;
                        return Err(ClientError::Protocol(format!("subscription framing: {e}")));
                    }
                    Err(e) => tracing::warn!(error = %e, "undecodable frame on a subscription"),
                }
                if !self.buffered.is_empty() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Reads the next chunk of whichever part has one first (the parts take turns at being
    /// polled first). Cancel-safe: quinn's `read_chunk` is.
    async fn read_any(&mut self) -> (usize, Result<Option<Bytes>, quinn::ReadError>) {
        let n = self.parts.len();
        let first = self.next_part % n;
        self.next_part = self.next_part.wrapping_add(1);
        let chunk =
            |r: Result<Option<quinn::Chunk>, quinn::ReadError>| r.map(|c| c.map(|c| c.bytes));
        if n == 1 {
            return (0, chunk(self.parts[0].stream.recv.read_chunk(READ_CHUNK_BYTES, true).await));
        }
        let mut reads: Vec<_> = self
            .parts
            .iter_mut()
            .enumerate()
            .filter(|(_, p)| !p.ended)
            .map(|(i, p)| {
                Box::pin(async move {
                    (i, chunk(p.stream.recv.read_chunk(READ_CHUNK_BYTES, true).await))
                })
            })
            .collect();
        // `next` reads only while some part has not ended: `reads` is not empty.
        let k = reads.len();
        let start = first % k.max(1);
        std::future::poll_fn(|cx| {
            for j in 0..k {
                if let Poll::Ready(x) = reads[(start + j) % k].as_mut().poll(cx) {
                    return Poll::Ready(x);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Opens part `i` again after `lost`, or returns `lost` when it cannot resume.
    async fn resume_after(&mut self, i: usize, lost: ClientError) -> Result<(), ClientError> {
        let Some(start) = self.resume_start(&self.parts[i].shards) else {
            self.parts[i].ended = true;
            return Err(lost);
        };
        tracing::warn!(error = %lost, stream = %self.options.stream, "resuming subscription");
        // Whatever was decoded but not returned from this part is read again.
        let shards = self.parts[i].shards.clone();
        self.buffered.retain(|r| !shards.contains(&r.shard));
        let fresh = match self.open_again(&shards, start).await {
            // Retention deleted records past the position while the part was away: it
            // continues at the oldest retained one (`next` counts what was skipped); what it
            // returned before is skipped as usual.
            Err(ClientError::Broker { code: ErrorCode::OffsetOutOfRange, message })
                if matches!(start, StartAt::Offset(_)) && shards.len() == 1 =>
            {
                tracing::warn!(
                    stream = %self.options.stream, ?start, %message,
                    "resuming at the oldest retained offset"
                );
                self.open_again(&shards, StartAt::Earliest).await?
            }
            other => other?,
        };
        self.parts.splice(i..=i, fresh);
        self.update_shards();
        self.resumes += 1;
        Ok(())
    }

    /// Opens the parts that read `shards` again, from `start`.
    async fn open_again(
        &mut self,
        shards: &[ShardId],
        start: StartAt,
    ) -> Result<Vec<Part>, ClientError> {
        let shards = shards.to_vec();
        Ok(match self.client.shared.cluster.clone() {
            Some(cluster) => {
                cluster.invalidate(&self.options.stream);
                let per_core = self.client.shared.config.subscribe_per_core;
                open_in_cluster(&cluster, &self.options, Some(shards), start, per_core).await?
            }
            None => {
                let shards = if self.split { Some(shards) } else { self.options.shards.clone() };
                let (parts, split) =
                    open_at_home(&self.client, &self.options, shards, start).await?;
                // A part opened whole may come back split (its stream could not be described
                // before): from then on each part asks for its own shards.
                self.split |= split;
                parts
            }
        })
    }

    /// Where a resumed part reading `shards` starts, when it can resume without missing
    /// records. The broker starts a group's shard at its commit where it has one, else at the
    /// start asked for, and `Latest` then means the end of the log at the resume: records
    /// stored during the outage would be skipped. So a resume from `Latest` needs a commit
    /// (this subscriber's) for every shard it reads, or, for one shard, what was consumed.
    fn resume_start(&self, shards: &[ShardId]) -> Option<StartAt> {
        let o = &self.options;
        if !o.resume {
            return None;
        }
        if let [shard] = shards[..] {
            if let Some(next) = self.consumed.get(&shard) {
                // With a group the broker still prefers the group's commit (the records
                // between it and here are skipped as returned before).
                return Some(StartAt::Offset(*next));
            }
        }
        if o.start != StartAt::Latest {
            // Earliest, an offset or a time: read again, what was returned is skipped.
            return Some(o.start);
        }
        // In a cluster a group's positions live with each shard's leader and are not
        // replicated: after a failover the new leader knows none, and would start at Latest.
        if self.client.shared.cluster.is_some() {
            return None;
        }
        let committed = self.committed_positions();
        (o.group.is_some() && shards.iter().all(|s| committed.contains_key(s))).then_some(o.start)
    }

    fn update_shards(&mut self) {
        let mut shards: Vec<ShardId> =
            self.parts.iter().flat_map(|p| p.shards.iter().copied()).collect();
        shards.sort_unstable();
        shards.dedup();
        self.shards = shards;
    }

    /// Commits that the group has consumed `shard` up to, not including, `next_offset`.
    /// Needs a group and the broker's `CONSUMER_GROUPS` capability. In a cluster the commit
    /// goes to the shard's owner.
    pub async fn commit(&self, shard: ShardId, next_offset: Offset) -> Result<(), ClientError> {
        let Some(group) = &self.options.group else {
            return Err(ClientError::InvalidArgument("commit needs a consumer group".into()));
        };
        let part = self.parts.iter().find(|p| p.shards.contains(&shard)).or(self.parts.first());
        let conn = match part {
            Some(p) => p.conn.clone(),
            None => self.client.shared.conn(0).await?,
        };
        let stream = &self.options.stream;
        let commit = |conn: Arc<Conn>| async move {
            let id = conn.next_request_id();
            let frame = Frame::CommitOffset(CommitOffset {
                request_id: id,
                stream: stream.clone(),
                group: group.clone(),
                shard,
                offset: next_offset,
            });
            conn.request(id, &frame).await
        };
        let mut answer = commit(conn).await;
        if let Some(cluster) = &self.client.shared.cluster {
            answer = cluster.follow(stream, Some(shard), answer, None, commit).await;
        }
        match answer? {
            Frame::CommitOk(_) => {
                self.committed_positions().insert(shard, next_offset);
                Ok(())
            }
            other => Err(unexpected(&other, FrameType::CommitOk)),
        }
    }

    fn committed_positions(&self) -> std::sync::MutexGuard<'_, BTreeMap<ShardId, Offset>> {
        // A panic elsewhere while it was held leaves a map that is still whole.
        self.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Commits, for every shard, the position after the last record [`Subscriber::next`]
    /// returned, unless already committed.
    pub async fn commit_consumed(&mut self) -> Result<(), ClientError> {
        let todo: Vec<(ShardId, Offset)> = self
            .consumed
            .iter()
            .filter(|(s, o)| self.committed_positions().get(s) != Some(o))
            .map(|(s, o)| (*s, *o))
            .collect();
        for (shard, offset) in todo {
            self.commit(shard, offset).await?;
        }
        Ok(())
    }
}

/// Opens a subscription to `shards` (`None`: all) on the home broker: one part per group of
/// [`per_core_groups`], each on its core's connection, or one part on the next connection.
/// Returns the parts and whether they name their shards.
async fn open_at_home(
    client: &Client,
    options: &SubscribeOptions,
    shards: Option<Vec<ShardId>>,
    start: StartAt,
) -> Result<(Vec<Part>, bool), ClientError> {
    let shared = &client.shared;
    let Some(groups) = per_core_groups(client, options, shards.as_deref()).await else {
        let conn = shared.conn(shared.home.next_slot()).await?;
        return Ok((vec![open_part(conn, options, shards, start).await?], false));
    };
    let mut parts = Vec::with_capacity(groups.len());
    for (slot, group) in groups {
        let conn = shared.conn(slot).await?;
        parts.push(open_part(conn, options, Some(group), start).await?);
    }
    Ok((parts, true))
}

/// The home pool's slots and the shards each should read, when the subscription is split by
/// core (`subscribe_per_core`): each shard goes to the slot whose connection the shard's core
/// owns ([`crate::pool::Pool::slot_for_shard`]). `None` (one part, on the next connection, as
/// asked) when the option is off, or for every shard (`shards` is `None`) when the pool reaches
/// one core, the stream cannot be described (the broker then answers the Subscribe itself:
/// created, not found, not allowed), or the shards would make one group anyway.
async fn per_core_groups(
    client: &Client,
    options: &SubscribeOptions,
    shards: Option<&[ShardId]>,
) -> Option<BTreeMap<usize, Vec<ShardId>>> {
    let home = &client.shared.home;
    if !client.shared.config.subscribe_per_core {
        return None;
    }
    let all: Vec<ShardId> = match shards {
        Some(list) => list.to_vec(),
        None => {
            let cores: BTreeSet<u16> = (0..home.len()).filter_map(|i| home.slot_core(i)).collect();
            if cores.len() < 2 {
                return None;
            }
            match client.describe_stream(&options.stream).await {
                Ok(d) if (d.shards as usize) <= felix_proto::limits::MAX_SUBSCRIBE_SHARDS => {
                    (0..d.shards).map(ShardId).collect()
                }
                Ok(_) => return None,
                Err(e) => {
                    tracing::debug!(stream = %options.stream, error = %e, "not split by core");
                    return None;
                }
            }
        }
    };
    let mut groups: BTreeMap<usize, Vec<ShardId>> = BTreeMap::new();
    for s in all {
        groups.entry(home.slot_for_shard(s)).or_default().push(s);
    }
    (shards.is_some() || groups.len() > 1).then_some(groups)
}

/// Sends Subscribe for `shards` (`None`: all) on `conn` and takes the subscription's stream.
async fn open_part(
    conn: Arc<Conn>,
    options: &SubscribeOptions,
    shards: Option<Vec<ShardId>>,
    start: StartAt,
) -> Result<Part, ClientError> {
    let id = conn.next_request_id();
    let frame = Frame::Subscribe(Subscribe {
        request_id: id,
        stream: options.stream.clone(),
        shards,
        start,
        group: options.group.clone(),
        positions: None,
    });
    let ok: SubscribeOk = match conn.request(id, &frame).await? {
        Frame::SubscribeOk(ok) => ok,
        other => return Err(unexpected(&other, FrameType::SubscribeOk)),
    };
    let stream = conn.take_subscription_stream(ok.subscription_id).await?;
    Ok(Part {
        conn,
        id: ok.subscription_id,
        shards: ok.shards,
        stream,
        ended: false,
        stopping: false,
    })
}

/// `group`, the shards owned by the broker at `address`, split by the slot of that broker's
/// pool that each shard's core owns (with `per_core`; whole without it, or when the pool
/// cannot be opened now: the connection attempt then reports why).
async fn split_by_core(
    cluster: &Cluster,
    address: String,
    group: Vec<ShardId>,
    per_core: bool,
) -> Vec<(String, Vec<ShardId>)> {
    let pool = match per_core {
        true => cluster.pool_for(&address).await.ok(),
        false => None,
    };
    let Some(pool) = pool else { return vec![(address, group)] };
    let mut by_slot: BTreeMap<usize, Vec<ShardId>> = BTreeMap::new();
    for s in group {
        by_slot.entry(pool.slot_for_shard(s)).or_default().push(s);
    }
    by_slot.into_values().map(|g| (address.clone(), g)).collect()
}

/// Opens the parts of a subscription to `shards` (`None`: every shard of the placement) in a
/// cluster: one Subscribe per owner (with `per_core`, per owner and core), naming its shards.
/// A part refused with `NotOwner` is grouped again after a fresh placement (at most
/// [`NOT_OWNER_REDIRECTS_MAX`] times); shards whose owner is down are retried until the
/// deadline, then `ShardUnavailable`.
async fn open_in_cluster(
    cluster: &Cluster,
    options: &SubscribeOptions,
    shards: Option<Vec<ShardId>>,
    start: StartAt,
    per_core: bool,
) -> Result<Vec<Part>, ClientError> {
    let stream = &options.stream;
    let mut parts = Vec::new();
    let mut todo = shards;
    let mut redirects = 0u32;
    let mut patience = Patience::default();
    let mut after: Option<Instant> = None;
    loop {
        let placement = match after {
            None => cluster.placement(stream).await,
            Some(t) => cluster.refresh(stream, t).await,
        };
        let placement = match placement {
            Ok(p) => p,
            Err(e) if e.is_shard_unavailable() || is_unreachable(&e) => {
                patience.wait(stream, None).await?;
                after = Some(Instant::now());
                continue;
            }
            Err(ClientError::Broker { code: ErrorCode::StreamNotFound, .. })
                if parts.is_empty() =>
            {
                // A stream the cluster does not know: the home broker answers the Subscribe
                // as a single broker would (an error, or the stream created).
                let home = cluster.home();
                let conn = home.conn(home.next_slot()).await?;
                return Ok(vec![open_part(conn, options, todo, start).await?]);
            }
            Err(e) => return Err(e),
        };
        let want = todo.take().unwrap_or_else(|| (0..placement.shards()).map(ShardId).collect());
        // Owner address (None: not live) -> its shards. A shard the placement lacks goes to
        // the home broker, whose answer (InvalidShard) is the caller's.
        let mut groups: BTreeMap<Option<String>, Vec<ShardId>> = BTreeMap::new();
        for s in want {
            let owner = match placement.owner(s) {
                Some(o) => o.live.then(|| o.address.clone()),
                None => Some(cluster.home().name().to_owned()),
            };
            groups.entry(owner).or_default().push(s);
        }
        let mut retry = Vec::new();
        let mut waiting = false;
        let mut by_core = Vec::new();
        for (owner, group) in groups {
            let Some(address) = owner else {
                retry.extend(group);
                waiting = true;
                continue;
            };
            by_core.extend(split_by_core(cluster, address, group, per_core).await);
        }
        for (address, group) in by_core {
            let slot_of = per_core.then(|| group[0]);
            let opened = match cluster.conn_at(&address, slot_of).await {
                Ok(conn) => open_part(conn, options, Some(group.clone()), start).await,
                Err(e) => Err(e),
            };
            match opened {
                Ok(part) => parts.push(part),
                Err(ClientError::NotOwner { stream: s, shard, owner }) => {
                    cluster.learn(&s, shard, &owner);
                    redirects += 1;
                    if redirects > NOT_OWNER_REDIRECTS_MAX {
                        return Err(ClientError::NotOwner { stream: s, shard, owner });
                    }
                    retry.extend(group);
                }
                Err(e) if e.is_shard_unavailable() || is_unreachable(&e) => {
                    retry.extend(group);
                    waiting = true;
                }
                Err(e) => return Err(e),
            }
        }
        if retry.is_empty() {
            return Ok(parts);
        }
        if waiting {
            patience.wait(stream, retry.first().copied()).await?;
        }
        todo = Some(retry);
        after = Some(Instant::now());
    }
}
