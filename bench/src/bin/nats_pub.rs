//! The NATS JetStream peer row of `bench/run.sh`: a JetStream publisher for a running
//! `nats-server -js`, measured the way felix-loadgen measures Felix.
//!
//! `nats_pub --server 127.0.0.1:4222 --server-pid PID[,PID...] [--subjects 12]
//!  [--payload-bytes 4096] [--in-flight 1024] [--warmup-s 1] [--duration-s 2] [--stream BENCH]
//!  [--replicas 1] [--label L] [--json F]`
//!
//! `--replicas 3` makes the stream R3 (for a cluster of `nats-server`s; `bench/replication.sh`),
//! and the server CPU is then the sum over every `--server-pid`.
//!
//! One current-thread tokio runtime (pin it with taskset): it creates a file-stored stream over
//! `bench.<stream>.*` (the server's default store), then publishes `--payload-bytes` messages
//! round-robin over `--subjects` subjects as fast as the server acks them, with at most
//! `--in-flight` publishes awaiting their ack (async-nats' ack backpressure). Every ack is awaited.
//! Over the measured window it reports what the server acked (payload + subject bytes: the
//! counterpart of Felix's value + key), the server's and its own CPU time from `/proc`, and the
//! publish-to-ack percentiles, as one JSON object whose field names follow felix-loadgen's
//! (`stored_mb_s`, `broker.cpu_pct`, `generator_busy_pct`, `ack.p99_us`, ...), so the suite's
//! summary reads both alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use hdrhistogram::Histogram;

/// A generator above this share of its CPUs measured itself, not the server (felix-loadgen's
/// threshold).
const GENERATOR_BUSY_WARN_PCT: f64 = 80.0;
/// How long the end of the run waits for the acks still in flight.
const DRAIN_TIMEOUT_MS: u64 = 5_000;
/// Latencies above this are clamped into the histogram's top bucket.
const LATENCY_MAX_US: u64 = 60_000_000;
/// A side at least this busy (% of the CPUs it may use), and busier than the other, bounded the
/// run (`bound_by`): felix-loadgen's `BOUND_BUSY_PCT`, so the rows compare.
const BOUND_BUSY_PCT: f64 = 80.0;

fn main() -> anyhow::Result<()> {
    let args = Args::parse(std::env::args().skip(1))?;
    let result =
        tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run(&args))?;
    let text = serde_json::to_string_pretty(&result)?;
    match &args.json {
        Some(path) => std::fs::write(path, text + "\n")?,
        None => println!("{text}"),
    }
    println!(
        "nats_pub {}: stored {:.1} MB/s, {:.0} MB per server CPU-s (server {:.0}% busy), \
         generator {:.0}% busy, ack p50/p99 {:.2}/{:.2} ms",
        args.label,
        result["stored_mb_s"].as_f64().unwrap_or(0.0),
        result["stored_mb_per_broker_cpu_s"].as_f64().unwrap_or(0.0),
        result["broker_busy_pct"].as_f64().unwrap_or(0.0),
        result["generator_busy_pct"].as_f64().unwrap_or(0.0),
        result["ack"]["p50_us"].as_f64().unwrap_or(0.0) / 1000.0,
        result["ack"]["p99_us"].as_f64().unwrap_or(0.0) / 1000.0,
    );
    Ok(())
}

/// The command line.
struct Args {
    server: String,
    server_pids: Vec<u32>,
    replicas: usize,
    subjects: usize,
    payload_bytes: usize,
    in_flight: usize,
    warmup_s: f64,
    duration_s: f64,
    stream: String,
    label: String,
    json: Option<String>,
}

impl Args {
    fn parse(mut it: impl Iterator<Item = String>) -> anyhow::Result<Self> {
        let mut a = Args {
            server: "127.0.0.1:4222".into(),
            server_pids: Vec::new(),
            replicas: 1,
            subjects: 12,
            payload_bytes: 4096,
            in_flight: 1024,
            warmup_s: 1.0,
            duration_s: 2.0,
            stream: "BENCH".into(),
            label: "nats".into(),
            json: None,
        };
        while let Some(flag) = it.next() {
            let value = it.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
            match flag.as_str() {
                "--server" => a.server = value,
                "--server-pid" => {
                    for pid in value.split(',') {
                        a.server_pids.push(pid.parse()?);
                    }
                }
                "--replicas" => a.replicas = value.parse()?,
                "--subjects" => a.subjects = value.parse()?,
                "--payload-bytes" => a.payload_bytes = value.parse()?,
                "--in-flight" => a.in_flight = value.parse()?,
                "--warmup-s" => a.warmup_s = value.parse()?,
                "--duration-s" => a.duration_s = value.parse()?,
                "--stream" => a.stream = value,
                "--label" => a.label = value,
                "--json" => a.json = Some(value),
                other => anyhow::bail!("unknown flag {other}"),
            }
        }
        anyhow::ensure!(a.subjects > 0, "--subjects must be at least 1");
        anyhow::ensure!((1..=5).contains(&a.replicas), "--replicas must be 1..=5");
        anyhow::ensure!(a.in_flight > 0, "--in-flight must be at least 1");
        anyhow::ensure!(a.duration_s > 0.0, "--duration-s must be positive");
        Ok(a)
    }
}

/// Counters the acker task keeps and the window edges read.
#[derive(Default)]
struct Acked {
    records: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    /// Set inside the measured window: only then do latencies go into the histogram.
    measuring: AtomicBool,
}

/// What is read at each edge of the window.
struct Edge {
    at: Instant,
    sent_records: u64,
    sent_bytes: u64,
    acked_records: u64,
    acked_bytes: u64,
    errors: u64,
    stream_bytes: Option<u64>,
    server_cpu_us: Option<u64>,
    own_cpu_us: u64,
    load_1m: Option<f64>,
}

async fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let client = async_nats::connect(&args.server).await?;
    let server_version = client.server_info().version;
    let js = jetstream::context::ContextBuilder::new()
        .max_ack_inflight(args.in_flight)
        .backpressure_on_inflight(true)
        .build(client);
    let prefix = format!("bench.{}", args.stream);
    js.get_or_create_stream(jetstream::stream::Config {
        name: args.stream.clone(),
        subjects: vec![format!("{prefix}.*")],
        storage: jetstream::stream::StorageType::File,
        num_replicas: args.replicas,
        ..Default::default()
    })
    .await?;
    let subjects: Vec<String> = (0..args.subjects).map(|i| format!("{prefix}.k{i}")).collect();
    let payload = Bytes::from(vec![0x5a_u8; args.payload_bytes]);

    let acked = Arc::new(Acked::default());
    let (ack_tx, ack_rx) = tokio::sync::mpsc::channel(args.in_flight);
    let acker = tokio::spawn(await_acks(ack_rx, acked.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let publisher = {
        let (js, stop, sent, acked) = (js.clone(), stop.clone(), sent.clone(), acked.clone());
        tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let subject = &subjects[i % subjects.len()];
                i += 1;
                let t0 = Instant::now();
                match js.publish(subject.clone(), payload.clone()).await {
                    Ok(ack) => {
                        sent.0.fetch_add(1, Ordering::Relaxed);
                        sent.1.fetch_add((payload.len() + subject.len()) as u64, Ordering::Relaxed);
                        let bytes = (payload.len() + subject.len()) as u64;
                        if ack_tx.send((t0, bytes, ack)).await.is_err() {
                            break;
                        }
                    }
                    Err(_) => {
                        acked.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };

    let mut stream = js.get_stream(&args.stream).await?;
    tokio::time::sleep(Duration::from_secs_f64(args.warmup_s)).await;
    let start = edge(args, &sent, &acked, &mut stream).await;
    acked.measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.duration_s)).await;
    acked.measuring.store(false, Ordering::Relaxed);
    let end = edge(args, &sent, &acked, &mut stream).await;
    stop.store(true, Ordering::Relaxed);
    publisher.await?;
    let hist =
        tokio::time::timeout(Duration::from_millis(DRAIN_TIMEOUT_MS), acker).await.map_err(
            |_| anyhow::anyhow!("acks still in flight {DRAIN_TIMEOUT_MS} ms after the end"),
        )??;
    Ok(report(args, &server_version, &start, &end, &hist))
}

/// Awaits every publish's ack in order (one stream: the server acks in order), counting acked
/// messages and bytes and recording latencies inside the window. Returns the histogram.
async fn await_acks(
    mut rx: tokio::sync::mpsc::Receiver<(Instant, u64, jetstream::context::PublishAckFuture)>,
    acked: Arc<Acked>,
) -> Histogram<u64> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, LATENCY_MAX_US, 3)
        .expect("constant bounds are valid: 1 <= low, high >= 2 * low, 3 significant digits");
    while let Some((t0, bytes, ack)) = rx.recv().await {
        match ack.await {
            Ok(_) => {
                acked.records.fetch_add(1, Ordering::Relaxed);
                acked.bytes.fetch_add(bytes, Ordering::Relaxed);
                if acked.measuring.load(Ordering::Relaxed) {
                    let us = (t0.elapsed().as_micros() as u64).clamp(1, LATENCY_MAX_US);
                    hist.saturating_record(us);
                }
            }
            Err(_) => {
                acked.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    hist
}

async fn edge(
    args: &Args,
    sent: &(AtomicU64, AtomicU64),
    acked: &Acked,
    stream: &mut jetstream::stream::Stream,
) -> Edge {
    let e = Edge {
        at: Instant::now(),
        sent_records: sent.0.load(Ordering::Relaxed),
        sent_bytes: sent.1.load(Ordering::Relaxed),
        acked_records: acked.records.load(Ordering::Relaxed),
        acked_bytes: acked.bytes.load(Ordering::Relaxed),
        errors: acked.errors.load(Ordering::Relaxed),
        stream_bytes: None,
        server_cpu_us: servers_cpu_us(&args.server_pids),
        own_cpu_us: felix_bench::process_cpu_us(),
        load_1m: load_average_1m(),
    };
    // The stream's own byte count (payload plus the server's per-message overhead), as evidence
    // that the acked bytes were stored.
    let stream_bytes = stream.info().await.ok().map(|i| i.state.bytes);
    Edge { stream_bytes, ..e }
}

fn report(
    args: &Args,
    server_version: &str,
    s: &Edge,
    e: &Edge,
    hist: &Histogram<u64>,
) -> serde_json::Value {
    let measured_s = e.at.duration_since(s.at).as_secs_f64();
    let stored_bytes = e.acked_bytes - s.acked_bytes;
    let stored_mb = stored_bytes as f64 / 1e6;
    let gen_cpu_s = (e.own_cpu_us - s.own_cpu_us) as f64 / 1e6;
    let gen_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gen_busy = gen_cpu_s / measured_s / gen_cpus as f64;
    let server_cpu_s = match (s.server_cpu_us, e.server_cpu_us) {
        (Some(a), Some(b)) => Some((b - a) as f64 / 1e6),
        _ => None,
    };
    // The servers are pinned to one CPU by bench/run.sh and bench/replication.sh: their busy
    // share is their CPU % of one core.
    let server_busy = server_cpu_s.map(|c| c / measured_s);
    let bound_by = server_busy.map(|sb| bound_of(100.0 * gen_busy, 100.0 * sb));
    let mut warnings = Vec::new();
    if 100.0 * gen_busy > GENERATOR_BUSY_WARN_PCT {
        warnings.push(format!(
            "generator was {:.0}% busy (> {GENERATOR_BUSY_WARN_PCT}%): this run may measure the \
             generator, not the server",
            100.0 * gen_busy
        ));
    }
    if server_cpu_s.is_none() {
        warnings.push("no --server-pid: no server CPU figures".into());
    }
    let errors = e.errors - s.errors;
    if errors > 0 {
        warnings.push(format!("{errors} publish errors in the window"));
    }
    serde_json::json!({
        "version": 1,
        "system": "nats-jetstream",
        "server_version": server_version,
        "label": args.label,
        "config": {
            "server": args.server,
            "stream": args.stream,
            "subjects": args.subjects,
            "payload_bytes": args.payload_bytes,
            "in_flight": args.in_flight,
            "warmup_s": args.warmup_s,
            "duration_s": args.duration_s,
            "storage": "file",
            "replicas": args.replicas,
            "servers": args.server_pids.len(),
        },
        "measured_s": measured_s,
        "load_average_1m": [s.load_1m, e.load_1m],
        "sent_records": e.sent_records - s.sent_records,
        "sent_bytes": e.sent_bytes - s.sent_bytes,
        "acked_records": e.acked_records - s.acked_records,
        "errors": errors,
        "generator_cpu_s": gen_cpu_s,
        "generator_cpu_pct": 100.0 * gen_cpu_s / measured_s,
        "generator_cpus": gen_cpus,
        "generator_busy_pct": 100.0 * gen_busy,
        "broker": {
            "stored_bytes": stored_bytes,
            "stream_bytes_delta": match (s.stream_bytes, e.stream_bytes) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            },
            "cpu_s": server_cpu_s,
            "cpu_pct": server_busy.map(|b| 100.0 * b),
        },
        "broker_busy_pct": server_busy.map(|b| 100.0 * b),
        "stored_mb_s": stored_mb / measured_s,
        "sent_mb_s": (e.sent_bytes - s.sent_bytes) as f64 / 1e6 / measured_s,
        "stored_mb_per_broker_cpu_s": server_cpu_s.filter(|c| *c > 0.0).map(|c| stored_mb / c),
        "stored_mb_per_generator_cpu_s": (gen_cpu_s > 0.0).then(|| stored_mb / gen_cpu_s),
        "bound_by": bound_by,
        "ack": {
            "count": hist.len(),
            "p50_us": hist.value_at_quantile(0.5),
            "p90_us": hist.value_at_quantile(0.9),
            "p99_us": hist.value_at_quantile(0.99),
            "p999_us": hist.value_at_quantile(0.999),
            "max_us": hist.max(),
            "mean_us": hist.mean(),
        },
        "warnings": warnings,
    })
}

/// Which side bounded a run, as felix-loadgen's `Bound::of`: the busier side if it was at least
/// [`BOUND_BUSY_PCT`] busy (a tie goes to the generator), else neither.
fn bound_of(generator_busy_pct: f64, server_busy_pct: f64) -> &'static str {
    if generator_busy_pct.max(server_busy_pct) < BOUND_BUSY_PCT {
        "neither"
    } else if generator_busy_pct >= server_busy_pct {
        "generator"
    } else {
        "broker"
    }
}

/// The CPU time of every server process, summed (`None` without any, or if one is gone).
fn servers_cpu_us(pids: &[u32]) -> Option<u64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|p| felix_bench::pid_cpu_us(*p)).sum()
}

/// The 1-minute load average, from `/proc/loadavg`.
fn load_average_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busier_side_over_the_threshold_is_the_bound() {
        assert_eq!(bound_of(97.0, 72.0), "generator");
        assert_eq!(bound_of(60.0, 93.0), "broker");
        assert_eq!(bound_of(40.0, 30.0), "neither");
        assert_eq!(bound_of(BOUND_BUSY_PCT, BOUND_BUSY_PCT), "generator", "a tie");
    }

    #[test]
    fn flags_parse_and_bad_ones_are_refused() {
        let args = |v: &[&str]| Args::parse(v.iter().map(|s| s.to_string()));
        let a = args(&["--subjects", "3", "--server-pid", "42", "--json", "r.json"]).unwrap();
        assert_eq!(
            (a.subjects, &a.server_pids[..], a.json.as_deref()),
            (3, &[42][..], Some("r.json"))
        );
        let r3 = args(&["--server-pid", "1,2,3", "--replicas", "3"]).unwrap();
        assert_eq!((&r3.server_pids[..], r3.replicas), (&[1, 2, 3][..], 3));
        assert!(args(&["--replicas", "0"]).is_err());
        assert_eq!((a.payload_bytes, a.in_flight), (4096, 1024));
        assert!(args(&["--subjects", "0"]).is_err());
        assert!(args(&["--in-flight"]).is_err());
        assert!(args(&["--bogus", "1"]).is_err());
    }
}
