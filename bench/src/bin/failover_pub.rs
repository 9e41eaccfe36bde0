//! The publisher of `bench/failover.sh`: one idempotent publisher at a fixed rate through the
//! Rust client (its default configuration, as `felix publish --addr b1,b2,b3` has it), timing
//! every ack as the client sees it, while the script strikes the cluster.
//!
//! Control lines on stdin: `strike LABEL` marks a fault (the script strikes right after), and
//! `end` closes its window: the publisher prints one JSON line for it, with the longest pause
//! between two consecutive acks from the last ack before the strike until the end mark
//! (`gap_ms`) and how long after the strike the first ack came (`first_ack_ms`). At the end of
//! stdin it stops, waits for every ticket, reads the stream back from the earliest offset and
//! prints a last JSON line: records sent, acked, failed, and read back (`duplicates`: records
//! stored more than once, `missing`: acked and not read back).
//!
//! ```sh
//! failover_pub --addr 10.0.0.11:7400,10.0.0.12:7400 --ca-file b1/dev-cert.pem \
//!     --stream bench/failover/s1 --rate 100
//! ```
//!
//! Each record's value is its sequence number (8 bytes, big-endian) followed by padding to
//! `--payload-bytes`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use felix_client::{Client, ClientConfig, Record, StartAt, SubscribeOptions, Trust};
use tokio::io::AsyncBufReadExt;

#[derive(Parser, Debug)]
#[command(about = "fixed-rate idempotent publisher that times the pauses between acks")]
struct Args {
    /// Seed brokers, `host:port,host:port`.
    #[arg(long)]
    addr: String,
    /// The brokers' CA (or development certificate).
    #[arg(long)]
    ca_file: std::path::PathBuf,
    /// The stream (it must exist: the publisher tags batches only when it knows the shards).
    #[arg(long)]
    stream: String,
    /// Records per second.
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Publish keyed records (this key) instead of unkeyed ones.
    #[arg(long)]
    key: Option<String>,
    /// Bytes per record (at least 8: the sequence number).
    #[arg(long, default_value_t = 64)]
    payload_bytes: usize,
}

/// The most tickets awaited at once (a stall of a minute at 1,000 records a second).
const WAITING_MAX: usize = 65_536;

/// What the acks came to.
#[derive(Default)]
struct Tally {
    sent: u64,
    /// When each ack came back (pruned to the current window).
    acks_at: Vec<Instant>,
    acked: Vec<u64>,
    failed: Vec<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The client's logs on stderr: FELIX_LOG (an EnvFilter), warnings by default.
    let filter = tracing_subscriber::EnvFilter::try_from_env("FELIX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    anyhow::ensure!(args.payload_bytes >= 8, "--payload-bytes must be at least 8");
    let mut config = ClientConfig::parse_env()?;
    config.addr = args.addr.clone();
    config.trust = Some(Trust::CaFile(args.ca_file.clone()));
    config.validate()?;
    let client = Client::connect(config).await.context("connect")?;
    let publisher = client.publisher(&args.stream).await.context("publisher")?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let producing = {
        let (tally, stop) = (tally.clone(), stop.clone());
        let (key, rate, payload_bytes) = (args.key.clone(), args.rate, args.payload_bytes);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
            let mut waiting = tokio::task::JoinSet::new();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let mut value = vec![0u8; payload_bytes];
                value[..8].copy_from_slice(&n.to_be_bytes());
                let record = match &key {
                    Some(k) => Record::keyed(k.clone(), value),
                    None => Record::unkeyed(value),
                };
                tally.lock().unwrap().sent += 1;
                match publisher.send(record).await {
                    Ok(ticket) => {
                        let tally = tally.clone();
                        waiting.spawn(async move {
                            let r = ticket.await;
                            let mut t = tally.lock().unwrap();
                            match r {
                                Ok(Some(_)) => {
                                    t.acks_at.push(Instant::now());
                                    t.acked.push(n);
                                }
                                other => t.failed.push(format!("{n}: {other:?}")),
                            }
                        });
                    }
                    Err(e) => tally.lock().unwrap().failed.push(format!("{n} send: {e}")),
                }
                n += 1;
                while waiting.try_join_next().is_some() {}
                while waiting.len() >= WAITING_MAX {
                    waiting.join_next().await;
                }
            }
            while waiting.join_next().await.is_some() {}
            publisher.close().await
        })
    };

    // The control lines.
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut strike: Option<(String, Instant)> = None;
    while let Some(line) = lines.next_line().await? {
        let line = line.trim();
        if let Some(label) = line.strip_prefix("strike ") {
            let now = Instant::now();
            // Keep the acks of the last seconds only: the one before the strike counts.
            let mut t = tally.lock().unwrap();
            let keep_from = now.checked_sub(Duration::from_secs(5)).unwrap_or(now);
            t.acks_at.retain(|at| *at >= keep_from);
            tracing::info!(trial = label.trim(), "strike");
            strike = Some((label.trim().to_owned(), now));
        } else if line == "end" {
            let Some((label, at)) = strike.take() else { continue };
            let end = Instant::now();
            let t = tally.lock().unwrap();
            let mut acks: Vec<Instant> = t.acks_at.iter().copied().filter(|a| *a <= end).collect();
            acks.sort();
            let before = acks.iter().rev().find(|a| **a < at).copied().unwrap_or(at);
            let window: Vec<Instant> = std::iter::once(before)
                .chain(acks.iter().copied().filter(|a| *a >= at))
                .chain(std::iter::once(end))
                .collect();
            let gap = window.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
            let first_ack = acks.iter().find(|a| **a >= at).map(|a| *a - at);
            let line = serde_json::json!({
                "trial": label,
                "gap_ms": gap.as_millis() as u64,
                "first_ack_ms": first_ack.map(|d| d.as_millis() as u64),
                "acks_in_window": acks.iter().filter(|a| **a >= at).count(),
                "failed_so_far": t.failed.len(),
            });
            println!("{line}");
        }
    }

    // Stop, wait for every ticket, read everything back.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let closed = producing.await?;
    let (sent, mut acked, failed) = {
        let t = tally.lock().unwrap();
        (t.sent, t.acked.clone(), t.failed.clone())
    };
    acked.sort_unstable();
    let acked_set: std::collections::HashSet<u64> = acked.iter().copied().collect();
    let mut unseen = acked_set.len();
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut sub = client
        .subscribe(SubscribeOptions::new(&args.stream).start(StartAt::Earliest))
        .await
        .context("subscribe")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let idle = if unseen == 0 { Duration::from_secs(2) } else { Duration::from_secs(10) };
        if Instant::now() > deadline {
            break;
        }
        match tokio::time::timeout(idle, sub.next()).await {
            Ok(Ok(Some(r))) if r.value.len() >= 8 => {
                let n = u64::from_be_bytes(r.value[..8].try_into().expect("8 bytes"));
                let count = seen.entry(n).or_default();
                if *count == 0 && acked_set.contains(&n) {
                    unseen -= 1;
                }
                *count += 1;
            }
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => break,
        }
    }
    let duplicates = seen.values().filter(|c| **c > 1).count();
    let missing = unseen;
    let line = serde_json::json!({
        "summary": true,
        "sent": sent,
        "acked": acked.len(),
        "failed": failed.len(),
        "failed_examples": failed.iter().take(5).collect::<Vec<_>>(),
        "read_back": seen.len(),
        "duplicates": duplicates,
        "missing": missing,
        "close": closed.err().map(|e| e.to_string()),
    });
    println!("{line}");
    client.close();
    Ok(())
}
