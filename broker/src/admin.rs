//! The admin thread: `/metrics` (OpenMetrics text), `/histograms` (the latency histograms
//! themselves, JSON), `/health` (liveness), `/ready` (readiness, [`crate::ready`]) and, in a
//! cluster, `/cluster` (the cluster as this broker's agent sees it, JSON: what
//! `felix cluster status --addr` reads) over HTTP/1.1.
//!
//! Not pinned and off the hot path: one thread, `felix-admin`, runs a current-thread tokio
//! runtime and serves each connection in its own task with hyper, so a slow or stalled client
//! never holds up another scrape. Every connection is bounded: its request head must arrive
//! within [`ADMIN_HEADER_READ_TIMEOUT_MS`] and fit in [`ADMIN_REQUEST_HEAD_MAX_BYTES`], the whole
//! exchange must end within [`ADMIN_REQUEST_TIMEOUT_MS`], at most [`ADMIN_CONNECTIONS_MAX`] are
//! served at once, and each serves one request (no keep-alive). The page reads the cores'
//! single-writer counters and the histogram copies the cores publish once a second.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use crate::app::stats::{self, AppStats};
use crate::ready::Readiness;

/// How long a client may take to send its request line and headers.
pub const ADMIN_HEADER_READ_TIMEOUT_MS: u64 = 2_000;

/// How long one connection (its one request and the answer) may last in all.
pub const ADMIN_REQUEST_TIMEOUT_MS: u64 = 5_000;

/// The largest request head (request line and headers) read; a longer one is refused with a
/// 431 and the connection closed. hyper's minimum is 8 KiB.
pub const ADMIN_REQUEST_HEAD_MAX_BYTES: usize = 16 * 1024;

/// Admin connections served at once; further ones are closed on accept.
pub const ADMIN_CONNECTIONS_MAX: usize = 64;

/// How long the accept loop waits after a failed accept.
const ADMIN_ACCEPT_BACKOFF_MS: u64 = 100;

pub use crate::net::stats::NetSnapshot;

/// What a request is answered from.
struct Pages {
    cores: Arc<Vec<Arc<AppStats>>>,
    net: NetSnapshot,
    ready: Readiness,
}

/// Starts the admin thread on `addr`. Fails at once if the address cannot be bound or the
/// runtime cannot be built.
pub fn start(
    addr: SocketAddr,
    cores: Arc<Vec<Arc<AppStats>>>,
    net: NetSnapshot,
    ready: impl Into<Readiness>,
) -> std::io::Result<SocketAddr> {
    let ready = ready.into();
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let pages = Arc::new(Pages { cores, net, ready });
    std::thread::Builder::new().name("felix-admin".into()).spawn(move || {
        runtime.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => accept_loop(listener, pages).await,
                Err(e) => tracing::error!("admin listener: {e}"),
            }
        });
    })?;
    Ok(local)
}

async fn accept_loop(listener: tokio::net::TcpListener, pages: Arc<Pages>) {
    let slots = Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(ADMIN_HEADER_READ_TIMEOUT_MS))
        .max_buf_size(ADMIN_REQUEST_HEAD_MAX_BYTES)
        .keep_alive(false);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!("admin accept: {e}");
                tokio::time::sleep(Duration::from_millis(ADMIN_ACCEPT_BACKOFF_MS)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let pages = pages.clone();
        let conn = http.serve_connection(
            TokioIo::new(stream),
            hyper::service::service_fn(move |req| {
                let pages = pages.clone();
                async move { Ok::<_, Infallible>(answer(&pages, &req)) }
            }),
        );
        tokio::spawn(async move {
            let deadline = Duration::from_millis(ADMIN_REQUEST_TIMEOUT_MS);
            // A timeout drops the connection; hyper's own errors (a head too large or too slow,
            // a reset) have already been answered or need no answer.
            let _ = tokio::time::timeout(deadline, conn).await;
            drop(slot);
        });
    }
}

fn answer(pages: &Pages, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" => {
            let net = pages.net.lock().map(|n| n.clone()).unwrap_or_default();
            (StatusCode::OK, stats::METRICS_CONTENT_TYPE, stats::render(&pages.cores, &net))
        }
        "/histograms" => {
            (StatusCode::OK, stats::HISTOGRAMS_CONTENT_TYPE, stats::render_histograms(&pages.cores))
        }
        "/health" if pages.ready.serving() => (StatusCode::OK, TEXT_PLAIN, "ok\n".to_owned()),
        "/health" => (StatusCode::SERVICE_UNAVAILABLE, TEXT_PLAIN, "stopping\n".to_owned()),
        "/ready" => match pages.ready.answer() {
            (true, body) => (StatusCode::OK, TEXT_PLAIN, body),
            (false, body) => (StatusCode::SERVICE_UNAVAILABLE, TEXT_PLAIN, body),
        },
        "/cluster" => match pages.ready.cluster_status().map(|s| serde_json::to_string(&s)) {
            Some(Ok(json)) => (StatusCode::OK, APPLICATION_JSON, json),
            Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, TEXT_PLAIN, format!("{e}\n")),
            None => (StatusCode::NOT_FOUND, TEXT_PLAIN, "not in a cluster\n".to_owned()),
        },
        _ => (
            StatusCode::NOT_FOUND,
            TEXT_PLAIN,
            "try /metrics, /histograms, /health, /ready or /cluster\n".to_owned(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";
/// The `Content-Type` of the `/cluster` page.
const APPLICATION_JSON: &str = "application/json";
