//! Disk space: a log that was never written holds one block, a small one little more, and a
//! segment's space is prepared in steps of at most `SEGMENT_GROW_BYTES` as writes arrive
//! (not `segment_bytes_max` at creation), while recovery still sees exactly the written data.
//! Both ways of preparing it: blocks reserved (the file holds just the data) and zeros
//! written ahead (the file runs at most a write and two steps past the data).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{records, run};
use felix_proto::{AckMode, CoreId, Offset, ShardId};
use felix_storage::{
    CoreStore, Preallocate, RetentionConfig, StorageConfig, StreamLog, SEGMENT_GROW_BYTES,
    SEGMENT_GROW_MIN_BYTES, WRITE_BYTES_MAX,
};

const SHARDS: [ShardId; 2] = [ShardId(0), ShardId(1)];
/// Slack for the file system's own metadata blocks of a file (extent tree, directory).
const FS_SLACK_BYTES: u64 = 64 << 10;

/// Bytes allocated on disk (st_blocks) and the sum of file sizes of every file under `dir`.
fn usage(dir: &Path) -> (u64, u64) {
    let mut allocated = 0;
    let mut sizes = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        if meta.is_dir() {
            let (a, s) = usage(&entry.path());
            allocated += a;
            sizes += s;
        } else {
            allocated += meta.blocks() * 512;
            sizes += meta.len();
        }
    }
    (allocated, sizes)
}

async fn open(dir: &Path, config: &StorageConfig) -> StreamLog {
    StreamLog::open("t/ns/s", dir, &SHARDS, config, RetentionConfig::default()).await.unwrap().0
}

/// How far past the data a log's files may reach: nothing when blocks are reserved, the zeros
/// of `Preallocate::Zero` (two steps beyond the largest next write) otherwise.
fn zeros_max(mode: Preallocate, step: u64, write: u64) -> u64 {
    match mode {
        Preallocate::Reserve => 0,
        Preallocate::Zero => write + 2 * step,
    }
}

#[test]
fn idle_logs_hold_one_block_and_small_logs_little_more_reserved() {
    idle_logs_hold_one_block_and_small_logs_little_more(Preallocate::Reserve);
}

#[test]
fn idle_logs_hold_one_block_and_small_logs_little_more_zeroed() {
    idle_logs_hold_one_block_and_small_logs_little_more(Preallocate::Zero);
}

fn idle_logs_hold_one_block_and_small_logs_little_more(mode: Preallocate) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        config.preallocate = mode;
        assert_eq!(config.segment_bytes_max, 256 << 20, "the default this test is about");
        let store = CoreStore::open(config, CoreId(0)).await.unwrap();
        let mut logs = Vec::new();
        for i in 0..20 {
            logs.push(store.open_stream(&format!("t/ns/s{i}"), &SHARDS, None).await.unwrap().0);
        }
        let (allocated, sizes) = usage(store.dir());
        // Twenty 4 KiB header blocks; before, each log reserved a whole 256 MiB segment.
        assert_eq!(sizes, 20 * 4096);
        assert!(allocated <= 20 * (4096 + FS_SLACK_BYTES), "{allocated} bytes allocated");
        // One small record each: a 4 KiB write and the smallest step prepared past it
        // (zeroed: two, after the 4 KiB the next write could take).
        for log in &logs {
            log.append(ShardId(1), &records(1, 0, 1, 100), 1, AckMode::Durable).await.unwrap();
        }
        for log in logs {
            let stats = log.stats();
            log.close().await.unwrap();
            assert_eq!(stats.bytes_written, 4096, "one write");
        }
        let (allocated, sizes) = usage(store.dir());
        let zeros = zeros_max(mode, SEGMENT_GROW_MIN_BYTES, 4096);
        match mode {
            Preallocate::Reserve => assert_eq!(sizes, 20 * 8192),
            // The fill started with the write: two steps past its end.
            Preallocate::Zero => {
                assert_eq!(sizes, 20 * (8192 + 2 * SEGMENT_GROW_MIN_BYTES), "zeroed ahead")
            }
        }
        let per_log = 8192 + zeros + SEGMENT_GROW_MIN_BYTES + FS_SLACK_BYTES;
        assert!(allocated <= 20 * per_log, "{allocated} bytes allocated for 20 small logs");
    });
}

#[test]
fn segments_grow_in_steps_and_recovery_sees_only_written_data_reserved() {
    segments_grow_in_steps_and_recovery_sees_only_written_data(Preallocate::Reserve);
}

#[test]
fn segments_grow_in_steps_and_recovery_sees_only_written_data_zeroed() {
    segments_grow_in_steps_and_recovery_sees_only_written_data(Preallocate::Zero);
}

fn segments_grow_in_steps_and_recovery_sees_only_written_data(mode: Preallocate) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        config.preallocate = mode;
        let zeros = zeros_max(mode, SEGMENT_GROW_BYTES, WRITE_BYTES_MAX as u64);
        let log_dir = path.join("log");
        let log = open(&log_dir, &config).await;
        let mut next = [0u64; 2];
        // About 10 MiB in 100 KiB records, both shards, some acks durable.
        for round in 0..104u64 {
            let shard = (round % 2) as u32;
            let ack = if round % 4 == 0 { AckMode::Durable } else { AckMode::Written };
            let batch = records(shard, next[shard as usize], 1, 100_000);
            let out = log.append(ShardId(shard), &batch, 1, ack).await.unwrap();
            assert_eq!(out.base_offset, Offset(next[shard as usize]));
            next[shard as usize] += 1;
            if round % 26 == 25 {
                // At every point the space runs at most one step (reserved) or a write and
                // two steps (zeroed) ahead of the data.
                let (allocated, sizes) = usage(&log_dir);
                let stored = log.stored_bytes();
                assert!(stored <= sizes && sizes <= stored + zeros, "{sizes} for {stored}");
                if mode == Preallocate::Reserve {
                    assert_eq!(sizes, stored);
                }
                assert!(
                    allocated <= sizes + SEGMENT_GROW_BYTES + FS_SLACK_BYTES,
                    "{allocated} bytes allocated for {sizes} bytes of data"
                );
            }
        }
        let zeroed = log.stats().zero_fill_bytes;
        let stored = log.stored_bytes();
        log.clone().close().await.unwrap();
        drop(log);
        assert!(stored > 10_000_000, "{stored}");
        let sizes = usage(&log_dir).1;
        match mode {
            Preallocate::Reserve => assert_eq!((sizes, zeroed), (stored, 0)),
            // Zeros ran ahead of the data and are on disk past it.
            Preallocate::Zero => assert!(sizes > stored && zeroed >= sizes - stored),
        }
        // Reopen: the data (not the zeros) is the log, reads are dense, appends go on and
        // grow again.
        let log = open(&log_dir, &config).await;
        assert_eq!(log.stored_bytes(), stored);
        for (i, shard) in SHARDS.iter().enumerate() {
            assert_eq!(log.next_offset(*shard).unwrap(), Offset(next[i]));
            let mut at = 0;
            while at < next[i] {
                let got = log.read(*shard, Offset(at), 1 << 20).await.unwrap();
                assert!(!got.is_empty(), "{shard} missing {at}");
                for b in got {
                    assert_eq!(b.records, records(shard.0, b.base_offset.0, 1, 100_000));
                    at = b.base_offset.0 + 1;
                }
            }
        }
        for _ in 0..60 {
            let batch = records(0, next[0], 1, 100_000);
            let out = log.append(ShardId(0), &batch, 1, AckMode::Durable).await.unwrap();
            assert_eq!(out.base_offset, Offset(next[0]));
            next[0] += 1;
        }
        let (allocated, sizes) = usage(&log_dir);
        let stored = log.stored_bytes();
        assert!(stored <= sizes && sizes <= stored + zeros, "{sizes} for {stored} after reopen");
        assert!(
            allocated <= sizes + SEGMENT_GROW_BYTES + FS_SLACK_BYTES,
            "{allocated} bytes allocated for {sizes} bytes of data after reopen"
        );
    });
}
