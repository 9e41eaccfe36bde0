//! Bulk-upload sink on the Felix per-core QUIC driver (one core).
//!
//! Usage: `net_felix_sink <listen> <data_dir> <warmup_s> <measure_s> [cpu]`. Prints `READY` when
//! listening; waits for the first datagram, lets `warmup_s` pass, then measures over `measure_s`
//! the datagrams the core received (its own counter), the bytes the application read, and the
//! process CPU time (utime + stime from /proc/self/stat); prints one JSON line and exits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_broker::net::steering::SteeringMode;
use felix_broker::net::{CoreContext, NetConfig, Server, TlsSource};

fn main() -> anyhow::Result<()> {
    init_tracing();
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() >= 5,
        "usage: net_felix_sink <listen> <data_dir> <warmup_s> <measure_s> [cpu]"
    );
    let mut cfg =
        NetConfig::new(args[1].parse()?, 1, TlsSource::Dev { data_dir: args[2].clone().into() });
    let warmup = Duration::from_secs_f64(args[3].parse()?);
    let measure = Duration::from_secs_f64(args[4].parse()?);
    if let Some(cpu) = args.get(5) {
        cfg.cpus = vec![cpu.parse()?];
    }
    cfg.steering = SteeringMode::Off;
    cfg.max_udp_payload = 1200;
    // The upload client sends on unidirectional streams.
    cfg.peer_uni_streams = true;
    let bytes = Arc::new(AtomicU64::new(0));
    let b = bytes.clone();
    let server = Server::start(cfg, move |ctx: CoreContext| {
        let bytes = b.clone();
        async move {
            while let Some(conn) = ctx.accept().await {
                let bytes = bytes.clone();
                glommio::spawn_local(async move {
                    while let Ok(mut recv) = conn.accept_uni().await {
                        let bytes = bytes.clone();
                        glommio::spawn_local(async move {
                            while let Ok(Some(chunk)) = recv.read_chunk(usize::MAX).await {
                                // Single writer (this core): relaxed load + store.
                                let n = bytes.load(Ordering::Relaxed) + chunk.len() as u64;
                                bytes.store(n, Ordering::Relaxed);
                            }
                        })
                        .detach();
                    }
                })
                .detach();
            }
        }
    })?;
    println!("READY {}", server.local_addr());
    while server.stats()[0].datagrams_in == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(warmup);
    let s0 = server.stats()[0];
    let b0 = bytes.load(Ordering::Relaxed);
    let c0 = felix_bench::process_cpu_us();
    let t0 = Instant::now();
    std::thread::sleep(measure);
    let s1 = server.stats()[0];
    let b1 = bytes.load(Ordering::Relaxed);
    let c1 = felix_bench::process_cpu_us();
    let wall = t0.elapsed().as_secs_f64();
    let datagrams = s1.datagrams_in - s0.datagrams_in;
    let cpu_us = c1 - c0;
    println!(
        "{}",
        serde_json::json!({
            "server": "felix",
            "wall_s": wall,
            "datagrams": datagrams,
            "bytes": b1 - b0,
            "cpu_us": cpu_us,
            "datagrams_per_s": datagrams as f64 / wall,
            "cpu_us_per_datagram": cpu_us as f64 / datagrams.max(1) as f64,
            "server_busy": cpu_us as f64 / 1e6 / wall,
            "recv_calls": s1.recv_calls - s0.recv_calls,
            "datagrams_out": s1.datagrams_out - s0.datagrams_out,
            "send_calls": s1.send_calls - s0.send_calls,
        })
    );
    server.shutdown();
    Ok(())
}

/// A tracing subscriber at `info` (as the broker binary runs): without any subscriber, the
/// `log` feature of quinn-proto's tracing turns every per-packet span into a `log` call.
fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}
