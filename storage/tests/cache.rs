//! The core's read cache (`storage/src/cache.rs`): readers of a log that interleaves many
//! shards share one read of each block; the cache stays within its capacity; a block read
//! while the segment was shorter is read again; every record still reads back right.

mod common;

use common::{read_all, records, run, small_config};
use felix_proto::{AckMode, Offset, ShardId};
use felix_storage::{RetentionConfig, StorageConfig, StreamLog, READ_CACHE_BLOCK_BYTES};

async fn open(dir: &std::path::Path, config: &StorageConfig, shards: &[ShardId]) -> StreamLog {
    StreamLog::open("t/ns/s", &dir.join("log"), shards, config, RetentionConfig::default())
        .await
        .expect("log opens")
        .0
}

fn shards(n: u32) -> Vec<ShardId> {
    (0..n).map(ShardId).collect()
}

/// `rounds` rounds of one one-record batch per shard (value `len` bytes), 64 appends in
/// flight: the log interleaves the shards batch by batch.
async fn append_rounds(log: &StreamLog, shards: &[ShardId], rounds: u64, len: usize) {
    let mut pending = Vec::new();
    for r in 0..rounds {
        for s in shards {
            let (l, s) = (log.clone(), *s);
            pending.push(glommio::spawn_local(async move {
                l.append(s, &records(s.0, r, 1, len), r, AckMode::Written).await.unwrap()
            }));
            if pending.len() >= 64 {
                for p in pending.drain(..) {
                    p.await;
                }
            }
        }
    }
    for p in pending.drain(..) {
        p.await;
    }
}

/// Read every shard from offset 0, one after the other, checking every record; returns the
/// bytes the executor read from files meanwhile.
async fn read_back(log: &StreamLog, shards: &[ShardId], rounds: u64, len: usize) -> u64 {
    let before = glommio::executor().io_stats().all_rings().file_reads().1;
    for s in shards {
        let batches = read_all(log, *s).await;
        assert_eq!(batches.len() as u64, rounds, "{s}");
        for (i, b) in batches.iter().enumerate() {
            assert_eq!(b.base_offset, Offset(i as u64));
            assert_eq!(b.records, records(s.0, i as u64, 1, len), "{s} at {i}");
        }
    }
    glommio::executor().io_stats().all_rings().file_reads().1 - before
}

/// The same rounds appended to a log with the default cache (under `dir/cached`) and to one
/// without (`dir/plain`), then read back: both logs and the bytes each read.
async fn read_with_and_without_cache(
    dir: &std::path::Path,
    shards: &[ShardId],
    rounds: u64,
    len: usize,
) -> (StreamLog, StreamLog, u64, u64) {
    let mut config = small_config(&dir.join("cached"));
    let cached = open(&dir.join("cached"), &config, shards).await;
    append_rounds(&cached, shards, rounds, len).await;
    config.read_cache_bytes = 0;
    let plain = open(&dir.join("plain"), &config, shards).await;
    append_rounds(&plain, shards, rounds, len).await;
    let with_cache = read_back(&cached, shards, rounds, len).await;
    let without = read_back(&plain, shards, rounds, len).await;
    (cached, plain, with_cache, without)
}

#[test]
fn readers_of_interleaved_shards_share_one_read_of_each_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let shards = shards(12);
        // 12 shards x 300 batches of ~2 KiB: ~8 MiB over a few small segments, in the dense
        // index, each shard's batches ~24 KiB apart (one read would span the others').
        let (rounds, len) = (300, 2000);
        let (cached, plain, with_cache, without) =
            read_with_and_without_cache(&path, &shards, rounds, len).await;
        assert!(cached.segment_count() >= 2, "no roll");
        let stats = cached.read_cache_stats();
        // The log fits in the cache: each block is read once, by whichever shard came first.
        let log_bytes = rounds * shards.len() as u64 * (len as u64 + 100);
        assert!(
            stats.misses <= log_bytes / READ_CACHE_BLOCK_BYTES + 2 * cached.segment_count() as u64,
            "{stats:?}"
        );
        assert!(stats.hits > 10 * stats.misses, "{stats:?}");
        // Readers walk forward: the block after the one being read is read ahead.
        assert!(stats.read_aheads * 2 > stats.misses, "{stats:?}");
        assert!(
            with_cache * 4 < without,
            "read {with_cache} bytes with the cache, {without} without"
        );
        assert_eq!(plain.read_cache_stats().misses + plain.read_cache_stats().hits, 0);
    });
}

#[test]
fn scans_below_the_dense_index_share_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        // Two shards, each past its dense index: their oldest batches are found by scanning.
        let shards = shards(2);
        let (rounds, len) = (felix_storage::index::INDEX_RECENT_MAX as u64 + 400, 300);
        let (cached, _, with_cache, without) =
            read_with_and_without_cache(&path, &shards, rounds, len).await;
        assert!(
            with_cache * 3 < without * 2,
            "read {with_cache} bytes with the cache, {without} without"
        );
        assert!(cached.read_cache_stats().hits > 0);
    });
}

#[test]
fn concurrent_readers_of_one_block_wait_for_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let shards = shards(2);
        let log = open(&path, &small_config(&path), &shards).await;
        // ~3 MiB: whole blocks, which the cache keeps (not the partial one at the end).
        let (rounds, len) = (1000, 1500);
        append_rounds(&log, &shards, rounds, len).await;
        let (a, b) = futures_lite::future::zip(
            log.read(ShardId(0), Offset(0), 1 << 20),
            log.read(ShardId(1), Offset(0), 1 << 20),
        )
        .await;
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a.len() > 100 && b.len() > 100, "{} {}", a.len(), b.len());
        assert_eq!(b[99].records, records(1, 99, 1, len));
        let stats = log.read_cache_stats();
        // Both started in block 0 at once: one read it, the other waited for that read; no
        // block was read twice.
        assert!(stats.waits >= 1, "{stats:?}");
        let blocks = log.stats().bytes_written / READ_CACHE_BLOCK_BYTES + 1;
        assert!(stats.misses <= blocks, "{stats:?}, {blocks} blocks written");
    });
}

#[test]
fn the_cache_keeps_within_its_capacity_and_reads_at_the_tail_see_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let shards = shards(4);
        let mut config = small_config(&path);
        config.read_cache_bytes = 2 * READ_CACHE_BLOCK_BYTES;
        let log = open(&path, &config, &shards).await;
        let (rounds, len) = (1500, 1500);
        append_rounds(&log, &shards, rounds, len).await;
        read_back(&log, &shards, rounds, len).await;
        let stats = log.read_cache_stats();
        assert!(stats.bytes <= 2 * READ_CACHE_BLOCK_BYTES, "{stats:?}");
        assert!(stats.evictions > 0, "{stats:?}");

        // The segment being written ends inside a block, which the cache does not keep: the
        // batches appended after a read there are read, not missed.
        let more = rounds + 20;
        for r in rounds..more {
            for s in &shards {
                log.append(*s, &records(s.0, r, 1, len), r, AckMode::Written).await.unwrap();
            }
            for s in &shards {
                let batches = log.read(*s, Offset(rounds), 1 << 20).await.unwrap();
                assert_eq!(batches.len() as u64, r + 1 - rounds, "{s}");
                for (i, b) in batches.iter().enumerate() {
                    assert_eq!(b.records, records(s.0, rounds + i as u64, 1, len));
                }
            }
        }
        read_back(&log, &shards, more, len).await;
        assert!(log.read_cache_stats().bytes <= 2 * READ_CACHE_BLOCK_BYTES);
    });
}

#[test]
fn a_cache_smaller_than_a_block_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StorageConfig::new(dir.path());
    config.read_cache_bytes = READ_CACHE_BLOCK_BYTES - 1;
    let e = config.validate().unwrap_err();
    assert!(e.to_string().contains("read_cache_bytes"), "{e}");
    config.read_cache_bytes = 0;
    config.validate().unwrap();
}
