//! Command line of `felix-loadgen`: every flag has a `FELIX_LOADGEN_*` twin, and
//! [`RunArgs::resolve`] turns them into the one [`RunConfig`] the run reads. The effective
//! configuration is printed before anything runs ([`RunConfig::describe`]); `--print-config`
//! prints it and exits, which is how the tests prove that each flag takes effect.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use felix_client::{AckMode, ClientConfig, PublishSettings, Trust};

/// The most worker threads.
pub const WORKERS_MAX: usize = 256;
/// The most publisher or subscriber tasks per worker.
pub const TASKS_PER_WORKER_MAX: usize = 256;
/// The largest record payload, in bytes (the broker caps frames further).
pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;
/// The most distinct keys.
pub const KEYS_MAX: u32 = 1 << 20;
/// Bytes at the front of every payload that carry the send time (Unix microseconds), so
/// subscribers can measure publish-to-delivery latency.
pub const TIMESTAMP_BYTES: usize = 8;

/// `felix-loadgen`: drive a Felix broker and report what it stored.
#[derive(Parser, Debug)]
#[command(name = "felix-loadgen", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a workload against a broker (publish, subscribe, mixed; `--soak` for a soak run).
    Run(Box<RunArgs>),
    /// Merge the JSON results of several generators into one fleet report.
    Merge(MergeArgs),
    /// Draw the plots of a JSON result.
    Plot(PlotArgs),
    /// One core's AES-128-GCM seal+open rate (ring), a physical limit for the reports.
    Aead(AeadArgs),
}

/// The workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Publishers only.
    Publish,
    /// Subscribers only (fanout when several read the same stream).
    Subscribe,
    /// Publishers and subscribers together.
    Mixed,
}

/// Where subscribers start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubscribeFrom {
    /// The oldest retained record.
    Earliest,
    /// The next record stored.
    Latest,
}

/// Flags of `felix-loadgen run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Broker address (host:port), or seed brokers of a cluster, comma-separated (the client
    /// connects to the first that answers and routes to every shard's owner).
    #[arg(long, env = "FELIX_LOADGEN_ADDR", default_value = "127.0.0.1:7400")]
    pub addr: String,
    /// Name the broker's certificate carries.
    #[arg(long, env = "FELIX_LOADGEN_SERVER_NAME", default_value = "localhost")]
    pub server_name: String,
    /// CA or self-signed certificate (PEM) to trust, e.g. DATA_DIR/dev-cert.pem.
    #[arg(long, env = "FELIX_LOADGEN_CA_FILE")]
    pub ca_file: PathBuf,
    /// Broker metrics address (host:port) scraped before, during and after the run, or one per
    /// broker of a cluster, comma-separated (stored bytes then count every broker); `off`.
    #[arg(long, env = "FELIX_LOADGEN_METRICS", default_value = "127.0.0.1:9400")]
    pub metrics: String,
    /// The broker's process id, for its CPU % and RSS from /proc (same host only).
    #[arg(long, env = "FELIX_LOADGEN_BROKER_PID")]
    pub broker_pid: Option<u32>,
    /// Workload.
    #[arg(long, env = "FELIX_LOADGEN_WORKLOAD", value_enum, default_value = "publish")]
    pub workload: Workload,
    /// Stream to publish to and subscribe from (tenant/namespace/stream).
    #[arg(long, env = "FELIX_LOADGEN_STREAM", default_value = "loadgen/bench/records")]
    pub stream: String,
    /// Create the stream with this many shards first (else it must exist or be auto-created).
    #[arg(long, env = "FELIX_LOADGEN_SHARDS")]
    pub shards: Option<u32>,
    /// Size retention of the stream `--shards` creates, in bytes per stream log (the shards one
    /// broker core holds); whole segments go, never the active one. 0 keeps everything.
    #[arg(long, env = "FELIX_LOADGEN_RETENTION_BYTES", default_value_t = 0)]
    pub retention_bytes: u64,
    /// Worker threads, each with its own tokio runtime and client (endpoint, connections).
    #[arg(long, env = "FELIX_LOADGEN_WORKERS", default_value_t = 1)]
    pub workers: usize,
    /// CPUs to pin the workers to, comma-separated, used round-robin (empty: no pinning).
    #[arg(long, env = "FELIX_LOADGEN_CPUS", value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Connections per worker (default: one per broker core).
    #[arg(long, env = "FELIX_LOADGEN_CONNECTIONS")]
    pub connections: Option<usize>,
    /// Publisher tasks per worker (they share the worker's publisher).
    #[arg(long, env = "FELIX_LOADGEN_PUBLISHERS", default_value_t = 4)]
    pub publishers: usize,
    /// Subscriber tasks per worker (each reads the whole stream: fanout).
    #[arg(long, env = "FELIX_LOADGEN_SUBSCRIBERS", default_value_t = 1)]
    pub subscribers: usize,
    /// Where subscribers start.
    #[arg(long, env = "FELIX_LOADGEN_SUBSCRIBE_FROM", value_enum, default_value = "latest")]
    pub subscribe_from: SubscribeFrom,
    /// Record payload bytes (at least 8: the send time rides in front).
    #[arg(long, env = "FELIX_LOADGEN_PAYLOAD_BYTES", default_value_t = 4096)]
    pub payload_bytes: usize,
    /// Records per batch (the publisher's batch_records_max).
    #[arg(long, env = "FELIX_LOADGEN_BATCH_RECORDS", default_value_t = 64)]
    pub batch_records: u32,
    /// Distinct keys, used round-robin; 0 publishes unkeyed.
    #[arg(long, env = "FELIX_LOADGEN_KEYS", default_value_t = 12)]
    pub keys: u32,
    /// Ack mode: none, written or durable.
    #[arg(long, env = "FELIX_LOADGEN_ACK", default_value = "durable",
          value_parser = felix_client::config::parse_ack_mode)]
    pub ack: AckMode,
    /// Records per second over all workers; absent: as fast as possible.
    #[arg(long, env = "FELIX_LOADGEN_RATE")]
    pub rate: Option<u64>,
    /// Publisher linger time, in microseconds.
    #[arg(long, env = "FELIX_LOADGEN_LINGER_US", default_value_t = 1_000)]
    pub linger_us: u64,
    /// Largest UDP payload the client's path MTU discovery may reach: 1452 models a real
    /// 1500-byte path instead of loopback's 64 KiB MTU.
    #[arg(long, env = "FELIX_LOADGEN_MAX_UDP_PAYLOAD", default_value_t = 1452)]
    pub max_udp_payload: u16,
    /// Send each QUIC stream's data before the next one's instead of round-robin (the
    /// client's `send_in_write_order`, off by default).
    #[arg(long, env = "FELIX_LOADGEN_SEND_IN_WRITE_ORDER")]
    pub send_in_write_order: bool,
    /// Split each subscription into one part per broker core, on that core's connection (the
    /// client's `subscribe_per_core`, on by default); `false` reads every shard through one
    /// connection.
    #[arg(long, env = "FELIX_LOADGEN_SUBSCRIBE_PER_CORE", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub subscribe_per_core: bool,
    /// Batches in flight per connection.
    #[arg(long, env = "FELIX_LOADGEN_IN_FLIGHT_BATCHES", default_value_t = 64)]
    pub in_flight_batches: usize,
    /// Idempotent publishing (the client's default): each acked batch carries a producer id
    /// and sequence number, and a batch whose connection is lost is sent again. `false` sends
    /// untagged batches (to measure what the tags cost).
    #[arg(long, env = "FELIX_LOADGEN_IDEMPOTENT", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub idempotent: bool,
    /// Records sent and not yet acked, per worker (a closed loop; 0: only the client's own
    /// queue and in-flight limits bound it, and latency then measures that queue).
    #[arg(long, env = "FELIX_LOADGEN_OUTSTANDING", default_value_t = 1024)]
    pub outstanding: usize,
    /// Warm-up seconds (run, not counted).
    #[arg(long, env = "FELIX_LOADGEN_WARMUP_S", default_value_t = 2.0)]
    pub warmup_s: f64,
    /// Measured seconds.
    #[arg(long, env = "FELIX_LOADGEN_DURATION_S", default_value_t = 10.0)]
    pub duration_s: f64,
    /// Start the warm-up at this Unix time in milliseconds (several generators together).
    #[arg(long, env = "FELIX_LOADGEN_START_AT")]
    pub start_at: Option<u64>,
    /// Soak mode: report errors, reconnects and the broker's RSS over time.
    #[arg(long, env = "FELIX_LOADGEN_SOAK")]
    pub soak: bool,
    /// Write the JSON result (with serialized HDR histograms) here.
    #[arg(long, env = "FELIX_LOADGEN_JSON")]
    pub json: Option<PathBuf>,
    /// Draw the plots (SVG) into this directory.
    #[arg(long, env = "FELIX_LOADGEN_PLOTS")]
    pub plots: Option<PathBuf>,
    /// A label for the reports (host or scenario name).
    #[arg(long, env = "FELIX_LOADGEN_LABEL", default_value = "loadgen")]
    pub label: String,
    /// No live progress line.
    #[arg(long, env = "FELIX_LOADGEN_QUIET")]
    pub quiet: bool,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// Flags of `felix-loadgen merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// JSON results of `felix-loadgen run --json`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write the merged fleet report (JSON) here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Flags of `felix-loadgen plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// A JSON result of `felix-loadgen run --json`.
    pub file: PathBuf,
    /// Directory for the SVG files.
    #[arg(long)]
    pub out: PathBuf,
}

/// Flags of `felix-loadgen aead`.
#[derive(Args, Debug)]
pub struct AeadArgs {
    /// Plaintext bytes per seal+open.
    #[arg(long, default_value_t = 1200)]
    pub bytes: usize,
    /// Seconds to measure.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
}

/// The effective configuration of a run: what every part of the run reads.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunConfig {
    /// Broker address, or seed addresses (comma-separated).
    pub addr: String,
    /// Certificate name.
    pub server_name: String,
    /// Trusted certificate file.
    pub ca_file: PathBuf,
    /// Metrics address (or addresses, comma-separated), `None` when off.
    pub metrics: Option<String>,
    /// Broker pid for /proc sampling.
    pub broker_pid: Option<u32>,
    /// Workload.
    pub workload: Workload,
    /// Stream.
    pub stream: String,
    /// Shards to create the stream with.
    pub shards: Option<u32>,
    /// Size retention to create it with (`None`: keep everything).
    pub retention_bytes: Option<u64>,
    /// Worker threads.
    pub workers: usize,
    /// CPU of each worker (`None`: not pinned).
    pub worker_cpus: Vec<Option<usize>>,
    /// Connections per worker.
    pub connections: Option<usize>,
    /// Publisher tasks per worker (0 unless the workload publishes).
    pub publishers: usize,
    /// Subscriber tasks per worker (0 unless the workload subscribes).
    pub subscribers: usize,
    /// Where subscribers start.
    pub subscribe_from: SubscribeFrom,
    /// Payload bytes.
    pub payload_bytes: usize,
    /// Records per batch.
    pub batch_records: u32,
    /// Keys (0: unkeyed).
    pub keys: u32,
    /// Ack mode name.
    pub ack: String,
    /// Records per second per publisher task (`None`: as fast as possible).
    pub rate_per_task: Option<f64>,
    /// Total records per second asked for.
    pub rate: Option<u64>,
    /// Linger, microseconds.
    pub linger_us: u64,
    /// Client path MTU discovery ceiling.
    pub max_udp_payload: u16,
    /// Streams sent in write order, not round-robin (results written before the flag existed
    /// read as `false`, the behaviour then).
    #[serde(default)]
    pub send_in_write_order: bool,
    /// Subscriptions split by broker core (results written before the flag existed read as
    /// `false`, the behaviour then).
    #[serde(default)]
    pub subscribe_per_core: bool,
    /// In-flight batches per connection.
    pub in_flight_batches: usize,
    /// Idempotent batches (results written before the flag existed read as `false`: the
    /// client did not tag batches then).
    #[serde(default)]
    pub idempotent: bool,
    /// Records in flight per worker (0: unbounded).
    pub outstanding: usize,
    /// Warm-up seconds.
    pub warmup_s: f64,
    /// Measured seconds.
    pub duration_s: f64,
    /// Start time, Unix ms.
    pub start_at: Option<u64>,
    /// Soak mode.
    pub soak: bool,
    /// JSON output.
    pub json: Option<PathBuf>,
    /// Plot directory.
    pub plots: Option<PathBuf>,
    /// Label.
    pub label: String,
    /// Live progress line.
    pub progress: bool,
}

impl RunArgs {
    /// Checks the flags and derives the effective configuration.
    pub fn resolve(&self) -> anyhow::Result<RunConfig> {
        if !(1..=WORKERS_MAX).contains(&self.workers) {
            bail!("--workers must be 1..={WORKERS_MAX}");
        }
        if self.publishers > TASKS_PER_WORKER_MAX || self.subscribers > TASKS_PER_WORKER_MAX {
            bail!("--publishers and --subscribers are at most {TASKS_PER_WORKER_MAX}");
        }
        if !(TIMESTAMP_BYTES..=PAYLOAD_BYTES_MAX).contains(&self.payload_bytes) {
            bail!("--payload-bytes must be {TIMESTAMP_BYTES}..={PAYLOAD_BYTES_MAX}");
        }
        if self.batch_records == 0 {
            bail!("--batch-records must be at least 1");
        }
        if self.keys > KEYS_MAX {
            bail!("--keys is at most {KEYS_MAX}");
        }
        if !(self.duration_s > 0.0 && self.duration_s.is_finite()) {
            bail!("--duration-s must be positive");
        }
        if !(self.warmup_s >= 0.0 && self.warmup_s.is_finite()) {
            bail!("--warmup-s must be zero or positive");
        }
        if self.rate == Some(0) {
            bail!("--rate must be positive (omit it for as fast as possible)");
        }
        let (publishers, subscribers) = match self.workload {
            Workload::Publish => (self.publishers, 0),
            Workload::Subscribe => (0, self.subscribers),
            Workload::Mixed => (self.publishers, self.subscribers),
        };
        if publishers + subscribers == 0 {
            bail!("the workload has no publisher and no subscriber task");
        }
        let available = core_affinity::get_core_ids().unwrap_or_default();
        for cpu in &self.cpus {
            if !available.iter().any(|c| c.id == *cpu) {
                bail!("--cpus names CPU {cpu}, which this process may not run on");
            }
        }
        let worker_cpus = (0..self.workers)
            .map(|w| (!self.cpus.is_empty()).then(|| self.cpus[w % self.cpus.len()]))
            .collect();
        let tasks = (self.workers * publishers) as f64;
        let rate_per_task = match (self.rate, publishers) {
            (Some(r), p) if p > 0 => Some(r as f64 / tasks),
            _ => None,
        };
        let metrics = (self.metrics != "off").then(|| self.metrics.clone());
        if let Some(m) = &metrics {
            let n = crate::metrics::addresses(m).len();
            if !(1..=crate::metrics::METRICS_ADDRS_MAX).contains(&n) {
                bail!(
                    "--metrics takes 1..={} addresses, or off",
                    crate::metrics::METRICS_ADDRS_MAX
                );
            }
        }
        let config = RunConfig {
            addr: self.addr.clone(),
            server_name: self.server_name.clone(),
            ca_file: self.ca_file.clone(),
            metrics,
            broker_pid: self.broker_pid,
            workload: self.workload,
            stream: self.stream.clone(),
            shards: self.shards,
            retention_bytes: (self.retention_bytes != 0).then_some(self.retention_bytes),
            workers: self.workers,
            worker_cpus,
            connections: self.connections,
            publishers,
            subscribers,
            subscribe_from: self.subscribe_from,
            payload_bytes: self.payload_bytes,
            batch_records: self.batch_records,
            keys: self.keys,
            ack: felix_client::config::ack_mode_name(self.ack).to_owned(),
            rate_per_task,
            rate: self.rate,
            linger_us: self.linger_us,
            max_udp_payload: self.max_udp_payload,
            send_in_write_order: self.send_in_write_order,
            subscribe_per_core: self.subscribe_per_core,
            in_flight_batches: self.in_flight_batches,
            idempotent: self.idempotent,
            outstanding: self.outstanding,
            warmup_s: self.warmup_s,
            duration_s: self.duration_s,
            start_at: self.start_at,
            soak: self.soak,
            json: self.json.clone(),
            plots: self.plots.clone(),
            label: self.label.clone(),
            progress: !self.quiet,
        };
        config.client_config().validate().context("client settings")?;
        Ok(config)
    }
}

impl RunConfig {
    /// The ack mode.
    pub fn ack_mode(&self) -> AckMode {
        felix_client::config::parse_ack_mode(&self.ack).unwrap_or(AckMode::Durable)
    }

    /// The client configuration each worker connects with.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(self.addr.clone(), Trust::CaFile(self.ca_file.clone()));
        c.server_name = self.server_name.clone();
        c.connections = self.connections;
        c.max_udp_payload = self.max_udp_payload;
        c.send_in_write_order = self.send_in_write_order;
        c.subscribe_per_core = self.subscribe_per_core;
        c.publish = PublishSettings {
            ack_mode: self.ack_mode(),
            linger_us: self.linger_us,
            batch_records_max: self.batch_records,
            in_flight_batches_max: self.in_flight_batches,
            idempotent: self.idempotent,
            ..PublishSettings::default()
        };
        c
    }

    /// The effective configuration as `key = value` lines, printed before a run.
    pub fn describe(&self) -> String {
        let cpus: Vec<String> = self
            .worker_cpus
            .iter()
            .map(|c| c.map_or_else(|| "any".to_owned(), |c| c.to_string()))
            .collect();
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
        let c = self.client_config();
        let lines = [
            ("label", self.label.clone()),
            ("addr", self.addr.clone()),
            ("server_name", self.server_name.clone()),
            ("ca_file", self.ca_file.display().to_string()),
            ("metrics", opt(self.metrics.clone())),
            ("broker_pid", opt(self.broker_pid.map(|p| p.to_string()))),
            ("workload", format!("{:?}", self.workload).to_lowercase()),
            ("stream", self.stream.clone()),
            ("shards", opt(self.shards.map(|s| s.to_string()))),
            ("retention_bytes", self.retention_bytes.unwrap_or(0).to_string()),
            ("workers", self.workers.to_string()),
            ("worker_cpus", cpus.join(",")),
            ("connections_per_worker", opt(self.connections.map(|s| s.to_string()))),
            ("publishers_per_worker", self.publishers.to_string()),
            ("subscribers_per_worker", self.subscribers.to_string()),
            ("subscribe_from", format!("{:?}", self.subscribe_from).to_lowercase()),
            ("payload_bytes", self.payload_bytes.to_string()),
            ("batch_records", self.batch_records.to_string()),
            ("keys", if self.keys == 0 { "unkeyed".into() } else { self.keys.to_string() }),
            ("ack", self.ack.clone()),
            ("rate", opt(self.rate.map(|r| format!("{r} records/s")))),
            ("linger_us", self.linger_us.to_string()),
            ("max_udp_payload", self.max_udp_payload.to_string()),
            ("send_in_write_order", self.send_in_write_order.to_string()),
            ("subscribe_per_core", self.subscribe_per_core.to_string()),
            ("in_flight_batches", self.in_flight_batches.to_string()),
            ("batch_bytes_max", c.publish.batch_bytes_max.to_string()),
            ("idempotent", c.publish.idempotent.to_string()),
            ("outstanding_per_worker", self.outstanding.to_string()),
            ("warmup_s", self.warmup_s.to_string()),
            ("duration_s", self.duration_s.to_string()),
            ("start_at", opt(self.start_at.map(|s| s.to_string()))),
            ("soak", self.soak.to_string()),
            ("json", opt(self.json.as_ref().map(|p| p.display().to_string()))),
            ("plots", opt(self.plots.as_ref().map(|p| p.display().to_string()))),
            ("progress", self.progress.to_string()),
        ];
        let mut out = String::from("felix-loadgen effective configuration:\n");
        for (k, v) in lines {
            out.push_str(&format!("  {k} = {v}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> anyhow::Result<RunConfig> {
        let mut args = vec!["felix-loadgen", "run", "--ca-file", "/x.pem"];
        args.extend_from_slice(extra);
        let cli = Cli::try_parse_from(args)?;
        match cli.command {
            Command::Run(r) => r.resolve(),
            other => bail!("unexpected {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_benchmark_scenario() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(c.payload_bytes, 4096);
        assert_eq!(c.batch_records, 64);
        assert_eq!(c.keys, 12);
        assert_eq!(c.ack, "durable");
        assert_eq!(c.workload, Workload::Publish);
        assert_eq!(c.subscribers, 0, "publish workload runs no subscriber");
        assert_eq!(c.rate_per_task, None);
        assert_eq!(c.worker_cpus, vec![None]);
    }

    #[test]
    fn every_flag_takes_effect() {
        let c = parse(&[
            "--addr=10.0.0.1:7500",
            "--server-name=felix.test",
            "--metrics=off",
            "--broker-pid=42",
            "--workload=mixed",
            "--stream=t/n/s1",
            "--shards=12",
            "--retention-bytes=1048576",
            "--workers=2",
            "--cpus=0",
            "--connections=3",
            "--publishers=5",
            "--subscribers=6",
            "--subscribe-from=earliest",
            "--payload-bytes=1000",
            "--batch-records=7",
            "--keys=0",
            "--ack=written",
            "--rate=1000",
            "--linger-us=250",
            "--in-flight-batches=9",
            "--outstanding=33",
            "--warmup-s=0.5",
            "--duration-s=3",
            "--start-at=1700000000000",
            "--soak",
            "--json=/tmp/r.json",
            "--plots=/tmp/p",
            "--label=host-a",
            "--quiet",
        ])
        .expect("all flags");
        assert_eq!(c.addr, "10.0.0.1:7500");
        assert_eq!(c.server_name, "felix.test");
        assert_eq!(c.metrics, None);
        assert_eq!(c.broker_pid, Some(42));
        assert_eq!(c.workload, Workload::Mixed);
        assert_eq!(c.stream, "t/n/s1");
        assert_eq!(c.shards, Some(12));
        assert_eq!(c.retention_bytes, Some(1 << 20));
        assert_eq!(c.workers, 2);
        assert_eq!(c.worker_cpus, vec![Some(0), Some(0)]);
        assert_eq!(c.connections, Some(3));
        assert_eq!((c.publishers, c.subscribers), (5, 6));
        assert_eq!(c.subscribe_from, SubscribeFrom::Earliest);
        assert_eq!(c.payload_bytes, 1000);
        assert_eq!(c.batch_records, 7);
        assert_eq!(c.keys, 0);
        assert_eq!(c.ack_mode(), AckMode::Written);
        assert_eq!(c.rate, Some(1000));
        assert_eq!(c.rate_per_task, Some(100.0), "1000/s over 2 workers x 5 tasks");
        assert_eq!(c.linger_us, 250);
        assert_eq!(c.in_flight_batches, 9);
        assert_eq!(c.outstanding, 33);
        assert_eq!((c.warmup_s, c.duration_s), (0.5, 3.0));
        assert_eq!(c.start_at, Some(1_700_000_000_000));
        assert!(c.soak);
        assert_eq!(c.json, Some(PathBuf::from("/tmp/r.json")));
        assert_eq!(c.plots, Some(PathBuf::from("/tmp/p")));
        assert_eq!(c.label, "host-a");
        assert!(!c.progress);
        let client = c.client_config();
        assert_eq!(client.addr, "10.0.0.1:7500");
        assert_eq!(client.server_name, "felix.test");
        assert_eq!(client.connections, Some(3));
        assert_eq!(client.publish.ack_mode, AckMode::Written);
        assert_eq!(client.publish.batch_records_max, 7);
        assert_eq!(client.publish.linger_us, 250);
        assert_eq!(client.publish.in_flight_batches_max, 9);
        assert_eq!(client.trust, Some(Trust::CaFile("/x.pem".into())));
        let seeds = parse(&["--addr=10.0.0.1:7500,10.0.0.2:7500", "--metrics=a:9400,b:9400"])
            .expect("lists");
        assert_eq!(seeds.client_config().seeds(), ["10.0.0.1:7500", "10.0.0.2:7500"]);
        assert_eq!(seeds.metrics.as_deref(), Some("a:9400,b:9400"));
        assert!(seeds.describe().contains("addr = 10.0.0.1:7500,10.0.0.2:7500"));
        let text = c.describe();
        for needle in ["workload = mixed", "keys = unkeyed", "ack = written", "rate = 1000"] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["--workers=0"][..],
            &["--payload-bytes=4"],
            &["--batch-records=0"],
            &["--duration-s=0"],
            &["--rate=0"],
            &["--ack=sometimes"],
            &["--cpus=100000"],
            &["--workload=subscribe", "--subscribers=0"],
            &["--in-flight-batches=0"],
            &["--addr=a:1,b"],
            &["--metrics=,"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
