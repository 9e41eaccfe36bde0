//! Fault injection: torn tails, bit flips before the tail (refuse / repair), a
//! half-created segment, retention by size and age and below offsets, and ENOSPC on a small file system (also
//! for tagged batches and their retries).

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use common::{records, run, small_config, small_fs};
use felix_proto::{AckMode, CoreId, Offset, ProducerId, ProducerTag, ShardId};
use felix_storage::{
    CoreStore, Preallocate, RetentionConfig, StorageConfig, StorageError, StreamLog,
};

const SHARDS: [ShardId; 2] = [ShardId(0), ShardId(1)];

async fn open(
    dir: &Path,
    config: &StorageConfig,
) -> felix_storage::Result<(StreamLog, felix_storage::RecoveryReport)> {
    StreamLog::open("t/ns/s", &dir.join("log"), &SHARDS, config, RetentionConfig::default()).await
}

/// Append `n` durable batches of `per` records of `len` bytes to `shard`, offsets from `next`.
async fn fill(log: &StreamLog, shard: u32, next: &mut u64, n: usize, per: usize, len: usize) {
    for _ in 0..n {
        let out = log
            .append(ShardId(shard), &records(shard, *next, per, len), 1, AckMode::Durable)
            .await
            .unwrap();
        assert_eq!(out.base_offset, Offset(*next));
        *next += per as u64;
    }
}

/// Every record of `shard` in `[from, to)` is present, intact and dense.
async fn check(log: &StreamLog, shard: u32, from: u64, to: u64, len: usize) {
    let mut at = from;
    while at < to {
        let bs = log.read(ShardId(shard), Offset(at), 1 << 20).await.unwrap();
        assert!(!bs.is_empty(), "shard {shard} missing offset {at}");
        for b in bs {
            let skip = (at - b.base_offset.0) as usize;
            let want = records(shard, b.base_offset.0, b.records.len(), len);
            assert_eq!(b.records[skip..], want[skip..]);
            at = b.base_offset.0 + b.records.len() as u64;
        }
    }
    assert!(at >= to);
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

/// The end of the last 4 KiB block of `path` holding a non-zero byte: where its data ends
/// (the zeros written ahead of the writes follow it).
fn data_end(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let blocks = bytes.chunks(4096).rposition(|b| b.iter().any(|&x| x != 0));
    blocks.map_or(0, |i| (i as u64 + 1) * 4096)
}

fn flip_bit(path: &Path, position: u64) {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(position)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x10;
    f.seek(SeekFrom::Start(position)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn torn_tails_are_truncated_reported_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let (log, _) = open(&path, &config).await.unwrap();
        let mut next = 0;
        fill(&log, 0, &mut next, 20, 3, 200).await;
        log.clone().close().await.unwrap();
        drop(log);
        let seg = segments(&path).pop().unwrap();
        // A torn batch: the first 100 bytes of a real batch, then nothing.
        let mut head = vec![0u8; 100];
        let mut f = std::fs::File::open(&seg).unwrap();
        f.seek(SeekFrom::Start(4096)).unwrap();
        f.read_exact(&mut head).unwrap();
        let size = std::fs::metadata(&seg).unwrap().len();
        append_bytes(&seg, &head);
        let (log, report) = open(&path, &config).await.unwrap();
        assert_eq!(report.torn_bytes_dropped, 100);
        assert_eq!(report.torn_at, Some((seg.clone(), size)));
        assert_eq!(log.stats().torn_bytes_dropped, 100);
        check(&log, 0, 0, next, 200).await;
        fill(&log, 0, &mut next, 5, 3, 200).await;
        log.clone().close().await.unwrap();
        drop(log);
        // Garbage (non-zero, no magic) is a torn tail too; a second reopen is clean.
        append_bytes(&seg, &[0xAB; 777]);
        let (_, report) = open(&path, &config).await.unwrap();
        assert_eq!(report.torn_bytes_dropped, 777);
        let (log, report) = open(&path, &config).await.unwrap();
        assert_eq!(report.torn_bytes_dropped, 0);
        check(&log, 0, 0, next, 200).await;
    });
}

#[test]
fn a_bit_flip_before_the_tail_refuses_to_open_unless_repair_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        let (log, _) = open(&path, &config).await.unwrap();
        let (mut n0, mut n1) = (0, 0);
        fill(&log, 0, &mut n0, 10, 2, 1000).await;
        // More than the torn-tail window (8 MiB in flight) of valid data after the damage.
        fill(&log, 1, &mut n1, 160, 8, 8000).await;
        log.clone().close().await.unwrap();
        drop(log);
        let seg = segments(&path).pop().unwrap();
        flip_bit(&seg, 4096 + 60);
        match open(&path, &config).await {
            Err(StorageError::Corrupt { path: p, position, .. }) => {
                assert_eq!(p, seg);
                assert_eq!(position, 4096);
            }
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("opened a corrupt log"),
        }
        config.repair = true;
        let (log, report) = open(&path, &config).await.unwrap();
        let repaired = report.repaired.expect("repair reported");
        assert_eq!(repaired.position, 4096);
        assert!(repaired.bytes_dropped > 8 << 20);
        assert_eq!(log.stats().repaired_bytes_dropped, repaired.bytes_dropped);
        assert_eq!(log.next_offset(ShardId(0)).unwrap(), Offset(0));
        let mut next = 0;
        fill(&log, 0, &mut next, 2, 2, 1000).await;
        check(&log, 0, 0, next, 1000).await;
    });
}

#[test]
fn a_bit_flip_in_the_last_write_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let (log, _) = open(&path, &config).await.unwrap();
        let mut next = 0;
        fill(&log, 0, &mut next, 10, 1, 100).await;
        log.clone().close().await.unwrap();
        drop(log);
        let seg = segments(&path).pop().unwrap();
        let end = data_end(&seg);
        // The last batch starts at the last aligned write: flip a byte inside it.
        flip_bit(&seg, end - 4096 + 70);
        let (log, report) = open(&path, &config).await.unwrap();
        assert!(report.torn_bytes_dropped > 0);
        assert_eq!(log.next_offset(ShardId(0)).unwrap(), Offset(9));
        check(&log, 0, 0, 9, 100).await;
    });
}

#[test]
fn a_half_created_segment_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let (log, _) = open(&path, &config).await.unwrap();
        let mut next = 0;
        fill(&log, 1, &mut next, 3, 1, 100).await;
        log.clone().close().await.unwrap();
        drop(log);
        let half = path.join("log").join(format!("{:020}.log", 1u64 << 40));
        std::fs::write(&half, [0u8; 512]).unwrap();
        let (log, report) = open(&path, &config).await.unwrap();
        assert_eq!(report.torn_at, Some((half.clone(), 0)));
        assert!(!half.exists());
        check(&log, 1, 0, next, 100).await;
    });
}

#[test]
fn retention_by_size_and_age_keeps_offsets_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let retention = RetentionConfig { bytes_max: Some(10 << 20), age_ms_max: Some(50_000) };
        let log_dir = path.join("log");
        let open_r = || StreamLog::open("t/ns/s", &log_dir, &SHARDS, &config, retention);
        let (log, _) = open_r().await.unwrap();
        let (mut n0, mut n1) = (0u64, 0u64);
        for i in 0..120u64 {
            let ts = if i < 60 { 1_000 } else { 100_000 };
            log.append(ShardId(0), &records(0, n0, 4, 30_000), ts, AckMode::Written).await.unwrap();
            n0 += 4;
            if i % 10 == 0 {
                log.append(ShardId(1), &records(1, n1, 1, 100), ts, AckMode::Written)
                    .await
                    .unwrap();
                n1 += 1;
            }
        }
        log.flush().await.unwrap();
        let before = log.segment_count();
        assert!(before >= 3, "{before} segments");
        // Age: nothing is older than 50 s at now = 40 s; size alone trims to ~10 MiB.
        let out = log.enforce_retention(40_000).await.unwrap();
        assert!(out.segments_deleted >= 1);
        assert!(log.stored_bytes() <= 10 << 20, "{} bytes left", log.stored_bytes());
        let start0 = log.start_offset(ShardId(0)).unwrap();
        assert!(start0.0 > 0);
        match log.read(ShardId(0), Offset(0), 100).await {
            Err(StorageError::OffsetBeforeStart { start, .. }) => assert_eq!(start, start0),
            other => panic!("expected OffsetBeforeStart, got {other:?}"),
        }
        check(&log, 0, start0.0, n0, 30_000).await;
        // Age: at now = 200 s every segment older than 150 s (ts 100 s is not) goes.
        log.enforce_retention(120_000).await.unwrap();
        assert!(log.stats().segments_deleted as usize >= before - log.segment_count());
        let start0 = log.start_offset(ShardId(0)).unwrap();
        let start1 = log.start_offset(ShardId(1)).unwrap();
        log.clone().close().await.unwrap();
        drop(log);
        let (log, _) = open_r().await.unwrap();
        assert_eq!(log.start_offset(ShardId(0)).unwrap(), start0);
        assert_eq!(log.start_offset(ShardId(1)).unwrap(), start1);
        assert_eq!(log.next_offset(ShardId(0)).unwrap(), Offset(n0));
        assert_eq!(log.next_offset(ShardId(1)).unwrap(), Offset(n1));
        check(&log, 0, start0.0, n0, 30_000).await;
        // Offsets are never reused after retention.
        let out =
            log.append(ShardId(1), &records(1, n1, 1, 100), 1, AckMode::Durable).await.unwrap();
        assert_eq!(out.base_offset, Offset(n1));
    });
}

#[test]
fn delete_below_drops_only_segments_wholly_below_every_shards_keep_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let (log, _) = open(&path, &config).await.unwrap();
        let (mut n0, mut n1) = (0u64, 0u64);
        for i in 0..120u64 {
            fill(&log, 0, &mut n0, 1, 4, 30_000).await;
            if i % 10 == 0 {
                fill(&log, 1, &mut n1, 1, 1, 100).await;
            }
        }
        let before = log.segment_count();
        assert!(before >= 4, "{before} segments");
        // A shard not named keeps everything: nothing goes.
        let out = log.delete_below(&[(ShardId(0), Offset(n0))]).await.unwrap();
        assert_eq!((out.segments_deleted, log.segment_count()), (0, before));
        // Below the middle of shard 0 (and all of shard 1): the segments before the one
        // holding offset n0 / 2 go, and not that one.
        let keep0 = n0 / 2;
        let keep = [(ShardId(0), Offset(keep0)), (ShardId(1), Offset(n1))];
        let out = log.delete_below(&keep).await.unwrap();
        assert!(out.segments_deleted >= 1, "{out:?}");
        let start0 = log.start_offset(ShardId(0)).unwrap();
        assert!(start0.0 > 0 && start0.0 <= keep0, "start {start0:?}, keep {keep0}");
        check(&log, 0, keep0, n0, 30_000).await;
        match log.read(ShardId(0), Offset(0), 100).await {
            Err(StorageError::OffsetBeforeStart { start, .. }) => assert_eq!(start, start0),
            other => panic!("expected OffsetBeforeStart, got {other:?}"),
        }
        // Everything below the end: all but the active segment, which is never deleted.
        let all = [(ShardId(0), Offset(n0)), (ShardId(1), Offset(n1))];
        log.delete_below(&all).await.unwrap();
        assert_eq!(log.segment_count(), 1);
        // Reopened, the log starts where the deletions left it and goes on at its end.
        let start0 = log.start_offset(ShardId(0)).unwrap();
        log.clone().close().await.unwrap();
        drop(log);
        let (log, _) = open(&path, &config).await.unwrap();
        assert_eq!(log.start_offset(ShardId(0)).unwrap(), start0);
        assert_eq!(log.next_offset(ShardId(0)).unwrap(), Offset(n0));
        check(&log, 0, start0.0, n0, 30_000).await;
        fill(&log, 0, &mut n0, 1, 4, 30_000).await;
    });
}

#[test]
fn a_log_naming_more_shards_than_a_log_holds_is_refused_with_file_and_position() {
    use felix_storage::format::{
        batch_slot, BATCH_MAGIC, SEGMENT_HEADER_BYTES, SHARDS_PER_LOG_MAX,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let shards: Vec<ShardId> = (0..SHARDS_PER_LOG_MAX as u32).map(ShardId).collect();
        let log_dir = path.join("log");
        let open_all =
            || StreamLog::open("t/ns/s", &log_dir, &shards, &config, RetentionConfig::default());
        let (log, _) = open_all().await.unwrap();
        for s in &shards {
            log.append(*s, &records(s.0, 0, 1, 10), 1, AckMode::Durable).await.unwrap();
        }
        // Shard 0's second batch is the last in the file.
        log.append(ShardId(0), &records(0, 1, 1, 10), 1, AckMode::Durable).await.unwrap();
        log.clone().close().await.unwrap();
        drop(log);
        // Rewrite that batch as the first batch of one shard more (a CRC-valid batch no
        // broker writes), so the file names SHARDS_PER_LOG_MAX + 1 shards.
        let file = segments(&path).pop().unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let (mut at, mut last) = (SEGMENT_HEADER_BYTES as usize, None);
        while at + 16 <= bytes.len() && u32_at(&bytes, at) == BATCH_MAGIC {
            last = Some(at);
            at += batch_slot(u64::from(u32_at(&bytes, at + 12))) as usize;
        }
        let last = last.expect("batches in the segment");
        let len = u32_at(&bytes, last + 12) as usize;
        let batch = &mut bytes[last..last + len];
        batch[16..20].copy_from_slice(&(SHARDS_PER_LOG_MAX as u32).to_le_bytes());
        batch[24..32].copy_from_slice(&0u64.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&batch[0..8]), &batch[12..]);
        batch[8..12].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&file, &bytes).unwrap();
        match open_all().await {
            Err(StorageError::Corrupt { path: p, position, reason }) => {
                assert_eq!(p, file);
                assert_eq!(position, last as u64);
                assert!(reason.contains("shard"), "{reason}");
            }
            Err(e) => panic!("expected Corrupt naming the file, got {e}"),
            Ok(_) => panic!("a log of {} shards opened", SHARDS_PER_LOG_MAX + 1),
        }
    });
}

#[test]
fn background_retention_runs_in_a_low_share_queue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let store = CoreStore::open(small_config(&path), CoreId(3)).await.unwrap();
        assert!(store.dir().ends_with("core-3"));
        let bad = store.open_stream("a//b", &SHARDS, None).await;
        assert!(matches!(bad, Err(StorageError::InvalidStreamName { .. })));
        let retention = RetentionConfig { bytes_max: None, age_ms_max: Some(1_000) };
        let (log, _) =
            store.open_stream("tenant/ns/events", &SHARDS, Some(retention)).await.unwrap();
        assert!(store.dir().join("tenant%2Fns%2Fevents").is_dir());
        let mut next = 0;
        fill(&log, 0, &mut next, 40, 4, 60_000).await;
        assert!(log.segment_count() >= 3);
        store.start_retention(std::time::Duration::from_millis(5)).unwrap();
        // Timestamps are from 1970: the task deletes all but the active segment.
        for _ in 0..2000 {
            if log.segment_count() == 1 {
                break;
            }
            glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(log.segment_count(), 1, "background retention did not run");
    });
}

#[test]
fn enospc_is_a_typed_error_and_nothing_acked_is_lost() {
    enospc_loses_nothing_acked(Preallocate::Reserve);
}

/// The same with zeros written ahead of the writes: fills fail too, failed writes truncate
/// under a fill that may still be running, and nothing acknowledged is zeroed.
#[test]
fn enospc_is_a_typed_error_and_nothing_acked_is_lost_with_zeros_ahead() {
    enospc_loses_nothing_acked(Preallocate::Zero);
}

fn enospc_loses_nothing_acked(space: Preallocate) {
    let work = tempfile::tempdir().unwrap();
    let Some((guard, kind)) = small_fs(work.path()) else {
        println!("SKIPPED: cannot make a small file system here (needs root, mkfs.ext4 + loop, or tmpfs)");
        return;
    };
    println!("ENOSPC test on {kind}, {space}");
    let mnt = guard.0.clone();
    run(move || async move {
        let mut config = small_config(&mnt);
        config.preallocate = space;
        let retention = RetentionConfig { bytes_max: Some(9 << 20), age_ms_max: None };
        let log_dir = mnt.join("log");
        let open_r = || StreamLog::open("t/ns/s", &log_dir, &SHARDS, &config, retention);
        let (log, _) = open_r().await.unwrap();
        // 16 concurrent durable appenders (several writes in flight) until the disk is full.
        let tasks: Vec<_> = (0..16u32)
            .map(|t| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    let shard = t % 2;
                    let mut acked = Vec::new();
                    loop {
                        let base = log.next_offset_assigned(ShardId(shard));
                        let batch = records(shard, base, 8, 16_000);
                        match log.append(ShardId(shard), &batch, 1, AckMode::Durable).await {
                            Ok(out) => {
                                assert_eq!(out.base_offset, Offset(base));
                                acked.push((shard, base));
                            }
                            Err(e) => return (acked, e),
                        }
                    }
                })
            })
            .collect();
        let mut acked = Vec::new();
        for t in tasks {
            let (a, e) = t.await;
            assert!(matches!(e, StorageError::NoSpace { .. }), "expected NoSpace, got {e:?}");
            acked.extend(a);
        }
        assert!(!acked.is_empty());
        assert!(log.stats().no_space_errors >= 1);
        // Still consistent and readable: dense offsets, every acked batch intact.
        for shard in 0..2 {
            let start = log.start_offset(ShardId(shard)).unwrap().0;
            let end = log.next_offset(ShardId(shard)).unwrap().0;
            check(&log, shard, start, end, 16_000).await;
            for (_, base) in acked.iter().filter(|(s, _)| *s == shard) {
                assert!(*base >= start && base + 8 <= end, "acked {shard}:{base} lost");
            }
        }
        let mut next = log.next_offset(ShardId(0)).unwrap().0;
        assert_eq!(log.next_offset_assigned(ShardId(0)), next, "failed offsets not handed back");
        // Free space with retention, then appending works again with dense offsets.
        let out = log.enforce_retention(0).await.unwrap();
        assert!(out.segments_deleted >= 1);
        let mut ok_again = false;
        for _ in 0..10 {
            if let Ok(out) =
                log.append(ShardId(0), &records(0, next, 8, 16_000), 1, AckMode::Durable).await
            {
                assert_eq!(out.base_offset, Offset(next));
                next += 8;
                ok_again = true;
                break;
            }
        }
        assert!(ok_again, "no append succeeded after retention freed space");
        log.clone().close().await.unwrap();
        drop(log);
        let (log, _) = open_r().await.unwrap();
        let start = log.start_offset(ShardId(0)).unwrap().0;
        assert_eq!(log.next_offset(ShardId(0)).unwrap(), Offset(next));
        check(&log, 0, start, next, 16_000).await;
    });
    drop(guard);
}

/// A tagged batch whose write fails with ENOSPC fails its queued retry too, and is forgotten
/// by the producer table: once space is freed its retry is stored as new at the offsets then
/// free, while retries of the acknowledged batches are still duplicates.
#[test]
fn enospc_fails_a_tagged_batch_and_its_retries_and_the_table_forgets_it() {
    let work = tempfile::tempdir().unwrap();
    let Some((guard, kind)) = small_fs(work.path()) else {
        println!("SKIPPED: cannot make a small file system here (needs root, mkfs.ext4 + loop, or tmpfs)");
        return;
    };
    println!("tagged ENOSPC test on {kind}");
    let mnt = guard.0.clone();
    run(move || async move {
        let config = small_config(&mnt);
        let retention = RetentionConfig { bytes_max: Some(9 << 20), age_ms_max: None };
        let log_dir = mnt.join("log");
        let (log, _) =
            StreamLog::open("t/ns/s", &log_dir, &SHARDS, &config, retention).await.unwrap();
        // Producer t appends seq 0, 1, ... to shard t % 2, each batch offered twice at once
        // (the original and a retry queued behind it), until the disk is full.
        let tasks: Vec<_> = (0..8u32)
            .map(|t| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    let shard = ShardId(t % 2);
                    let mut acked = Vec::new();
                    for seq in 0u32.. {
                        let tag = Some(ProducerTag { producer: ProducerId(t.into()), seq });
                        let base = log.next_offset_assigned(shard);
                        let batch = records(shard.0, base, 8, 16_000);
                        let (a, b) = futures_lite::future::zip(
                            log.append_tagged(shard, &batch, 1, AckMode::Durable, tag),
                            log.append_tagged(shard, &batch, 1, AckMode::Written, tag),
                        )
                        .await;
                        match (a, b) {
                            (Ok(a), Ok(b)) => {
                                assert_eq!((a.base_offset, a.duplicate), (Offset(base), false));
                                assert_eq!((b.base_offset, b.duplicate), (Offset(base), true));
                                acked.push(a);
                            }
                            (Err(a), Err(b)) => {
                                assert!(matches!(a, StorageError::NoSpace { .. }), "{a:?}");
                                assert!(matches!(b, StorageError::NoSpace { .. }), "{b:?}");
                                return (t, acked, seq);
                            }
                            other => panic!("original and retry answered apart: {other:?}"),
                        }
                    }
                    unreachable!("the disk fills up")
                })
            })
            .collect();
        let mut producers = Vec::new();
        for t in tasks {
            producers.push(t.await);
        }
        assert!(log.enforce_retention(0).await.unwrap().segments_deleted >= 1);
        for (t, acked, failed_seq) in producers {
            let shard = ShardId(t % 2);
            let tag = |seq| Some(ProducerTag { producer: ProducerId(t.into()), seq });
            if let Some(last) = acked.last() {
                let seq = failed_seq - 1;
                let batch = records(shard.0, last.base_offset.0, 8, 16_000);
                let out = log.append_tagged(shard, &batch, 1, AckMode::Durable, tag(seq)).await;
                assert_eq!(out.unwrap().base_offset, last.base_offset, "producer {t}");
            }
            // The failed batch is not remembered: its retry is stored now, as new.
            let mut stored = false;
            for _ in 0..10 {
                let base = log.next_offset_assigned(shard);
                let batch = records(shard.0, base, 8, 16_000);
                let tag = tag(failed_seq);
                if let Ok(out) = log.append_tagged(shard, &batch, 1, AckMode::Durable, tag).await {
                    assert_eq!((out.base_offset, out.duplicate), (Offset(base), false));
                    stored = true;
                    break;
                }
            }
            assert!(stored, "producer {t}: the retry of its failed batch was not stored");
        }
        for shard in 0..2 {
            let start = log.start_offset(ShardId(shard)).unwrap().0;
            let end = log.next_offset(ShardId(shard)).unwrap().0;
            check(&log, shard, start, end, 16_000).await;
        }
        log.close().await.unwrap();
    });
    drop(guard);
}

/// Power-loss simulation (in the spirit of redb's crash backend): after a flush, more
/// batches are written but not flushed; then a random subset of the unflushed 4 KiB blocks
/// is zeroed or filled with garbage, as a device that lost part of its volatile cache
/// would leave them (with `Preallocate::Zero`, the zeros past the data too). Every durably
/// acknowledged record must survive, offsets stay dense.
#[test]
fn losing_random_unflushed_blocks_never_loses_durable_records() {
    use rand::{Rng, SeedableRng};
    let seed: u64 =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64;
    println!("power-loss simulation seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for trial in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let written = rng.gen_range(1..40usize);
        let p2 = path.clone();
        // Both ways of preparing space: blocks reserved, or zeros written ahead of the data.
        let space = if trial % 2 == 0 { Preallocate::Reserve } else { Preallocate::Zero };
        let (durable_next, durable_end) = run(move || async move {
            let mut config = StorageConfig::new(&p2);
            config.preallocate = space;
            let (log, _) = open(&p2, &config).await.unwrap();
            let mut next = 0;
            fill(&log, 0, &mut next, 20, 3, 700).await;
            let durable_end = log.stored_bytes();
            for _ in 0..written {
                log.append(ShardId(0), &records(0, next, 3, 700), 1, AckMode::Written)
                    .await
                    .unwrap();
                next += 3;
            }
            (next - 3 * written as u64, durable_end)
        });
        let seg = segments(&path).pop().unwrap();
        let size = std::fs::metadata(&seg).unwrap().len();
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&seg).unwrap();
        let mut block = durable_end;
        while block < size {
            match rng.gen_range(0..3) {
                0 => {}
                1 => {
                    f.seek(SeekFrom::Start(block)).unwrap();
                    f.write_all(&[0u8; 4096]).unwrap();
                }
                _ => {
                    let junk: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
                    f.seek(SeekFrom::Start(block)).unwrap();
                    f.write_all(&junk).unwrap();
                }
            }
            block += 4096;
        }
        f.sync_all().unwrap();
        drop(f);
        run(move || async move {
            let mut config = StorageConfig::new(&path);
            config.preallocate = space;
            let (log, report) = open(&path, &config)
                .await
                .unwrap_or_else(|e| panic!("seed {seed} trial {trial}: reopen failed: {e}"));
            let next = log.next_offset(ShardId(0)).unwrap().0;
            assert!(next >= durable_next, "seed {seed} trial {trial}: durable records lost");
            check(&log, 0, 0, next, 700).await;
            assert!(report.repaired.is_none());
        });
    }
}

/// A segment header block (CRC set) at log position `base` starting each `(shard, offset)`.
fn header_block(base: u64, starts: &[(u32, u64)]) -> Vec<u8> {
    use felix_storage::format::{SegmentHeader, SEGMENT_HEADER_BYTES};
    let header = SegmentHeader {
        base_position: base,
        created_ms: 0,
        next_offsets: starts.iter().map(|(s, o)| (ShardId(*s), Offset(*o))).collect(),
    };
    let mut block = vec![0u8; SEGMENT_HEADER_BYTES as usize];
    header.encode(&mut block);
    block
}

/// One CRC-valid batch of shard 0 at `base` holding one record of `len` bytes, padded to its
/// slot.
fn batch_block(base: u64, len: usize) -> Vec<u8> {
    use felix_storage::format::{batch_encoded_len, batch_slot, encode_batch};
    let records = [felix_proto::Record::unkeyed(vec![b'v'; len])];
    let encoded = batch_encoded_len(&records, None, None);
    let mut out = vec![0u8; batch_slot(encoded as u64) as usize];
    encode_batch(&mut out[..encoded], ShardId(0), Offset(base), 1, None, None, &records);
    out
}

/// Opens the log of `files` (name, bytes); the refusal's file and reason.
fn open_files(files: Vec<(String, Vec<u8>)>) -> (PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    std::fs::create_dir_all(path.join("log")).unwrap();
    for (name, bytes) in &files {
        std::fs::write(path.join("log").join(name), bytes).unwrap();
    }
    run(move || async move {
        let shards = [ShardId(0)];
        let config = small_config(&path);
        let log_dir = path.join("log");
        match StreamLog::open("t/ns/s", &log_dir, &shards, &config, RetentionConfig::default())
            .await
        {
            Err(StorageError::Corrupt { path: p, position, reason }) => {
                assert_eq!(position, 0, "{reason}");
                (p.strip_prefix(&log_dir).unwrap().to_owned(), reason)
            }
            Err(e) => panic!("expected Corrupt naming the file, got {e}"),
            Ok((log, _)) => {
                let next = log.next_offset(ShardId(0)).unwrap();
                panic!("the log opened, shard 0 at {next}")
            }
        }
    })
}

/// Found by fuzzing: CRC-valid headers no broker writes, whose positions or offsets leave no
/// room to grow, made appends and recovery overflow (a panic, or in release builds an ack at
/// an offset no read returns). They are refused, naming the file.
#[test]
fn a_segment_header_past_the_largest_position_or_offset_is_refused() {
    use felix_storage::format::{OFFSET_MAX, POSITION_MAX};
    let name = |base: u64| format!("{base:020}.log");
    for base in [u64::MAX - 4095, POSITION_MAX - 4095 + 1] {
        let (file, reason) = open_files(vec![(name(base), header_block(base, &[(0, 0)]))]);
        assert_eq!(file, PathBuf::from(name(base)));
        assert!(reason.contains("largest log position"), "{reason}");
    }
    for next in [u64::MAX, OFFSET_MAX + 1] {
        let (file, reason) = open_files(vec![(name(0), header_block(0, &[(0, next)]))]);
        assert_eq!(file, PathBuf::from(name(0)));
        assert!(reason.contains("largest offset"), "{reason}");
    }
}

/// Found by fuzzing: a segment whose base lies inside the previous segment's batches (every
/// CRC valid, names matching headers) opened, and reads of the shard then looked in the wrong
/// file and underflowed. It is refused, naming the later file.
#[test]
fn a_segment_starting_inside_the_previous_one_is_refused() {
    // 0.log holds offsets 0 and 1 at log positions 4096 and 4160 (the second is 6 KiB), so
    // its batches end past 8192; 4096.log claims to start at 4096.
    let mut first = header_block(0, &[(0, 0)]);
    first.extend(batch_block(0, 1));
    first.extend(batch_block(1, 6000));
    first.resize(first.len().next_multiple_of(4096), 0);
    let mut second = header_block(4096, &[(0, 2)]);
    second.extend(batch_block(2, 1));
    second.resize(second.len().next_multiple_of(4096), 0);
    let files = vec![(format!("{:020}.log", 0), first), (format!("{:020}.log", 4096), second)];
    let (file, reason) = open_files(files);
    assert_eq!(file, PathBuf::from(format!("{:020}.log", 4096)));
    assert!(reason.contains("inside the previous segment"), "{reason}");
}

/// Found by fuzzing: looking for a valid batch past the in-flight window after damage, recovery
/// read each plausible header's whole claimed batch (up to `BATCH_BYTES_LIMIT`) on its own,
/// so a region of such headers cost up to 4 MiB of reads per 4 KiB block (a 256 MiB segment:
/// about 250 GB). Each chunk is now read once with the longest batch that may start in it.
#[test]
fn a_search_past_damage_reads_each_byte_a_bounded_number_of_times() {
    use felix_storage::format::{align_up, BATCH_MAGIC};
    use felix_storage::{BATCH_BYTES_LIMIT, WRITE_IN_FLIGHT_BYTES_MAX};
    const BLOCKS: usize = 64;
    let mut segment = header_block(0, &[(0, 0)]);
    // The damage: a bad magic where the first batch would be.
    segment.resize(4096 + 8, 0);
    segment[4096..4100].copy_from_slice(b"JUNK");
    // Past the window, blocks that each claim a batch of the largest size (never valid).
    let window = align_up(4096 + WRITE_IN_FLIGHT_BYTES_MAX as u64) as usize;
    segment.resize(window + BLOCKS * 4096 + BATCH_BYTES_LIMIT, 0);
    for i in 0..BLOCKS {
        let at = window + i * 4096;
        segment[at..at + 4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
        segment[at + 4] = 1;
        segment[at + 12..at + 16].copy_from_slice(&(BATCH_BYTES_LIMIT as u32).to_le_bytes());
    }
    let size = segment.len() as u64;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    std::fs::create_dir_all(path.join("log")).unwrap();
    std::fs::write(path.join("log").join(format!("{:020}.log", 0)), &segment).unwrap();
    drop(segment);
    let read = run(move || async move {
        let config = small_config(&path);
        let before = glommio::executor().io_stats().all_rings().file_reads().1;
        // A torn tail: cut, the log opens empty.
        let (log, report) = open(&path, &config).await.unwrap();
        assert_eq!(log.next_offset(ShardId(0)).unwrap(), Offset(0));
        assert!(report.torn_at.is_some());
        glommio::executor().io_stats().all_rings().file_reads().1 - before
    });
    // Before: about BLOCKS x 4 MiB (256 MiB) for this 13 MiB file.
    assert!(read < 3 * size, "{read} bytes read for a {size}-byte segment");
}
