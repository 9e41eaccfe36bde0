//! kill -9 of the `felix` process during acked durable publishing: after a restart every acked
//! record is there exactly once, in order per key, with dense offsets per shard. The odd
//! trials run with `--preallocate zero` (zeros written ahead of the log writes).

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
    let seed: u64 =
        std::env::var("FELIX_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    println!("kill -9 test seed {seed} (rerun with FELIX_TEST_SEED={seed})");
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
