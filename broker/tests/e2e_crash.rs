//! kill -9 of the `felix` process during acked durable publishing: after a restart every acked
//! record is there exactly once, in order per key, with dense offsets per shard. The odd
//! trials run with `--preallocate zero` (zeros written ahead of the log writes). And kill -9
//! during consumer-group commits: every acked position survives, snapshots of the offsets log
//! included.

mod e2e_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e_support::{connect_when_up, free_addr, spawn_felix, ReadBack, TestBroker, WAIT};
use felix_client::{AckMode, PublishSettings, Record, StartAt, SubscribeOptions, Trust};

const TRIALS: u64 = 3;
const KEYS: u32 = 6;

fn client_config(addr: &str, dir: &std::path::Path) -> felix_client::ClientConfig {
    felix_client::ClientConfig {
        addr: addr.to_owned(),
        trust: Some(Trust::CaFile(dir.join("dev-cert.pem"))),
        connect_timeout_ms: 1000,
        reconnect_attempts_max: 0,
        publish: PublishSettings {
            ack_mode: AckMode::Durable,
            linger_us: 100,
            ..PublishSettings::default()
        },
        ..felix_client::ClientConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_durable_publishing_loses_no_acked_record() {
    let seed = e2e_support::test_seed("kill -9 test");
    let mut rng = seed;
    for trial in 0..TRIALS {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let kill_after = Duration::from_millis(150 + (rng >> 33) % 600);
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let space: &[&str] =
            if trial % 2 == 1 { &["--preallocate", "zero"] } else { &["--preallocate", "reserve"] };
        let child = spawn_felix(dir.path(), &addr, space);
        let client = connect_when_up(&addr, dir.path(), client_config).await;
        client.create_stream("acme/app/crash", 4, Default::default()).await.unwrap();
        let publisher = client.publisher("acme/app/crash").await.unwrap();
        let acked: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for key in 0..KEYS {
            let (p, acked, stop) = (publisher.clone(), acked.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                // Sequential per key: each record is sent after the previous one is acked.
                for seq in 0u32.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let rec = Record::keyed(format!("key-{key}"), seq.to_be_bytes().to_vec());
                    match tokio::time::timeout(Duration::from_secs(3), p.publish(rec)).await {
                        Ok(Ok(Some(_))) => acked.lock().unwrap().push((key, seq)),
                        _ => return,
                    }
                }
            }));
        }
        tokio::time::sleep(kill_after).await;
        drop(child); // SIGKILL
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            let _ = tokio::time::timeout(WAIT, w).await;
        }
        client.close();
        let acked = acked.lock().unwrap().clone();
        assert!(
            !acked.is_empty(),
            "trial {trial}: nothing was acked before the kill ({kill_after:?})"
        );

        let broker = TestBroker::start(dir.path(), 2, space);
        let reader = broker.client().await;
        let mut sub = reader
            .subscribe(SubscribeOptions::new("acme/app/crash").start(StartAt::Earliest))
            .await
            .unwrap();
        let what = format!("trial {trial} seed {seed}");
        let mut back = ReadBack::default();
        // Read until the log is drained (no record for a while).
        while let Ok(next) = tokio::time::timeout(Duration::from_millis(800), sub.next()).await {
            back.add(&next.unwrap().expect("subscription ended"), &what);
        }
        for (key, seq) in &acked {
            assert!(back.all.contains(&(*key, *seq)), "{what}: acked ({key}, {seq}) lost");
        }
        back.assert_ordered_and_dense(&what);
        println!(
            "trial {trial} ({}): killed after {kill_after:?}, {} acked, {} stored",
            space[1],
            acked.len(),
            back.all.len()
        );
    }
}

/// kill -9 while consumer groups commit (and the offsets log is snapshotted and compacted,
/// one 4 MiB segment of commits at a time): after a restart every group resumes at or past
/// its last acknowledged commit, and not past the last one it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_commits_keeps_every_acked_position() {
    use felix_proto::Frame;
    const GROUPS: usize = 40;
    const OFFSET_MAX: u64 = 590;
    let seed = e2e_support::test_seed("kill -9 commit test");
    let mut rng = seed;
    let segment = ["--segment-bytes", "4198400"];
    for trial in 0..2 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // From about 10,000 commits (under a segment) to all of them (past the first snapshot).
        let kill_after = Duration::from_millis(1500 + (rng >> 33) % 2500);
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let child = spawn_felix(dir.path(), &addr, &segment);
        let client = connect_when_up(&addr, dir.path(), client_config).await;
        client.create_stream("acme/app/pos", 1, Default::default()).await.unwrap();
        let publisher = client.publisher("acme/app/pos").await.unwrap();
        for i in 0..OFFSET_MAX + 10 {
            publisher.publish(Record::unkeyed(i.to_be_bytes().to_vec())).await.unwrap();
        }
        let (conn, _hello_send, _hello_recv) =
            e2e_support::raw_session(addr.parse().unwrap(), dir.path()).await;
        // Per group: (last acked, last sent).
        let positions: Arc<Mutex<Vec<(u64, u64)>>> = Arc::new(Mutex::new(vec![(0, 0); GROUPS]));
        let group = |g: usize| format!("g{g:02}-{}", "x".repeat(196));
        let mut tasks = Vec::new();
        for g in 0..GROUPS {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            let (positions, group) = (positions.clone(), group(g));
            tasks.push(tokio::spawn(async move {
                for offset in 1..=OFFSET_MAX {
                    let commit = e2e_support::commit_frame("acme/app/pos", &group, offset, offset);
                    positions.lock().unwrap()[g].1 = offset;
                    if send.write_all(&commit.to_bytes()).await.is_err() {
                        return;
                    }
                    let answer = tokio::time::timeout(
                        Duration::from_secs(3),
                        e2e_support::read_frames(&mut recv, 1),
                    );
                    match answer.await.as_deref() {
                        Ok([Frame::CommitOk(_)]) => positions.lock().unwrap()[g].0 = offset,
                        _ => return,
                    }
                }
            }));
        }
        tokio::time::sleep(kill_after).await;
        drop(child); // SIGKILL
        for t in tasks {
            let _ = tokio::time::timeout(WAIT, t).await;
        }
        drop(conn);
        client.close();
        let positions = positions.lock().unwrap().clone();
        let acked: u64 = positions.iter().map(|p| p.0).sum();
        assert!(acked > 0, "trial {trial}: no commit acked before the kill ({kill_after:?})");

        let broker = TestBroker::start(dir.path(), 2, &segment);
        let reader = broker.client().await;
        for (g, (acked, sent)) in positions.iter().enumerate() {
            let opts =
                SubscribeOptions::new("acme/app/pos").start(StartAt::Earliest).group(group(g));
            let mut sub = reader.subscribe(opts).await.unwrap();
            let first = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
            let at = first.offset.0;
            assert!(
                *acked <= at && at <= *sent,
                "trial {trial} seed {seed}: group {g} resumes at {at}, acked {acked}, sent {sent}"
            );
        }
        println!("trial {trial}: killed after {kill_after:?}, {acked} commits acked");
    }
}
