//! The result of a run (written as JSON, histograms serialized in HDR V2 deflate + base64), its
//! text rendering, and `merge`: several generators' results combined into one fleet report.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::Context;
use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;

use crate::config::RunConfig;
use crate::worker::new_histogram;

/// The version of the JSON layout.
pub const RESULT_VERSION: u32 = 1;
/// A generator above this share of its CPUs measured itself, not the broker.
pub const GENERATOR_BUSY_WARN_PCT: f64 = 80.0;
/// The broker storing less than this share of what was sent is warned about.
pub const STORED_SHARE_WARN: f64 = 0.98;
/// A side this busy (% of the CPUs it may use), and busier than the other, bounded the run.
pub const BOUND_BUSY_PCT: f64 = 80.0;

/// Which side bounded a run's throughput, from the two processes' busy fractions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// The broker was at least [`BOUND_BUSY_PCT`] busy, and busier than the generator: the
    /// run measured the broker.
    Broker,
    /// The generator was at least [`BOUND_BUSY_PCT`] busy, and at least as busy as the broker:
    /// the run measured the generator.
    Generator,
    /// Neither was: a fixed rate, or both waited on something else (disk, flow control).
    Neither,
}

impl Bound {
    /// The bound of a run whose generator was `generator_busy_pct` and broker
    /// `broker_busy_pct` busy (each % of the CPUs it may use).
    pub fn of(generator_busy_pct: f64, broker_busy_pct: f64) -> Self {
        let busiest = generator_busy_pct.max(broker_busy_pct);
        if busiest < BOUND_BUSY_PCT {
            Self::Neither
        } else if generator_busy_pct >= broker_busy_pct {
            Self::Generator
        } else {
            Self::Broker
        }
    }

    /// Its name, as in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Broker => "broker",
            Self::Generator => "generator",
            Self::Neither => "neither",
        }
    }
}

/// The two sides' CPU with interrupt work moved to the side it served. On one host over
/// loopback a datagram's receive path runs in its sender's softirq, and the disk's completions
/// run on whichever CPU its interrupt is routed to; the kernel charges both to the task that
/// happened to be running. So the generator pays for the broker's receive path (and perhaps
/// its disk), and the broker for the generator's. Here the interrupt time measured on each
/// side's CPUs (`/proc/stat`) is taken off that side and given to the other. This assumes
/// the two sides run on disjoint CPUs and that the interrupts on a side's CPUs served the
/// other side (true of the receive path and the disk; not of timers, which are small).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InterruptsAttributed {
    /// The CPUs the generator may run on.
    pub generator_cpus: Vec<usize>,
    /// The CPUs the broker may run on.
    pub broker_cpus: Vec<usize>,
    /// Interrupt seconds on the generator's CPUs in the window (moved to the broker).
    pub on_generator_cpus_s: f64,
    /// Interrupt seconds on the broker's CPUs in the window (moved to the generator).
    pub on_broker_cpus_s: f64,
    /// The generator's CPU seconds after the move.
    pub generator_cpu_s: f64,
    /// The broker's CPU seconds after the move.
    pub broker_cpu_s: f64,
    /// The generator's busy % after the move (of the CPUs it may use).
    pub generator_busy_pct: f64,
    /// The broker's busy % after the move (of its cores).
    pub broker_busy_pct: f64,
    /// Stored MB per broker CPU-second after the move.
    pub stored_mb_per_broker_cpu_s: Option<f64>,
    /// Stored MB per generator CPU-second after the move.
    pub stored_mb_per_generator_cpu_s: Option<f64>,
    /// [`Bound::of`] the busy % after the move.
    pub bound_by: Bound,
}

/// One side's CPU over a window, as the attribution needs it.
#[derive(Clone, Copy, Debug)]
pub struct SideCpu {
    /// CPU seconds its process was charged.
    pub cpu_s: f64,
    /// Interrupt seconds measured on its CPUs.
    pub interrupts_s: f64,
    /// The CPUs (or cores) its busy % is over.
    pub cpus: usize,
}

impl InterruptsAttributed {
    /// Moves each side's interrupt time to the other. A side gives up no more than it was
    /// charged: interrupt time that fell while it was idle was never in its CPU seconds.
    pub fn of(
        generator: SideCpu,
        broker: SideCpu,
        cpu_lists: (Vec<usize>, Vec<usize>),
        window_s: f64,
        stored_bytes: u64,
    ) -> Self {
        let from_generator = generator.interrupts_s.clamp(0.0, generator.cpu_s.max(0.0));
        let from_broker = broker.interrupts_s.clamp(0.0, broker.cpu_s.max(0.0));
        let generator_cpu_s = generator.cpu_s - from_generator + from_broker;
        let broker_cpu_s = broker.cpu_s - from_broker + from_generator;
        let busy =
            |cpu_s: f64, cpus: usize| 100.0 * cpu_s / window_s.max(1e-6) / cpus.max(1) as f64;
        let per = |cpu_s: f64| (cpu_s > 0.0).then(|| stored_bytes as f64 / 1e6 / cpu_s);
        let generator_busy_pct = busy(generator_cpu_s, generator.cpus);
        let broker_busy_pct = busy(broker_cpu_s, broker.cpus);
        Self {
            generator_cpus: cpu_lists.0,
            broker_cpus: cpu_lists.1,
            on_generator_cpus_s: generator.interrupts_s,
            on_broker_cpus_s: broker.interrupts_s,
            generator_cpu_s,
            broker_cpu_s,
            generator_busy_pct,
            broker_busy_pct,
            stored_mb_per_broker_cpu_s: per(broker_cpu_s),
            stored_mb_per_generator_cpu_s: per(generator_cpu_s),
            bound_by: Bound::of(generator_busy_pct, broker_busy_pct),
        }
    }
}

/// The warning for a generator over [`GENERATOR_BUSY_WARN_PCT`] busy, if the run may have
/// measured it. With interrupt work moved to the side it served, a broker that was then the
/// busier side bounded the run however busy the generator's own figure reads: no warning.
fn generator_busy_warning(
    busy_pct: f64,
    attributed: Option<&InterruptsAttributed>,
) -> Option<String> {
    if busy_pct <= GENERATOR_BUSY_WARN_PCT {
        return None;
    }
    match attributed {
        Some(a) if a.bound_by == Bound::Broker => None,
        Some(a) => Some(format!(
            "generator was {busy_pct:.0}% busy (> {GENERATOR_BUSY_WARN_PCT}%; {:.0}% with \
             interrupt work moved to the side it served, broker {:.0}%): this run may measure \
             the generator, not the broker",
            a.generator_busy_pct, a.broker_busy_pct
        )),
        None => Some(format!(
            "generator was {busy_pct:.0}% busy (> {GENERATOR_BUSY_WARN_PCT}%): this run may \
             measure the generator, not the broker"
        )),
    }
}

/// A latency histogram with its percentiles, in microseconds.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Percentiles.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
    /// Mean.
    pub mean_us: f64,
    /// The histogram, HDR V2 deflate, base64.
    pub hdr: String,
}

impl Latency {
    /// Summarises and serializes `h`.
    pub fn of(h: &Histogram<u64>) -> Self {
        let mut buf = Vec::new();
        let hdr = match V2DeflateSerializer::new().serialize(h, &mut buf) {
            Ok(_) => base64::engine::general_purpose::STANDARD.encode(&buf),
            Err(_) => String::new(),
        };
        Self {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            mean_us: h.mean(),
            hdr,
        }
    }

    /// The histogram back from `hdr`.
    pub fn histogram(&self) -> anyhow::Result<Histogram<u64>> {
        if self.hdr.is_empty() {
            return Ok(new_histogram());
        }
        let bytes = base64::engine::general_purpose::STANDARD.decode(&self.hdr)?;
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| anyhow::anyhow!("histogram: {e:?}"))?;
        Ok(h)
    }
}

/// One worker's totals over the measured window.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct WorkerResult {
    /// Worker index.
    pub index: usize,
    /// CPU it was pinned to.
    pub cpu: Option<usize>,
    /// Records sent.
    pub sent_records: u64,
    /// Bytes sent (value + key).
    pub sent_bytes: u64,
    /// Records acked.
    pub acked_records: u64,
    /// Errors.
    pub errors: u64,
    /// Records delivered to its subscribers.
    pub delivered_records: u64,
    /// Publish-to-ack latency.
    pub ack: Latency,
    /// Publish-to-delivery latency.
    pub delivery: Latency,
}

/// The generator's QUIC counters over the window, summed over its workers' clients
/// (`felix_client::Client::quic_stats`, sampled every 10 ms; a connection replaced in the
/// window leaves the sum with it).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ClientQuic {
    /// Packets the generator sent.
    pub packets_sent: u64,
    /// Of those, packets declared lost: datagrams dropped on the way or by the broker's socket.
    pub packets_lost: u64,
    /// Congestion events on the generator's connections.
    pub congestion_events: u64,
    /// Times path MTU discovery took losses for a black hole (and fell back to 1200 bytes).
    #[serde(default)]
    pub black_holes: u64,
    /// The smallest current path MTU (UDP payload bytes) of the generator's connections at the
    /// end of the run; 0 when unknown.
    #[serde(default)]
    pub mtu_min: u64,
    /// STREAM_DATA_BLOCKED and DATA_BLOCKED frames the generator sent in the window: how often
    /// it had data the broker's flow control did not yet allow (the broker had not read it).
    #[serde(default)]
    pub flow_control_blocked: u64,
}

/// How long the generator's batches waited in its client before they were written, over the
/// window (`felix_client::Publisher::send_stats`, read at its edges): the part of a
/// record's publish-to-ack latency that neither the network nor the broker sees.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ClientSend {
    /// Batches written in the window.
    pub batches: u64,
    /// Their send delay (ready, full or lingered, until written to the QUIC stream), median.
    pub delay_p50_us: u64,
    /// The send delay's 99th percentile.
    pub delay_p99_us: u64,
    /// The longest send delay.
    pub delay_max_us: u64,
    /// Times a batch waited for its idempotent producer's window, and for how long in all.
    pub window_waits: u64,
    /// Milliseconds of those waits.
    pub window_wait_ms: f64,
    /// Times a batch waited for an in-flight slot of its connection, and for how long in all.
    pub in_flight_waits: u64,
    /// Milliseconds of those waits.
    pub in_flight_wait_ms: f64,
    /// Milliseconds spent writing frames to QUIC streams (long when QUIC held writes back).
    pub write_ms: f64,
}

impl ClientSend {
    /// The window's figures from the publishers' statistics at its edges.
    pub fn between(start: &felix_client::SendStats, end: &felix_client::SendStats) -> Self {
        let d = end.since(start);
        let q = |p: f64| if d.delay_us.is_empty() { 0 } else { d.delay_us.value_at_quantile(p) };
        Self {
            batches: d.batches,
            delay_p50_us: q(0.5),
            delay_p99_us: q(0.99),
            delay_max_us: if d.delay_us.is_empty() { 0 } else { d.delay_us.max() },
            window_waits: d.window_waits,
            window_wait_ms: d.window_wait_us as f64 / 1e3,
            in_flight_waits: d.in_flight_waits,
            in_flight_wait_ms: d.in_flight_wait_us as f64 / 1e3,
            write_ms: d.write_us as f64 / 1e3,
        }
    }
}

/// What the broker's own counters and /proc say about the window.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct BrokerResult {
    /// Bytes stored (value + key) over the window: the throughput figure.
    pub stored_bytes: u64,
    /// Bytes stored per broker core.
    pub stored_bytes_per_core: Vec<u64>,
    /// fdatasyncs over the window.
    pub flushes: u64,
    /// fdatasyncs per GB (1e9 bytes) stored.
    pub flushes_per_gb: f64,
    /// Connections the broker accepted during the window (reconnects, in a steady run).
    pub connections_accepted: u64,
    /// Publishes the broker refused during the window.
    pub publish_errors: u64,
    /// QUIC packets the broker's connections sent during the window (all connections, the
    /// generator's and any other; sampled by the broker once a second).
    #[serde(default)]
    pub quic_packets_sent: u64,
    /// Of those, packets its loss detection declared lost: datagrams dropped on the way or by
    /// the generator's socket.
    #[serde(default)]
    pub quic_packets_lost: u64,
    /// Congestion events on the broker's connections during the window.
    #[serde(default)]
    pub quic_congestion_events: u64,
    /// EventBatch bytes each broker core sent to subscribers over the window (which cores
    /// did the delivering; empty from a broker without the counter).
    #[serde(default)]
    pub event_bytes_per_core: Vec<u64>,
    /// The broker's publish-to-ack p50 and p99 per core: over the window when
    /// `latency_span_ms_per_core` is set (the difference of its published histograms, see
    /// there), else its histogram since it started, read at the window's end.
    pub ack_p50_us_per_core: Vec<u64>,
    /// p99 per core.
    pub ack_p99_us_per_core: Vec<u64>,
    /// The same p99 counted once per record of each batch (the broker's
    /// `ack_record_latency_us`), over the window only: the figure to set beside the client's
    /// per-record p99. Empty without a window, or from a broker without it.
    #[serde(default)]
    pub ack_record_p99_us_per_core: Vec<u64>,
    /// The broker's publish receive span p50 per core (over the same span as the ack
    /// quantiles): how long a Publish frame took to arrive, from the first read of its bytes
    /// to the last, before the publish-to-ack clock starts. Empty from a broker without it.
    #[serde(default)]
    pub receive_p50_us_per_core: Vec<u64>,
    /// Receive span p99 per core.
    #[serde(default)]
    pub receive_p99_us_per_core: Vec<u64>,
    /// The broker's flush (fdatasync) p50 per core (over the same span as the ack
    /// quantiles), the floor under its publish-to-ack latency.
    #[serde(default)]
    pub flush_p50_us_per_core: Vec<u64>,
    /// Flush p99 per core.
    #[serde(default)]
    pub flush_p99_us_per_core: Vec<u64>,
    /// The broker's write p99 per core (one O_DIRECT write, issue to completion; over the
    /// same span as the ack quantiles): with the flush, the disk's part of a durable ack.
    #[serde(default)]
    pub write_p99_us_per_core: Vec<u64>,
    /// The span the latency quantiles above cover, per core, in milliseconds: from the first
    /// publication of the broker's histograms (`/histograms`, once a second per core) at or
    /// after the window's start to the last one before its end. Empty when the quantiles are
    /// the broker's since-start ones (no `/histograms`, or no two publications in the window),
    /// which also count the warm-up.
    #[serde(default)]
    pub latency_span_ms_per_core: Vec<u64>,
    /// Broker CPU seconds over the window (when its pid was given).
    pub cpu_s: Option<f64>,
    /// Broker CPU, % of one core.
    pub cpu_pct: Option<f64>,
    /// RSS at the window's start, end and its largest sample, in bytes.
    pub rss_start_bytes: Option<u64>,
    /// RSS at the end.
    pub rss_end_bytes: Option<u64>,
    /// Largest RSS sample.
    pub rss_max_bytes: Option<u64>,
}

/// One second of the run.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Second {
    /// Seconds since the warm-up began.
    pub t_s: f64,
    /// Inside the measured window.
    pub measured: bool,
    /// Bytes sent this second.
    pub sent_bytes: u64,
    /// Records acked this second.
    pub acked_records: u64,
    /// Errors this second.
    pub errors: u64,
    /// Records delivered this second.
    pub delivered_records: u64,
    /// Publish-to-ack p50 this second, all workers.
    pub ack_p50_us: u64,
    /// Publish-to-ack p99 this second, all workers.
    pub ack_p99_us: u64,
    /// Generator CPU, % of one core.
    pub generator_cpu_pct: f64,
    /// Broker CPU, % of one core.
    pub broker_cpu_pct: Option<f64>,
    /// Broker RSS.
    pub broker_rss_bytes: Option<u64>,
    /// Bytes stored this second per broker core.
    pub stored_bytes_per_core: Vec<u64>,
    /// The broker's publish-to-ack p99 per core (its histogram as of this second).
    pub broker_ack_p99_us_per_core: Vec<u64>,
    /// The span, per core, of the broker's own quantiles below: from its previous publication
    /// of `/histograms` that this run saw to its latest (about a second); empty when a core
    /// had not published again.
    #[serde(default)]
    pub broker_latest_span_ms_per_core: Vec<u64>,
    /// The broker's publish-to-ack p99 per core over that span.
    #[serde(default)]
    pub broker_latest_ack_p99_us_per_core: Vec<u64>,
    /// Its O_DIRECT write p99 per core over that span.
    #[serde(default)]
    pub broker_latest_write_p99_us_per_core: Vec<u64>,
    /// Its flush (fdatasync) p99 per core over that span.
    #[serde(default)]
    pub broker_latest_flush_p99_us_per_core: Vec<u64>,
    /// Connections accepted by the broker this second.
    pub broker_connections_accepted: u64,
    /// The 99th percentile of the generator's batches' send delay this second
    /// ([`ClientSend`]); 0 with no batch written.
    #[serde(default)]
    pub client_send_delay_p99_us: u64,
}

/// The JSON result of one generator's run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunResult {
    /// Layout version.
    pub version: u32,
    /// The effective configuration.
    pub config: RunConfig,
    /// Unix ms when the measured window began and ended.
    pub window_start_unix_ms: u64,
    /// End of the window.
    pub window_end_unix_ms: u64,
    /// Measured seconds.
    pub measured_s: f64,
    /// Load average (1 min) at the start and end of the window.
    pub load_average_1m: (Option<f64>, Option<f64>),
    /// Records sent in the window.
    pub sent_records: u64,
    /// Bytes (value + key) sent in the window.
    pub sent_bytes: u64,
    /// Records acked in the window.
    pub acked_records: u64,
    /// Errors in the window.
    pub errors: u64,
    /// Distinct shards the keys map to (DESIGN 6.5: a keyed load must use more than one).
    #[serde(default)]
    pub key_shards: Option<u64>,
    /// Subscriptions restarted in the window.
    pub resubscribes: u64,
    /// Records delivered to subscribers in the window.
    pub delivered_records: u64,
    /// Bytes delivered to subscribers in the window.
    pub delivered_bytes: u64,
    /// The generator's own QUIC counters over the window (its clients' connections).
    #[serde(default)]
    pub client_quic: ClientQuic,
    /// How long the generator's batches waited in its client before they were written.
    #[serde(default)]
    pub client_send: ClientSend,
    /// Generator CPU seconds in the window.
    pub generator_cpu_s: f64,
    /// Generator CPU, % of one core.
    pub generator_cpu_pct: f64,
    /// CPUs the generator may run on.
    pub generator_cpus: usize,
    /// Generator CPU as % of the CPUs it may use.
    pub generator_busy_pct: f64,
    /// The broker's side, when its metrics were scraped.
    pub broker: Option<BrokerResult>,
    /// Stored MB (1e6 bytes) per second: the throughput.
    pub stored_mb_s: Option<f64>,
    /// Sent MB per second (the generator's offer; not the throughput).
    pub sent_mb_s: f64,
    /// Stored MB per broker CPU-second.
    pub stored_mb_per_broker_cpu_s: Option<f64>,
    /// Stored MB per generator CPU-second (the generator's cost of the same bytes).
    #[serde(default)]
    pub stored_mb_per_generator_cpu_s: Option<f64>,
    /// Broker CPU as % of its cores (CPU of `--broker-pid` over the core count its `/metrics`
    /// reports; `None` without both, or with several metrics addresses).
    #[serde(default)]
    pub broker_busy_pct: Option<f64>,
    /// Which side bounded the run ([`Bound::of`] the generator's and broker's busy %).
    #[serde(default)]
    pub bound_by: Option<Bound>,
    /// The same CPU figures with interrupt work moved to the side it served
    /// ([`InterruptsAttributed`]); `None` unless the broker's pid was given and the two sides'
    /// CPUs are disjoint.
    #[serde(default)]
    pub interrupts_attributed: Option<InterruptsAttributed>,
    /// Publish-to-ack latency of every worker together.
    pub ack: Latency,
    /// Publish-to-delivery latency of every worker together.
    pub delivery: Latency,
    /// Per worker.
    pub workers: Vec<WorkerResult>,
    /// Per second, warm-up included.
    pub timeline: Vec<Second>,
    /// Why the figures may not mean what they seem.
    pub warnings: Vec<String>,
    /// Worker errors seen (last message per worker).
    pub last_errors: Vec<String>,
}

impl RunResult {
    /// The warnings DESIGN section 6 asks for, from the figures.
    pub fn derive_warnings(&mut self) {
        if let Some(w) =
            generator_busy_warning(self.generator_busy_pct, self.interrupts_attributed.as_ref())
        {
            self.warnings.push(w);
        }
        if let Some(b) = &self.broker {
            if self.sent_bytes > 0
                && (b.stored_bytes as f64) < STORED_SHARE_WARN * self.sent_bytes as f64
            {
                self.warnings.push(format!(
                    "broker stored {} bytes, less than the {} sent ({:.1}%)",
                    b.stored_bytes,
                    self.sent_bytes,
                    100.0 * b.stored_bytes as f64 / self.sent_bytes as f64
                ));
            }
        } else {
            self.warnings.push(
                "broker metrics not scraped: no stored figure, sent bytes are not throughput"
                    .into(),
            );
        }
        if self.config.keys > 1
            && self.config.shards.is_some_and(|s| s > 1)
            && self.key_shards == Some(1)
        {
            self.warnings.push("every key maps to one shard: sharding was not exercised".into());
        }
        if self.errors > 0 {
            self.warnings.push(format!("{} errors in the window", self.errors));
        }
    }

    /// The end-of-run report.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let mb = |b: u64| b as f64 / 1e6;
        let _ = writeln!(o, "== felix-loadgen result: {} ==", self.config.label);
        let _ = writeln!(
            o,
            "window {:.1} s, load average {} -> {}",
            self.measured_s,
            fmt_opt(self.load_average_1m.0),
            fmt_opt(self.load_average_1m.1)
        );
        if let Some(n) = self.key_shards {
            let _ = writeln!(
                o,
                "keys: {} map to {n} distinct shard(s) of {}",
                self.config.keys,
                self.config.shards.map_or_else(|| "?".to_owned(), |s| s.to_string())
            );
        }
        let _ = writeln!(
            o,
            "client sent   {:>10.1} MB ({:.1} MB/s, {} records, {} acked, {} errors)",
            mb(self.sent_bytes),
            self.sent_mb_s,
            self.sent_records,
            self.acked_records,
            self.errors
        );
        if let Some(b) = &self.broker {
            let _ = writeln!(
                o,
                "broker stored {:>10.1} MB ({:.1} MB/s = throughput; per core {:?} MB)",
                mb(b.stored_bytes),
                self.stored_mb_s.unwrap_or(0.0),
                b.stored_bytes_per_core
                    .iter()
                    .map(|v| (mb(*v) * 10.0).round() / 10.0)
                    .collect::<Vec<_>>()
            );
            let _ = writeln!(
                o,
                "broker flushes {} ({:.0} per GB), connections accepted {}, publish errors {}",
                b.flushes, b.flushes_per_gb, b.connections_accepted, b.publish_errors
            );
            let _ = writeln!(
                o,
                "broker QUIC packets sent {}, lost {}, congestion events {}; generator's sent {}, \
                 lost {}, congestion events {}, MTU black holes {}, path MTU {}, held back by \
                 the broker's flow control {}",
                b.quic_packets_sent,
                b.quic_packets_lost,
                b.quic_congestion_events,
                self.client_quic.packets_sent,
                self.client_quic.packets_lost,
                self.client_quic.congestion_events,
                self.client_quic.black_holes,
                self.client_quic.mtu_min,
                self.client_quic.flow_control_blocked
            );
            let over = if b.latency_span_ms_per_core.is_empty() {
                "since it started".to_owned()
            } else {
                format!("over {:?} ms of the window", b.latency_span_ms_per_core)
            };
            let _ = writeln!(
                o,
                "broker publish-to-ack per core (its histogram, {over}): p50 {:?} us, p99 {:?} us; \
                 per record p99 {:?} us",
                b.ack_p50_us_per_core, b.ack_p99_us_per_core, b.ack_record_p99_us_per_core
            );
            let _ = writeln!(
                o,
                "broker publish receive span per core (first to last read of a batch's bytes, \
                 {over}): p50 {:?} us, p99 {:?} us",
                b.receive_p50_us_per_core, b.receive_p99_us_per_core
            );
            let _ = writeln!(
                o,
                "broker flush (fdatasync) per core (its histogram, {over}): p50 {:?} us, \
                 p99 {:?} us; write p99 {:?} us",
                b.flush_p50_us_per_core, b.flush_p99_us_per_core, b.write_p99_us_per_core
            );
            let _ = writeln!(
                o,
                "broker CPU {}% of a core, {} MB per broker CPU-second, RSS {} -> {} (max {}) MiB",
                fmt_opt(b.cpu_pct),
                fmt_opt(self.stored_mb_per_broker_cpu_s),
                fmt_opt(b.rss_start_bytes.map(|v| v as f64 / 1048576.0)),
                fmt_opt(b.rss_end_bytes.map(|v| v as f64 / 1048576.0)),
                fmt_opt(b.rss_max_bytes.map(|v| v as f64 / 1048576.0)),
            );
        }
        let _ = writeln!(
            o,
            "generator CPU {:.1}% of a core, {:.1}% of its {} CPU(s), {} MB per generator CPU-second",
            self.generator_cpu_pct,
            self.generator_busy_pct,
            self.generator_cpus,
            fmt_opt(self.stored_mb_per_generator_cpu_s)
        );
        let _ = writeln!(
            o,
            "bound by: {} (broker {}% busy, generator {:.1}% busy; threshold {BOUND_BUSY_PCT}%)",
            self.bound_by.map_or("-", Bound::name),
            fmt_opt(self.broker_busy_pct),
            self.generator_busy_pct
        );
        if let Some(a) = &self.interrupts_attributed {
            let _ = writeln!(
                o,
                "interrupts (irq + softirq): {:.2} CPU-s on the generator's CPUs {:?}, {:.2} on the \
                 broker's {:?}; moved to the side they served: broker {:.1}% busy, {} MB per \
                 broker CPU-second; generator {:.1}% busy, {} MB per generator CPU-second; \
                 bound by: {}",
                a.on_generator_cpus_s,
                a.generator_cpus,
                a.on_broker_cpus_s,
                a.broker_cpus,
                a.broker_busy_pct,
                fmt_opt(a.stored_mb_per_broker_cpu_s),
                a.generator_busy_pct,
                fmt_opt(a.stored_mb_per_generator_cpu_s),
                a.bound_by.name(),
            );
        }
        let c = &self.client_send;
        if c.batches > 0 {
            let _ = writeln!(
                o,
                "client send delay (batch ready -> written to its QUIC stream): {} batches, p50 \
                 {} us, p99 {} us, max {} us; waited for a producer window {} times ({:.1} ms), \
                 for an in-flight slot {} times ({:.1} ms); writing {:.1} ms",
                c.batches,
                c.delay_p50_us,
                c.delay_p99_us,
                c.delay_max_us,
                c.window_waits,
                c.window_wait_ms,
                c.in_flight_waits,
                c.in_flight_wait_ms,
                c.write_ms
            );
        }
        let _ = writeln!(o, "publish-to-ack latency (us):");
        let _ = writeln!(
            o,
            "  {:<8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "worker", "acked", "p50", "p90", "p99", "p99.9", "max"
        );
        for w in &self.workers {
            let l = &w.ack;
            let _ = writeln!(
                o,
                "  {:<8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}",
                w.index, l.count, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
            );
        }
        let l = &self.ack;
        let _ = writeln!(
            o,
            "  {:<8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "all", l.count, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        );
        if self.delivery.count > 0 {
            let l = &self.delivery;
            let _ = writeln!(
                o,
                "publish-to-delivery (us): {} records ({:.1} MB), p50 {} p99 {} max {}, resubscribes {}",
                self.delivered_records,
                mb(self.delivered_bytes),
                l.p50_us,
                l.p99_us,
                l.max_us,
                self.resubscribes
            );
        }
        for w in &self.warnings {
            let _ = writeln!(o, "WARNING: {w}");
        }
        for e in &self.last_errors {
            let _ = writeln!(o, "last error: {e}");
        }
        o
    }
}

/// The fleet report of several generators.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FleetReport {
    /// Labels of the merged results.
    pub labels: Vec<String>,
    /// Largest difference between window starts, in ms (how together they started).
    pub start_skew_ms: u64,
    /// Sum of sent bytes.
    pub sent_bytes: u64,
    /// Stored bytes, per broker metrics address counted once (the largest figure of its
    /// generators, whose windows overlap).
    pub stored_bytes: u64,
    /// Stored MB per second over the longest window.
    pub stored_mb_s: f64,
    /// Errors.
    pub errors: u64,
    /// Highest generator busy %.
    pub generator_busy_pct_max: f64,
    /// Merged publish-to-ack latency.
    pub ack: Latency,
    /// Merged publish-to-delivery latency.
    pub delivery: Latency,
}

/// Combines results into one fleet report.
pub fn merge(results: &[RunResult]) -> anyhow::Result<FleetReport> {
    anyhow::ensure!(!results.is_empty(), "nothing to merge");
    let mut ack = new_histogram();
    let mut delivery = new_histogram();
    let mut stored: BTreeMap<String, u64> = BTreeMap::new();
    for r in results {
        ack.add(r.ack.histogram().with_context(|| format!("{}: ack histogram", r.config.label))?)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        delivery
            .add(
                r.delivery
                    .histogram()
                    .with_context(|| format!("{}: delivery histogram", r.config.label))?,
            )
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        if let (Some(m), Some(b)) = (&r.config.metrics, &r.broker) {
            let e = stored.entry(m.clone()).or_default();
            *e = (*e).max(b.stored_bytes);
        }
    }
    let starts = results.iter().map(|r| r.window_start_unix_ms);
    let skew = starts.clone().max().unwrap_or(0) - starts.min().unwrap_or(0);
    let window_s = results.iter().map(|r| r.measured_s).fold(0.0, f64::max).max(1e-9);
    let stored_bytes: u64 = stored.values().sum();
    Ok(FleetReport {
        labels: results.iter().map(|r| r.config.label.clone()).collect(),
        start_skew_ms: skew,
        sent_bytes: results.iter().map(|r| r.sent_bytes).sum(),
        stored_bytes,
        stored_mb_s: stored_bytes as f64 / 1e6 / window_s,
        errors: results.iter().map(|r| r.errors).sum(),
        generator_busy_pct_max: results.iter().map(|r| r.generator_busy_pct).fold(0.0, f64::max),
        ack: Latency::of(&ack),
        delivery: Latency::of(&delivery),
    })
}

impl FleetReport {
    /// Text form.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "== fleet of {} generators: {} ==",
            self.labels.len(),
            self.labels.join(", ")
        );
        let _ = writeln!(o, "start skew {} ms", self.start_skew_ms);
        let _ = writeln!(
            o,
            "sent {:.1} MB, stored {:.1} MB ({:.1} MB/s), errors {}, busiest generator {:.0}%",
            self.sent_bytes as f64 / 1e6,
            self.stored_bytes as f64 / 1e6,
            self.stored_mb_s,
            self.errors,
            self.generator_busy_pct_max
        );
        let a = &self.ack;
        let _ = writeln!(
            o,
            "publish-to-ack (us): {} samples, p50 {} p90 {} p99 {} p99.9 {} max {}",
            a.count, a.p50_us, a.p90_us, a.p99_us, a.p999_us, a.max_us
        );
        o
    }
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busier_side_over_the_threshold_is_the_bound() {
        assert_eq!(Bound::of(97.0, 72.0), Bound::Generator);
        assert_eq!(Bound::of(60.0, 93.0), Bound::Broker);
        assert_eq!(Bound::of(40.0, 30.0), Bound::Neither, "a fixed rate bounds neither");
        assert_eq!(Bound::of(BOUND_BUSY_PCT, BOUND_BUSY_PCT), Bound::Generator, "a tie");
        assert_eq!(serde_json::to_string(&Bound::Broker).unwrap(), "\"broker\"");
        assert_eq!(Bound::Neither.name(), "neither");
    }

    #[test]
    fn a_busy_generator_is_warned_about_unless_the_broker_was_the_bound() {
        let side = |cpu_s, interrupts_s| SideCpu { cpu_s, interrupts_s, cpus: 1 };
        let lists = || (vec![1], vec![0]);
        assert_eq!(generator_busy_warning(75.0, None), None);
        let plain = generator_busy_warning(92.0, None).expect("over 80 %");
        assert!(plain.contains("92% busy") && plain.contains("may measure"), "{plain}");
        // 3.68 s of 4 charged to the generator, 0.44 s of it the broker's: 81 % vs 95 %.
        let broker_bound =
            InterruptsAttributed::of(side(3.68, 0.44), side(3.36, 0.02), lists(), 4.0, 1);
        assert_eq!(broker_bound.bound_by, Bound::Broker);
        assert_eq!(generator_busy_warning(92.0, Some(&broker_bound)), None);
        // Little interrupt time: the generator stays the busier side, and the warning says so.
        let generator_bound =
            InterruptsAttributed::of(side(3.68, 0.04), side(3.2, 0.02), lists(), 4.0, 1);
        assert_eq!(generator_bound.bound_by, Bound::Generator);
        let w = generator_busy_warning(92.0, Some(&generator_bound)).expect("still the bound");
        assert!(w.contains("92% busy") && w.contains("moved to the side it served"), "{w}");
    }

    #[test]
    fn interrupt_time_moves_to_the_side_it_served() {
        let side = |cpu_s, interrupts_s| SideCpu { cpu_s, interrupts_s, cpus: 1 };
        // A 4 s window: the generator was charged 3.6 s, 0.4 s of it the broker's receive
        // path and disk; the broker 3.4 s, 0.1 s of it the generator's.
        let a = InterruptsAttributed::of(
            side(3.6, 0.4),
            side(3.4, 0.1),
            (vec![1], vec![0]),
            4.0,
            1_600_000_000,
        );
        assert!((a.generator_cpu_s - 3.3).abs() < 1e-9, "{a:?}");
        assert!((a.broker_cpu_s - 3.7).abs() < 1e-9, "{a:?}");
        assert!((a.generator_busy_pct - 82.5).abs() < 1e-9);
        assert!((a.broker_busy_pct - 92.5).abs() < 1e-9);
        assert_eq!(a.bound_by, Bound::Broker, "the plain figures say generator: 90 vs 85 %");
        assert_eq!(Bound::of(90.0, 85.0), Bound::Generator);
        let per_broker = a.stored_mb_per_broker_cpu_s.expect("broker CPU");
        assert!((per_broker - 1600.0 / 3.7).abs() < 1e-6);
        // The total is kept.
        assert!((a.generator_cpu_s + a.broker_cpu_s - 7.0).abs() < 1e-9);
        // A side gives up no more than it was charged.
        let b =
            InterruptsAttributed::of(side(0.2, 0.5), side(3.0, 0.0), (vec![1], vec![0]), 4.0, 0);
        assert!((b.generator_cpu_s - 0.0).abs() < 1e-9 && (b.broker_cpu_s - 3.2).abs() < 1e-9);
        assert_eq!(b.stored_mb_per_generator_cpu_s, None, "no CPU, no ratio");
        // Busy % is over each side's CPUs.
        let two = SideCpu { cpu_s: 4.0, interrupts_s: 0.0, cpus: 2 };
        let c = InterruptsAttributed::of(two, side(1.0, 0.0), (vec![2, 3], vec![0]), 4.0, 0);
        assert!((c.generator_busy_pct - 50.0).abs() < 1e-9);
    }

    #[test]
    fn latency_round_trips_through_hdr() {
        let mut h = new_histogram();
        for v in 1..=1000u64 {
            h.record(v * 10).expect("in range");
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert!(!l.hdr.is_empty());
        let back = l.histogram().expect("decodes");
        assert_eq!(back.len(), 1000);
        assert_eq!(back.value_at_quantile(0.99), h.value_at_quantile(0.99));
    }
}
