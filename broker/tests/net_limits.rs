//! The per-core limits, each with its metric: connections per core, streams per connection,
//! idle timeout, handshakes per second (stateless retry past it); and end-to-end flow control
//! (a slow reader pushes back on the sender).

#[path = "net_support.rs"]
mod support;

use std::time::Duration;

use felix_broker::net::{CoreContext, Server};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_core_are_refused_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1);
    cfg.max_conns_per_core = 2;
    let (server, _seen) = start_echo(cfg);
    let ep = client(dir.path());
    let (a, _) = connect(&ep, server.local_addr()).await;
    let (b, _) = connect(&ep, server.local_addr()).await;
    let third =
        tokio::time::timeout(STEP_TIMEOUT, ep.connect(server.local_addr(), "localhost").unwrap())
            .await
            .expect("answer in time");
    match third {
        Err(quinn::ConnectionError::ConnectionClosed(c)) => {
            assert_eq!(c.error_code, quinn::TransportErrorCode::CONNECTION_REFUSED)
        }
        other => panic!("third connection should be refused, got {other:?}"),
    }
    assert_eq!(server.stats()[0].refused_conn_limit, 1);
    assert_eq!(server.stats()[0].connections, 2);
    // Room again once one closes.
    a.close(0u32.into(), b"");
    assert!(eventually(|| server.stats()[0].connections == 1).await);
    let (_c, _) = connect(&ep, server.local_addr()).await;
    drop(b);
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1);
    cfg.max_streams_per_conn = 2;
    let (server, _seen) = start_echo(cfg);
    let ep = client(dir.path());
    let (conn, _) = connect(&ep, server.local_addr()).await;
    let (mut s1, mut r1) = conn.open_bi().await.unwrap();
    let (mut s2, _r2) = conn.open_bi().await.unwrap();
    // Streams are only announced with data.
    s1.write_all(b"one").await.unwrap();
    s2.write_all(b"two").await.unwrap();
    // A third stream waits for credit: quinn opens locally when it has credit, so a blocked open
    // is the limit at work (no network wait involved).
    let blocked = tokio::time::timeout(Duration::from_millis(300), conn.open_bi()).await;
    assert!(blocked.is_err(), "third stream must wait for MAX_STREAMS");
    // Finishing one stream (both directions) gives the credit back.
    s1.finish().unwrap();
    let echoed = r1.read_to_end(16).await.unwrap();
    assert_eq!(echoed, b"one");
    let third = tokio::time::timeout(STEP_TIMEOUT, conn.open_bi()).await;
    assert!(third.expect("credit returned in time").is_ok());
    assert!(server.stats()[0].streams_accepted >= 2);
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1);
    cfg.idle_timeout = Duration::from_millis(300);
    let (server, seen) = start_echo(cfg);
    let ep = client(dir.path());
    let (conn, _) = connect(&ep, server.local_addr()).await;
    let why = tokio::time::timeout(STEP_TIMEOUT, conn.closed()).await.expect("idle close in time");
    assert!(matches!(why, quinn::ConnectionError::TimedOut), "{why:?}");
    assert!(eventually(|| server.stats()[0].idle_timeouts == 1).await);
    assert!(eventually(|| seen.lock().unwrap().closed.len() == 1).await);
    assert!(seen.lock().unwrap().closed[0].contains("timed out"));
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_past_the_rate_get_a_stateless_retry() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1);
    cfg.handshakes_per_sec_per_core = 1;
    let (server, _seen) = start_echo(cfg);
    let ep = client(dir.path());
    let mut conns = Vec::new();
    for _ in 0..4 {
        // quinn answers the retry transparently: every connection still succeeds.
        conns.push(connect(&ep, server.local_addr()).await.0);
    }
    let s = server.stats()[0];
    assert!(s.retries >= 2, "{s:?}");
    assert_eq!(s.handshakes, 4);
    for c in &conns {
        echo_once(c, b"after retry").await;
    }
    server.shutdown();
}

/// A server that never reads: the client's writes stop at the stream window (1 MiB) instead of
/// buffering without bound, and resume once the server reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_pushes_back_on_the_sender() {
    let dir = tempfile::tempdir().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Arc::new(std::sync::Mutex::new(Some(go_rx)));
    let (read_tx, read_rx) = std::sync::mpsc::channel::<usize>();
    let server = Server::start(config(dir.path(), 1), move |ctx: CoreContext| {
        let go = go_rx.lock().unwrap().take();
        let read_tx = read_tx.clone();
        async move {
            let Some(go) = go else { return };
            let conn = ctx.accept().await.unwrap();
            let mut recv = conn.accept_uni().await.unwrap();
            // Wait (without blocking the core) for the test's go-ahead.
            while go.try_recv().is_err() {
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            let mut total = 0;
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(Some(n)) = recv.read(&mut buf).await {
                total += n;
            }
            read_tx.send(total).unwrap();
            conn.closed().await;
        }
    })
    .unwrap();
    let ep = client(dir.path());
    let conn =
        tokio::time::timeout(STEP_TIMEOUT, ep.connect(server.local_addr(), "localhost").unwrap())
            .await
            .unwrap()
            .unwrap();
    let mut send = conn.open_uni().await.unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut written = 0usize;
    // Write until the writes stop being accepted (blocked for 500 ms).
    while let Ok(r) = tokio::time::timeout(Duration::from_millis(500), send.write(&chunk)).await {
        written += r.unwrap();
        assert!(written <= 4 << 20, "the sender was never pushed back");
    }
    let window = felix_broker::net::config::STREAM_RECEIVE_WINDOW_BYTES as usize;
    assert!(written >= window / 2, "wrote {written}");
    assert!(written <= window + chunk.len(), "wrote {written} past the window");
    go_tx.send(()).unwrap();
    let more = 2 * window;
    let mut extra = 0;
    while extra < more {
        extra += tokio::time::timeout(STEP_TIMEOUT, send.write(&chunk))
            .await
            .expect("writes resume once the reader reads")
            .unwrap();
    }
    send.finish().unwrap();
    let total = tokio::task::spawn_blocking(move || read_rx.recv_timeout(STEP_TIMEOUT))
        .await
        .unwrap()
        .expect("server read everything");
    assert_eq!(total, written + extra);
    conn.close(0u32.into(), b"");
    server.shutdown();
}
