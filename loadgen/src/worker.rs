//! A worker: one OS thread, pinned when asked, with its own current-thread tokio runtime and
//! its own [`felix_client::Client`] (so its own quinn endpoints and connections). Nothing is
//! funnelled through another thread: the worker's publisher and subscriber tasks run on it.
//!
//! Call order: [`spawn`], wait for [`WorkerShared::connected`] on every worker, set the
//! run's `go` flag, read the counters and drain the histograms ([`WorkerShared::take_intervals`])
//! while it runs, set `stop`, join.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use felix_client::{
    Client, ClientError, PublishTicket, Publisher, Record, SendStats, SendStatsReader, StartAt,
    SubscribeOptions,
};
use felix_proto::Payload;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use hdrhistogram::Histogram;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::{RunConfig, SubscribeFrom, TIMESTAMP_BYTES};
use crate::sys;

/// The longest a worker waits for its last acks after `stop`.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed operation before the next try (no hot error loop).
pub const ERROR_PAUSE: Duration = Duration::from_millis(50);
/// How often a waiting worker looks at the run's flags.
const FLAG_POLL: Duration = Duration::from_millis(1);
/// Records a paced publisher sends in one go at most.
const PACE_BURST_MAX: u64 = 256;
/// Records whose timestamps one arena allocation holds.
const ARENA_RECORDS: usize = 256;

/// What a worker shares with the run: cumulative counters and interval histograms.
#[derive(Debug)]
pub struct WorkerShared {
    /// Set when the client is connected and publishers are ready.
    pub connected: AtomicBool,
    /// Set when the worker gave up (see `last_error`).
    pub failed: AtomicBool,
    /// Records handed to the publisher.
    pub sent_records: AtomicU64,
    /// Value plus key bytes handed to the publisher (what the broker counts as stored).
    pub sent_bytes: AtomicU64,
    /// Records acked (or written, with ack mode none).
    pub acked_records: AtomicU64,
    /// Failed sends, failed acks and subscription errors.
    pub errors: AtomicU64,
    /// Subscriptions restarted after an error.
    pub resubscribes: AtomicU64,
    /// Records delivered to subscribers.
    pub delivered_records: AtomicU64,
    /// Distinct shards the keys map to (0: unknown, e.g. unkeyed or stream not described).
    pub key_shards: AtomicU64,
    /// Value plus key bytes delivered to subscribers.
    pub delivered_bytes: AtomicU64,
    /// The worker's client's QUIC packets sent, lost, and congestion events
    /// (`Client::quic_stats`), updated every 10 ms (`FLAG_POLL` x 10) while it runs.
    pub quic_packets_sent: AtomicU64,
    /// Packets declared lost.
    pub quic_packets_lost: AtomicU64,
    /// Congestion events.
    pub quic_congestion_events: AtomicU64,
    /// Black holes path MTU discovery detected (each one a fall back to 1200-byte datagrams).
    pub quic_black_holes: AtomicU64,
    /// The client's flow-control-blocked frames sent ([`felix_client::QuicStats`]).
    pub quic_flow_blocked: AtomicU64,
    /// The smallest current path MTU of the client's connections (a gauge; 0 before any).
    pub quic_mtu_min: AtomicU64,
    /// Reads the publisher's send statistics ([`felix_client::Publisher::send_stats`]); set
    /// once the publisher is up.
    send_stats: Mutex<Option<SendStatsReader>>,
    /// The most recent error, for the report.
    pub last_error: Mutex<Option<String>>,
    /// Publish-to-ack latency (us) since the last drain.
    ack_us: Mutex<Histogram<u64>>,
    /// Publish-to-delivery latency (us) since the last drain.
    delivery_us: Mutex<Histogram<u64>>,
}

/// The run's flags every worker watches.
#[derive(Debug, Default)]
pub struct RunFlags {
    /// Start publishing and subscribing.
    pub go: AtomicBool,
    /// Stop sending; drain; exit.
    pub stop: AtomicBool,
}

/// A latency histogram: 1 us .. 10 minutes, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy new_with_bounds' conditions (low >= 1,
    // high >= 2 * low, sigfig <= 5), so this cannot fail.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("constant histogram bounds")
}

impl WorkerShared {
    /// Takes the client's QUIC statistics (what the run reports over its window).
    fn note_quic(&self, client: &felix_client::Client) {
        let q = client.quic_stats();
        self.quic_packets_sent.store(q.packets_sent, Ordering::Relaxed);
        self.quic_packets_lost.store(q.packets_lost, Ordering::Relaxed);
        self.quic_congestion_events.store(q.congestion_events, Ordering::Relaxed);
        self.quic_black_holes.store(q.black_holes, Ordering::Relaxed);
        self.quic_flow_blocked.store(q.flow_control_blocked, Ordering::Relaxed);
        self.quic_mtu_min.store(q.mtu_min.into(), Ordering::Relaxed);
    }

    /// The publisher's send statistics now (empty before it is up, or without one).
    pub fn send_stats(&self) -> SendStats {
        let reader = self.send_stats.lock().ok().and_then(|r| r.clone());
        reader.map(|r| r.read()).unwrap_or_default()
    }

    fn new() -> Self {
        Self {
            connected: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            sent_records: AtomicU64::new(0),
            sent_bytes: AtomicU64::new(0),
            acked_records: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            resubscribes: AtomicU64::new(0),
            quic_packets_sent: AtomicU64::new(0),
            quic_packets_lost: AtomicU64::new(0),
            quic_congestion_events: AtomicU64::new(0),
            quic_black_holes: AtomicU64::new(0),
            quic_flow_blocked: AtomicU64::new(0),
            quic_mtu_min: AtomicU64::new(0),
            delivered_records: AtomicU64::new(0),
            key_shards: AtomicU64::new(0),
            delivered_bytes: AtomicU64::new(0),
            send_stats: Mutex::new(None),
            last_error: Mutex::new(None),
            ack_us: Mutex::new(new_histogram()),
            delivery_us: Mutex::new(new_histogram()),
        }
    }

    /// Takes the ack and delivery histograms recorded since the last call.
    pub fn take_intervals(&self) -> (Histogram<u64>, Histogram<u64>) {
        let take = |m: &Mutex<Histogram<u64>>| match m.lock() {
            Ok(mut h) => std::mem::replace(&mut *h, new_histogram()),
            Err(_) => new_histogram(),
        };
        (take(&self.ack_us), take(&self.delivery_us))
    }

    fn error(&self, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.last_error.lock() {
            *l = Some(e.to_string());
        }
    }

    fn record(m: &Mutex<Histogram<u64>>, us: u64) {
        if let Ok(mut h) = m.lock() {
            h.saturating_record(us.max(1));
        }
    }
}

/// Starts worker `index`.
pub fn spawn(
    index: usize,
    config: Arc<RunConfig>,
    flags: Arc<RunFlags>,
) -> std::io::Result<(Arc<WorkerShared>, JoinHandle<()>)> {
    let shared = Arc::new(WorkerShared::new());
    let s = shared.clone();
    let handle =
        std::thread::Builder::new().name(format!("loadgen-w{index}")).spawn(move || {
            if let Some(cpu) = config.worker_cpus.get(index).copied().flatten() {
                if !sys::pin_current_thread(cpu) {
                    s.error(format!("worker {index}: pinning to CPU {cpu} refused"));
                }
            }
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    s.error(format!("worker {index}: runtime: {e}"));
                    s.failed.store(true, Ordering::Relaxed);
                    return;
                }
            };
            if let Err(e) = rt.block_on(run(index, &config, &flags, &s)) {
                s.error(format!("worker {index}: {e}"));
                s.failed.store(true, Ordering::Relaxed);
            }
        })?;
    Ok((shared, handle))
}

async fn run(
    index: usize,
    config: &Arc<RunConfig>,
    flags: &Arc<RunFlags>,
    shared: &Arc<WorkerShared>,
) -> anyhow::Result<()> {
    let client = Client::connect(config.client_config()).await?;
    let publisher =
        if config.publishers > 0 { Some(client.publisher(&config.stream).await?) } else { None };
    if let Some(p) = &publisher {
        let shards: std::collections::BTreeSet<u32> =
            (0..config.keys).filter_map(|k| p.shard_for_key(&key_bytes(k)).map(|s| s.0)).collect();
        shared.key_shards.store(shards.len() as u64, Ordering::Relaxed);
        if let Ok(mut slot) = shared.send_stats.lock() {
            *slot = Some(p.send_stats_reader());
        }
    }
    shared.connected.store(true, Ordering::Relaxed);
    while !flags.go.load(Ordering::Relaxed) {
        if flags.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        tokio::time::sleep(FLAG_POLL).await;
    }
    for task in 0..config.subscribers {
        tokio::spawn(subscribe(client.clone(), config.clone(), shared.clone(), task));
    }
    let mut publishers = Vec::new();
    let window = (config.outstanding > 0).then(|| Arc::new(Semaphore::new(config.outstanding)));
    if let Some(p) = &publisher {
        for task in 0..config.publishers {
            let seed = index * config.publishers + task;
            publishers.push(tokio::spawn(publish(
                p.clone(),
                config.clone(),
                flags.clone(),
                shared.clone(),
                window.clone(),
                seed,
            )));
        }
    }
    while !flags.stop.load(Ordering::Relaxed) {
        shared.note_quic(&client);
        tokio::time::sleep(FLAG_POLL * 10).await;
    }
    shared.note_quic(&client);
    for t in publishers {
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, t).await;
    }
    if let Some(p) = publisher {
        if tokio::time::timeout(DRAIN_TIMEOUT, p.flush()).await.is_err() {
            shared.error("acks still missing after the drain timeout");
        }
    }
    client.close();
    Ok(())
}

/// One publisher task: records of `payload_bytes` with the send time in front, keys
/// round-robin (starting at `seed`, so tasks interleave), paced when a rate is set.
///
/// The task itself waits for its records' acks, one future per batch (tickets of one batch
/// resolve together: [`PublishTicket::same_batch`]) in a `FuturesUnordered` polled beside the
/// sending, so a record costs neither a task nor a future of its own; record payloads are cut
/// from an arena of [`ARENA_RECORDS`] timestamps followed by one filler shared by every record
/// (the client hands it to quinn without a copy).
async fn publish(
    publisher: Publisher,
    config: Arc<RunConfig>,
    flags: Arc<RunFlags>,
    shared: Arc<WorkerShared>,
    window: Option<Arc<Semaphore>>,
    seed: usize,
) {
    let keys: Vec<Bytes> = (0..config.keys).map(key_bytes).collect();
    let filler = Bytes::from(vec![0xa5u8; config.payload_bytes - TIMESTAMP_BYTES]);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut key_index = seed;
    let mut arena = BytesMut::new();
    // The batch each key's last record went into, with the send times of its records.
    let mut open: HashMap<usize, (PublishTicket, SendTimes)> = HashMap::new();
    let mut acks = FuturesUnordered::new();
    'send: while !flags.stop.load(Ordering::Relaxed) {
        let due = match config.rate_per_task {
            Some(rate) => {
                let due = (started.elapsed().as_secs_f64() * rate) as u64;
                if due <= sent {
                    // Nothing due: wait for acks (or the pacing tick).
                    tokio::select! {
                        Some(done) = acks.next(), if !acks.is_empty() => {
                            acks_done(&shared, &window, done);
                        }
                        _ = tokio::time::sleep(FLAG_POLL) => {}
                    }
                    continue;
                }
                (due - sent).min(PACE_BURST_MAX)
            }
            None => PACE_BURST_MAX,
        };
        for _ in 0..due {
            // Take the acks that are in without waiting, then a window permit (waiting for
            // acks while the window is full).
            while let Some(Some(done)) = acks.next().now_or_never() {
                acks_done(&shared, &window, done);
            }
            if let Some(w) = &window {
                loop {
                    tokio::select! {
                        biased;
                        Some(done) = acks.next(), if !acks.is_empty() => {
                            acks_done(&shared, &window, done);
                        }
                        p = w.acquire() => match p {
                            // Given back, for the batch, when it resolves.
                            Ok(p) => break p.forget(),
                            Err(_) => break 'send,
                        },
                    }
                }
            }
            if arena.capacity() < TIMESTAMP_BYTES {
                arena = BytesMut::with_capacity(TIMESTAMP_BYTES * ARENA_RECORDS);
            }
            arena.extend_from_slice(&sys::unix_us().to_le_bytes());
            let value = Payload::from_parts([arena.split().freeze(), filler.clone()]);
            let (record, group) = if keys.is_empty() {
                (Record::unkeyed(value), 0)
            } else {
                key_index = (key_index + 1) % keys.len();
                (Record::keyed(keys[key_index].clone(), value), key_index)
            };
            let bytes = (record.value.len() + record.key.as_ref().map_or(0, |k| k.len())) as u64;
            let t0 = Instant::now();
            match publisher.send(record).await {
                Ok(ticket) => {
                    sent += 1;
                    shared.sent_records.fetch_add(1, Ordering::Relaxed);
                    shared.sent_bytes.fetch_add(bytes, Ordering::Relaxed);
                    match open.get(&group) {
                        Some((last, times)) if last.same_batch(&ticket) => lock(times).push(t0),
                        _ => {
                            let times: SendTimes = Arc::new(Mutex::new(vec![t0]));
                            let wait = ticket.clone();
                            let recorded = times.clone();
                            acks.push(async move { (wait.await.map(|_| ()), recorded) });
                            open.insert(group, (ticket, times));
                        }
                    }
                }
                Err(e) => {
                    shared.error(e);
                    if let Some(w) = &window {
                        w.add_permits(1); // nothing was sent for it
                    }
                    tokio::time::sleep(ERROR_PAUSE).await;
                    break;
                }
            }
            if flags.stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    // Stopped: the rest of the acks still count (the run's drain waits for them).
    drop(open);
    while let Some(done) = acks.next().await {
        acks_done(&shared, &window, done);
    }
}

/// The send times of the records of one batch.
type SendTimes = Arc<Mutex<Vec<Instant>>>;

fn lock(times: &SendTimes) -> std::sync::MutexGuard<'_, Vec<Instant>> {
    // Pushes only: a poisoned list is still a list.
    times.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records the acks of one batch: each record's latency from its send time, or one error per
/// record; gives the records' window permits back.
fn acks_done(
    shared: &WorkerShared,
    window: &Option<Arc<Semaphore>>,
    (result, times): (Result<(), ClientError>, SendTimes),
) {
    let times = std::mem::take(&mut *lock(&times));
    match &result {
        Ok(()) => {
            let now = Instant::now();
            if let Ok(mut h) = shared.ack_us.lock() {
                for t0 in &times {
                    h.saturating_record((now.duration_since(*t0).as_micros() as u64).max(1));
                }
            }
            shared.acked_records.fetch_add(times.len() as u64, Ordering::Relaxed);
        }
        Err(e) => {
            for _ in &times {
                shared.error(e);
            }
        }
    }
    if let Some(w) = window {
        w.add_permits(times.len());
    }
}

/// Key number `k`.
fn key_bytes(k: u32) -> Bytes {
    Bytes::from(format!("key-{k:05}").into_bytes())
}

/// One subscriber task: reads the whole stream until the worker stops, measuring
/// publish-to-delivery latency from the send time in each payload; resubscribes after errors.
async fn subscribe(client: Client, config: Arc<RunConfig>, shared: Arc<WorkerShared>, task: usize) {
    let start = match config.subscribe_from {
        SubscribeFrom::Earliest => StartAt::Earliest,
        SubscribeFrom::Latest => StartAt::Latest,
    };
    let mut first = true;
    loop {
        if !first {
            shared.resubscribes.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(ERROR_PAUSE).await;
        }
        first = false;
        let options = SubscribeOptions::new(config.stream.clone()).start(start);
        let mut sub = match client.subscribe(options).await {
            Ok(s) => s,
            Err(e) => {
                shared.error(format!("subscriber {task}: {e}"));
                continue;
            }
        };
        loop {
            match sub.next().await {
                Ok(Some(r)) => {
                    let bytes = r.value.len() + r.key.as_ref().map_or(0, |k| k.len());
                    shared.delivered_records.fetch_add(1, Ordering::Relaxed);
                    shared.delivered_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    if let Some(ts) = r.value.get(..TIMESTAMP_BYTES) {
                        let mut b = [0u8; TIMESTAMP_BYTES];
                        b.copy_from_slice(ts);
                        let sent_us = u64::from_le_bytes(b);
                        WorkerShared::record(
                            &shared.delivery_us,
                            sys::unix_us().saturating_sub(sent_us),
                        );
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared.error(format!("subscriber {task}: {e}"));
                    break;
                }
            }
        }
    }
}
