//! Leader epochs and follower appends (`StreamLog::append_with`): epochs are stored in the
//! batches and read back, each shard's epoch index answers the replication model's questions
//! (`felix_replication::ReplicaLog`) before and after a reopen, regressions and misplaced
//! follower copies store nothing, truncations, retention and failed writes cut the index as
//! a reopen would build it, and the index stays within `EPOCH_CHANGES_PER_SHARD_MAX`,
//! answering older questions conservatively.

mod common;

use bytes::Bytes;
use common::{read_all, records, run, small_config, small_fs};
use felix_proto::{AckMode, Offset, ProducerId, ProducerTag, ShardId};
use felix_replication::{Batch, Epoch, ReplicaLog};
use felix_storage::{
    AppendOutcome, BatchMeta, RetentionConfig, StorageConfig, StorageError, StoredBatch, StreamLog,
    EPOCH_CHANGES_PER_SHARD_MAX,
};
use rand::{Rng, SeedableRng};

const SHARDS: [ShardId; 2] = [ShardId(0), ShardId(1)];
const S0: ShardId = ShardId(0);
const S1: ShardId = ShardId(1);

async fn open(path: &std::path::Path, config: &StorageConfig) -> StreamLog {
    StreamLog::open("t/ns/e", &path.join("log"), &SHARDS, config, RetentionConfig::default())
        .await
        .expect("log opens")
        .0
}

fn epoch(e: u64) -> BatchMeta {
    BatchMeta { epoch: Some(e), ..BatchMeta::default() }
}

fn tag(producer: u64, seq: u32) -> Option<ProducerTag> {
    Some(ProducerTag { producer: ProducerId(producer), seq })
}

/// Append `n` records of `len` bytes to `shard` with `meta`; returns the base offset.
async fn put(log: &StreamLog, shard: ShardId, n: usize, len: usize, meta: BatchMeta) -> u64 {
    let base = log.next_offset_assigned(shard);
    let out = log
        .append_with(shard, &records(shard.0, base, n, len), 7, AckMode::Written, meta)
        .await
        .unwrap_or_else(|e| panic!("append of {meta:?} at {base}: {e}"));
    assert_eq!((out.base_offset, out.duplicate), (Offset(base), false));
    base
}

/// Offer `n` records of `len` bytes, named for offset `base`, to shard 0 with `meta`.
async fn offer(
    log: &StreamLog,
    base: u64,
    n: usize,
    len: usize,
    ack: AckMode,
    meta: BatchMeta,
) -> felix_storage::Result<AppendOutcome> {
    log.append_with(S0, &records(0, base, n, len), 1, ack, meta).await
}

/// The replication model of what `shard` stores (epoch-less batches are epoch 0).
async fn model_of(log: &StreamLog, shard: ShardId) -> ReplicaLog {
    let batches = read_all(log, shard)
        .await
        .into_iter()
        .map(|b| Batch {
            epoch: Epoch(b.epoch.unwrap_or(0)),
            base: b.base_offset,
            records: b.records.len() as u32,
            producer: None,
            time_ms: 0,
            payload: Bytes::new(),
        })
        .collect();
    ReplicaLog::from_batches(batches).expect("stored batches are a valid replica log")
}

/// The three epoch queries of `shard` for every epoch up to one past its last.
fn answers(log: &StreamLog, shard: ShardId) -> Vec<(Option<u64>, Option<u64>, Offset)> {
    let last = log.last_epoch(shard).unwrap();
    (0..=last.unwrap_or(0) + 1)
        .map(|e| {
            (
                last,
                log.largest_epoch_at_most(shard, e).unwrap(),
                log.end_of_epoch(shard, e).unwrap(),
            )
        })
        .collect()
}

/// The queries of `shard` answer as `model` does.
fn assert_matches(log: &StreamLog, shard: ShardId, model: &ReplicaLog, context: &str) {
    let last = log.last_epoch(shard).unwrap();
    let want_last = (!model.batches().is_empty()).then_some(model.last_epoch().0);
    assert_eq!(last, want_last, "{context}: last_epoch of {shard}");
    for e in 0..=model.last_epoch().0 + 1 {
        assert_eq!(
            log.largest_epoch_at_most(shard, e).unwrap(),
            model.largest_epoch_at_most(Epoch(e)).map(|x| x.0),
            "{context}: largest_epoch_at_most({e}) of {shard}"
        );
        assert_eq!(
            log.end_of_epoch(shard, e).unwrap(),
            model.end_of_epoch(Epoch(e)),
            "{context}: end_of_epoch({e}) of {shard}"
        );
    }
}

#[test]
fn epochs_round_trip_through_reads_with_and_without_tags_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let metas = [
            BatchMeta::default(),
            epoch(0),
            BatchMeta { producer: tag(9, 0), ..BatchMeta::default() },
            BatchMeta { producer: tag(9, 1), epoch: Some(3), expected_base: None },
            epoch(3),
            epoch(u64::MAX - 1),
            BatchMeta { producer: tag(9, 2), epoch: Some(u64::MAX), expected_base: None },
        ];
        for (i, meta) in metas.iter().enumerate() {
            put(&log, S0, 1 + i % 3, 40, *meta).await;
            put(&log, S1, 2, 40, BatchMeta::default()).await;
        }
        let check = |batches: Vec<StoredBatch>| {
            assert_eq!(batches.len(), metas.len());
            for (b, meta) in batches.iter().zip(&metas) {
                assert_eq!((b.epoch, b.producer), (meta.epoch, meta.producer), "{b:?}");
                let want = records(0, b.base_offset.0, b.records.len(), 40);
                assert_eq!(b.records, want);
            }
        };
        check(read_all(&log, S0).await);
        assert!(read_all(&log, S1).await.iter().all(|b| b.epoch.is_none()));
        assert_eq!(log.last_epoch(S0).unwrap(), Some(u64::MAX));
        assert_eq!(log.last_epoch(S1).unwrap(), Some(0), "epoch-less batches are epoch 0");
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        check(read_all(&log, S0).await);
        assert_eq!(log.last_epoch(S0).unwrap(), Some(u64::MAX));
        log.close().await.unwrap();
    });
}

#[test]
fn random_histories_answer_as_the_replication_model_before_and_after_a_reopen() {
    for seed in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        run(move || async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let config = small_config(&path);
            let mut log = open(&path, &config).await;
            let mut model = ReplicaLog::default();
            let mut epoch_now = 0u64;
            for step in 0..300 {
                let context = format!("seed {seed} step {step}");
                if rng.gen_ratio(1, 25) && !model.batches().is_empty() {
                    // Truncate at a batch boundary (the model's rule), possibly an epoch's start.
                    let batches = model.batches();
                    let to = batches[rng.gen_range(0..batches.len())].base;
                    log.truncate_shard(S0, to).await.unwrap();
                    model.truncate(to).expect("the model truncates at a stored boundary");
                    // A new leader's epoch is above every epoch ever used.
                    epoch_now += 1;
                } else if rng.gen_ratio(1, 60) {
                    log.clone().close().await.unwrap();
                    drop(log);
                    log = open(&path, &config).await;
                    assert_matches(&log, S0, &model, &format!("{context}, reopened"));
                } else {
                    if rng.gen_ratio(1, 6) {
                        epoch_now += rng.gen_range(1..4);
                    }
                    // Before the first election, batches may carry epoch 0 or none.
                    let meta = if epoch_now == 0 && rng.gen() {
                        BatchMeta::default()
                    } else {
                        epoch(epoch_now)
                    };
                    let n = rng.gen_range(1..5);
                    let base = put(&log, S0, n, rng.gen_range(10..30_000), meta).await;
                    model
                        .append(Batch {
                            epoch: Epoch(epoch_now),
                            base: Offset(base),
                            records: n as u32,
                            producer: None,
                            time_ms: 0,
                            payload: Bytes::new(),
                        })
                        .unwrap();
                    if rng.gen_ratio(1, 3) {
                        put(&log, S1, 1, 100, BatchMeta::default()).await;
                    }
                }
                assert_matches(&log, S0, &model, &context);
            }
            log.clone().close().await.unwrap();
            drop(log);
            let log = open(&path, &config).await;
            assert_matches(&log, S0, &model, &format!("seed {seed}, final reopen"));
            assert_matches(&log, S0, &model_of(&log, S0).await, &format!("seed {seed}, stored"));
            log.close().await.unwrap();
        });
    }
}

#[test]
fn an_epoch_regression_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let log = open(&path, &StorageConfig::new(&path)).await;
        put(&log, S0, 2, 10, epoch(5)).await;
        let errors = log.stats().append_errors;
        let refused = offer(&log, 2, 1, 10, AckMode::Durable, epoch(4));
        match refused.await {
            Err(StorageError::EpochRegression { shard, epoch: 4, last: 5 }) => {
                assert_eq!(shard, S0)
            }
            other => panic!("expected EpochRegression, got {other:?}"),
        }
        assert_eq!(log.stats().append_errors, errors + 1);
        assert_eq!(log.next_offset_assigned(S0), 2, "no offset taken");
        // Other shards have their own epochs.
        put(&log, S1, 1, 10, epoch(1)).await;
        // The same epoch again, and a higher one, are fine; the check sees queued batches.
        put(&log, S0, 1, 10, epoch(5)).await;
        let none = offer(&log, 3, 1, 10, AckMode::None, epoch(8));
        assert_eq!(none.await.unwrap().base_offset, Offset(3));
        let queued = offer(&log, 4, 1, 10, AckMode::None, epoch(7));
        assert!(matches!(queued.await, Err(StorageError::EpochRegression { last: 8, .. })));
        // An epoch-less batch is allowed after stamped ones; it does not lower the bound.
        let plain = put(&log, S0, 1, 10, BatchMeta::default()).await;
        assert_eq!(plain, 4);
        let after = offer(&log, 5, 1, 10, AckMode::Written, epoch(7));
        assert!(matches!(after.await, Err(StorageError::EpochRegression { last: 8, .. })));
        // The queries count it as epoch 0 and vouch for nothing from it on.
        assert_eq!(log.last_epoch(S0).unwrap(), Some(0));
        assert_eq!(log.end_of_epoch(S0, 8).unwrap(), Offset(4));
        assert_eq!(log.largest_epoch_at_most(S0, 9).unwrap(), Some(8));
        put(&log, S0, 1, 10, epoch(9)).await;
        assert_eq!(log.end_of_epoch(S0, 9).unwrap(), Offset(4));
        assert_eq!(log.largest_epoch_at_most(S0, 9).unwrap(), Some(8));
        let stored: Vec<_> = read_all(&log, S0).await.iter().map(|b| b.epoch).collect();
        assert_eq!(stored, [Some(5), Some(5), Some(8), None, Some(9)]);
        log.close().await.unwrap();
        // Recovery builds the same answers.
        let log = open(&path, &StorageConfig::new(&path)).await;
        assert_eq!(log.last_epoch(S0).unwrap(), Some(9));
        assert_eq!(log.end_of_epoch(S0, 9).unwrap(), Offset(4));
        assert_eq!(log.end_of_epoch(S0, 5).unwrap(), Offset(3));
        let again = offer(&log, 6, 1, 10, AckMode::Written, epoch(8));
        assert!(matches!(again.await, Err(StorageError::EpochRegression { last: 9, .. })));
        log.close().await.unwrap();
    });
}

#[test]
fn a_follower_copy_at_the_wrong_offset_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let log = open(&path, &StorageConfig::new(&path)).await;
        put(&log, S0, 3, 10, epoch(1)).await;
        for expected in [0u64, 2, 4, u64::MAX] {
            let meta = BatchMeta { expected_base: Some(Offset(expected)), ..epoch(1) };
            match offer(&log, 3, 2, 10, AckMode::Written, meta).await {
                Err(StorageError::OffsetMismatch { shard, expected: e, next }) => {
                    assert_eq!((shard, e, next), (S0, Offset(expected), Offset(3)));
                }
                other => panic!("expected OffsetMismatch at {expected}, got {other:?}"),
            }
        }
        assert_eq!(log.next_offset_assigned(S0), 3);
        assert_eq!(read_all(&log, S0).await.len(), 1, "nothing stored");
        assert_eq!(log.last_epoch(S0).unwrap(), Some(1));
        // Where it belongs, also behind a queued batch.
        let meta = BatchMeta { expected_base: Some(Offset(3)), ..epoch(2) };
        let queued = offer(&log, 3, 2, 10, AckMode::None, meta);
        assert_eq!(queued.await.unwrap().base_offset, Offset(3));
        let meta = BatchMeta { expected_base: Some(Offset(5)), ..epoch(2) };
        assert_eq!(put(&log, S0, 1, 10, meta).await, 5);
        // The offset is checked first, then the epoch.
        let meta = BatchMeta { expected_base: Some(Offset(0)), ..epoch(1) };
        let both = offer(&log, 6, 1, 10, AckMode::Written, meta);
        assert!(matches!(both.await, Err(StorageError::OffsetMismatch { .. })));
        // A follower stores the leader's tagged batches as they come: a second copy of a
        // batch and a gap in the sequence numbers are the leader's decisions, not refused.
        let leader_batch = BatchMeta { producer: tag(4, 0), ..epoch(2) };
        assert_eq!(put(&log, S0, 1, 10, leader_batch).await, 6);
        let second_copy = BatchMeta { expected_base: Some(Offset(7)), ..leader_batch };
        assert_eq!(put(&log, S0, 1, 10, second_copy).await, 7);
        let gap = BatchMeta { producer: tag(4, 5), expected_base: Some(Offset(8)), ..epoch(2) };
        assert_eq!(put(&log, S0, 1, 10, gap).await, 8);
        // Without expected_base the table applies: seq 5 was recorded, 6 follows, 9 is a gap.
        let next = BatchMeta { producer: tag(4, 6), ..epoch(2) };
        assert_eq!(put(&log, S0, 1, 10, next).await, 9);
        let leader_gap = BatchMeta { producer: tag(4, 9), ..epoch(2) };
        let refused = offer(&log, 10, 1, 10, AckMode::Written, leader_gap);
        assert!(matches!(refused.await, Err(StorageError::OutOfOrderSequence { .. })));
        log.close().await.unwrap();
    });
}

#[test]
fn a_reopen_across_many_segment_rolls_rebuilds_the_epoch_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log = open(&path, &config).await;
        // 64 KiB records: about 64 batches per 4 MiB segment.
        for i in 0..300u64 {
            put(&log, S0, 1, 64 << 10, epoch(1 + i / 7)).await;
            if i % 3 == 0 {
                let meta = if i < 150 { BatchMeta::default() } else { epoch(i / 50) };
                put(&log, S1, 1, 1000, meta).await;
            }
        }
        assert!(log.segment_count() >= 4, "{} segments", log.segment_count());
        let before = [answers(&log, S0), answers(&log, S1)];
        assert_matches(&log, S0, &model_of(&log, S0).await, "written");
        assert_matches(&log, S1, &model_of(&log, S1).await, "written");
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        assert_eq!([answers(&log, S0), answers(&log, S1)], before);
        assert_eq!(log.last_epoch(S0).unwrap(), Some(1 + 299 / 7));
        assert_eq!(log.end_of_epoch(S0, 10).unwrap(), Offset(70));
        assert_eq!(log.end_of_epoch(S1, 0).unwrap(), Offset(50), "epoch-less until offset 50");
        log.close().await.unwrap();
    });
}

#[test]
fn retention_leaves_the_index_a_reopen_would_build() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let retention = RetentionConfig { bytes_max: Some(9 << 20), age_ms_max: None };
        let log_dir = path.join("log");
        let open_r = || StreamLog::open("t/ns/e", &log_dir, &SHARDS, &config, retention);
        let (log, _) = open_r().await.unwrap();
        // An epoch-less batch at offset 20 (in the first segment) lowers the epoch: the
        // queries vouch for nothing from there on, until retention deletes it.
        for i in 0..200u64 {
            let meta = if i == 20 { BatchMeta::default() } else { epoch(1 + i / 9) };
            put(&log, S0, 1, 64 << 10, meta).await;
            if i % 5 == 0 {
                put(&log, S1, 1, 100, BatchMeta::default()).await;
            }
        }
        assert_eq!(log.end_of_epoch(S0, 100).unwrap(), Offset(20));
        assert!(log.enforce_retention(0).await.unwrap().segments_deleted >= 1);
        let start = log.start_offset(S0).unwrap().0;
        assert!(start > 20, "the first segment is deleted (start {start})");
        assert_eq!(log.end_of_epoch(S0, 100).unwrap(), Offset(200));
        assert_eq!(log.end_of_epoch(S0, 0).unwrap(), Offset(start));
        let before = [answers(&log, S0), answers(&log, S1)];
        log.close().await.unwrap();
        let (log, _) = open_r().await.unwrap();
        assert_eq!(log.start_offset(S0).unwrap().0, start);
        assert_eq!([answers(&log, S0), answers(&log, S1)], before);
        log.close().await.unwrap();
    });
}

#[test]
fn truncation_inside_an_epoch_and_at_its_start_cuts_the_index_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log = open(&path, &config).await;
        // Epochs 1, 2, 3 hold offsets 0..10, 10..20, 20..30, in batches of 5.
        for e in 1..=3u64 {
            put(&log, S0, 5, 20, epoch(e)).await;
            put(&log, S1, 1, 20, epoch(e)).await;
            put(&log, S0, 5, 20, epoch(e)).await;
        }
        // Inside epoch 3 (and inside a batch): epoch 3 stays, ending at the cut.
        log.truncate_shard(S0, Offset(23)).await.unwrap();
        assert_eq!(log.last_epoch(S0).unwrap(), Some(3));
        assert_eq!(log.end_of_epoch(S0, 3).unwrap(), Offset(23));
        assert_eq!(log.end_of_epoch(S0, 2).unwrap(), Offset(20));
        // At epoch 3's start: epoch 2 is the last, and epoch 3 may come again (a follower
        // refetches it), as may epoch 2.
        log.truncate_shard(S0, Offset(20)).await.unwrap();
        let expect_cut = |log: &StreamLog| {
            assert_eq!(log.last_epoch(S0).unwrap(), Some(2));
            assert_eq!(log.largest_epoch_at_most(S0, 3).unwrap(), Some(2));
            assert_eq!(log.end_of_epoch(S0, 2).unwrap(), Offset(20));
            assert_eq!(log.end_of_epoch(S0, 1).unwrap(), Offset(10));
            assert_eq!(log.end_of_epoch(S0, 0).unwrap(), Offset(0));
            assert_eq!(log.last_epoch(S1).unwrap(), Some(3), "the other shard is untouched");
        };
        expect_cut(&log);
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        expect_cut(&log);
        put(&log, S0, 2, 20, epoch(2)).await;
        put(&log, S0, 2, 20, epoch(3)).await;
        put(&log, S0, 2, 20, epoch(6)).await;
        let model = model_of(&log, S0).await;
        assert_eq!(model.end(), Offset(26));
        assert_matches(&log, S0, &model, "appended after the cut");
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        assert_matches(&log, S0, &model, "reopened");
        assert_eq!(log.end_of_epoch(S0, 3).unwrap(), Offset(24));
        log.close().await.unwrap();
    });
}

#[test]
fn the_index_is_bounded_and_answers_older_questions_conservatively() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let extra = 10u64;
        let changes = EPOCH_CHANGES_PER_SHARD_MAX as u64 + extra;
        // Batch i (one record, offset i) has epoch i + 1: every batch is a change.
        for i in 0..changes {
            let r = records(0, i, 1, 8);
            let out = log.append_with(S0, &r, 1, AckMode::None, epoch(i + 1)).await.unwrap();
            assert_eq!(out.base_offset, Offset(i));
        }
        log.flush().await.unwrap();
        assert_eq!(log.stats().epoch_changes_dropped, extra);
        let check = |log: &StreamLog| {
            assert_eq!(log.last_epoch(S0).unwrap(), Some(changes));
            // Epochs 1..=10 were dropped: no claim about them, and a later epoch may start
            // anywhere from the shard's start.
            assert_eq!(log.largest_epoch_at_most(S0, extra).unwrap(), None);
            assert_eq!(log.end_of_epoch(S0, 1).unwrap(), Offset(0));
            assert_eq!(log.end_of_epoch(S0, extra - 1).unwrap(), Offset(0));
            // From the largest dropped epoch on: exact.
            assert_eq!(log.end_of_epoch(S0, extra).unwrap(), Offset(extra));
            assert_eq!(log.largest_epoch_at_most(S0, extra + 1).unwrap(), Some(extra + 1));
            assert_eq!(log.end_of_epoch(S0, 2000).unwrap(), Offset(2000));
            assert_eq!(log.end_of_epoch(S0, changes).unwrap(), Offset(changes));
        };
        check(&log);
        log.close().await.unwrap();
        let log = open(&path, &config).await;
        check(&log);
        assert_eq!(log.stats().epoch_changes_dropped, 0, "recovery's drops are not counted");
        // A truncation below every kept change: nothing below is vouched for any more,
        // and the regression bound is the largest dropped epoch.
        log.truncate_shard(S0, Offset(5)).await.unwrap();
        assert_eq!(log.last_epoch(S0).unwrap(), Some(extra), "an upper bound");
        assert_eq!(log.largest_epoch_at_most(S0, changes).unwrap(), None);
        assert_eq!(log.end_of_epoch(S0, 3).unwrap(), Offset(0));
        let low = offer(&log, 5, 1, 8, AckMode::Written, epoch(6));
        assert!(
            matches!(low.await, Err(StorageError::EpochRegression { last, .. }) if last == extra)
        );
        log.close().await.unwrap();
        // Reopening rebuilds the exact index from the log.
        let log = open(&path, &config).await;
        assert_eq!(log.last_epoch(S0).unwrap(), Some(5));
        assert_eq!(log.end_of_epoch(S0, 3).unwrap(), Offset(3));
        assert_eq!(put(&log, S0, 1, 8, epoch(6)).await, 5);
        log.close().await.unwrap();
    });
}

/// A batch whose write fails (ENOSPC) hands its offsets out again, and the epoch index
/// forgets it: the queries and the regression check then describe what is stored.
#[test]
fn a_failed_write_rolls_the_epoch_index_back() {
    let work = tempfile::tempdir().unwrap();
    let Some((guard, kind)) = small_fs(work.path()) else {
        println!("SKIPPED: cannot make a small file system here (needs root, mkfs.ext4 + loop, or tmpfs)");
        return;
    };
    println!("epoch ENOSPC test on {kind}");
    let mnt = guard.0.clone();
    run(move || async move {
        let config = small_config(&mnt);
        let log = open(&mnt, &config).await;
        // Every batch a new epoch: 7 queued without waiting, then one that waits for its
        // write, until a write fails.
        let mut e = 0u64;
        let failed = loop {
            for _ in 0..7 {
                e += 1;
                let base = log.next_offset_assigned(S0);
                let r = records(0, base, 2, 16_000);
                // An `AckMode::None` append answers at once; its write may fail later.
                log.append_with(S0, &r, 1, AckMode::None, epoch(e)).await.unwrap();
            }
            e += 1;
            let base = log.next_offset_assigned(S0);
            let r = records(0, base, 2, 16_000);
            if let Err(err) = log.append_with(S0, &r, 1, AckMode::Written, epoch(e)).await {
                break err;
            }
        };
        assert!(matches!(failed, StorageError::NoSpace { .. }), "{failed:?}");
        let next = log.next_offset(S0).unwrap().0;
        assert_eq!(log.next_offset_assigned(S0), next, "failed offsets handed out again");
        let model = model_of(&log, S0).await;
        assert!(model.last_epoch().0 < e, "the last batch failed");
        assert_matches(&log, S0, &model, "after the failed write");
        // The regression bound is the last stored epoch again: a batch of that epoch is not
        // refused as a regression (the disk may still be full).
        let retry = log
            .append_with(
                S0,
                &records(0, next, 1, 10),
                1,
                AckMode::Written,
                epoch(model.last_epoch().0),
            )
            .await;
        assert!(!matches!(retry, Err(StorageError::EpochRegression { .. })), "{retry:?}");
        log.close().await.ok();
        let log = open(&mnt, &config).await;
        assert_matches(&log, S0, &model_of(&log, S0).await, "reopened");
        log.close().await.ok();
    });
    drop(guard);
}
