//! The admin thread: `/metrics` (Prometheus text) and `/health` over plain HTTP/1.1.
//!
//! Not pinned and off the hot path: it reads the cores' single-writer counters and the
//! histogram copies the cores publish once a second.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::app::stats::{self, AppStats};

/// Request header lines read at most (the rest is ignored).
const MAX_HEADER_LINES: usize = 64;

/// Network counters per core, refreshed by the main thread.
pub type NetSnapshot = Arc<Mutex<Vec<Vec<(&'static str, u64)>>>>;

/// Starts the admin thread on `addr`. Fails at once if the address cannot be bound.
pub fn start(
    addr: SocketAddr,
    cores: Arc<Vec<Arc<AppStats>>>,
    net: NetSnapshot,
    ready: Arc<AtomicBool>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new().name("felix-admin".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
            let _ = serve(stream, &cores, &net, &ready);
        }
    })?;
    Ok(local)
}

fn serve(
    stream: TcpStream,
    cores: &[Arc<AppStats>],
    net: &NetSnapshot,
    ready: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // Drain the headers (bounded by the read timeout).
    let mut header = String::new();
    for _ in 0..MAX_HEADER_LINES {
        header.clear();
        if reader.read_line(&mut header)? <= 2 {
            break;
        }
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = match path {
        "/metrics" => {
            let net = net.lock().map(|n| n.clone()).unwrap_or_default();
            ("200 OK", stats::render(cores, &net))
        }
        "/health" if ready.load(Ordering::Relaxed) => ("200 OK", "ok\n".to_owned()),
        "/health" => ("503 Service Unavailable", "stopping\n".to_owned()),
        _ => ("404 Not Found", "try /metrics or /health\n".to_owned()),
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
