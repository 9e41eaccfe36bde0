//! End-to-end over loopback: handshake, echo on many streams and clean close against a quinn
//! (tokio) client, for 1, 2 and 4 cores.

#[path = "net_support.rs"]
mod support;

use std::time::Duration;

use support::*;

async fn echo_many(cores: usize, conns: usize, streams: usize, len: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (server, seen) = start_echo(config(dir.path(), cores));
    let addr = server.local_addr();
    let mut owners = Vec::new();
    let mut endpoints = Vec::new();
    for _ in 0..conns {
        // One client endpoint (local port) per connection, so the kernel's hash spreads the
        // handshakes over the cores.
        let ep = client(dir.path());
        let (conn, core) = connect(&ep, addr).await;
        endpoints.push(ep);
        assert!(usize::from(core) < cores);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..streams {
            let conn = conn.clone();
            tasks.spawn(async move { echo_once(&conn, &payload(i, len)).await });
        }
        let all = async {
            while let Some(r) = tasks.join_next().await {
                r.expect("stream task");
            }
        };
        tokio::time::timeout(STEP_TIMEOUT, all).await.expect("echo in time");
        owners.push((conn, core));
    }
    for (conn, _) in &owners {
        conn.close(7u32.into(), b"bye");
    }
    let closed = eventually(|| seen.lock().unwrap().closed.len() == conns).await;
    assert!(closed, "server saw every close: {:?}", seen.lock().unwrap());
    for why in &seen.lock().unwrap().closed {
        assert!(why.contains("(code 7)"), "clean close, got {why}");
    }
    assert_eq!(seen.lock().unwrap().streams_done, conns * streams);
    let drained = eventually(|| server.stats().iter().all(|s| s.connections == 0)).await;
    assert!(drained, "connections drained: {:?}", server.stats());
    let stats = server.stats();
    let handshakes: u64 = stats.iter().map(|s| s.handshakes).sum();
    assert_eq!(handshakes, conns as u64);
    let accepted: u64 = stats.iter().map(|s| s.streams_accepted).sum();
    assert_eq!(accepted, (conns * streams) as u64);
    for (core, s) in stats.iter().enumerate() {
        let owned = owners.iter().filter(|(_, c)| usize::from(*c) == core).count() as u64;
        assert_eq!(s.handshakes, owned, "core {core} handshakes");
        assert!(s.datagrams_out > 0 || owned == 0);
    }
    for ep in endpoints {
        ep.wait_idle().await;
    }
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_one_core() {
    echo_many(1, 2, 32, 20_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_two_cores() {
    echo_many(2, 6, 16, 10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_four_cores() {
    echo_many(4, 8, 8, 10_000).await;
}

/// A large transfer on one stream: exercises flow control windows (1 MiB per stream) in both
/// directions and GSO/GRO batching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_large_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _seen) = start_echo(config(dir.path(), 1));
    let ep = client(dir.path());
    let (conn, _) = connect(&ep, server.local_addr()).await;
    let data = payload(9, 8 << 20);
    tokio::time::timeout(Duration::from_secs(60), echo_once(&conn, &data))
        .await
        .expect("large echo in time");
    let s = server.stats()[0];
    assert!(s.datagrams_in > 5_000, "{s:?}");
    conn.close(0u32.into(), b"");
    server.shutdown();
}
