//! Bulk-upload sink on a plain `quinn` (tokio, current-thread runtime) server: the comparison
//! for the Felix driver. Same sink work: accept connections and unidirectional streams, read
//! chunks and count their bytes.
//!
//! Usage: `net_quinn_sink <listen> <warmup_s> <measure_s>`. Prints `READY <addr>`, waits for the
//! first datagram, lets `warmup_s` pass, measures over `measure_s` the UDP datagrams the
//! connections received (quinn's per-connection `udp_rx` counters), the bytes read and the
//! process CPU time (utime + stime from /proc/self/stat); prints one JSON line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    init_tracing();
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 4, "usage: net_quinn_sink <listen> <warmup_s> <measure_s>");
    let listen: std::net::SocketAddr = args[1].parse()?;
    let warmup = Duration::from_secs_f64(args[2].parse()?);
    let measure = Duration::from_secs_f64(args[3].parse()?);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(listen, warmup, measure))
}

async fn run(
    listen: std::net::SocketAddr,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<()> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)?;
    tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut server_config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    // The same windows as the Felix driver.
    transport
        .stream_receive_window(quinn::VarInt::from_u32(1 << 20))
        .receive_window(quinn::VarInt::from_u32(8 << 20));
    let mut mtud = quinn::MtuDiscoveryConfig::default();
    mtud.upper_bound(1200);
    transport.mtu_discovery_config(Some(mtud));
    server_config.transport_config(Arc::new(transport));
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config.max_udp_payload_size(1200)?;
    let socket = std::net::UdpSocket::bind(listen)?;
    let endpoint = quinn::Endpoint::new(
        endpoint_config,
        Some(server_config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    println!("READY {}", endpoint.local_addr()?);
    let bytes = Arc::new(AtomicU64::new(0));
    let conns: Arc<Mutex<Vec<quinn::Connection>>> = Arc::default();
    {
        let endpoint = endpoint.clone();
        let bytes = bytes.clone();
        let conns = conns.clone();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let bytes = bytes.clone();
                let conns = conns.clone();
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    conns.lock().unwrap().push(conn.clone());
                    while let Ok(mut recv) = conn.accept_uni().await {
                        let bytes = bytes.clone();
                        tokio::spawn(async move {
                            while let Ok(Some(chunk)) = recv.read_chunk(usize::MAX, true).await {
                                bytes.fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
                            }
                        });
                    }
                });
            }
        });
    }
    let datagrams = |conns: &Mutex<Vec<quinn::Connection>>| -> u64 {
        conns.lock().unwrap().iter().map(|c| c.stats().udp_rx.datagrams).sum()
    };
    while datagrams(&conns) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(warmup).await;
    let d0 = datagrams(&conns);
    let b0 = bytes.load(Ordering::Relaxed);
    let c0 = felix_bench::process_cpu_us();
    let t0 = Instant::now();
    tokio::time::sleep(measure).await;
    let d1 = datagrams(&conns);
    let b1 = bytes.load(Ordering::Relaxed);
    let c1 = felix_bench::process_cpu_us();
    let wall = t0.elapsed().as_secs_f64();
    let d = d1 - d0;
    let cpu_us = c1 - c0;
    println!(
        "{}",
        serde_json::json!({
            "server": "quinn",
            "wall_s": wall,
            "datagrams": d,
            "bytes": b1 - b0,
            "cpu_us": cpu_us,
            "datagrams_per_s": d as f64 / wall,
            "cpu_us_per_datagram": cpu_us as f64 / d.max(1) as f64,
            "server_busy": cpu_us as f64 / 1e6 / wall,
        })
    );
    endpoint.close(0u32.into(), b"");
    let _ = tokio::time::timeout(Duration::from_millis(200), endpoint.wait_idle()).await;
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
