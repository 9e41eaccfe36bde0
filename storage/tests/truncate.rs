//! Logical truncation of one shard of a shared stream log (`StreamLog::truncate_shard`):
//! reads, next offsets and appends after a truncation, other shards untouched, across
//! segment rolls, through the sparse index, with retention, and after a reopen.

mod common;

use bytes::Bytes;
use common::{run, small_config};
use felix_proto::{AckMode, Offset, Record, ShardId};
use felix_storage::{
    RetentionConfig, StorageConfig, StorageError, StreamLog, MARKER_BLOCK_BYTES, TRUNCATIONS_FILE,
};
use rand::{Rng, SeedableRng};

const SHARDS: [ShardId; 3] = [ShardId(0), ShardId(1), ShardId(7)];

/// What every shard should hold: the records by offset from the shard's first offset 0, and
/// the base offsets of the batches appended (to pick cuts inside batches).
struct Model {
    records: Vec<Vec<Record>>,
    bases: Vec<Vec<u64>>,
    generation: u64,
}

impl Model {
    fn new() -> Self {
        Self {
            records: vec![Vec::new(); SHARDS.len()],
            bases: vec![Vec::new(); SHARDS.len()],
            generation: 0,
        }
    }

    fn next(&self, i: usize) -> u64 {
        self.records[i].len() as u64
    }

    /// Append `n` records of `value_len` bytes to shard `i` and check the offset it gets.
    async fn append(&mut self, log: &StreamLog, i: usize, n: usize, value_len: usize) {
        let base = self.next(i);
        let recs = values(SHARDS[i].0, base, n, self.generation, value_len);
        let out = log.append(SHARDS[i], &recs, 7, AckMode::Written).await.expect("append");
        assert_eq!(out.base_offset, Offset(base), "{} append", SHARDS[i]);
        self.records[i].extend(recs);
        self.bases[i].push(base);
    }

    /// Truncate shard `i` at `at` in the log and in the model; later appends of it get new
    /// contents (another generation), so a record that comes back from before is visible.
    async fn truncate(&mut self, log: &StreamLog, i: usize, at: u64) {
        log.truncate_shard(SHARDS[i], Offset(at)).await.expect("truncate");
        self.records[i].truncate(at as usize);
        self.bases[i].retain(|b| *b < at);
        self.generation += 1;
        assert_eq!(log.next_offset(SHARDS[i]).unwrap(), Offset(at));
        assert_eq!(log.next_offset_assigned(SHARDS[i]), at);
    }

    /// An offset strictly inside the newest batch of shard `i` that has >= 2 records.
    fn inside_a_batch(&self, i: usize) -> u64 {
        let next = self.next(i);
        let ends = self.bases[i].iter().skip(1).copied().chain([next]);
        self.bases[i]
            .iter()
            .zip(ends)
            .filter(|(b, e)| e - *b >= 2)
            .map(|(b, _)| b + 1)
            .last()
            .expect("a batch of two records or more")
    }

    /// Read every shard densely from its first offset, with small and large reads.
    async fn check(&self, log: &StreamLog) {
        for (shard, records) in SHARDS.iter().zip(&self.records) {
            for max_bytes in [8 << 10, 1 << 20] {
                check_shard(log, *shard, records, max_bytes).await;
            }
        }
    }
}

/// Records whose contents name (shard, offset, generation).
fn values(shard: u32, base: u64, n: usize, generation: u64, value_len: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let tag = format!("s{shard}-o{}-g{generation}|", base + i as u64);
            Record::unkeyed(Bytes::from(
                tag.bytes().cycle().take(value_len.max(tag.len())).collect::<Vec<u8>>(),
            ))
        })
        .collect()
}

/// Read `shard` from its first stored offset to its end: batches are contiguous and every
/// record is the model's.
async fn check_shard(log: &StreamLog, shard: ShardId, model: &[Record], max_bytes: usize) {
    let next = model.len() as u64;
    assert_eq!(log.next_offset(shard).unwrap(), Offset(next), "{shard} next offset");
    let mut at = log.start_offset(shard).unwrap().0;
    while at < next {
        let batches = log.read(shard, Offset(at), max_bytes).await.expect("read");
        assert!(!batches.is_empty(), "{shard} has nothing at {at} (next {next})");
        for (k, b) in batches.iter().enumerate() {
            let base = b.base_offset.0;
            if k == 0 {
                assert!(base <= at, "{shard}: read at {at} starts at {base}");
            } else {
                assert_eq!(base, at, "{shard}: batches are contiguous");
            }
            let end = base + b.records.len() as u64;
            assert!(at < end && end <= next, "{shard}: batch {base}..{end} at {at}, next {next}");
            for o in at..end {
                assert_eq!(
                    b.records[(o - base) as usize],
                    model[o as usize],
                    "{shard} offset {o} (batch at {base})"
                );
            }
            at = end;
        }
    }
    assert!(log.read(shard, Offset(next), 1 << 20).await.unwrap().is_empty());
}

async fn open(path: &std::path::Path, config: &StorageConfig) -> StreamLog {
    StreamLog::open("t/ns/trunc", &path.join("log"), &SHARDS, config, RetentionConfig::default())
        .await
        .expect("log opens")
        .0
}

#[test]
fn truncation_across_segment_rolls_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log = open(&path, &config).await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let mut m = Model::new();
        while log.segment_count() < 3 {
            for i in 0..SHARDS.len() {
                m.append(&log, i, rng.gen_range(1..8), 1000).await;
            }
        }
        // Shard 1 in the first segment (10 % into it), inside a batch; shard 0 in the
        // active segment, inside its newest multi-record batch.
        let early = m.bases[1][m.bases[1].len() / 10] + 1;
        m.truncate(&log, 1, early).await;
        let late = m.inside_a_batch(0);
        m.truncate(&log, 0, late).await;
        m.check(&log).await;
        let segments = log.segment_count();
        while log.segment_count() < segments + 2 {
            for i in 0..SHARDS.len() {
                m.append(&log, i, rng.gen_range(1..8), 1000).await;
            }
        }
        m.check(&log).await;
        // Again, of the same shards, inside the data written since.
        let again = m.inside_a_batch(1);
        m.truncate(&log, 1, again).await;
        m.truncate(&log, 0, m.next(0) - 1).await;
        for i in 0..SHARDS.len() {
            m.append(&log, i, 3, 1000).await;
        }
        m.check(&log).await;
        log.clone().close().await.unwrap();
        drop(log);
        let (log, report) = StreamLog::open(
            "t/ns/trunc",
            &path.join("log"),
            &SHARDS,
            &config,
            RetentionConfig::default(),
        )
        .await
        .unwrap();
        assert_eq!(report.torn_bytes_dropped, 0);
        m.check(&log).await;
        // The reopened log appends where the truncations left off.
        for i in 0..SHARDS.len() {
            m.append(&log, i, 2, 100).await;
        }
        m.check(&log).await;
    });
}

#[test]
fn repeated_random_truncations_match_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let seed: u64 = std::env::var("FELIX_TRUNCATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed {seed} (FELIX_TRUNCATE_SEED={seed} to repeat)");
    run(move || async move {
        let config = small_config(&path);
        let mut log = open(&path, &config).await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut m = Model::new();
        for step in 0..60 {
            for _ in 0..rng.gen_range(0..40) {
                let i = rng.gen_range(0..SHARDS.len());
                m.append(&log, i, rng.gen_range(1..10), rng.gen_range(10..3000)).await;
            }
            let i = rng.gen_range(0..SHARDS.len());
            let at = rng.gen_range(0..=m.next(i));
            m.truncate(&log, i, at).await;
            if step % 10 == 9 {
                m.check(&log).await;
                log.clone().close().await.unwrap();
                drop(log);
                log = open(&path, &config).await;
                m.check(&log).await;
            }
        }
        // Truncating everything leaves an empty shard that starts again at 0.
        m.truncate(&log, 2, 0).await;
        m.append(&log, 2, 4, 10).await;
        m.check(&log).await;
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        m.check(&log).await;
    });
}

#[test]
fn truncation_below_the_dense_index_is_applied_by_scans() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let mut m = Model::new();
        let batches = felix_storage::index::INDEX_RECENT_MAX + 300;
        for k in 0..batches {
            m.append(&log, 0, 2, 20).await;
            if k % 50 == 0 {
                m.append(&log, 1, 1, 20).await;
            }
        }
        // Offset 301 lies in a batch that only the sparse index reaches: reads scan the log
        // and must skip the old records at and after it.
        m.truncate(&log, 0, 301).await;
        for _ in 0..20 {
            m.append(&log, 0, 3, 20).await;
        }
        m.check(&log).await;
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        m.check(&log).await;
    });
}

#[test]
fn retention_keeps_what_was_written_after_a_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let retention = RetentionConfig { bytes_max: Some(1), age_ms_max: None };
        let (log, _) =
            StreamLog::open("t/ns/trunc", &path.join("log"), &SHARDS, &config, retention)
                .await
                .unwrap();
        let mut m = Model::new();
        while log.segment_count() < 3 {
            for i in 0..SHARDS.len() {
                m.append(&log, i, 5, 1000).await;
            }
        }
        // Shard 1 goes back to an offset of the first segment; the records written after it
        // sit in the active segment, behind old records of shard 1 at higher offsets.
        let at = 7;
        m.truncate(&log, 1, at).await;
        for _ in 0..4 {
            m.append(&log, 1, 5, 1000).await;
        }
        let out = log.enforce_retention(0).await.unwrap();
        assert!(out.segments_deleted >= 2, "{out:?}");
        assert_eq!(log.start_offset(ShardId(1)).unwrap(), Offset(at));
        let e = log.read(ShardId(1), Offset(at - 1), 100).await;
        assert!(matches!(e, Err(StorageError::OffsetBeforeStart { .. })), "{e:?}");
        let e = log.truncate_shard(ShardId(1), Offset(at - 1)).await;
        assert!(matches!(e, Err(StorageError::TruncateOutOfRange { .. })), "{e:?}");
        m.check(&log).await;
        log.close().await.unwrap();
        let (log, _) =
            StreamLog::open("t/ns/trunc", &path.join("log"), &SHARDS, &config, retention)
                .await
                .unwrap();
        assert_eq!(log.start_offset(ShardId(1)).unwrap(), Offset(at));
        m.check(&log).await;
    });
}

#[test]
fn misuse_gets_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let mut m = Model::new();
        m.append(&log, 0, 5, 10).await;
        let e = log.truncate_shard(ShardId(0), Offset(6)).await;
        assert!(
            matches!(
                e,
                Err(StorageError::TruncateOutOfRange { requested: Offset(6), next: Offset(5), .. })
            ),
            "{e:?}"
        );
        let e = log.truncate_shard(ShardId(3), Offset(0)).await;
        assert!(matches!(e, Err(StorageError::UnknownShard { .. })), "{e:?}");
        // An append of the shard still queued: the truncation is refused.
        let queued = values(0, 5, 2, 0, 10);
        log.append(ShardId(0), &queued, 7, AckMode::None).await.unwrap();
        let e = log.truncate_shard(ShardId(0), Offset(2)).await;
        assert!(matches!(e, Err(StorageError::ShardBusy { .. })), "{e:?}");
        log.flush().await.unwrap();
        while log.next_offset(ShardId(0)).unwrap() != Offset(7) {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
        m.records[0].extend(queued);
        m.bases[0].push(5);
        // An append offered while the shard is being truncated is refused; other shards
        // append meanwhile.
        let (t, (a, b)) = futures_lite::future::zip(
            log.truncate_shard(ShardId(0), Offset(2)),
            futures_lite::future::zip(
                log.append(ShardId(0), &values(0, 2, 1, 9, 10), 7, AckMode::Written),
                log.append(ShardId(1), &values(1, 0, 1, 0, 10), 7, AckMode::Written),
            ),
        )
        .await;
        t.unwrap();
        assert!(matches!(a, Err(StorageError::ShardBusy { .. })), "{a:?}");
        b.unwrap();
        m.records[0].truncate(2);
        m.records[1].extend(values(1, 0, 1, 0, 10));
        // Truncating at the end does nothing.
        log.truncate_shard(ShardId(0), Offset(2)).await.unwrap();
        m.check(&log).await;
    });
}

#[test]
fn a_torn_marker_is_dropped_and_earlier_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let mut m = Model::new();
        for _ in 0..4 {
            m.append(&log, 2, 5, 10).await;
        }
        m.truncate(&log, 2, 12).await;
        m.append(&log, 2, 5, 10).await;
        log.close().await.unwrap();
        let file = path.join("log").join(TRUNCATIONS_FILE);
        assert_eq!(std::fs::metadata(&file).unwrap().len(), MARKER_BLOCK_BYTES);
        // A crash while a second marker was being written: half a block of it.
        let mut bytes = std::fs::read(&file).unwrap();
        let mut torn = bytes.clone();
        torn[16] = 9;
        bytes.extend_from_slice(&torn[..MARKER_BLOCK_BYTES as usize / 2]);
        std::fs::write(&file, &bytes).unwrap();
        let log = open(&path, &config).await;
        m.check(&log).await;
        assert_eq!(std::fs::metadata(&file).unwrap().len(), MARKER_BLOCK_BYTES);
        // A whole block with a bad CRC at the end: torn as well.
        log.close().await.unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        bytes.extend_from_slice(&torn);
        std::fs::write(&file, &bytes).unwrap();
        let log = open(&path, &config).await;
        m.check(&log).await;
        // Damage before the last block refuses to open.
        log.close().await.unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        let good = bytes.clone();
        bytes[20] ^= 1;
        bytes.extend_from_slice(&good);
        std::fs::write(&file, &bytes).unwrap();
        let e = StreamLog::open(
            "t/ns/trunc",
            &path.join("log"),
            &SHARDS,
            &config,
            RetentionConfig::default(),
        )
        .await;
        assert!(matches!(e, Err(StorageError::Corrupt { .. })), "{:?}", e.map(|_| ()));
    });
}

#[test]
fn a_truncation_at_a_segment_boundary_survives_the_roll_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log = open(&path, &config).await;
        let mut m = Model::new();
        // Four writes of ~1000 KiB fill the 4 MiB segment: the next write rolls.
        for _ in 0..4 {
            m.append(&log, 0, 10, 100 << 10).await;
        }
        assert_eq!(log.segment_count(), 1);
        // The marker's position is the end of the full segment, which becomes the base of the
        // next one, whose header already holds the truncated next offset.
        m.truncate(&log, 0, 15).await;
        m.append(&log, 0, 10, 100 << 10).await;
        m.append(&log, 1, 3, 10).await;
        assert_eq!(log.segment_count(), 2);
        m.check(&log).await;
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        m.check(&log).await;
    });
}

#[test]
fn the_marker_limit_is_enforced_and_freed_by_retention() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let retention = RetentionConfig { bytes_max: Some(1), age_ms_max: None };
        let open = |path: std::path::PathBuf, config: StorageConfig| async move {
            StreamLog::open("t/ns/trunc", &path.join("log"), &SHARDS, &config, retention)
                .await
                .unwrap()
                .0
        };
        let log = open(path.clone(), config.clone()).await;
        let mut m = Model::new();
        for _ in 0..felix_storage::TRUNCATION_MARKERS_MAX {
            m.append(&log, 1, 2, 10).await;
            m.truncate(&log, 1, m.next(1) - 1).await;
        }
        m.append(&log, 1, 2, 10).await;
        let e = log.truncate_shard(ShardId(1), Offset(0)).await;
        assert!(matches!(e, Err(StorageError::TooManyTruncations { .. })), "{e:?}");
        m.check(&log).await;
        // Once the segments holding the truncated records are deleted, a reopen drops their
        // markers and truncations work again.
        while log.segment_count() < 3 {
            m.append(&log, 0, 8, 10 << 10).await;
        }
        log.enforce_retention(0).await.unwrap();
        assert_eq!(log.segment_count(), 1);
        log.close().await.unwrap();
        let log = open(path.clone(), config.clone()).await;
        let file = path.join("log").join(TRUNCATIONS_FILE);
        assert!(!file.exists(), "no marker is left to keep");
        let at = m.next(0) - 3;
        m.truncate(&log, 0, at).await;
        assert_eq!(std::fs::metadata(&file).unwrap().len(), MARKER_BLOCK_BYTES);
        m.append(&log, 0, 2, 10).await;
        log.close().await.unwrap();
        let log = open(path.clone(), config.clone()).await;
        assert_eq!(log.next_offset(ShardId(0)).unwrap(), Offset(m.next(0)));
        check_shard(&log, ShardId(0), &m.records[0], 1 << 20).await;
    });
}
