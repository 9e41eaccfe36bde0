//! The admin endpoint: a slow or stalled client does not hold up a scrape, a request's size is
//! bounded, and `/metrics` carries every metric name docs/operations.md documents.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use felix_broker::app::stats::AppStats;

/// The tests measure time and the process's memory: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// How long a client waits for an answer before the test fails rather than hangs.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// An admin endpoint over two cores' (idle) statistics and a made-up network snapshot.
fn start_admin() -> SocketAddr {
    let cores = Arc::new(vec![Arc::new(AppStats::default()), Arc::new(AppStats::default())]);
    let net = Arc::new(Mutex::new(vec![
        vec![("datagrams_in", 3), ("misrouted", 0)],
        vec![("datagrams_in", 4), ("misrouted", 1)],
    ]));
    felix_broker::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        cores,
        net,
        Arc::new(AtomicBool::new(true)),
    )
    .unwrap()
}

/// GETs `path` and returns the whole answer (head and body).
fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    page
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS");
    kb * 1024
}

#[test]
fn a_trickling_client_and_idle_connections_do_not_delay_a_scrape() {
    let _serial = serial();
    let addr = start_admin();
    let idle: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let request = b"GET /metrics HTTP/1.1\r\nHost: a-very-slow-client.example\r\n";
            for b in request.iter().cycle() {
                if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Let the server accept the stalled connections (and the trickler start) first.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let t = Instant::now();
        let page = get(addr, "/metrics");
        let took = t.elapsed();
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("felix_net_datagrams_in{core=\"1\"} 4"), "{page}");
        assert!(took < Duration::from_secs(1), "a scrape took {took:?} behind slow clients");
        let health = get(addr, "/health");
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    }
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    drop(idle);
}

#[test]
fn a_stalled_request_is_closed_by_the_header_timeout() {
    let _serial = serial();
    let addr = start_admin();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let t = Instant::now();
    let mut rest = Vec::new();
    // The server answers (408) or just closes; either way the read ends.
    let _ = s.read_to_end(&mut rest);
    let limit = Duration::from_millis(felix_broker::admin::ADMIN_REQUEST_TIMEOUT_MS);
    assert!(t.elapsed() <= limit + Duration::from_secs(1), "held {:?}", t.elapsed());
    let answer = String::from_utf8_lossy(&rest);
    assert!(!answer.contains("200 OK"), "a half request was answered: {answer}");
}

#[test]
fn an_oversized_request_head_is_refused_without_buffering_it() {
    let _serial = serial();
    let addr = start_admin();
    // Warm up (runtime, first page) before measuring.
    assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200"));
    let before = rss_bytes();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    // A request line 64 MiB long and never ended.
    let total: usize = 64 << 20;
    let chunk = vec![b'a'; 64 << 10];
    let mut sent = 0;
    if s.write_all(b"GET /").is_ok() {
        while sent < total {
            match s.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
    }
    let grown = rss_bytes().saturating_sub(before);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(sent < total, "the server read all {sent} bytes of the request line");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "an oversized head was answered {answer}"
    );
    assert!(grown < 8 << 20, "RSS grew {grown} bytes for one oversized request");
    // The endpoint still serves.
    assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200"));
}

#[test]
fn metrics_carry_every_documented_name_in_openmetrics_text() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let serve = felix_broker::config::parse_serve(&[
        "felix",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &d,
        "--cores",
        "2",
        "--metrics",
        "off",
        "--no-pin",
        "--min-free-bytes",
        "16777216",
    ])
    .unwrap();
    let broker = felix_broker::app::Broker::start(&serve).expect("broker starts");
    broker.refresh();
    let addr = felix_broker::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        broker.stats.clone(),
        broker.net.clone(),
        broker.ready.clone(),
    )
    .unwrap();
    let page = get(addr, "/metrics");
    broker.shutdown();
    let (head, body) = page.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let samples: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
    let documented = include_str!("../../docs/operations.md");
    // The per-stream series (`felix_stream_*`, one per shard a core owns) need a stream:
    // broker/tests/replication.rs reads them.
    let mut names: Vec<&str> = documented
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| w.starts_with("felix_") && !w.ends_with('_'))
        .filter(|w| !w.starts_with("felix_stream_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() > 10, "docs/operations.md names {names:?}");
    for name in names {
        for core in 0..2 {
            let series = format!("{name}{{core=\"{core}\"");
            assert!(
                samples.iter().any(|l| l.starts_with(&series)),
                "no {series}..}} sample for the documented {name} in\n{body}"
            );
        }
    }
    // The scrapers' series (loadgen, `felix cluster status`).
    for series in [
        "felix_storage_append_bytes_total{core=\"0\"} ",
        "felix_broker_publishes_total{core=\"1\"} ",
        "felix_broker_connections_open{core=\"0\"} ",
        "felix_broker_connections_accepted_total{core=\"0\"} ",
        "felix_broker_publish_errors_total{core=\"0\"} ",
        "felix_storage_flushes_total{core=\"0\"} ",
        "felix_storage_flushes_overlapped_total{core=\"0\"} ",
        "felix_publish_ack_latency_us{core=\"0\",quantile=\"0.5\"} ",
        "felix_publish_ack_latency_us{core=\"1\",quantile=\"0.99\"} ",
    ] {
        assert!(samples.iter().any(|l| l.starts_with(series)), "no {series} in\n{body}");
    }
}

#[test]
fn histograms_page_carries_each_cores_published_histograms() {
    use base64::Engine;
    use hdrhistogram::serialization::Deserializer;
    let _serial = serial();
    let cores = vec![Arc::new(AppStats::default()), Arc::new(AppStats::default())];
    let mut ack = felix_broker::app::stats::new_histogram();
    ack.record_n(1_500, 99).unwrap();
    ack.record(40_000).unwrap();
    felix_broker::app::stats::publish_histogram(&cores[1].ack_latency_us, &ack);
    let mut flush = felix_broker::app::stats::new_histogram();
    flush.record_n(700, 3).unwrap();
    felix_broker::app::stats::publish_histogram(&cores[1].flush_latency_us, &flush);
    cores[1].histograms_published_unix_ms.store(1_700_000_000_123, Ordering::Release);
    let addr = felix_broker::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(cores),
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(AtomicBool::new(true)),
    )
    .unwrap();
    let page = get(addr, "/histograms");
    let (head, body) = page.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
    let decode = |core: usize, name: &str| -> hdrhistogram::Histogram<u64> {
        let b64 = v["cores"][core][name].as_str().unwrap_or_else(|| panic!("{name} in {body}"));
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
        Deserializer::new().deserialize(&mut bytes.as_slice()).expect("HDR V2")
    };
    assert_eq!(v["cores"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["cores"][0]["published_unix_ms"].as_u64(), Some(0), "not published yet");
    assert_eq!(v["cores"][1]["published_unix_ms"].as_u64(), Some(1_700_000_000_123));
    assert_eq!(decode(0, "ack_latency_us").len(), 0);
    let got = decode(1, "ack_latency_us");
    assert_eq!(got.len(), 100);
    assert_eq!(got.count_at(1_500), 99);
    assert_eq!(got.value_at_quantile(0.99), got.highest_equivalent(1_500));
    assert!(got.max() >= 40_000);
    assert_eq!(decode(1, "flush_latency_us").count_at(700), 3);
    assert_eq!(decode(1, "write_latency_us").len(), 0);
    assert_eq!(decode(1, "fan_in").len(), 0);
    assert!(get(addr, "/nope").contains("/histograms"), "the 404 names the pages");
}

#[test]
fn connections_over_the_cap_are_closed_and_slots_come_back() {
    let _serial = serial();
    let addr = start_admin();
    let held: Vec<TcpStream> = (0..felix_broker::admin::ADMIN_CONNECTIONS_MAX)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = TcpStream::connect(addr).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 64];
    // Closed at once: end of stream or a reset, not a read timeout.
    match extra.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "a connection over the cap was served"),
        Err(e) => assert!(
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "a connection over the cap was held open: {e}"
        ),
    }
    // The idle ones are closed by the header timeout, and their slots serve again.
    let header_timeout = Duration::from_millis(felix_broker::admin::ADMIN_HEADER_READ_TIMEOUT_MS);
    std::thread::sleep(header_timeout + Duration::from_millis(500));
    assert!(get(addr, "/health").starts_with("HTTP/1.1 200"));
    drop(held);
}
