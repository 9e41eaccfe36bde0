//! Cross-module tests of a stream log: append/read, recovery, group commit, limits,
//! tail notification, segment rolls and the sparse index.

mod common;

use std::path::PathBuf;
use std::rc::Rc;

use bytes::Bytes;
use common::{records, run, small_config};
use felix_proto::{AckMode, Offset, Record, ShardId};
use felix_storage::{RetentionConfig, StorageConfig, StorageError, StreamLog, WriteSync};

const SHARDS: [ShardId; 3] = [ShardId(0), ShardId(1), ShardId(7)];

async fn open(dir: &std::path::Path, config: &StorageConfig) -> StreamLog {
    StreamLog::open("t/ns/s", &dir.join("log"), &SHARDS, config, RetentionConfig::default())
        .await
        .expect("log opens")
        .0
}

/// Read every record of `shard` from offset 0 and check dense offsets and content.
async fn check_shard(log: &StreamLog, shard: ShardId, expected_next: u64, value_len: usize) {
    let mut at = 0u64;
    while at < expected_next {
        let batches = log.read(shard, Offset(at), 64 << 10).await.expect("read");
        assert!(!batches.is_empty(), "{shard} has nothing at {at}");
        for b in batches {
            assert_eq!(b.shard, shard);
            assert!(b.base_offset.0 <= at && at < b.base_offset.0 + b.records.len() as u64);
            let want = records(shard.0, b.base_offset.0, b.records.len(), value_len);
            assert_eq!(b.records, want, "{shard} batch at {}", b.base_offset);
            at = b.base_offset.0 + b.records.len() as u64;
        }
    }
    assert_eq!(at, expected_next);
    assert_eq!(log.next_offset(shard).unwrap(), Offset(expected_next));
    assert!(log.read(shard, Offset(expected_next), 1 << 20).await.unwrap().is_empty());
}

/// Walk `shard` from offset 0 with `read_with` (the borrowed views) and check that each view
/// shows exactly what `read` returns for the same offset: header fields and every record.
async fn check_views(log: &StreamLog, shard: ShardId, expected_next: u64) {
    let mut at = 0u64;
    while at < expected_next {
        let owned = log.read(shard, Offset(at), 64 << 10).await.expect("read");
        let mut seen = Vec::new();
        log.read_with(shard, Offset(at), 64 << 10, |v| {
            let records: Vec<Record> = v
                .records()
                .map(|(k, value)| Record {
                    key: k.map(Bytes::copy_from_slice),
                    value: Bytes::copy_from_slice(value).into(),
                })
                .collect();
            assert_eq!(records.len() as u32, v.record_count());
            seen.push((v.shard(), v.base_offset(), v.end(), v.first_timestamp_ms(), records));
        })
        .await
        .expect("read_with");
        assert!(!seen.is_empty(), "{shard} has nothing at {at}");
        assert_eq!(seen.len(), owned.len(), "{shard} at {at}");
        for (view, b) in seen.iter().zip(&owned) {
            let end = b.base_offset.0 + b.records.len() as u64;
            assert_eq!(
                view,
                &(b.shard, b.base_offset, end, b.first_timestamp_ms, b.records.clone())
            );
        }
        at = seen.last().unwrap().2;
    }
    assert_eq!(at, expected_next);
}

/// Appends one-record batches `0..n` to shard 0 and, every `every`th, the next one to shard
/// 1 (value lengths `lens`), 64 appends in flight at a time: offsets follow append order.
async fn append_interleaved(log: &StreamLog, n: u64, every: u64, lens: (usize, usize)) {
    let mut pending = Vec::new();
    for i in 0..n {
        let l = log.clone();
        pending.push(glommio::spawn_local(async move {
            l.append(ShardId(0), &records(0, i, 1, lens.0), i, AckMode::Written).await.unwrap()
        }));
        if i % every == 0 {
            let l = log.clone();
            pending.push(glommio::spawn_local(async move {
                let rec = records(1, i / every, 1, lens.1);
                l.append(ShardId(1), &rec, i, AckMode::Written).await.unwrap()
            }));
        }
        if pending.len() >= 64 {
            for p in pending.drain(..) {
                p.await;
            }
        }
    }
    for p in pending.drain(..) {
        p.await;
    }
}

/// The segment file under `dir` holding `needle`, and where it starts in it.
fn find_on_disk(dir: &std::path::Path, needle: &[u8]) -> (PathBuf, usize) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let file = entry.unwrap().path();
        let bytes = std::fs::read(&file).unwrap();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            return (file, at);
        }
    }
    panic!("{} is not on disk", String::from_utf8_lossy(needle));
}

#[test]
fn append_read_and_reopen_keep_dense_offsets_per_shard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let mut next = [0u64; 3];
        for round in 0..30u64 {
            for (i, shard) in SHARDS.iter().enumerate() {
                let n = 1 + (round as usize + i) % 5;
                let ack = [AckMode::None, AckMode::Written, AckMode::Durable][(round % 3) as usize];
                let out = log
                    .append(*shard, &records(shard.0, next[i], n, 100), 1000 + round, ack)
                    .await
                    .unwrap();
                assert_eq!(out.base_offset, Offset(next[i]));
                next[i] += n as u64;
            }
        }
        log.clone().close().await.unwrap();
        for (i, shard) in SHARDS.iter().enumerate() {
            check_shard(&log, *shard, next[i], 100).await;
        }
        drop(log);
        let (log, report) = StreamLog::open(
            "t/ns/s",
            &path.join("log"),
            &SHARDS,
            &config,
            RetentionConfig::default(),
        )
        .await
        .unwrap();
        assert_eq!(report.torn_bytes_dropped, 0);
        assert_eq!(report.batches, 90);
        for (i, shard) in SHARDS.iter().enumerate() {
            check_shard(&log, *shard, next[i], 100).await;
            // Keyed and unkeyed records, 1 to 5 per batch, through borrowed views.
            check_views(&log, *shard, next[i]).await;
        }
        let out = log
            .append(ShardId(1), &records(1, next[1], 2, 100), 5, AckMode::Durable)
            .await
            .unwrap();
        assert_eq!(out.base_offset, Offset(next[1]));
    });
}

#[test]
fn bad_input_gets_typed_errors_and_the_log_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        config.batch_bytes_max = 4096;
        config.batch_records_max = 10;
        let log = open(&path, &config).await;
        let e = log.append(ShardId(2), &records(2, 0, 1, 10), 0, AckMode::Durable).await;
        assert!(matches!(e, Err(StorageError::UnknownShard { shard: ShardId(2), .. })), "{e:?}");
        let e = log.append(ShardId(0), &records(0, 0, 1, 5000), 0, AckMode::Durable).await;
        assert!(matches!(e, Err(StorageError::BatchTooLarge { limit: 4096, .. })), "{e:?}");
        let e = log.append(ShardId(0), &records(0, 0, 11, 1), 0, AckMode::Durable).await;
        assert!(matches!(e, Err(StorageError::TooManyRecords { count: 11, .. })), "{e:?}");
        let e = log.append(ShardId(0), &[], 0, AckMode::Durable).await;
        assert!(matches!(e, Err(StorageError::EmptyBatch)), "{e:?}");
        let e = log.read(ShardId(9), Offset(0), 100).await;
        assert!(matches!(e, Err(StorageError::UnknownShard { .. })), "{e:?}");
        // No offset was consumed by the rejected batches.
        let out = log.append(ShardId(0), &records(0, 0, 3, 10), 0, AckMode::Durable).await.unwrap();
        assert_eq!(out.base_offset, Offset(0));
        check_shard(&log, ShardId(0), 3, 10).await;
        assert_eq!(log.stats().append_errors, 4);
    });
}

#[test]
fn group_commit_covers_concurrent_durable_appends_with_few_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        config.write_sync = WriteSync::Fdatasync;
        let log = open(&path, &config).await;
        let before = log.stats().flushes;
        let tasks: Vec<_> = (0..64u32)
            .map(|i| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    let shard = SHARDS[i as usize % 3];
                    for _ in 0..4 {
                        log.append(shard, &records(shard.0, 0, 4, 1000), 1, AckMode::Durable)
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        let stats = log.stats();
        assert_eq!(stats.appends, 256);
        let flushes = stats.flushes - before;
        assert!(flushes < 256, "group commit did not group: {flushes} flushes for 256 appends");
        assert!(stats.fan_in.max() > 1, "fan-in never exceeded 1");
        assert_eq!(stats.fan_in.len(), stats.flush_latency_us.len());
        assert!(stats.bytes_written >= stats.batch_bytes);
        let mut total = 0;
        for shard in SHARDS {
            total += log.next_offset(shard).unwrap().0;
        }
        assert_eq!(total, 256 * 4);
    });
}

/// Durable appends on three shards at once, each waiting for its ack (and a moment) before the
/// next: a write that completes while a flush runs starts its own flush (two in flight), and
/// every acked record is there, also after reopening.
#[test]
fn a_durable_append_written_during_a_flush_starts_its_own_flush() {
    const PER_SHARD: u64 = 150;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = small_config(&path);
        config.write_sync = WriteSync::Fdatasync;
        let log = open(&path, &config).await;
        let tasks: Vec<_> = SHARDS
            .iter()
            .map(|&shard| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    for i in 0..PER_SHARD {
                        let out = log
                            .append(shard, &records(shard.0, 2 * i, 2, 700), 1, AckMode::Durable)
                            .await
                            .unwrap();
                        assert_eq!(out.base_offset, Offset(2 * i));
                        // Out of step with the other shards' appenders, so that writes complete
                        // while a flush runs.
                        let pause = (i * 37 + u64::from(shard.0) * 101) % 400;
                        glommio::timer::sleep(std::time::Duration::from_micros(pause)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        let stats = log.stats();
        assert!(
            stats.flushes_overlapped > 0,
            "no flush started while another ran ({} flushes)",
            stats.flushes
        );
        for shard in SHARDS {
            check_shard(&log, shard, 2 * PER_SHARD, 700).await;
        }
        drop(log);
        let log = open(&path, &config).await;
        for shard in SHARDS {
            check_shard(&log, shard, 2 * PER_SHARD, 700).await;
        }
    });
}

/// With O_DSYNC segments (`WriteSync::Dsync`) a durable append is acknowledged when its write is
/// published: concurrent durable appenders on three shards across many segment rolls need
/// no group-commit fdatasync at all (only the one each roll makes), and every acked record
/// reads back, also after reopening, and after reopening with the other mode in turn.
#[test]
fn with_dsync_writes_a_durable_append_is_acked_without_a_flush() {
    const PER_SHARD: u64 = 800;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = small_config(&path);
        assert_eq!(config.write_sync, WriteSync::Fdatasync, "the default");
        config.write_sync = WriteSync::Dsync;
        let log = open(&path, &config).await;
        let tasks: Vec<_> = SHARDS
            .iter()
            .map(|&shard| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    for i in 0..PER_SHARD {
                        let out = log
                            .append(shard, &records(shard.0, 2 * i, 2, 3000), 1, AckMode::Durable)
                            .await
                            .unwrap();
                        assert_eq!(out.base_offset, Offset(2 * i));
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        let stats = log.stats();
        assert!(stats.segments_created >= 3, "rolled {} times", stats.segments_created);
        assert_eq!(stats.flush_latency_us.len(), 0, "no group-commit fdatasync ran");
        assert!(stats.writes > 0);
        log.flush().await.unwrap();
        assert_eq!(log.stats().flush_latency_us.len(), 0, "everything written is durable");
        for shard in SHARDS {
            check_shard(&log, shard, 2 * PER_SHARD, 3000).await;
        }
        drop(log);
        // Reopened with fdatasync: the same records; appends now wait for flushes.
        let mut fdatasync = config.clone();
        fdatasync.write_sync = WriteSync::Fdatasync;
        let log = open(&path, &fdatasync).await;
        for shard in SHARDS {
            check_shard(&log, shard, 2 * PER_SHARD, 3000).await;
            let next = 2 * PER_SHARD;
            log.append(shard, &records(shard.0, next, 2, 3000), 1, AckMode::Durable).await.unwrap();
        }
        assert!(!log.stats().flush_latency_us.is_empty(), "fdatasync mode flushes");
        drop(log);
        let log = open(&path, &config).await;
        for shard in SHARDS {
            check_shard(&log, shard, 2 * PER_SHARD + 2, 3000).await;
        }
    });
}

#[test]
fn tail_readers_wake_on_new_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let woke = Rc::new(std::cell::Cell::new(false));
        let waiter = {
            let (log, woke) = (log.clone(), woke.clone());
            glommio::spawn_local(async move {
                log.wait_for(ShardId(7), Offset(2)).await.unwrap();
                woke.set(true);
                log.read(ShardId(7), Offset(2), 1 << 20).await.unwrap()
            })
        };
        log.append(ShardId(7), &records(7, 0, 2, 10), 0, AckMode::Written).await.unwrap();
        glommio::yield_if_needed().await;
        glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        assert!(!woke.get(), "woke before offset 2 existed");
        log.append(ShardId(7), &records(7, 2, 1, 10), 0, AckMode::Written).await.unwrap();
        let got = waiter.await;
        assert!(woke.get());
        assert_eq!(got[0].base_offset, Offset(2));
        // Already there: resolves at once.
        log.wait_for(ShardId(7), Offset(0)).await.unwrap();
    });
}

#[test]
fn segments_roll_and_old_entries_are_served_through_the_sparse_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log = open(&path, &config).await;
        // > INDEX_RECENT_MAX batches of shard 0, interleaved with shard 1, over several segments.
        let n = felix_storage::index::INDEX_RECENT_MAX as u64 + 300;
        append_interleaved(&log, n, 4, (1500, 500)).await;
        assert!(log.segment_count() >= 2, "no roll: {} segments", log.segment_count());
        // Offsets were assigned in append order, so content matches offsets.
        check_shard(&log, ShardId(0), n, 1500).await;
        // The same through borrowed views, below (scan) and within (dense) the index.
        check_views(&log, ShardId(0), n).await;
        check_views(&log, ShardId(1), n.div_ceil(4)).await;
        let old = log.read(ShardId(0), Offset(5), 3000).await.unwrap();
        assert_eq!(old[0].base_offset, Offset(5));
        log.clone().close().await.unwrap();
        drop(log);
        let log = open(&path, &config).await;
        check_shard(&log, ShardId(0), n, 1500).await;
        check_shard(&log, ShardId(1), n.div_ceil(4), 500).await;
    });
}

#[test]
fn a_corrupt_batch_of_one_shard_stops_its_readers_not_the_others() {
    corrupt_batches(false);
}

#[test]
fn a_corrupt_batch_of_one_shard_stops_its_readers_not_the_others_through_the_cache() {
    corrupt_batches(true);
}

/// Damages a batch of shard 1, then (without the read cache) the header of one of shard 0's.
fn corrupt_batches(cache: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = small_config(&path);
        if !cache {
            config.read_cache_bytes = 0;
        }
        let log = open(&path, &config).await;
        // Shard 0 past its dense index (its oldest batches are read by scanning the log),
        // shard 1 interleaved with it.
        let n = felix_storage::index::INDEX_RECENT_MAX as u64 + 200;
        // Through the cache, enough for whole blocks (the cache keeps no partial one of the
        // segment being written).
        let len = if cache { 400 } else { 64 };
        append_interleaved(&log, n, 8, (len, len)).await;
        log.flush().await.unwrap();
        // Damage one byte of the value of shard 1's record at offset 3 (an old batch, amid
        // shard 0's scanned ones).
        let tag = b"s1-o3.";
        let (file, at) = find_on_disk(&path.join("log"), tag);
        let at = at + tag.len();
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at] ^= 0xff;
        std::fs::write(&file, &bytes).unwrap();

        // Shard 0 reads everything, through the scan and the dense index.
        check_shard(&log, ShardId(0), n, len).await;
        // Shard 1's reader gets a typed error naming the file.
        match log.read(ShardId(1), Offset(3), 1 << 20).await {
            Err(StorageError::Corrupt { path, .. }) => assert_eq!(path, file),
            other => panic!("{other:?}"),
        }

        if cache {
            // The bytes below are damaged behind the log's back after it read (and verified)
            // them: the cache would go on serving what it read.
            assert!(log.read_cache_stats().hits > 0);
            return;
        }
        // A damaged header (shard 0's batch at offset 5 now names shard 7) makes the scan step
        // over it: shard 0's reader must get an error, not records 4 then 6.
        let (file, key_at) = find_on_disk(&path.join("log"), b"s0-o5");
        // The key follows the 48-byte batch header and the 9-byte record header.
        let shard_at = key_at - 9 - 48 + 16;
        let mut bytes = std::fs::read(&file).unwrap();
        assert_eq!(bytes[shard_at..shard_at + 4], 0u32.to_le_bytes());
        bytes[shard_at..shard_at + 4].copy_from_slice(&7u32.to_le_bytes());
        std::fs::write(&file, &bytes).unwrap();
        match log.read(ShardId(0), Offset(4), 1 << 20).await {
            Err(StorageError::Corrupt { path, reason, .. }) => {
                assert_eq!(path, file);
                assert!(reason.contains("offset 5 was due"), "{reason}");
            }
            other => panic!("{:?}", other.map(|b| b.len())),
        }
    });
}

#[test]
fn reading_one_shard_reads_little_of_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        // Interleave: shard 0 gets 100 small batches, shard 1 one 100 KB batch after each.
        for i in 0..100u64 {
            log.append(ShardId(0), &records(0, i, 1, 200), 1, AckMode::Written).await.unwrap();
            log.append(ShardId(1), &records(1, i, 1, 100_000), 1, AckMode::Written).await.unwrap();
        }
        let before = glommio::executor().io_stats().all_rings().file_reads().1;
        check_shard(&log, ShardId(0), 100, 200).await;
        let read = glommio::executor().io_stats().all_rings().file_reads().1 - before;
        // Shard 1 holds ~10 MB; shard 0's reads may only touch the blocks around its batches.
        assert!(read < 1_000_000, "read {read} bytes to serve 100 small batches");
        assert!(read > 0);
    });
}

#[test]
fn a_relative_data_directory_works() {
    // Regression: glommio's mkdirat failed with EBADF on relative paths.
    let dir = tempfile::tempdir_in(".").unwrap();
    let rel = PathBuf::from(".").join(dir.path().file_name().unwrap()).join("a/b");
    assert!(rel.is_relative());
    run(move || async move {
        let config = StorageConfig::new(&rel);
        let log = open(&rel, &config).await;
        log.append(ShardId(0), &records(0, 0, 1, 10), 0, AckMode::Durable).await.unwrap();
        check_shard(&log, ShardId(0), 1, 10).await;
    });
}

/// Regression (hardening #1): a read below the dense index scans the log from a sparse
/// entry; when its byte budget stopped it inside one segment it went on in the next one and
/// skipped every batch in between. Four interleaved shards, each with far more batches than
/// the dense index holds, over many small segments; every shard is read densely from offset
/// 0 with a small budget, before and after a reopen.
#[test]
fn every_shard_reads_densely_from_zero_across_many_segment_rolls() {
    const SHARDS4: [ShardId; 4] = [ShardId(0), ShardId(1), ShardId(2), ShardId(3)];
    const VALUE: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log_dir = path.join("log");
        let open4 =
            || StreamLog::open("t/ns/s", &log_dir, &SHARDS4, &config, RetentionConfig::default());
        let log = open4().await.expect("log opens").0;
        let per_shard = felix_storage::index::INDEX_RECENT_MAX as u64 + 2500;
        // Batches of 1 to 5 records: a budget stop on a large batch must not let a smaller
        // one further on (in the next segment) slip in.
        let size = |shard: ShardId, i: u64| 1 + ((i * 7 + u64::from(shard.0)) % 5) as usize;
        let mut next = [0u64; 4];
        let mut pending = Vec::new();
        for i in 0..per_shard {
            for shard in SHARDS4 {
                let l = log.clone();
                let n = size(shard, i);
                let base = next[shard.0 as usize];
                next[shard.0 as usize] += n as u64;
                pending.push(glommio::spawn_local(async move {
                    let records = records(shard.0, base, n, VALUE);
                    let out = l.append(shard, &records, i, AckMode::Written).await.unwrap();
                    assert_eq!(out.base_offset, Offset(base));
                }));
            }
            if pending.len() >= 64 {
                for p in pending.drain(..) {
                    p.await;
                }
            }
        }
        for p in pending.drain(..) {
            p.await;
        }
        assert!(log.segment_count() >= 5, "only {} segments", log.segment_count());
        let read_all = |log: StreamLog| async move {
            for shard in SHARDS4 {
                let end = next[shard.0 as usize];
                let mut at = 0u64;
                while at < end {
                    let batches = log.read(shard, Offset(at), 16 << 10).await.expect("read");
                    assert!(!batches.is_empty(), "{shard} has nothing at {at}");
                    for b in batches {
                        assert_eq!(b.base_offset, Offset(at), "{shard}: offsets jump");
                        assert_eq!(b.records, records(shard.0, at, b.records.len(), VALUE));
                        at += b.records.len() as u64;
                    }
                }
                assert_eq!(at, end);
            }
            log
        };
        let log = read_all(log).await;
        log.clone().close().await.unwrap();
        drop(log);
        let (log, report) = open4().await.expect("log reopens");
        assert_eq!(report.batches, per_shard * 4);
        read_all(log).await;
    });
}

/// A crash between creating a file and writing its first block leaves it empty. glommio
/// probes polled-I/O support (once per device and thread) by reading the start of the first
/// file it opens for direct I/O; were that file one of these, the read would succeed without
/// reaching the device, and on a device without polling every later read and write of the
/// thread would fail with EOPNOTSUPP. Each reopen runs on a fresh executor thread, so the
/// empty file is the first one it opens.
#[test]
fn empty_files_left_by_a_crash_do_not_break_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let mut next = [0u64; 3];
    let config = small_config(&path);
    {
        let (path, config) = (path.clone(), config.clone());
        next = run(move || async move {
            let log = open(&path, &config).await;
            for round in 0..40u64 {
                for (i, shard) in SHARDS.iter().enumerate() {
                    let recs = records(shard.0, next[i], 32, 4000);
                    log.append(*shard, &recs, round, AckMode::Durable).await.unwrap();
                    next[i] += 32;
                }
            }
            log.close().await.unwrap();
            next
        });
    }
    let log_dir = path.join("log");
    let segments = std::fs::read_dir(&log_dir).unwrap().count();
    assert!(segments > 3, "the log rolled segments ({segments} files)");
    // Each file a crash can leave empty, first in the order recovery opens them: a marker
    // rewrite's temporary file, then the marker file itself.
    // A probe file (see the storage driver) that a crashed process left behind (a pid above
    // the kernel's largest), and one of a live process (pid 1), which is left alone.
    std::fs::write(log_dir.join(".io-probe.4294967.0"), [0u8; 4096]).unwrap();
    std::fs::write(log_dir.join(".io-probe.1.0"), [0u8; 4096]).unwrap();
    for name in ["truncations.tmp", "truncations"] {
        std::fs::File::create(log_dir.join(name)).unwrap();
        let (path, config) = (path.clone(), config.clone());
        run(move || async move {
            let log = open(&path, &config).await;
            for (i, shard) in SHARDS.iter().enumerate() {
                check_shard(&log, *shard, next[i], 4000).await;
            }
            let out =
                log.append(ShardId(0), &records(0, next[0], 1, 4000), 99, AckMode::Durable).await;
            assert_eq!(out.unwrap().base_offset, Offset(next[0]), "appends work too");
            log.close().await.unwrap();
        });
        next[0] += 1;
        let probes: Vec<_> = std::fs::read_dir(&log_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".io-probe"))
            .collect();
        assert_eq!(probes, [".io-probe.1.0"], "the gone process's probe file is removed");
    }
}

/// `submit` fixes a batch's offsets when it returns: batches submitted one after another are
/// stored in that order, read back whole across segment rolls and a reopen, whether their
/// `Appending`s are awaited newest first or dropped; a refused batch takes no offset.
#[test]
fn submitted_batches_are_stored_in_submit_order_however_they_are_awaited() {
    const BATCHES: u64 = 300;
    const PER_BATCH: usize = 8;
    const VALUE: usize = 4000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log = open(&path, &config).await;
        let shard = SHARDS[1];
        let mut pending = Vec::new();
        for i in 0..BATCHES {
            let base = i * PER_BATCH as u64;
            let batch = records(shard.0, base, PER_BATCH, VALUE);
            let mode = if i % 3 == 0 { AckMode::Durable } else { AckMode::Written };
            let appending = log.submit(shard, &batch, 1, mode, Default::default()).unwrap();
            assert_eq!(appending.outcome().base_offset, Offset(base), "offset fixed at submit");
            // Every fifth one is dropped unawaited: it is written all the same.
            if i % 5 != 4 {
                pending.push((base, appending));
            }
            if i == 100 {
                let refused = log.submit(shard, &[], 1, AckMode::Written, Default::default());
                assert!(matches!(refused, Err(StorageError::EmptyBatch)), "empty batch refused");
            }
        }
        while let Some((base, appending)) = pending.pop() {
            let out = appending.done().await.expect("append completes");
            assert_eq!((out.base_offset, out.record_count), (Offset(base), PER_BATCH as u32));
        }
        log.flush().await.unwrap();
        let end = BATCHES * PER_BATCH as u64;
        check_shard(&log, shard, end, VALUE).await;
        assert!(log.segment_count() >= 3, "small segments rolled: {}", log.segment_count());
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        check_shard(&log, shard, end, VALUE).await;
    });
}
