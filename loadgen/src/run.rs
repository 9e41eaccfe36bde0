//! The driver of a run: creates the stream, starts the workers, waits for `--start-at`, then
//! samples once a second (worker counters and histograms, the broker's `/metrics`, /proc for
//! both processes' CPU and the broker's RSS), prints the progress line, and at the end builds
//! the [`RunResult`] from the snapshots taken at the window's start and end.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use felix_client::{Client, Retention, SendStats};
use hdrhistogram::Histogram;

use crate::config::RunConfig;
use crate::metrics::{self, BrokerSample, HistogramSample};
use crate::report::{
    Bound, BrokerResult, ClientQuic, ClientSend, InterruptsAttributed, Latency, RunResult, Second,
    SideCpu, WorkerResult, RESULT_VERSION,
};
use crate::sys;
use crate::worker::{self, new_histogram, RunFlags, WorkerShared};

/// The longest the workers may take to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Sampling period.
pub const TICK: Duration = Duration::from_secs(1);
/// The latest `--start-at` may lie in the future.
pub const START_AT_AHEAD_MAX: Duration = Duration::from_secs(24 * 3600);

/// Counter totals of all workers at one moment.
#[derive(Clone, Copy, Default)]
struct Totals {
    sent_records: u64,
    sent_bytes: u64,
    acked: u64,
    errors: u64,
    resubscribes: u64,
    delivered_records: u64,
    delivered_bytes: u64,
    quic_sent: u64,
    quic_lost: u64,
    quic_congestion: u64,
    quic_black_holes: u64,
    quic_flow_blocked: u64,
}

impl Totals {
    fn of(w: &WorkerShared) -> Self {
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Self {
            sent_records: l(&w.sent_records),
            sent_bytes: l(&w.sent_bytes),
            acked: l(&w.acked_records),
            errors: l(&w.errors),
            resubscribes: l(&w.resubscribes),
            delivered_records: l(&w.delivered_records),
            delivered_bytes: l(&w.delivered_bytes),
            quic_sent: l(&w.quic_packets_sent),
            quic_lost: l(&w.quic_packets_lost),
            quic_congestion: l(&w.quic_congestion_events),
            quic_black_holes: l(&w.quic_black_holes),
            quic_flow_blocked: l(&w.quic_flow_blocked),
        }
    }

    fn sum(all: &[Self]) -> Self {
        all.iter().fold(Self::default(), |a, b| a.plus(b, 1))
    }

    fn plus(&self, o: &Self, sign: i8) -> Self {
        let f = |a: u64, b: u64| if sign > 0 { a + b } else { a.saturating_sub(b) };
        Self {
            sent_records: f(self.sent_records, o.sent_records),
            sent_bytes: f(self.sent_bytes, o.sent_bytes),
            acked: f(self.acked, o.acked),
            errors: f(self.errors, o.errors),
            resubscribes: f(self.resubscribes, o.resubscribes),
            delivered_records: f(self.delivered_records, o.delivered_records),
            delivered_bytes: f(self.delivered_bytes, o.delivered_bytes),
            quic_sent: f(self.quic_sent, o.quic_sent),
            quic_lost: f(self.quic_lost, o.quic_lost),
            quic_congestion: f(self.quic_congestion, o.quic_congestion),
            quic_black_holes: f(self.quic_black_holes, o.quic_black_holes),
            quic_flow_blocked: f(self.quic_flow_blocked, o.quic_flow_blocked),
        }
    }
}

/// A snapshot at a window edge.
struct Edge {
    at: Instant,
    unix_ms: u64,
    workers: Vec<Totals>,
    generator_cpu_s: f64,
    broker_cpu_s: Option<f64>,
    /// Interrupt seconds on the generator's and on the broker's CPUs (when attributed).
    interrupts: Option<(f64, f64)>,
    broker: Option<BrokerSample>,
    histograms: Option<HistogramSample>,
    load: Option<f64>,
    rss: Option<u64>,
    /// The publishers' send statistics, summed over the workers.
    send: SendStats,
}

/// Runs the workload and returns its result.
pub fn run(config: RunConfig) -> anyhow::Result<RunResult> {
    if let Some(shards) = config.shards {
        create_stream(&config, shards)?;
    }
    let config = Arc::new(config);
    let flags = Arc::new(RunFlags::default());
    let mut workers = Vec::new();
    for i in 0..config.workers {
        workers.push(worker::spawn(i, config.clone(), flags.clone()).context("worker thread")?);
    }
    let connect_start = Instant::now();
    loop {
        if let Some(w) = workers.iter().find(|(s, _)| s.failed.load(Ordering::Relaxed)) {
            flags.stop.store(true, Ordering::Relaxed);
            let e = w.0.last_error.lock().ok().and_then(|e| e.clone()).unwrap_or_default();
            bail!("a worker failed to start: {e}");
        }
        if workers.iter().all(|(s, _)| s.connected.load(Ordering::Relaxed)) {
            break;
        }
        if connect_start.elapsed() > CONNECT_TIMEOUT {
            flags.stop.store(true, Ordering::Relaxed);
            bail!("workers not connected after {CONNECT_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(at) = config.start_at {
        let now = sys::unix_ms();
        if at > now {
            anyhow::ensure!(
                at - now <= START_AT_AHEAD_MAX.as_millis() as u64,
                "--start-at is too far ahead"
            );
            std::thread::sleep(Duration::from_millis(at - now));
        } else {
            eprintln!("felix-loadgen: --start-at {at} passed {} ms ago; starting now", now - at);
        }
    }
    let shared: Vec<Arc<WorkerShared>> = workers.iter().map(|(s, _)| s.clone()).collect();
    let mut sampler = Sampler::new(&config, &shared);
    flags.go.store(true, Ordering::Relaxed);
    let began = Instant::now();
    let warmup = Duration::from_secs_f64(config.warmup_s);
    let end = warmup + Duration::from_secs_f64(config.duration_s);
    let mut start_edge: Option<Edge> = None;
    if warmup.is_zero() {
        let edge = sampler.edge();
        sampler.start_window(&edge);
        start_edge = Some(edge);
    }
    let mut next = began;
    loop {
        let since = next.duration_since(began);
        let boundary = if start_edge.is_none() { warmup } else { end };
        let target = (since + TICK).min(boundary);
        next = began + target;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let measured = start_edge.is_some();
        sampler.tick(began.elapsed().as_secs_f64(), measured);
        if target == boundary {
            if start_edge.is_none() {
                let edge = sampler.edge();
                sampler.start_window(&edge);
                start_edge = Some(edge);
            } else {
                break;
            }
        }
    }
    let end_edge = sampler.edge();
    flags.stop.store(true, Ordering::Relaxed);
    for (_, h) in workers {
        let _ = h.join();
    }
    let start_edge = start_edge.context("window start")?;
    Ok(sampler.finish(start_edge, end_edge))
}

fn create_stream(config: &RunConfig, shards: u32) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut c = config.client_config();
        c.connections = Some(1);
        let client = Client::connect(c).await.context("connect to create the stream")?;
        let d = client
            .create_stream(
                &config.stream,
                shards,
                Retention { bytes_max: config.retention_bytes, ..Retention::default() },
            )
            .await
            .with_context(|| format!("create stream {} with {shards} shards", config.stream))?;
        client.close();
        anyhow::ensure!(
            d.shards == shards,
            "stream {} exists with {} shards, not {shards}: use another --stream or wipe the broker",
            config.stream,
            d.shards
        );
        Ok(())
    })
}

/// The send statistics of every worker's publisher, summed.
fn send_stats(workers: &[Arc<WorkerShared>]) -> SendStats {
    let mut sum = SendStats::default();
    for w in workers {
        sum.add(&w.send_stats());
    }
    sum
}

struct Sampler<'a> {
    config: &'a RunConfig,
    workers: &'a [Arc<WorkerShared>],
    previous: Totals,
    previous_gen_cpu_s: f64,
    previous_broker_cpu_s: Option<f64>,
    previous_broker: Option<BrokerSample>,
    previous_at: Instant,
    /// The publishers' send statistics at the previous tick.
    previous_send: SendStats,
    ack_totals: Vec<Histogram<u64>>,
    delivery_totals: Vec<Histogram<u64>>,
    timeline: Vec<Second>,
    rss_max: Option<u64>,
    /// When the window began, Unix ms (`None` during the warm-up).
    window_start_unix_ms: Option<u64>,
    /// The first histograms the broker published at or after the window's start.
    histograms_start: Option<HistogramSample>,
    /// The broker's histograms as of its last publication seen (each second's quantiles are
    /// the difference from it).
    previous_histograms: Option<HistogramSample>,
    /// The generator's and the broker's CPUs, when the broker's pid is known and the two
    /// sets are disjoint: interrupt time is then attributed ([`InterruptsAttributed`]).
    interrupt_cpus: Option<(Vec<usize>, Vec<usize>)>,
}

impl<'a> Sampler<'a> {
    fn new(config: &'a RunConfig, workers: &'a [Arc<WorkerShared>]) -> Self {
        let broker = config.metrics.as_deref().and_then(|m| metrics::scrape_all(m).ok());
        let n = workers.len();
        Self {
            config,
            workers,
            previous: Totals::sum(&workers.iter().map(|w| Totals::of(w)).collect::<Vec<_>>()),
            previous_gen_cpu_s: sys::process_cpu_s(None).unwrap_or(0.0),
            previous_broker_cpu_s: config.broker_pid.and_then(|p| sys::process_cpu_s(Some(p))),
            previous_broker: broker,
            previous_at: Instant::now(),
            previous_send: send_stats(workers),
            interrupt_cpus: config.broker_pid.and_then(disjoint_cpus),
            ack_totals: (0..n).map(|_| new_histogram()).collect(),
            delivery_totals: (0..n).map(|_| new_histogram()).collect(),
            timeline: Vec::new(),
            rss_max: None,
            window_start_unix_ms: None,
            histograms_start: None,
            previous_histograms: None,
        }
    }

    fn edge(&self) -> Edge {
        Edge {
            at: Instant::now(),
            unix_ms: sys::unix_ms(),
            workers: self.workers.iter().map(|w| Totals::of(w)).collect(),
            generator_cpu_s: sys::process_cpu_s(None).unwrap_or(0.0),
            broker_cpu_s: self.config.broker_pid.and_then(|p| sys::process_cpu_s(Some(p))),
            interrupts: self
                .interrupt_cpus
                .as_ref()
                .and_then(|(g, b)| Some((sys::interrupt_s(g)?, sys::interrupt_s(b)?))),
            broker: self.config.metrics.as_deref().and_then(|m| metrics::scrape_all(m).ok()),
            histograms: self.scrape_histograms(),
            load: sys::load_average_1m(),
            rss: self.config.broker_pid.and_then(sys::process_rss_bytes),
            send: send_stats(self.workers),
        }
    }

    fn scrape_histograms(&self) -> Option<HistogramSample> {
        self.config.metrics.as_deref().and_then(|m| metrics::scrape_histograms_all(m).ok())
    }

    /// Marks the window's start (at its start edge).
    fn start_window(&mut self, edge: &Edge) {
        self.window_start_unix_ms = Some(edge.unix_ms);
        self.take_histograms_start(edge.histograms.clone());
    }

    /// Keeps `h` as the window's first histograms if every core published it inside the
    /// window (the broker publishes once a second, so the one seen at the start edge usually
    /// holds some of the warm-up; a later tick's is taken then).
    fn take_histograms_start(&mut self, h: Option<HistogramSample>) {
        if let (None, Some(start), Some(h)) = (&self.histograms_start, self.window_start_unix_ms, h)
        {
            if h.oldest_unix_ms() >= start {
                self.histograms_start = Some(h);
            }
        }
    }

    fn tick(&mut self, t_s: f64, measured: bool) {
        let histograms = self.scrape_histograms();
        if measured && self.histograms_start.is_none() && self.window_start_unix_ms.is_some() {
            self.take_histograms_start(histograms.clone());
        }
        // The broker's own quantiles since its previous publication (about a second), when
        // every core has published since.
        let latest = match (&self.previous_histograms, &histograms) {
            (Some(p), Some(h)) => h.since(p),
            _ => None,
        };
        // The base is a sample in which every core has published (0: not yet).
        let complete = histograms
            .as_ref()
            .is_some_and(|h| !h.published_unix_ms.is_empty() && !h.published_unix_ms.contains(&0));
        if complete && (latest.is_some() || self.previous_histograms.is_none()) {
            self.previous_histograms = histograms;
        }
        let latest = latest.unwrap_or_default();
        let now = Instant::now();
        let dt = now.duration_since(self.previous_at).as_secs_f64().max(1e-6);
        self.previous_at = now;
        let totals = Totals::sum(&self.workers.iter().map(|w| Totals::of(w)).collect::<Vec<_>>());
        let d = totals.plus(&self.previous, -1);
        self.previous = totals;
        let mut interval = new_histogram();
        for (i, w) in self.workers.iter().enumerate() {
            let (ack, delivery) = w.take_intervals();
            let _ = interval.add(&ack);
            if measured {
                let _ = self.ack_totals[i].add(&ack);
                let _ = self.delivery_totals[i].add(&delivery);
            }
        }
        let gen_cpu = sys::process_cpu_s(None).unwrap_or(0.0);
        let gen_pct = 100.0 * (gen_cpu - self.previous_gen_cpu_s) / dt;
        self.previous_gen_cpu_s = gen_cpu;
        let broker_cpu = self.config.broker_pid.and_then(|p| sys::process_cpu_s(Some(p)));
        let broker_pct = match (broker_cpu, self.previous_broker_cpu_s) {
            (Some(a), Some(b)) => Some(100.0 * (a - b) / dt),
            _ => None,
        };
        self.previous_broker_cpu_s = broker_cpu;
        let rss = self.config.broker_pid.and_then(sys::process_rss_bytes);
        if measured {
            self.rss_max = self.rss_max.max(rss);
        }
        let scrape = self.config.metrics.as_deref().and_then(|m| metrics::scrape_all(m).ok());
        let (stored, p99s, accepted) = match (&scrape, &self.previous_broker) {
            (Some(s), Some(p)) => (
                s.delta(p, |s| &s.append_bytes),
                s.ack_p99_us.clone(),
                BrokerSample::total(&s.delta(p, |s| &s.connections_accepted)),
            ),
            _ => (Vec::new(), Vec::new(), 0),
        };
        if scrape.is_some() {
            self.previous_broker = scrape;
        }
        let send = send_stats(self.workers);
        let send_second = ClientSend::between(&self.previous_send, &send);
        self.previous_send = send;
        let second = Second {
            t_s,
            measured,
            sent_bytes: d.sent_bytes,
            acked_records: d.acked,
            errors: d.errors,
            delivered_records: d.delivered_records,
            ack_p50_us: interval.value_at_quantile(0.5),
            ack_p99_us: interval.value_at_quantile(0.99),
            generator_cpu_pct: gen_pct,
            broker_cpu_pct: broker_pct,
            broker_rss_bytes: rss,
            stored_bytes_per_core: stored,
            broker_ack_p99_us_per_core: p99s,
            broker_latest_span_ms_per_core: latest.span_ms,
            broker_latest_ack_p99_us_per_core: latest.ack_p99_us,
            broker_latest_write_p99_us_per_core: latest.write_p99_us,
            broker_latest_flush_p99_us_per_core: latest.flush_p99_us,
            broker_connections_accepted: accepted,
            client_send_delay_p99_us: send_second.delay_p99_us,
        };
        if self.config.progress {
            let stored: u64 = second.stored_bytes_per_core.iter().sum();
            let mut line = format!(
                "[{:>6.1}s{}] sent {:>7.1} MB/s  stored {:>7.1} MB/s  acked {:>7.0}/s  p99 {:>6} us  \
                 errors {}  gen {:>3.0}%",
                t_s,
                if measured { "" } else { " warm-up" },
                d.sent_bytes as f64 / 1e6 / dt,
                stored as f64 / 1e6 / dt,
                d.acked as f64 / dt,
                second.ack_p99_us,
                d.errors,
                gen_pct,
            );
            if let Some(b) = broker_pct {
                line.push_str(&format!("  broker {b:>3.0}%"));
            }
            if self.config.subscribers > 0 {
                line.push_str(&format!("  delivered {:>7.0}/s", d.delivered_records as f64 / dt));
            }
            if let (true, Some(r)) = (self.config.soak, rss) {
                line.push_str(&format!("  broker RSS {:.1} MiB", r as f64 / 1048576.0));
            }
            eprintln!("{line}");
        }
        self.timeline.push(second);
    }

    fn finish(self, start: Edge, end: Edge) -> RunResult {
        let window_s = end.at.duration_since(start.at).as_secs_f64().max(1e-6);
        let per_worker: Vec<Totals> =
            end.workers.iter().zip(&start.workers).map(|(e, s)| e.plus(s, -1)).collect();
        let total = Totals::sum(&per_worker);
        let mut all_ack = new_histogram();
        let mut all_delivery = new_histogram();
        let workers: Vec<WorkerResult> = per_worker
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let _ = all_ack.add(&self.ack_totals[i]);
                let _ = all_delivery.add(&self.delivery_totals[i]);
                WorkerResult {
                    index: i,
                    cpu: self.config.worker_cpus.get(i).copied().flatten(),
                    sent_records: t.sent_records,
                    sent_bytes: t.sent_bytes,
                    acked_records: t.acked,
                    errors: t.errors,
                    delivered_records: t.delivered_records,
                    ack: Latency::of(&self.ack_totals[i]),
                    delivery: Latency::of(&self.delivery_totals[i]),
                }
            })
            .collect();
        let broker_cpu_s = match (end.broker_cpu_s, start.broker_cpu_s) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        };
        let window = match (&self.histograms_start, &end.histograms) {
            (Some(a), Some(b)) => b.since(a),
            _ => None,
        };
        let broker = match (&end.broker, &start.broker) {
            (Some(e), Some(s)) => {
                // The window's own quantiles when the histograms allow, else since start.
                let pick = |w: Option<&Vec<u64>>, since_start: &Vec<u64>| {
                    w.cloned().unwrap_or_else(|| since_start.clone())
                };
                let w = window.as_ref();
                let per_core = e.delta(s, |s| &s.append_bytes);
                let stored: u64 = per_core.iter().sum();
                let flushes = BrokerSample::total(&e.delta(s, |s| &s.flushes));
                Some(BrokerResult {
                    stored_bytes: stored,
                    stored_bytes_per_core: per_core,
                    flushes,
                    flushes_per_gb: if stored > 0 {
                        flushes as f64 / (stored as f64 / 1e9)
                    } else {
                        0.0
                    },
                    connections_accepted: BrokerSample::total(
                        &e.delta(s, |s| &s.connections_accepted),
                    ),
                    publish_errors: BrokerSample::total(&e.delta(s, |s| &s.publish_errors)),
                    quic_packets_sent: BrokerSample::total(&e.delta(s, |s| &s.quic_packets_sent)),
                    quic_packets_lost: BrokerSample::total(&e.delta(s, |s| &s.quic_packets_lost)),
                    quic_congestion_events: BrokerSample::total(
                        &e.delta(s, |s| &s.quic_congestion_events),
                    ),
                    event_bytes_per_core: e.delta(s, |s| &s.event_bytes),
                    ack_p50_us_per_core: pick(w.map(|w| &w.ack_p50_us), &e.ack_p50_us),
                    ack_p99_us_per_core: pick(w.map(|w| &w.ack_p99_us), &e.ack_p99_us),
                    ack_record_p99_us_per_core: w
                        .map(|w| w.ack_record_p99_us.clone())
                        .unwrap_or_default(),
                    receive_p50_us_per_core: pick(w.map(|w| &w.receive_p50_us), &e.receive_p50_us),
                    receive_p99_us_per_core: pick(w.map(|w| &w.receive_p99_us), &e.receive_p99_us),
                    flush_p50_us_per_core: pick(w.map(|w| &w.flush_p50_us), &e.flush_p50_us),
                    flush_p99_us_per_core: pick(w.map(|w| &w.flush_p99_us), &e.flush_p99_us),
                    write_p99_us_per_core: pick(w.map(|w| &w.write_p99_us), &e.write_p99_us),
                    latency_span_ms_per_core: w.map(|w| w.span_ms.clone()).unwrap_or_default(),
                    cpu_s: broker_cpu_s,
                    cpu_pct: broker_cpu_s.map(|c| 100.0 * c / window_s),
                    rss_start_bytes: start.rss,
                    rss_end_bytes: end.rss,
                    rss_max_bytes: self.rss_max.max(end.rss),
                })
            }
            _ => None,
        };
        let stored_mb_s = broker.as_ref().map(|b| b.stored_bytes as f64 / 1e6 / window_s);
        let per_cpu_s = match (&broker, broker_cpu_s) {
            (Some(b), Some(c)) if c > 0.0 => Some(b.stored_bytes as f64 / 1e6 / c),
            _ => None,
        };
        let gen_cpu_s = end.generator_cpu_s - start.generator_cpu_s;
        let gen_pct = 100.0 * gen_cpu_s / window_s;
        let cpus = sys::allowed_cpus();
        let gen_busy_pct = gen_pct / cpus as f64;
        let per_gen_cpu_s = match &broker {
            Some(b) if gen_cpu_s > 0.0 => Some(b.stored_bytes as f64 / 1e6 / gen_cpu_s),
            _ => None,
        };
        // The broker's cores from its own per-core series; with several brokers, the pid is
        // one of them and its share of the cores is not known.
        let one_broker =
            self.config.metrics.as_deref().is_some_and(|m| metrics::addresses(m).len() == 1);
        let broker_busy_pct = match &broker {
            Some(b) if one_broker && !b.stored_bytes_per_core.is_empty() => {
                b.cpu_pct.map(|p| p / b.stored_bytes_per_core.len() as f64)
            }
            _ => None,
        };
        let bound_by = broker_busy_pct.map(|b| Bound::of(gen_busy_pct, b));
        let interrupts_attributed = match (
            &self.interrupt_cpus,
            &broker,
            broker_busy_pct,
            broker_cpu_s,
            end.interrupts,
            start.interrupts,
        ) {
            (Some(lists), Some(b), Some(_), Some(broker_cpu_s), Some(e), Some(s)) => {
                Some(InterruptsAttributed::of(
                    SideCpu { cpu_s: gen_cpu_s, interrupts_s: e.0 - s.0, cpus },
                    SideCpu {
                        cpu_s: broker_cpu_s,
                        interrupts_s: e.1 - s.1,
                        cpus: b.stored_bytes_per_core.len(),
                    },
                    lists.clone(),
                    window_s,
                    b.stored_bytes,
                ))
            }
            _ => None,
        };
        let last_errors = self
            .workers
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                w.last_error.lock().ok()?.clone().map(|e| format!("worker {i}: {e}"))
            })
            .collect();
        let mut result = RunResult {
            version: RESULT_VERSION,
            config: self.config.clone(),
            window_start_unix_ms: start.unix_ms,
            window_end_unix_ms: end.unix_ms,
            measured_s: window_s,
            load_average_1m: (start.load, end.load),
            sent_records: total.sent_records,
            sent_bytes: total.sent_bytes,
            acked_records: total.acked,
            errors: total.errors,
            key_shards: self
                .workers
                .iter()
                .map(|w| w.key_shards.load(Ordering::Relaxed))
                .max()
                .filter(|n| *n > 0),
            resubscribes: total.resubscribes,
            delivered_records: total.delivered_records,
            delivered_bytes: total.delivered_bytes,
            client_send: ClientSend::between(&start.send, &end.send),
            client_quic: ClientQuic {
                packets_sent: total.quic_sent,
                packets_lost: total.quic_lost,
                congestion_events: total.quic_congestion,
                black_holes: total.quic_black_holes,
                flow_control_blocked: total.quic_flow_blocked,
                mtu_min: self
                    .workers
                    .iter()
                    .map(|w| w.quic_mtu_min.load(Ordering::Relaxed))
                    .filter(|m| *m > 0)
                    .min()
                    .unwrap_or(0),
            },
            generator_cpu_s: gen_cpu_s,
            generator_cpu_pct: gen_pct,
            generator_cpus: cpus,
            generator_busy_pct: gen_busy_pct,
            broker,
            stored_mb_s,
            sent_mb_s: total.sent_bytes as f64 / 1e6 / window_s,
            stored_mb_per_broker_cpu_s: per_cpu_s,
            stored_mb_per_generator_cpu_s: per_gen_cpu_s,
            broker_busy_pct,
            bound_by,
            interrupts_attributed,
            ack: Latency::of(&all_ack),
            delivery: Latency::of(&all_delivery),
            workers,
            timeline: self.timeline,
            warnings: Vec::new(),
            last_errors,
        };
        result.derive_warnings();
        result
    }
}

/// The generator's and the broker's CPUs, if both are known and share none.
fn disjoint_cpus(broker_pid: u32) -> Option<(Vec<usize>, Vec<usize>)> {
    let generator = sys::allowed_cpu_list(None)?;
    let broker = sys::allowed_cpu_list(Some(broker_pid))?;
    generator.iter().all(|c| !broker.contains(c)).then_some((generator, broker))
}
