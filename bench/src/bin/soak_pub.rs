//! The load of `bench/soak-cluster.sh`: steady publishing beside a churn of short-lived
//! idempotent producers, for as long as the soak runs.
//!
//! - **Steady**: one publisher sends `--rate` unkeyed records a second of `--payload-bytes`.
//! - **Churn**: `--producers` publishers, spread evenly over `--duration-s`, each made, used
//!   for one durable record and dropped: every one is a new idempotent producer id on its
//!   shard, as every `felix publish` run and every restarted client is.
//!
//! Every 10 s (and at the end) it prints a JSON line: seconds since the start, producers
//! made, records acked and failed. Exits non-zero if any record failed.
//!
//! ```sh
//! soak_pub --addr 127.0.0.1:7501,127.0.0.1:7502 --ca-file b1/dev-cert.pem \
//!     --stream bench/soak/s1 --duration-s 1800 --producers 100000 --rate 200
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use felix_client::{Client, ClientConfig, Record, Trust};

#[derive(Parser, Debug)]
#[command(about = "steady publishing beside a churn of short-lived idempotent producers")]
struct Args {
    /// Seed brokers, `host:port,host:port`.
    #[arg(long)]
    addr: String,
    /// The brokers' CA (or development certificate).
    #[arg(long)]
    ca_file: std::path::PathBuf,
    /// The stream (it must exist).
    #[arg(long)]
    stream: String,
    /// How long to run, seconds.
    #[arg(long, default_value_t = 1800)]
    duration_s: u64,
    /// Short-lived producers over the run.
    #[arg(long, default_value_t = 100_000)]
    producers: u64,
    /// Steady records per second.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 1024)]
    payload_bytes: usize,
    /// Short-lived producers working at once.
    #[arg(long, default_value_t = 16)]
    concurrency: u64,
}

#[derive(Default)]
struct Counts {
    producers: AtomicU64,
    acked: AtomicU64,
    failed: AtomicU64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("FELIX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let mut config = ClientConfig::parse_env()?;
    config.addr = args.addr.clone();
    config.trust = Some(Trust::CaFile(args.ca_file.clone()));
    config.validate()?;
    let client = Client::connect(config).await.context("connect")?;
    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let end = started + Duration::from_secs(args.duration_s);
    let payload = vec![0x5a_u8; args.payload_bytes];

    let steady = {
        let publisher = client.publisher(&args.stream).await.context("publisher")?;
        let (counts, payload) = (counts.clone(), payload.clone());
        let every = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tickets = tokio::task::JoinSet::new();
            while Instant::now() < end {
                tick.tick().await;
                match publisher.send(Record::unkeyed(payload.clone())).await {
                    Ok(ticket) => {
                        let counts = counts.clone();
                        tickets.spawn(async move {
                            let ok = matches!(ticket.await, Ok(Some(_)));
                            let c = if ok { &counts.acked } else { &counts.failed };
                            c.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                    Err(_) => {
                        counts.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                while tickets.len() > 10_000 {
                    tickets.join_next().await;
                }
            }
            while tickets.join_next().await.is_some() {}
        })
    };

    let mut churn = tokio::task::JoinSet::new();
    let per_worker = args.producers / args.concurrency.max(1);
    for _ in 0..args.concurrency.max(1) {
        let (client, counts, payload) = (client.clone(), counts.clone(), payload.clone());
        let stream = args.stream.clone();
        // Each worker makes its share of the producers evenly over the run.
        let every = Duration::from_secs_f64(args.duration_s as f64 / per_worker.max(1) as f64);
        churn.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for _ in 0..per_worker {
                tick.tick().await;
                if Instant::now() >= end {
                    break;
                }
                let ok = async {
                    let publisher = client.publisher(&stream).await.ok()?;
                    let ticket = publisher.send(Record::unkeyed(payload.clone())).await.ok()?;
                    ticket.await.ok()?
                }
                .await
                .is_some();
                counts.producers.fetch_add(1, Ordering::Relaxed);
                let c = if ok { &counts.acked } else { &counts.failed };
                c.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    let report = move |counts: &Counts| {
        println!(
            "{{\"t_s\":{:.1},\"producers\":{},\"acked\":{},\"failed\":{}}}",
            started.elapsed().as_secs_f64(),
            counts.producers.load(Ordering::Relaxed),
            counts.acked.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed)
        );
    };
    let reporter = {
        let counts = counts.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                report(&counts);
            }
        })
    };
    while churn.join_next().await.is_some() {}
    steady.await.ok();
    reporter.abort();
    report(&counts);
    client.close();
    let failed = counts.failed.load(Ordering::Relaxed);
    anyhow::ensure!(failed == 0, "{failed} records failed");
    Ok(())
}
