//! Connection migration across the SO_REUSEPORT group: clients rebind to a new local port in the
//! middle of a transfer (quinn `Endpoint::rebind`). With eBPF or classic BPF steering every
//! datagram reaches the owning core directly (0 misrouted); with steering off the transfers
//! still complete, through the core-mesh safety net (misrouted > 0).

#[path = "net_support.rs"]
mod support;

use std::time::Duration;

use felix_broker::net::steering::{EffectiveSteering, SteeringMode};
use support::*;

const CORES: usize = 4;
const CONNS: usize = 4;
const MIGRATIONS_PER_CONN: usize = 6;
const CHUNK_BYTES: usize = 16 * 1024;
const CHUNKS: usize = 64;

/// Pause between two rebinds of one client: longer than a path validation on loopback, so each
/// new path is validated before the next move. (Moving again while the server still validates
/// the previous path can make the validation fail, and quinn-proto 0.11.19 then trips a debug
/// assertion: quinn issue #2658, fixed upstream by #2660.)
const MIGRATION_INTERVAL: Duration = Duration::from_millis(150);

fn chunk(seed: usize, i: usize) -> Vec<u8> {
    payload(seed * 10_000 + i, CHUNK_BYTES)
}

/// One connection: echo chunks on one stream while the client rebinds to a new port
/// `MIGRATIONS_PER_CONN` times; the upload runs until the last migration is done and at least
/// `CHUNKS` chunks went out. Returns the number of migrations.
async fn migrating_transfer(ep: quinn::Endpoint, conn: quinn::Connection, seed: usize) -> usize {
    let (mut send, mut recv) = conn.open_bi().await.expect("open_bi");
    let reader = tokio::spawn(async move { recv.read_to_end(usize::MAX).await });
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(async move {
        let mut i = 0;
        while i < CHUNKS || !*done_rx.borrow_and_update() {
            send.write_all(&chunk(seed, i)).await.expect("write");
            i += 1;
            // Pace the upload so it spans the migrations without growing without bound.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        send.finish().expect("finish");
        i
    });
    let mut migrations = 0;
    while migrations < MIGRATIONS_PER_CONN {
        tokio::time::sleep(MIGRATION_INTERVAL).await;
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        ep.rebind(socket).expect("rebind");
        migrations += 1;
    }
    tokio::time::sleep(MIGRATION_INTERVAL).await;
    done_tx.send(true).unwrap();
    let chunks = tokio::time::timeout(STEP_TIMEOUT, writer)
        .await
        .expect("upload in time")
        .expect("writer task");
    let back = tokio::time::timeout(STEP_TIMEOUT, reader)
        .await
        .expect("echo in time")
        .expect("reader task")
        .expect("read echo");
    assert_eq!(back.len(), chunks * CHUNK_BYTES);
    for (i, got) in back.chunks(CHUNK_BYTES).enumerate() {
        assert!(got == chunk(seed, i), "chunk {i} differs after migrations");
    }
    conn.close(0u32.into(), b"done");
    migrations
}

async fn run(mode: SteeringMode, refuse_ebpf: bool, expect: EffectiveSteering) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), CORES);
    cfg.steering = mode;
    cfg.steering_refuse_ebpf = refuse_ebpf;
    let (server, seen) = start_echo(cfg);
    assert_eq!(server.steering(), expect);
    let addr = server.local_addr();
    let mut tasks = tokio::task::JoinSet::new();
    let mut owners = Vec::new();
    for i in 0..CONNS {
        let ep = client(dir.path());
        let (conn, core) = connect(&ep, addr).await;
        owners.push(usize::from(core));
        tasks.spawn(migrating_transfer(ep, conn, i));
    }
    let mut migrations = 0;
    let all = async {
        while let Some(r) = tasks.join_next().await {
            migrations += r.expect("transfer task");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all).await.expect("transfers in time");
    assert!(migrations >= 20, "{migrations} migrations");
    assert!(eventually(|| seen.lock().unwrap().closed.len() == CONNS).await);
    let stats = server.stats();
    let misrouted: u64 = stats.iter().map(|s| s.misrouted).sum();
    let forwarded_in: u64 = stats.iter().map(|s| s.forwarded_in).sum();
    let dropped: u64 = stats.iter().map(|s| s.dropped_mesh_full).sum();
    eprintln!("{mode:?}: owners {owners:?}, {migrations} migrations, stats {stats:#?}");
    assert_eq!(seen.lock().unwrap().accepted.len(), CONNS);
    // The server followed every client to its new port.
    assert_eq!(seen.lock().unwrap().peers.len(), CONNS);
    for (first, last) in &seen.lock().unwrap().peers {
        assert_ne!(first, last, "the server still talks to the first address");
    }
    match expect {
        EffectiveSteering::Ebpf | EffectiveSteering::Cbpf => {
            assert_eq!(misrouted, 0, "steered: no datagram reached a non-owner");
            assert_eq!(forwarded_in, 0);
            for (core, s) in stats.iter().enumerate() {
                if !owners.contains(&core) {
                    assert_eq!(s.datagrams_in, 0, "core {core} owns nothing and got datagrams");
                }
            }
        }
        EffectiveSteering::Off => {
            assert!(misrouted > 0, "4-tuple hashing after migrations must misroute");
            assert_eq!(forwarded_in + dropped, misrouted);
        }
    }
    for s in &stats {
        CoreStatsCheck(s).consistent();
    }
    server.shutdown();
}

struct CoreStatsCheck<'a>(&'a felix_broker::net::CoreStatsSnapshot);

impl CoreStatsCheck<'_> {
    fn consistent(&self) {
        let s = self.0;
        assert!(s.misrouted <= s.datagrams_in, "{s:?}");
        assert_eq!(s.forwarded_out + s.dropped_mesh_full + s.dropped_bad_core, s.misrouted);
        assert!(s.recv_calls <= s.datagrams_in);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_ebpf() {
    run(SteeringMode::Ebpf, false, EffectiveSteering::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_cbpf() {
    run(SteeringMode::Cbpf, false, EffectiveSteering::Cbpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_steering_off_uses_safety_net() {
    run(SteeringMode::Off, false, EffectiveSteering::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_ebpf_refused_falls_back_to_cbpf() {
    run(SteeringMode::Auto, true, EffectiveSteering::Cbpf).await;
}
