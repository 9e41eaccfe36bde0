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

/// Power-loss simulation (as in tests/faults.rs): after a truncation (durable when it
/// returns), more batches of the truncated shard and another one are written but not
/// flushed; then a random subset of the unflushed 4 KiB blocks is zeroed or filled with
/// garbage. The truncation must hold (no old record at or after its offset comes back), and
/// every record from before it and every durable one must survive, densely.
#[test]
fn losing_unflushed_blocks_after_a_truncation_keeps_it() {
    use std::io::{Seek, SeekFrom, Write};
    let seed: u64 = std::env::var("FELIX_TRUNCATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("power-loss simulation seed {seed} (FELIX_TRUNCATE_SEED={seed} to repeat)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for trial in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let written = rng.gen_range(1..30usize);
        let cut = rng.gen_range(0..60u64);
        let p2 = path.clone();
        let (model, durable_next, durable_end) = run(move || async move {
            let config = StorageConfig::new(&p2);
            let log = open(&p2, &config).await;
            let mut m = Model::new();
            for _ in 0..20 {
                m.append(&log, 0, 3, 700).await;
                m.append(&log, 1, 3, 700).await;
            }
            m.truncate(&log, 0, cut).await;
            // The truncation flushed everything before it.
            let durable_end = log.stored_bytes();
            let durable_next = [m.next(0), m.next(1)];
            for k in 0..written {
                m.append(&log, k % 2, 3, 700).await;
            }
            (m, durable_next, durable_end)
        });
        let seg = path.join("log").join(format!("{:020}.log", 0));
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
            let config = StorageConfig::new(&path);
            let log = open(&path, &config).await;
            for (i, shard) in SHARDS.iter().enumerate().take(2) {
                let next = log.next_offset(*shard).unwrap().0;
                assert!(
                    next >= durable_next[i] && next <= model.next(i),
                    "seed {seed} trial {trial}: {shard} ends at {next}, durable {}",
                    durable_next[i]
                );
                // What survived is a prefix of what was written, truncation included.
                check_shard(&log, *shard, &model.records[i][..next as usize], 1 << 20).await;
            }
        });
    }
}

/// Damage to durable data before a marker's position (here cut like a torn tail) leaves the
/// marker past the end of the log: opening refuses; with `repair` the marker moves to the
/// new end and the log works on.
#[test]
fn a_marker_past_a_repaired_end_is_refused_or_moved() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let p2 = path.clone();
    let mut m = run(move || async move {
        let log = open(&p2, &StorageConfig::new(&p2)).await;
        let mut m = Model::new();
        for _ in 0..20 {
            m.append(&log, 0, 3, 700).await;
            m.append(&log, 1, 3, 700).await;
        }
        m.truncate(&log, 0, 45).await;
        for _ in 0..5 {
            m.append(&log, 0, 3, 700).await;
        }
        log.close().await.unwrap();
        m
    });
    // One batch per 4 KiB write: the 11th batch (shard 0, offsets 15..18) is damaged.
    let seg = path.join("log").join(format!("{:020}.log", 0));
    let mut f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.seek(SeekFrom::Start(4096 * 11 + 200)).unwrap();
    f.write_all(b"damage").unwrap();
    f.sync_all().unwrap();
    drop(f);
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        let e = StreamLog::open(
            "t/ns/trunc",
            &path.join("log"),
            &SHARDS,
            &config,
            RetentionConfig::default(),
        )
        .await;
        assert!(matches!(e, Err(StorageError::Corrupt { .. })), "{:?}", e.map(|_| ()));
        config.repair = true;
        let log = open(&path, &config).await;
        for (i, shard) in SHARDS.iter().enumerate().take(2) {
            assert_eq!(log.next_offset(*shard).unwrap(), Offset(15));
            m.records[i].truncate(15);
            m.bases[i].retain(|b| *b < 15);
        }
        m.check(&log).await;
        m.append(&log, 0, 2, 700).await;
        m.append(&log, 1, 2, 700).await;
        log.close().await.unwrap();
        config.repair = false;
        let log = open(&path, &config).await;
        m.check(&log).await;
    });
}

/// Crash test: a child process appends durably and truncates shards (one task per shard, so
/// no append of a shard is in flight during its truncation) and is killed with SIGKILL at
/// random moments, also between a truncation and the appends after it. After each kill the
/// parent reopens the log and checks every shard densely: every durably acked record not
/// removed by a truncation is there with its contents, and no record a truncation removed
/// comes back (each truncation starts a new generation, written into the values, and every
/// record at or after a truncation's offset must be of that generation or a later one).
///
/// The child is this test binary re-executed with `FELIX_TRUNC_CRASH_CHILD=<dir>`.
/// `FELIX_CRASH_SEED` fixes the seed, `FELIX_CRASH_TRIALS` the number of kills (default 20).
mod crash {
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;

    const CHILD_ENV: &str = "FELIX_TRUNC_CRASH_CHILD";
    const CRASH_SHARDS: u32 = 4;
    const CHILD_LIFETIME_MAX: Duration = Duration::from_secs(30);
    /// Generations of one child: trial t uses t * GENERATIONS_PER_TRIAL and up.
    const GENERATIONS_PER_TRIAL: u64 = 1_000_000;

    fn shards() -> Vec<ShardId> {
        (0..CRASH_SHARDS).map(ShardId).collect()
    }

    /// The value of (shard, offset, generation): its length and bytes depend on all three.
    fn value(shard: u32, offset: u64, generation: u64) -> Bytes {
        let tag = format!("s{shard}-o{offset}-g{generation}|");
        // 0..28 KiB, so that the log rolls segments (4 MiB) every few trials.
        let len = tag.len() + (offset.wrapping_mul(7919) % (28 << 10)) as usize;
        Bytes::from(tag.bytes().cycle().take(len).collect::<Vec<u8>>())
    }

    /// The generation a stored value names, if it is a well-formed value of (shard, offset).
    fn generation_of(shard: u32, offset: u64, v: &[u8]) -> Option<u64> {
        let prefix = format!("s{shard}-o{offset}-g");
        let rest = v.strip_prefix(prefix.as_bytes())?;
        let end = rest.iter().position(|b| *b == b'|')?;
        let g: u64 = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
        (value(shard, offset, g) == v).then_some(g)
    }

    /// The child's body: per shard, append (durable) or truncate, printing
    /// `A shard base count generation` after a durable ack, `t shard offset generation`
    /// before a truncation and `T shard offset generation` after it returned.
    #[test]
    fn truncate_crash_child_process_entry() {
        let Ok(dir) = std::env::var(CHILD_ENV) else { return };
        let seed: u64 = std::env::var("FELIX_CRASH_CHILD_SEED").unwrap().parse().unwrap();
        let gen_base: u64 = std::env::var("FELIX_CRASH_CHILD_GEN").unwrap().parse().unwrap();
        run(move || async move {
            let dir = std::path::PathBuf::from(dir);
            let (log, _) = StreamLog::open(
                "crash/trunc/s",
                &dir,
                &shards(),
                &small_config(&dir),
                RetentionConfig::default(),
            )
            .await
            .expect("child opens the log");
            println!("ready");
            let deadline = std::time::Instant::now() + CHILD_LIFETIME_MAX;
            let tasks: Vec<_> = (0..CRASH_SHARDS)
                .map(|shard| {
                    let log = log.clone();
                    glommio::spawn_local(async move {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ u64::from(shard));
                        let mut generation = gen_base;
                        let say = |line: String| {
                            let mut o = std::io::stdout().lock();
                            writeln!(o, "{line}").unwrap();
                            o.flush().unwrap();
                        };
                        while std::time::Instant::now() < deadline {
                            let id = ShardId(shard);
                            let next = log.next_offset_assigned(id);
                            let start = log.start_offset(id).unwrap().0;
                            if next > start && rng.gen_range(0..8) == 0 {
                                let at = match rng.gen_range(0..4) {
                                    0 => next - 1,
                                    1 => start,
                                    _ => rng.gen_range(start..next),
                                };
                                generation += 1;
                                say(format!("t {shard} {at} {generation}"));
                                log.truncate_shard(id, Offset(at)).await.expect("truncate");
                                say(format!("T {shard} {at} {generation}"));
                                continue;
                            }
                            let n = rng.gen_range(1..8usize);
                            let records: Vec<Record> = (0..n)
                                .map(|i| Record::unkeyed(value(shard, next + i as u64, generation)))
                                .collect();
                            let out = log
                                .append(id, &records, 1, AckMode::Durable)
                                .await
                                .expect("append");
                            assert_eq!(out.base_offset.0, next);
                            say(format!("A {shard} {next} {n} {generation}"));
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
        });
    }

    /// What the parent knows of one shard.
    #[derive(Default, Clone)]
    struct Known {
        /// offset -> generation of every durably acked record not truncated since.
        acked: BTreeMap<u64, u64>,
        /// (offset, generation) of every truncation known to have happened.
        fences: Vec<(u64, u64)>,
        /// A truncation that started and was not seen to return.
        pending: Option<(u64, u64)>,
        truncations: u64,
    }

    impl Known {
        fn fence(&mut self, at: u64, generation: u64) {
            self.acked.split_off(&at);
            self.fences.push((at, generation));
            self.truncations += 1;
        }
    }

    #[test]
    fn kill_9_during_truncations_and_appends_recovers_exactly() {
        if std::env::var(CHILD_ENV).is_ok() {
            return;
        }
        let seed: u64 = std::env::var("FELIX_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        let trials: usize =
            std::env::var("FELIX_CRASH_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
        println!("truncation crash test seed {seed} (FELIX_CRASH_SEED={seed} to repeat), {trials} trials");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let log_dir = dir.path().join("log");
        let mut known: Vec<Known> = vec![Known::default(); CRASH_SHARDS as usize];
        let mut pending_resolved = 0u64;
        for trial in 0..trials {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "crash::truncate_crash_child_process_entry",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, &log_dir)
                .env("FELIX_CRASH_CHILD_SEED", rng.gen::<u64>().to_string())
                .env(
                    "FELIX_CRASH_CHILD_GEN",
                    ((trial as u64 + 1) * GENERATIONS_PER_TRIAL).to_string(),
                )
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
            let ready = rx.iter().any(|l| l.ends_with("ready"));
            assert!(ready, "seed {seed} trial {trial}: child never became ready");
            std::thread::sleep(Duration::from_millis(rng.gen_range(5..300)));
            child.kill().expect("SIGKILL child");
            child.wait().unwrap();
            reader.join().unwrap();
            for line in rx.try_iter() {
                let f: Vec<&str> = line.split(' ').collect();
                let n: Vec<u64> = f.iter().skip(1).filter_map(|p| p.parse().ok()).collect();
                match (f.first().copied(), n.as_slice()) {
                    (Some("A"), [s, base, count, g]) => {
                        for o in *base..base + count {
                            known[*s as usize].acked.insert(o, *g);
                        }
                    }
                    (Some("t"), [s, at, g]) => known[*s as usize].pending = Some((*at, *g)),
                    (Some("T"), [s, at, g]) => {
                        let k = &mut known[*s as usize];
                        assert_eq!(k.pending.take(), Some((*at, *g)), "seed {seed}: child output");
                        k.fence(*at, *g);
                    }
                    _ => {} // a line cut by the kill
                }
            }
            let dir2 = log_dir.clone();
            let snapshot = known.clone();
            let (nexts, report) = run(move || async move {
                let (log, report) = StreamLog::open(
                    "crash/trunc/s",
                    &dir2,
                    &shards(),
                    &small_config(&dir2),
                    RetentionConfig::default(),
                )
                .await
                .unwrap_or_else(|e| panic!("seed {seed} trial {trial}: reopen failed: {e}"));
                let mut nexts = Vec::new();
                for shard in 0..CRASH_SHARDS {
                    nexts.push(log.next_offset(ShardId(shard)).unwrap().0);
                }
                let mut seen = Vec::new();
                for shard in 0..CRASH_SHARDS {
                    let next = nexts[shard as usize];
                    let mut gens = Vec::new();
                    let mut at = 0;
                    while at < next {
                        let batches = log.read(ShardId(shard), Offset(at), 1 << 20).await.unwrap();
                        assert!(
                            !batches.is_empty(),
                            "seed {seed} trial {trial}: shard {shard} empty at {at}"
                        );
                        for b in batches {
                            assert_eq!(
                                b.base_offset.0, at,
                                "seed {seed}: offsets not dense in shard {shard}"
                            );
                            for r in &b.records {
                                let g = generation_of(shard, at, &r.value.to_bytes()).unwrap_or_else(|| {
                                    panic!("seed {seed} trial {trial}: shard {shard} offset {at}: bad value")
                                });
                                gens.push(g);
                                at += 1;
                            }
                        }
                    }
                    seen.push(gens);
                }
                drop(snapshot);
                ((nexts, seen, log.segment_count()), report)
            });
            let (nexts, seen, segments) = nexts;
            for shard in 0..CRASH_SHARDS as usize {
                let k = &mut known[shard];
                let next = nexts[shard];
                // A truncation cut short by the kill happened iff the shard ends at its offset
                // (its appends were all acked before it started, so otherwise the shard is longer).
                if let Some((at, g)) = k.pending.take() {
                    if next == at {
                        k.fence(at, g);
                        pending_resolved += 1;
                    } else {
                        assert!(
                            next > at,
                            "seed {seed} trial {trial}: shard {shard} ends at {next} < {at}"
                        );
                    }
                }
                for (o, g) in &k.acked {
                    assert!(
                        *o < next,
                        "seed {seed} trial {trial}: acked shard {shard} offset {o} lost (next {next}); recovery {report:?}"
                    );
                    assert_eq!(
                        seen[shard][*o as usize], *g,
                        "seed {seed} trial {trial}: shard {shard} offset {o} holds another generation"
                    );
                }
                for (o, g) in seen[shard].iter().enumerate() {
                    for (at, fence_g) in &k.fences {
                        assert!(
                            (o as u64) < *at || g >= fence_g,
                            "seed {seed} trial {trial}: shard {shard} offset {o} of generation {g} \
                             came back after the truncation at {at} (generation {fence_g})"
                        );
                    }
                }
            }
            println!(
                "trial {trial}: next offsets {nexts:?}, truncations {:?}, {segments} segments, torn bytes {}",
                known.iter().map(|k| k.truncations).collect::<Vec<_>>(),
                report.torn_bytes_dropped
            );
        }
        let truncations: u64 = known.iter().map(|k| k.truncations).sum();
        let acked: usize = known.iter().map(|k| k.acked.len()).sum();
        println!("{truncations} truncations ({pending_resolved} cut short by a kill), {acked} acked records kept");
        assert!(truncations > 0 && acked > 0, "seed {seed}: the child did too little");
    }
}
