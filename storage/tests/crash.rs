//! Crash test: durable appends in a child process killed with SIGKILL at random moments.
//! After each kill the parent reopens the log and checks that every record whose durable
//! ack the child printed is present and intact, and that offsets are dense.
//!
//! The child is this test binary re-executed with `FELIX_CRASH_CHILD=<dir>`.
//! `FELIX_CRASH_SEED` fixes the seed, `FELIX_CRASH_TRIALS` the number of kills (default 20).
//! Each trial opens the log with `WriteSync::Dsync` or `WriteSync::Fdatasync` at random, and
//! with `Preallocate::Reserve` or `Preallocate::Zero` at random (zeros written ahead of the
//! data must never hide or cost an acknowledged record).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{AckMode, Offset, Record, ShardId};
use felix_storage::{RetentionConfig, StorageConfig, StreamLog};
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "FELIX_CRASH_CHILD";
const SHARDS: u32 = 4;
const APPENDERS: usize = 16;
const CHILD_LIFETIME_MAX: Duration = Duration::from_secs(30);

fn shards() -> Vec<ShardId> {
    (0..SHARDS).map(ShardId).collect()
}

/// The value of (shard, offset): its length and bytes depend on both.
fn value(shard: u32, offset: u64) -> Bytes {
    let tag = format!("s{shard}-o{offset}|");
    let len = 16 + (offset.wrapping_mul(7919) % 400) as usize;
    Bytes::from(tag.bytes().cycle().take(len).collect::<Vec<u8>>())
}

fn small_config(dir: &std::path::Path) -> StorageConfig {
    common::small_config(dir)
}

/// The child's body: append forever; print "shard base count" after each durable ack.
#[test]
fn crash_child_process_entry() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let seed: u64 = std::env::var("FELIX_CRASH_CHILD_SEED").unwrap().parse().unwrap();
    common::run(move || async move {
        let dir = std::path::PathBuf::from(dir);
        let mut config = small_config(&dir);
        // Each trial picks the durability mode; the log is reopened in the other one often.
        config.write_sync = std::env::var("FELIX_CRASH_CHILD_SYNC").unwrap().parse().unwrap();
        config.preallocate = std::env::var("FELIX_CRASH_CHILD_SPACE").unwrap().parse().unwrap();
        let (log, _) =
            StreamLog::open("crash/test/s", &dir, &shards(), &config, RetentionConfig::default())
                .await
                .expect("child opens the log");
        println!("ready");
        let deadline = std::time::Instant::now() + CHILD_LIFETIME_MAX;
        let tasks: Vec<_> = (0..APPENDERS)
            .map(|t| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ t as u64);
                    while std::time::Instant::now() < deadline {
                        let shard = rng.gen_range(0..SHARDS);
                        let n = rng.gen_range(1..8usize);
                        // Offsets are assigned in call order, so read the next one first.
                        let base = log.next_offset_assigned(ShardId(shard));
                        let records: Vec<Record> = (0..n)
                            .map(|i| Record::unkeyed(value(shard, base + i as u64)))
                            .collect();
                        let out = log
                            .append(ShardId(shard), &records, 1, AckMode::Durable)
                            .await
                            .expect("append");
                        assert_eq!(out.base_offset.0, base);
                        let mut o = std::io::stdout().lock();
                        writeln!(o, "{shard} {base} {n}").unwrap();
                        o.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    });
}

#[test]
fn kill_9_never_loses_a_durably_acked_record() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let seed: u64 =
        std::env::var("FELIX_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    let trials: usize =
        std::env::var("FELIX_CRASH_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    println!("crash test seed {seed} (FELIX_CRASH_SEED={seed} to repeat), {trials} trials");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Kept on failure for inspection; removed at the end of a passing run.
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap().keep();
    println!("crash test data in {}", dir.display());
    let log_dir = dir.join("log");
    // (shard, base) -> count of every batch whose durable ack was printed.
    let mut acked: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for trial in 0..trials {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["crash_child_process_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &log_dir)
            .env("FELIX_CRASH_CHILD_SEED", rng.gen::<u64>().to_string())
            .env("FELIX_CRASH_CHILD_SYNC", if rng.gen_bool(0.5) { "dsync" } else { "fdatasync" })
            .env("FELIX_CRASH_CHILD_SPACE", if rng.gen_bool(0.5) { "zero" } else { "reserve" })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait for "ready", then kill after a random delay.
        let ready = rx.iter().any(|l| l.ends_with("ready"));
        assert!(ready, "seed {seed} trial {trial}: child never became ready");
        std::thread::sleep(Duration::from_millis(rng.gen_range(5..150)));
        child.kill().expect("SIGKILL child");
        child.wait().unwrap();
        reader.join().unwrap();
        let mut new = 0;
        for line in rx.try_iter() {
            let parts: Vec<u64> = line.split(' ').filter_map(|p| p.parse().ok()).collect();
            if parts.len() == 3 {
                acked.insert((parts[0] as u32, parts[1]), parts[2]);
                new += 1;
            }
        }
        let acked_now = acked.clone();
        let dir2 = log_dir.clone();
        let (report, totals) = common::run(move || async move {
            let (log, report) = StreamLog::open(
                "crash/test/s",
                &dir2,
                &shards(),
                &small_config(&dir2),
                RetentionConfig::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("seed {seed} trial {trial}: reopen failed: {e}"));
            let mut totals = Vec::new();
            for shard in 0..SHARDS {
                let next = log.next_offset(ShardId(shard)).unwrap().0;
                let mut at = 0;
                while at < next {
                    for b in log.read(ShardId(shard), Offset(at), 1 << 20).await.unwrap() {
                        assert_eq!(
                            b.base_offset.0, at,
                            "seed {seed}: offsets not dense in shard {shard}"
                        );
                        for (i, r) in b.records.iter().enumerate() {
                            assert_eq!(
                                r.value,
                                value(shard, at + i as u64),
                                "seed {seed}: shard {shard} offset {}",
                                at + i as u64
                            );
                        }
                        at += b.records.len() as u64;
                    }
                }
                for ((s, base), count) in acked_now.range((shard, 0)..(shard + 1, 0)) {
                    assert!(
                        base + count <= next,
                        "seed {seed} trial {trial}: acked {s}:{base}+{count} lost (next {next}); recovery: {report:?}"
                    );
                }
                totals.push(next);
            }
            (report, totals)
        });
        println!(
            "trial {trial}: {new} acks seen, next offsets {totals:?}, torn bytes dropped {}",
            report.torn_bytes_dropped
        );
    }
    assert!(!acked.is_empty(), "seed {seed}: the child never acked anything");
    std::fs::remove_dir_all(&dir).unwrap();
}
