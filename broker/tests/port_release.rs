//! A gracefully stopped in-process broker lets go of its UDP port at once, so that a broker
//! restarted in the same process on the same address starts. Until 2026-12-04 the core mesh's
//! tasks outlived the stop: each held its core's shell (and socket) and waited on a channel
//! whose sender the other core's task held, so with two cores or more the port stayed bound
//! until the process exited.
//!
//! It also lets go of its files: until 2026-12-04 the application's tasks still pending at the
//! stop (the mesh loops, the stats publisher, a subscription's pumps) held each core's state,
//! so every stream log stayed open, and each restart opened every log again.

mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::{TestBroker, WAIT};
use felix_client::{AckMode, PublishSettings, Record, StartAt, SubscribeOptions};

/// Stops and restarts of one broker on one address.
const ROUNDS: usize = 5;
/// How long the port may stay bound after a stop (the leak held it forever).
const RELEASE_WAIT: Duration = Duration::from_secs(1);
/// How long the data directory's files may stay open after a stop.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// File descriptors the process may hold after the last round beyond those after the first.
const FDS_SLACK: usize = 4;

/// The targets of the process's open file descriptors but glommio's eventfds: glommio 0.9
/// leaves one open per executor that ever ran (DataDog/glommio#448), whatever runs on it.
fn open_fds() -> Vec<std::path::PathBuf> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.as_os_str() != "anon_inode:[eventfd]")
        .collect()
}

/// The files under `dir` the process still holds open once `wait` has passed (none, as soon as
/// there are none).
fn open_under(dir: &std::path::Path, wait: Duration) -> Vec<std::path::PathBuf> {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let started = Instant::now();
    loop {
        let open: Vec<_> = open_fds()
            .into_iter()
            .filter(|t| t.starts_with(dir) || t.starts_with(&canonical))
            .collect();
        if open.is_empty() || started.elapsed() > wait {
            return open;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Publishes and reads back a few records of a new stream on `broker`.
async fn traffic(broker: &TestBroker, round: usize) {
    let client = broker.client().await;
    let stream = format!("acme/app/r{round}");
    client.create_stream(&stream, 2, Default::default()).await.unwrap();
    let settings =
        PublishSettings { ack_mode: AckMode::Durable, linger_us: 50, ..PublishSettings::default() };
    let publisher = client.publisher_with(&stream, settings).await.unwrap();
    for i in 0..20 {
        let sent = publisher.publish(Record::keyed(format!("k{i}"), "v"));
        assert!(tokio::time::timeout(WAIT, sent).await.unwrap().unwrap().is_some());
    }
    let options = SubscribeOptions::new(&stream).start(StartAt::Earliest);
    let mut sub = client.subscribe(options).await.unwrap();
    for _ in 0..20 {
        tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    }
}

/// Whether `addr` can be bound (without SO_REUSEPORT) within `wait`.
fn released_within(addr: &str, wait: Duration) -> bool {
    let started = Instant::now();
    loop {
        if std::net::UdpSocket::bind(addr).is_ok() {
            return true;
        }
        if started.elapsed() > wait {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_broker_releases_its_port_and_restarts_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let addr = e2e_support::free_addr_for_restarts();
    let mut after_first = None;
    for round in 0..ROUNDS {
        let mut broker = TestBroker::start_at(&addr, dir.path(), 2, &[]);
        traffic(&broker, round).await;
        tokio::task::block_in_place(|| broker.stop());
        assert!(
            released_within(&addr, RELEASE_WAIT),
            "round {round}: {addr} still bound {RELEASE_WAIT:?} after the broker stopped"
        );
        let open = open_under(dir.path(), CLOSE_WAIT);
        assert!(
            open.is_empty(),
            "round {round}: still open {CLOSE_WAIT:?} after the stop: {open:?}"
        );
        let fds = open_fds();
        let first = *after_first.get_or_insert(fds.len());
        assert!(
            fds.len() <= first + FDS_SLACK,
            "round {round}: {} file descriptors open, {first} after the first round: {fds:?}",
            fds.len()
        );
    }
}
