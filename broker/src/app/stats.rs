//! Per-core broker counters and histograms, and their OpenMetrics rendering (prometheus-client).
//!
//! Each core writes only its own `AppStats` (relaxed atomics with a single writer, so no cache
//! line is contended on the hot path); the admin thread reads them. Histograms are recorded in
//! a core-local `hdrhistogram` and copied into the shared slot once per
//! [`HISTOGRAM_PUBLISH_INTERVAL_MS`], the only moment a lock is taken.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;
use prometheus_client::encoding::{text, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// How often a core copies its histograms for the admin thread, in milliseconds.
pub const HISTOGRAM_PUBLISH_INTERVAL_MS: u64 = 1_000;
/// The lowest value a latency histogram tells apart, in microseconds.
pub const HISTOGRAM_LOW_US: u64 = 1;
/// The highest value a latency histogram tracks, in microseconds (one hour).
pub const HISTOGRAM_HIGH_US: u64 = 3_600_000_000;
/// Significant decimal digits a histogram keeps (its relative precision: 0.1 %).
pub const HISTOGRAM_SIGNIFICANT_DIGITS: u8 = 3;
// hdrhistogram's bounds: low >= 1, high >= 2 * low, at most 5 significant digits.
const _: () = assert!(
    HISTOGRAM_LOW_US >= 1
        && HISTOGRAM_HIGH_US >= 2 * HISTOGRAM_LOW_US
        && HISTOGRAM_SIGNIFICANT_DIGITS <= 5
);

macro_rules! counters {
    ($($name:ident: $help:literal),* $(,)?) => {
        /// One core's counters (single writer: the core).
        #[derive(Default, Debug)]
        pub struct Counters { $(#[doc = $help] pub $name: AtomicU64,)* }

        impl Counters {
            /// Name, help and value of every counter.
            pub fn fields(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($name), $help, self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

counters! {
    connections_accepted: "Connections accepted by the broker logic.",
    connections_open: "Connections currently open.",
    publishes: "Publish batches received.",
    publish_records: "Records received in publishes.",
    publish_bytes: "Payload bytes received in publishes.",
    acks: "PublishAcks sent.",
    publish_errors: "Publishes refused with an error.",
    publish_duplicates: "Idempotent batches received again and answered with their stored offsets.",
    forwarded_out: "Batches this core forwarded to the owning core.",
    forwarded_in: "Batches other cores forwarded to this core.",
    rejected_frames: "Frames rejected (malformed, unknown flags, over limits, unauthenticated).",
    subscriptions: "Subscriptions started.",
    event_batches: "EventBatches sent to subscribers.",
    event_bytes: "EventBatch bytes sent to subscribers.",
    slow_consumers: "Subscriptions disconnected for being too slow.",
    tail_batches: "EventBatches served to subscribers from the in-memory tail.",
    log_batches: "EventBatches served to subscribers by reading the log.",
    tail_encodes: "EventBatch encodings of tail batches (shared by every subscriber).",
    commits: "Consumer positions committed.",
    storage_append_bytes: "Bytes appended to storage (record payloads and keys), i.e. stored.",
    storage_appends: "Batches appended to storage.",
    storage_flushes: "fdatasyncs issued by storage.",
    storage_flushes_overlapped: "Group-commit fdatasyncs issued while another of the same log ran.",
    storage_bytes_written: "Bytes written to log files (encoded, padded).",
    storage_zero_fill_bytes: "Zeros written ahead of the log writes (--preallocate zero).",
    storage_torn_bytes_dropped: "Bytes of torn tails dropped at recovery.",
    storage_read_cache_hits: "Log reads served from the core's read cache.",
    storage_read_cache_misses: "Log blocks the read cache read from disk.",
    storage_read_cache_waits: "Log reads that waited for another reader's read of the same block.",
    storage_read_cache_evictions: "Blocks the read cache dropped to stay within --read-cache-bytes.",
    storage_read_cache_bytes: "Bytes the read cache holds (gauge).",
    inflight_bytes: "Publish bytes received and not yet acked (gauge).",
    storage_below_floor: "1 while the data directory's free space is below --min-free-bytes, so appends get StorageFull (gauge).",
    cluster_not_owner: "Requests refused because another broker of the cluster owns the shard.",
    replication_bytes_sent: "Batch payload bytes sent to followers in fetch replies.",
    replication_bytes_received: "Batch payload bytes received from leaders in fetch replies.",
    replication_frames_dropped: "Replication frames dropped (a peer link's queue full or its connection down).",
    replication_truncated_batches: "Batches truncated from replicas to match a new leader's log.",
    replication_leaderships: "Times a replica on this core became its shard's leader.",
    replication_isr_proposals: "In-sync-set proposals sent to the controller by leaders on this core.",
    replication_isr_proposals_dropped: "In-sync-set proposals dropped because the shard's previous one was still on its way to the cluster agent (resent by the leader).",
    replication_lease_refusals: "Appends refused by leaders on this core because their lease was not confirmed.",
    replication_batches_archived: "Batches replicas on this core moved out of memory (committed, durable, read from storage after).",
    replication_fetches_from_log: "Fetch replies leaders on this core read from storage (the follower asked for archived batches).",
    replication_retention_bytes_deleted: "Log bytes retention deleted from replicated streams' logs on this core (below their shards' log starts).",
    replication_resident_batches: "Batches replicas on this core hold in memory (gauge).",
    replication_producers: "Idempotent producers the producer tables of replicas on this core remember (gauge).",
    replication_producers_expired: "Idempotent producers the producer tables of replicas on this core forgot after --producer-expiry (gauge: a truncation rebuilds a table, and its count, from the log).",
    replication_index_bytes: "Bytes of batch bookkeeping (offsets, epochs, producer tables; payloads left out) the replicas on this core hold (gauge).",
    storage_producers: "Idempotent producers the producer tables of unreplicated shards on this core remember (gauge).",
    storage_producers_expired: "Idempotent producers unreplicated shards on this core forgot after --producer-expiry.",
    storage_producers_evicted: "Idempotent producers unreplicated shards on this core forgot for room (--max-producers-per-shard).",
    replicas_leading: "Replicated shards this core leads (gauge).",
    replicas_following: "Replicated shards this core follows (gauge).",
    replication_lag_records: "Largest lag, in records, of a follower of a shard this core leads (gauge).",
    replication_lag_bytes: "Largest lag, in payload bytes, of a follower of a shard this core leads (gauge).",
    replication_peers_unreachable: "Live brokers of the cluster this core's replication links cannot connect to (gauge).",
    stream_series_dropped: "Shards this core owns that the per-stream series leave out (past 10,000 per core; gauge).",
}

/// The counters exported as gauges.
const GAUGES: [&str; 15] = [
    "stream_series_dropped",
    "replication_producers",
    "replication_producers_expired",
    "replication_index_bytes",
    "storage_producers",
    "inflight_bytes",
    "storage_below_floor",
    "replication_peers_unreachable",
    "storage_read_cache_bytes",
    "connections_open",
    "replicas_leading",
    "replicas_following",
    "replication_resident_batches",
    "replication_lag_records",
    "replication_lag_bytes",
];

/// One replicated shard on a core, as its replica last saw it (published once a second).
#[derive(Clone, Debug, Default)]
pub struct ReplicaStatus {
    /// The stream.
    pub stream: String,
    /// The shard.
    pub shard: u32,
    /// Whether this replica leads the shard.
    pub leader: bool,
    /// The leader epoch it follows or leads.
    pub epoch: u64,
    /// Its log end.
    pub log_end: u64,
    /// Its commit point.
    pub committed: u64,
    /// On a leader, each follower: (node, lag in records, lag in payload bytes, in sync).
    pub followers: Vec<(String, u64, u64, bool)>,
}

/// One shard this core owns (leads, when replicated), for the per-stream series of the metrics
/// page (published with the histograms).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardSeries {
    /// The stream.
    pub stream: String,
    /// The shard.
    pub shard: u32,
    /// Payload bytes (keys and values) appended to it through this broker since it started.
    pub bytes_in: u64,
    /// Records appended to it through this broker since it started.
    pub records_in: u64,
    /// Its end offset (the next offset; a replicated shard's commit point).
    pub end_offset: u64,
}

/// The most per-shard series one core publishes; the shards past it are counted in
/// `stream_series_dropped`.
pub const SHARD_SERIES_MAX_PER_CORE: usize = 10_000;

/// One core's statistics.
#[derive(Debug)]
pub struct AppStats {
    /// Counters.
    pub counters: Counters,
    /// Publish-to-ack latency in microseconds (published copy).
    pub ack_latency_us: Mutex<Histogram<u64>>,
    /// Publish-to-ack latency in microseconds counted once per record of each batch
    /// (published copy): the figure to set beside a client's per-record latency, in which a
    /// slow batch of many records weighs more than a fast one of few.
    pub ack_record_latency_us: Mutex<Histogram<u64>>,
    /// Publish receive span in microseconds: from the first to the last read of a Publish
    /// frame's bytes from its QUIC stream (published copy).
    pub receive_span_us: Mutex<Histogram<u64>>,
    /// Storage flush latency in microseconds (published copy).
    pub flush_latency_us: Mutex<Histogram<u64>>,
    /// Storage write latency in microseconds (published copy).
    pub write_latency_us: Mutex<Histogram<u64>>,
    /// Storage fan-in, appends per flush (published copy).
    pub fan_in: Mutex<Histogram<u64>>,
    /// The replicated shards on this core (published copy).
    pub replicas: Mutex<Vec<ReplicaStatus>>,
    /// The shards this core owns, per stream (published copy).
    pub streams: Mutex<Vec<ShardSeries>>,
    /// When the core last published its histograms, Unix milliseconds (0: not yet).
    pub histograms_published_unix_ms: AtomicU64,
}

impl Default for AppStats {
    fn default() -> Self {
        Self {
            counters: Counters::default(),
            ack_latency_us: Mutex::new(new_histogram()),
            ack_record_latency_us: Mutex::new(new_histogram()),
            receive_span_us: Mutex::new(new_histogram()),
            flush_latency_us: Mutex::new(new_histogram()),
            write_latency_us: Mutex::new(new_histogram()),
            fan_in: Mutex::new(new_histogram()),
            replicas: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            histograms_published_unix_ms: AtomicU64::new(0),
        }
    }
}

/// A histogram of [`HISTOGRAM_LOW_US`] .. [`HISTOGRAM_HIGH_US`] (1 µs .. 1 hour),
/// [`HISTOGRAM_SIGNIFICANT_DIGITS`] significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(HISTOGRAM_LOW_US, HISTOGRAM_HIGH_US, HISTOGRAM_SIGNIFICANT_DIGITS)
        .unwrap_or_else(|_| {
            Histogram::new(HISTOGRAM_SIGNIFICANT_DIGITS).unwrap_or_else(|_| unreachable_histogram())
        })
}

fn unreachable_histogram() -> Histogram<u64> {
    // Histogram::new(HISTOGRAM_SIGNIFICANT_DIGITS) only fails for sigfig > 5.
    std::process::abort()
}

/// Adds `v` to a single-writer counter.
pub fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

/// Sets a single-writer gauge.
pub fn set(c: &AtomicU64, v: u64) {
    c.store(v, Ordering::Relaxed);
}

/// Replaces a published histogram with the core's current one.
pub fn publish_histogram(slot: &Mutex<Histogram<u64>>, h: &Histogram<u64>) {
    if let Ok(mut s) = slot.lock() {
        s.clone_from(h);
    }
}

/// The `Content-Type` of [`render`]'s page (OpenMetrics text 1.0.0).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Quantiles exported for each latency and fan-in summary.
const SUMMARY_QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// One figure of every core, in core order, each sample labelled `core="<n>"`.
///
/// Counters are exported as `<name>_total`. The network figures are of unknown kind (counters
/// and gauges share one snapshot) and keep their bare `felix_net_<name>`: OpenMetrics counters
/// must end in `_total` and the documented names do not.
#[derive(Debug)]
struct PerCore {
    kind: MetricType,
    values: Vec<u64>,
}

impl EncodeMetric for PerCore {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (core, v) in self.values.iter().enumerate() {
            let label = [("core", core.to_string())];
            let mut sample = encoder.encode_family(&label)?;
            match self.kind {
                MetricType::Counter => sample.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                _ => sample.encode_gauge(v)?,
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

/// Renders every core's statistics as OpenMetrics text. `net` holds each core's network
/// counters as (name, value) pairs.
///
/// A registry is built from the snapshots on each scrape. prometheus-client has no summary
/// type, so the three quantile summaries are written by hand, before the `# EOF` marker.
pub fn render(cores: &[std::sync::Arc<AppStats>], net: &[Vec<(&'static str, u64)>]) -> String {
    let mut registry = Registry::default();
    if let Some(first) = net.first() {
        for (i, (name, _)) in first.iter().enumerate() {
            let values = net.iter().map(|f| f.get(i).map_or(0, |(_, v)| *v)).collect();
            registry.register(
                format!("felix_net_{name}"),
                "Network figure of the core (QUIC driver)",
                PerCore { kind: MetricType::Unknown, values },
            );
        }
    }
    let per_core: Vec<_> = cores.iter().map(|s| s.counters.fields()).collect();
    if let Some(first) = per_core.first() {
        for (i, (name, help, _)) in first.iter().enumerate() {
            let metric = if name.starts_with("storage_") {
                format!("felix_{name}")
            } else {
                format!("felix_broker_{name}")
            };
            let kind = if GAUGES.contains(name) { MetricType::Gauge } else { MetricType::Counter };
            let values = per_core.iter().map(|f| f.get(i).map_or(0, |(_, _, v)| *v)).collect();
            // The registry ends help texts with a full stop itself.
            registry.register(metric, help.trim_end_matches('.'), PerCore { kind, values });
        }
    }
    let mut out = String::new();
    let _ = text::encode_registry(&mut out, &registry);
    render_summaries(&mut out, cores);
    render_replicas(&mut out, cores);
    render_streams(&mut out, cores);
    let _ = text::encode_eof(&mut out);
    out
}

/// Each follower's lag behind each replicated shard's leader, by hand (labels per shard and
/// follower): `felix_replica_lag_records` and `felix_replica_lag_bytes`, on the leader's core.
fn render_replicas(out: &mut String, cores: &[std::sync::Arc<AppStats>]) {
    for (metric, help, pick) in [
        (
            "felix_replica_lag_records",
            "Records a follower of a shard led here has not yet made durable.",
            (|f: &(String, u64, u64, bool)| f.1) as fn(&(String, u64, u64, bool)) -> u64,
        ),
        (
            "felix_replica_lag_bytes",
            "Payload bytes a follower of a shard led here has not yet made durable.",
            |f: &(String, u64, u64, bool)| f.2,
        ),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}");
        let _ = writeln!(out, "# TYPE {metric} gauge");
        for (core, s) in cores.iter().enumerate() {
            let Ok(replicas) = s.replicas.lock() else { continue };
            for r in replicas.iter().filter(|r| r.leader) {
                for f in &r.followers {
                    let _ = writeln!(
                        out,
                        "{metric}{{core=\"{core}\",stream=\"{}\",shard=\"{}\",follower=\"{}\"}} {}",
                        r.stream,
                        r.shard,
                        f.0,
                        pick(f)
                    );
                }
            }
        }
    }
}

/// The per-stream series, by hand (labels per stream and shard), from the core that owns (leads)
/// each shard: `felix_stream_bytes_in`, `felix_stream_records_in` (counters) and
/// `felix_stream_end_offset` (gauge).
fn render_streams(out: &mut String, cores: &[std::sync::Arc<AppStats>]) {
    type Pick = fn(&ShardSeries) -> u64;
    for (metric, kind, help, pick) in [
        (
            "felix_stream_bytes_in",
            "counter",
            "Payload bytes (keys and values) appended to a shard through this broker since it started.",
            (|s: &ShardSeries| s.bytes_in) as Pick,
        ),
        (
            "felix_stream_records_in",
            "counter",
            "Records appended to a shard through this broker since it started.",
            |s: &ShardSeries| s.records_in,
        ),
        (
            "felix_stream_end_offset",
            "gauge",
            "A shard's end offset (the next offset; a replicated shard's commit point), on its owner.",
            |s: &ShardSeries| s.end_offset,
        ),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}");
        let _ = writeln!(out, "# TYPE {metric} {kind}");
        let suffix = if kind == "counter" { "_total" } else { "" };
        for (core, s) in cores.iter().enumerate() {
            let Ok(series) = s.streams.lock() else { continue };
            for x in series.iter() {
                let _ = writeln!(
                    out,
                    "{metric}{suffix}{{core=\"{core}\",stream=\"{}\",shard=\"{}\"}} {}",
                    x.stream,
                    x.shard,
                    pick(x)
                );
            }
        }
    }
}

/// The `Content-Type` of [`render_histograms`]' page.
pub const HISTOGRAMS_CONTENT_TYPE: &str = "application/json";

/// The published histograms themselves (the admin page `/histograms`), so that a client can
/// take the quantiles of any span between two scrapes (the difference of the two) instead of
/// the summaries' since-start quantiles. JSON: `{"cores": [{"core": n, "published_unix_ms": t,
/// "<name>": "<HDR V2 deflate, base64>", ...}, ...]}` with the names `ack_latency_us`,
/// `ack_record_latency_us`, `receive_span_us`, `flush_latency_us`, `write_latency_us` and `fan_in`. `published_unix_ms` is when the core
/// last copied them (once per [`HISTOGRAM_PUBLISH_INTERVAL_MS`]; 0 before its first copy): a
/// histogram holds what was recorded up to then.
pub fn render_histograms(cores: &[std::sync::Arc<AppStats>]) -> String {
    use base64::Engine;
    use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
    let mut serializer = V2DeflateSerializer::new();
    let mut encode = |slot: &Mutex<Histogram<u64>>| -> serde_json::Value {
        let mut buf = Vec::new();
        let Ok(h) = slot.lock() else { return serde_json::Value::Null };
        match serializer.serialize(&h, &mut buf) {
            Ok(_) => base64::engine::general_purpose::STANDARD.encode(&buf).into(),
            Err(_) => serde_json::Value::Null,
        }
    };
    let cores: Vec<serde_json::Value> = cores
        .iter()
        .enumerate()
        .map(|(core, s)| {
            // Read the time first: the histograms copied after it are at least as new.
            let published = s.histograms_published_unix_ms.load(Ordering::Acquire);
            serde_json::json!({
                "core": core,
                "published_unix_ms": published,
                "ack_latency_us": encode(&s.ack_latency_us),
                "ack_record_latency_us": encode(&s.ack_record_latency_us),
                "receive_span_us": encode(&s.receive_span_us),
                "flush_latency_us": encode(&s.flush_latency_us),
                "write_latency_us": encode(&s.write_latency_us),
                "fan_in": encode(&s.fan_in),
            })
        })
        .collect();
    let mut out = serde_json::json!({ "cores": cores }).to_string();
    out.push('\n');
    out
}

/// The quantile summaries of the published histograms, by hand (see [`render`]).
fn render_summaries(out: &mut String, cores: &[std::sync::Arc<AppStats>]) {
    for (metric, help, pick) in [
        (
            "felix_publish_ack_latency_us",
            "Publish-to-ack latency in microseconds.",
            (|s: &AppStats| &s.ack_latency_us) as fn(&AppStats) -> &Mutex<Histogram<u64>>,
        ),
        (
            "felix_publish_receive_span_us",
            "Time from the first to the last read of a Publish frame's bytes from its QUIC \
             stream, in microseconds: how long a batch took to arrive.",
            |s: &AppStats| &s.receive_span_us,
        ),
        (
            "felix_storage_flush_latency_us",
            "Storage flush (fdatasync) latency in microseconds.",
            |s: &AppStats| &s.flush_latency_us,
        ),
        (
            "felix_storage_write_latency_us",
            "Storage write (O_DIRECT, issue to completion) latency in microseconds.",
            |s: &AppStats| &s.write_latency_us,
        ),
        ("felix_storage_fan_in", "Storage appends per flush.", |s: &AppStats| &s.fan_in),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}");
        let _ = writeln!(out, "# TYPE {metric} summary");
        for (core, s) in cores.iter().enumerate() {
            let Ok(h) = pick(s).lock() else { continue };
            for q in SUMMARY_QUANTILES {
                let _ = writeln!(
                    out,
                    "{metric}{{core=\"{core}\",quantile=\"{q}\"}} {}",
                    h.value_at_quantile(q)
                );
            }
            let _ = writeln!(out, "{metric}_count{{core=\"{core}\"}} {}", h.len());
            let sum = h.mean() * h.len() as f64;
            let _ = writeln!(out, "{metric}_sum{{core=\"{core}\"}} {sum:.0}");
        }
    }
}
