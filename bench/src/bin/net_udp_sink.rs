//! Raw UDP sink: `recvmmsg` with UDP GRO through quinn-udp, counting datagrams; the physical
//! limit of one core receiving on loopback, for comparison with the QUIC servers.
//!
//! Usage: `net_udp_sink <listen> <warmup_s> <measure_s>`. Prints `READY <addr>`, then as the
//! other sinks: waits for the first datagram, warms up, measures, prints one JSON line.

use std::io::IoSliceMut;
use std::time::{Duration, Instant};

use quinn_udp::{RecvMeta, UdpSocketState, BATCH_SIZE};

/// GRO delivers at most 64 KiB per receive.
const CHUNK_BYTES: usize = 64 * 1024;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 4, "usage: net_udp_sink <listen> <warmup_s> <measure_s>");
    let listen: std::net::SocketAddr = args[1].parse()?;
    let warmup = Duration::from_secs_f64(args[2].parse()?);
    let measure = Duration::from_secs_f64(args[3].parse()?);
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(listen),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    socket.set_recv_buffer_size(4 << 20)?;
    socket.bind(&listen.into())?;
    socket.set_read_timeout(Some(Duration::from_millis(50)))?;
    let state = UdpSocketState::new((&socket).into())?;
    let local = socket.local_addr()?.as_socket().expect("inet");
    println!("READY {local}");
    let mut storage = vec![0u8; CHUNK_BYTES * BATCH_SIZE];
    let mut metas = [RecvMeta::default(); BATCH_SIZE];
    let mut datagrams = 0u64;
    let mut calls = 0u64;
    let mut first: Option<Instant> = None;
    let mut window: Option<(Instant, u64, u64, u64)> = None;
    loop {
        let mut chunks = storage.chunks_mut(CHUNK_BYTES);
        let mut iovs: [IoSliceMut<'_>; BATCH_SIZE] =
            std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or_default()));
        match state.recv((&socket).into(), &mut iovs, &mut metas) {
            Ok(n) => {
                calls += 1;
                for m in &metas[..n] {
                    datagrams += m.len.div_ceil(m.stride.max(1)) as u64;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Err(e.into()),
        }
        let now = Instant::now();
        if datagrams > 0 && first.is_none() {
            first = Some(now);
        }
        match (first, window) {
            (Some(f), None) if now - f >= warmup => {
                window = Some((now, datagrams, felix_bench::process_cpu_us(), calls));
            }
            (_, Some((t0, d0, c0, k0))) if now - t0 >= measure => {
                let wall = (now - t0).as_secs_f64();
                let d = datagrams - d0;
                let cpu_us = felix_bench::process_cpu_us() - c0;
                println!(
                    "{}",
                    serde_json::json!({
                        "server": "udp",
                        "wall_s": wall,
                        "datagrams": d,
                        "bytes": d * 1200,
                        "cpu_us": cpu_us,
                        "datagrams_per_s": d as f64 / wall,
                        "cpu_us_per_datagram": cpu_us as f64 / d.max(1) as f64,
                        "server_busy": cpu_us as f64 / 1e6 / wall,
                        "recv_calls": calls - k0,
                    })
                );
                return Ok(());
            }
            _ => {}
        }
    }
}
